"""Multiple-choice tasks: what a task is, the registry, loading. Importing this package registers every
built-in task.

- `base`: `MultipleChoiceTask` (raw rows -> checked `Doc`s) and `Doc`;
- `registry`: task id -> factory, `<id>_<k>shot` ids and `<prefix>:` resolvers;
- `loading`: a task's documents, with `fewshot` putting the description and examples before each prompt;
- `lint`: checks of a task's rendered documents (`inloop-eval lint`);
- `splits`: every split the registered tasks read (what `inloop-eval data fetch` materialises);
- `native`: the built-in task families; `olmo`: OLMo's labels as mixins over them (`olmo:<label>`);
- `oe_eval`: oe-eval request files (`oe_eval:<task>:<variant>`); `harness`: lm-evaluation-harness YAML
  tasks (`harness:<path>`).
"""

from inloop_eval.tasks.base import Doc, MultipleChoiceTask
from inloop_eval.tasks.loading import load_docs
from inloop_eval.tasks.registry import get_task, register, task_names

__all__ = ["Doc", "MultipleChoiceTask", "get_task", "load_docs", "register", "task_names"]

# Built-in task families; importing each registers its task ids.
from inloop_eval.tasks import oe_eval  # noqa: E402, F401
from inloop_eval.tasks.harness import suite as harness_suite  # noqa: E402, F401
from inloop_eval.tasks.native import (  # noqa: E402, F401
    arc,
    boolq,
    classification,
    commonsense_qa,
    copa,
    gold_only,
    hellaswag,
    lambada,
    mmlu,
    openbookqa,
    piqa,
    sciq,
    social_iqa,
    winogrande,
)
from inloop_eval.tasks.olmo import labels as olmo_labels  # noqa: E402, F401
