"""Task definitions and the registry. Importing this package registers every built-in task."""

from inloop_eval.tasks.base import Doc, MultipleChoiceTask
from inloop_eval.tasks.loading import load_docs
from inloop_eval.tasks.registry import get_task, register, task_names

__all__ = ["Doc", "MultipleChoiceTask", "get_task", "load_docs", "register", "task_names"]

# Built-in task families; importing each registers its task ids.
from inloop_eval.tasks import (  # noqa: E402, F401
    arc,
    boolq,
    classification,
    commonsense_qa,
    copa,
    gold_only,
    harness_yaml,
    hellaswag,
    lambada,
    mmlu,
    oe_eval,
    olmo,
    openbookqa,
    piqa,
    sciq,
    social_iqa,
    winogrande,
)
