"""Everything OLMo-core needs: `adapter` (its `Transformer`'s adapters: packed rows and kept prefixes, or the
sequence split under TP/CP), `attention` (how its attention and RoPE positions are routed during an
evaluation: the mask and positions of packed rows, the kept prefix's keys and values), `head` (its output
head scoring an evaluation's targets inside the forward, a bounded chunk of positions at a time),
`topology` (how it splits the sequence over TP x CP ranks), `layout` (its model built in the watcher's
sharded layout: TP over the mesh's `tp`, FSDP2 over its `dp`), `callback` (the trainer hook:
`InLoopEvalCallbackConfig`, `InLoopPerplexityCallbackConfig`, the evaluator callback and
`with_recommended_evals`), `perplexity` (OLMo-core's `LMEvaluatorCallbackConfig` as perplexity domains) and
`rotation` (`KeepLeasedCheckpointsCallback`: checkpoints a watcher's lease holds kept from `max_checkpoints`
rotation), `checkpoint` (its `step<N>` folders as the watcher finds, checks and loads them, whole or sharded),
`keys` (the `olmo_core` key style) and `plugin` (what the engine, the watcher and the key names consult of
this package, `inloop_eval.frameworks`). docs/olmo_core.md shows the set-up."""
