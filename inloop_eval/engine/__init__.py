"""The engine that runs a model over requests, framework-neutral (it imports no training framework), in the
order a batch goes through it: pairs to rows (`rows`; rows sharing a few-shot prefix, `prefix_sharing`),
token-budget batches (`batching`, rows of known widths cut into them by `batch_cuts`), each rank's share of the work (`sharding`), the one seam between the scoring
loop and a model (`adapter`: an adapter's `forward` returns outputs that score the targets), the forms a
model's outputs come back in (`outputs/`: full logits, hidden states and a head, vocabulary-sharded,
sequence-sharded, a pipeline's last stage), the engine's own attention for packed rows that every
framework's attention is routed through during an evaluation (`tree_attention`: the plan's mask rendered
dense or as a FlexAttention block mask, which `flex_kernel` arranges as one sequence of a ladder length and
runs compiled once per length; `attention_route`: the one routine applying a framework's declared
attention route for one forward and putting it back), the framework-neutral adapters (`adapters/`: logits callables,
the reference GPT's hidden states, torch pipeline schedules), the model families that pick an adapter for a
model (`families`; each framework's adapter lives in `inloop_eval/integrations/<framework>/`), the scoring
loop (`scoring`, the shared arithmetic in `logprobs`), the one scoring call every evaluator makes and the
context it is given (`evaluation`), and leaving training untouched (`training_state`). The
collectives every layer relies on are one level up, in `inloop_eval.distributed`."""
