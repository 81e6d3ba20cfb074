"""The engine that runs a model over requests, in the order a batch goes through it: pairs to rows (`rows`;
rows sharing a few-shot prefix, `prefix_sharing`), token-budget batches (`batching`, rows of known widths cut into them by `batch_cuts`), each rank's share of the work (`sharding`), the one seam between the scoring loop and a model
(`layout`: an adapter's `forward` returns outputs that score the targets), the ways a model returns its
outputs (`layouts/`: full logits, hidden states and a head, vocabulary-sharded, sequence-sharded, a pipeline's
last stage), the adapters of the model families (`adapters`, `olmo_core_adapter` with `olmo_core_packing`
and `sequence_parallel`, `pipeline`) and the registry that picks one (`registry`), the scoring loop
(`scoring`, the shared arithmetic in `logprobs`), and leaving training untouched (`training_state`). The
collectives every layer relies on are one level up, in `inloop_eval.distributed`."""
