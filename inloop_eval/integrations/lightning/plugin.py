"""Lightning's plugin (see `inloop_eval.frameworks`): a callback only; its models are scored by the family
they are of (a Hugging Face model, the reference GPT, any module returning logits)."""

from inloop_eval.frameworks import Framework

FRAMEWORK = Framework(
    name="lightning",
    title="Lightning",
    package="lightning",
    trainer_hooks=("inloop_eval.integrations.lightning.callback:InLoopEvalCallback",),
)
