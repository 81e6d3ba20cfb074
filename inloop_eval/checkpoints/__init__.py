"""Model checkpoints, framework-neutral, below both the watcher (`inloop_eval.watch`) and the frameworks'
integration packages, which use them alike: `formats` (`Checkpoint`, `CheckpointFormat`, the interface each
framework's checkpoint format implements, `LoadedModel`, `checkpoint_formats`; no torch imported), `builders`
(the model a `model_builder` gives), `layout` (the parallel layout, `--tp`, `--fsdp`, a model is built in
under torchrun, and its mesh), `shard_reads` (reading a DCP checkpoint so that each rank reads only the
slices it holds: `ShardReader`, `load_shards`), `saved_shapes` (a DCP tensor saved with another shape than
the model's, named with its checkpoint: `shape_mismatch`) and `leases` (a watcher's hold on checkpoints not
yet evaluated, which trainers' rotation respects: `held`)."""
