"""Everything torchtitan needs: `adapter` (its decoders as trained under FSDP, HSDP and TP: hidden states then
`lm_head` at the positions read, or logits sharded on the vocabulary), `attention` (packed rows and kept
prefixes: RoPE at each token's position, core attention through the engine's tree attention), `layout` (its
model built in the watcher's sharded layout through its own `parallelize_fn`), `validator` (the trainer
hook: `InLoopValidator`, torchtitan's validator slot, with its parallelism checks and tokenizer) and
`rotation` (`KeepLeasedCheckpointManager`: its checkpoint purge keeps what a watcher's lease holds),
`checkpoint` (its `step-<N>` folders as the watcher finds and loads them) and `plugin` (what the watcher
consults of this package, `inloop_eval.frameworks`). docs/torchtitan.md shows the set-up."""
