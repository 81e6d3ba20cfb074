"""`TaskCallbackFields`, the base of OLMo-core's and torchtitan's callback configs: each check of its
`__post_init__`, the evaluator config it describes, and the context-length rule every callback shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from inloop_eval.errors import ConfigError
from inloop_eval.integrations.callback_config import TaskCallbackFields, check_trained_length


@dataclass(kw_only=True)
class WithPreset(TaskCallbackFields):
    """A trainer config with a third way to name tasks, and one more field that applies to `tasks` only."""

    preset: str | None = None
    style: str = "plain"

    TASK_SOURCES: ClassVar[dict[str, str]] = {**TaskCallbackFields.TASK_SOURCES, "preset": "a named set"}
    TASK_ONLY_FIELDS: ClassVar[tuple[str, ...]] = (*TaskCallbackFields.TASK_ONLY_FIELDS, "style")


def test_exactly_one_way_of_naming_the_tasks():
    with pytest.raises(ConfigError, match=r"TaskCallbackFields: name either `tasks` .* or `config` .*found "):
        TaskCallbackFields()
    with pytest.raises(ConfigError, match=r"found tasks=\['piqa'\], config='eval.yaml'"):
        TaskCallbackFields(tasks=["piqa"], config="eval.yaml")
    with pytest.raises(ConfigError, match=r"WithPreset: name either `tasks` .*, `config` .* or `preset`"):
        WithPreset(tasks=["piqa"], preset="fast")
    assert WithPreset(preset="fast").preset == "fast"


def test_tasks_lists_at_least_one_and_a_positive_batch():
    with pytest.raises(ConfigError, match="TaskCallbackFields: `tasks` lists no task"):
        TaskCallbackFields(tasks=[])
    with pytest.raises(ConfigError, match="batch_tokens must be >= 1, found 0"):
        TaskCallbackFields(tasks=["piqa"], batch_tokens=0)


def test_fields_of_tasks_are_refused_beside_a_config_file():
    with pytest.raises(
        ConfigError, match="`limit` and `batch_tokens` apply to `tasks`; with config='e.yaml'"
    ):
        TaskCallbackFields(config="e.yaml", batch_tokens=64)
    with pytest.raises(ConfigError, match="`limit`, `batch_tokens` and `style` apply to `tasks`"):
        WithPreset(config="e.yaml", style="fancy")
    assert WithPreset(tasks=["piqa"], style="fancy").style == "fancy"


def test_the_described_config_takes_the_schedule_and_the_trained_length(tmp_path):
    built = TaskCallbackFields(
        tasks=["piqa", "copa"], limit=3, batch_tokens=512, strict=True
    ).described_config(eval_interval=9, trained_length=128, trained_length_name="the seq_len")
    assert [(e.task, e.limit, e.batch_tokens) for e in built.evaluators] == [
        ("piqa", 3, 512),
        ("copa", 3, 512),
    ]
    assert (built.eval_interval, built.max_length, built.strict) == (9, 128, True)
    path = tmp_path / "eval.yaml"
    path.write_text("evaluators: [{task: copa}]\neval_interval: 7\nmax_length: 64\n")
    from_file = TaskCallbackFields(config=str(path), data_root="/data").described_config(
        eval_interval=5, trained_length=None, trained_length_name="the seq_len"
    )
    assert (from_file.eval_interval, from_file.max_length, from_file.data_root) == (5, 64, "/data")
    with pytest.raises(
        ConfigError, match=r"eval.yaml: max_length 64 is longer than the seq_len 32, past the"
    ):
        TaskCallbackFields(config=str(path)).described_config(
            eval_interval=5, trained_length=32, trained_length_name="the seq_len"
        )


def test_a_length_within_the_trained_length_passes():
    check_trained_length("here", "max_length", 32, 32, "the seq_len")
    check_trained_length("here", "max_length", None, 8, "the seq_len")
    check_trained_length("here", "max_length", 64, None, "the seq_len")
    with pytest.raises(ConfigError, match="here: the length 33 is longer than the seq_len 32.*; shorten it"):
        check_trained_length("here", "the length", 33, 32, "the seq_len", fix="shorten it")


def test_tasks_is_a_list_of_ids_not_a_string():
    """`tasks="piqa"` would be read as the tasks 'p', 'i', 'q', 'a'."""
    with pytest.raises(ConfigError, match=r"`tasks` must be a list of task ids, e.g. tasks=\['piqa'\], found 'piqa'"):
        TaskCallbackFields(tasks="piqa")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a list of task ids"):
        TaskCallbackFields(tasks=["piqa", 3])  # type: ignore[list-item]


@pytest.mark.parametrize("trained", [0, -5, 1])
def test_a_trained_length_under_two_tokens_is_refused(trained):
    with pytest.raises(ConfigError, match=f"seq_len must be at least 2 tokens .*found {trained}"):
        check_trained_length("validator", "max_length", None, trained, "seq_len")
    config = TaskCallbackFields(tasks=["piqa"])
    with pytest.raises(ConfigError, match="at least 2 tokens"):
        config.described_config(eval_interval=10, trained_length=trained, trained_length_name="seq_len")
