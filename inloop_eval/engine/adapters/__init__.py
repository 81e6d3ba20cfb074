"""The framework-neutral adapters (`engine/adapter.py`'s `ModelAdapter`): `logits` (any module or callable
returning logits, plain or a vocabulary-sharded DTensor), `hidden_states` (a model showing its hidden states
and head: the reference GPT, packed rows and kept prefixes), `pipeline` (a torch pipeline schedule run
forward only). Each framework's own adapter is in `inloop_eval/integrations/<framework>/adapter.py`."""
