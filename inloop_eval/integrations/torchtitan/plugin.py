"""torchtitan's plugin: what the watcher uses of this package (each part by import path, imported when first
used; see `inloop_eval.frameworks`). A torchtitan model is scored through the validator's adapter, which
`validator.InLoopValidator` builds with the trainer's parallel dims."""

from inloop_eval.frameworks import Framework

FRAMEWORK = Framework(
    name="torchtitan",
    title="torchtitan",
    package="torchtitan",
    attention="inloop_eval.integrations.torchtitan.attention:ROUTE",
    checkpoint="inloop_eval.integrations.torchtitan.checkpoint:FORMAT",
    trainer_hooks=(
        "inloop_eval.integrations.torchtitan.validator:InLoopValidator",
        "inloop_eval.integrations.torchtitan.rotation:KeepLeasedCheckpointManager",
    ),
)
