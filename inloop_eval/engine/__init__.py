"""The engine that runs a model over requests: how to call a model (`adapters`; packed rows for OLMo-core
Transformers, `olmo_core_packing`), token-budget batches (`batching`), log-probabilities at continuation
positions (`scoring`; from logits sharded over the vocabulary by a tensor-parallel head, `vocab_parallel`; from
a sequence split over tensor- or context-parallel ranks, `sequence_parallel`), a model split into pipeline
stages scored through its schedule (`pipeline`), each rank's share of documents (`sharding`), and leaving
training untouched (`training_state`). The collectives every layer relies on are one level up, in
`inloop_eval.distributed`."""
