"""Hugging Face transformers' plugin: what the engine, the watcher and `inloop-eval evaluate --model` use of
this package (each part by import path, imported when first used; see `inloop_eval.frameworks`). A causal LM
is a `PreTrainedModel` with output embeddings (`is_causal_lm`)."""

from typing import Any

from inloop_eval.frameworks import Framework, loaded_class

PRETRAINED_MODEL = "transformers:PreTrainedModel"


class HuggingFace(Framework):
    """transformers' models match by `PreTrainedModel` and a head (`get_output_embeddings`)."""

    def matches(self, model: Any) -> bool:
        cls = loaded_class(PRETRAINED_MODEL)
        return cls is not None and isinstance(model, cls) and hasattr(model, "get_output_embeddings")


FRAMEWORK = HuggingFace(
    name="transformers",
    title="Hugging Face transformers",
    package="transformers",
    extra="hf",
    model_class=PRETRAINED_MODEL,
    adapter="inloop_eval.integrations.hf.adapter:build_adapter",
    through_call=False,
    checkpoint="inloop_eval.integrations.hf.checkpoint:FORMAT",
    saved_models=True,
    trainer_hooks=("inloop_eval.integrations.hf.callback:InLoopEvalCallback",),
)
