"""OLMo-core's plugin: what the engine, the watcher and the key names use of this package (each part by
import path, imported when first used; see `inloop_eval.frameworks`)."""

from inloop_eval.frameworks import Framework

FRAMEWORK = Framework(
    name="olmo_core",
    title="OLMo-core",
    package="olmo_core",
    model_class="olmo_core.nn.transformer.model:Transformer",
    adapter="inloop_eval.integrations.olmo_core.adapter:build_adapter",
    attention="inloop_eval.integrations.olmo_core.attention:ROUTE",
    checkpoint="inloop_eval.integrations.olmo_core.checkpoint:FORMAT",
    key_style="inloop_eval.integrations.olmo_core.keys:KEY_STYLE",
    trainer_hooks=(
        "inloop_eval.integrations.olmo_core.callback:InLoopEvalCallbackConfig",
        "inloop_eval.integrations.olmo_core.callback:InLoopPerplexityCallbackConfig",
        "inloop_eval.integrations.olmo_core.rotation:KeepLeasedCheckpointsCallback",
    ),
)
