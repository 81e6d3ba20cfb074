"""Everything Hugging Face needs: `adapter` (causal LMs: the head at the positions read, packed rows and kept
prefixes through its cache for the verified model types), `attention` (the engine's attention set as their
implementation for an evaluation's forwards, whatever kernel they train with), `callback` (the `Trainer`
hook, `InLoopEvalCallback`) and `layout` (a causal LM loaded FSDP2-sharded from its safetensors for the
watcher's `--fsdp`, each rank reading only its rows), `checkpoint` (its `checkpoint-<N>` folders as the watcher
and `evaluate --model` find, check and load them) and `plugin` (what the engine and the watcher consult of
this package, `inloop_eval.frameworks`). docs/hf_lightning.md shows the set-up."""
