"""Megatron-core's plugin (see `inloop_eval.frameworks`): Megatron-LM's loop has no hooks; it passes
`adapter.MegatronAdapter(model)` to the evaluator itself (this package's docstring shows the two calls)."""

from inloop_eval.frameworks import Framework

FRAMEWORK = Framework(
    name="megatron",
    title="Megatron-core",
    package="megatron",
    attention="inloop_eval.integrations.megatron.attention:ROUTE",
    trainer_hooks=("inloop_eval.integrations.megatron.adapter:MegatronAdapter",),
)
