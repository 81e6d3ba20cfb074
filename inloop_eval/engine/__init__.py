"""The engine that runs a model over requests: how to call a model (`adapters`), token-budget batches
(`batching`), log-probabilities at continuation positions (`scoring`), each rank's share of documents
(`sharding`), the collectives and failure agreement (`distributed`), and leaving training untouched
(`training_state`)."""
