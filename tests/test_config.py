"""Config dataclasses: every check in __post_init__, and the YAML files in configs/."""

from __future__ import annotations

import pytest
from helpers import REPO

from inloop_eval.config import ConfigError, EvaluatorConfig, TaskEvalConfig
from inloop_eval.demo import DemoConfig
from inloop_eval.tasks import get_task


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": ""}, "`task` is required"),
        ({"task": "piqa", "label": "My Task"}, "lower-case without spaces"),
        ({"task": "piqa", "type": "generate"}, "type must be one of"),
        ({"task": "piqa", "batch_tokens": 0}, "batch_tokens must be >= 1"),
        ({"task": "piqa", "limit": 0}, "limit must be >= 1"),
        ({"task": "piqa", "metrics": ["acc", "mcc"]}, r"unknown metrics \['mcc'\]"),
    ],
)
def test_task_eval_config_checks(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TaskEvalConfig(**kwargs)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"eval_interval": 0}, "eval_interval must be >= 1"),
        ({"max_length": 1}, "max_length must be >= 2"),
        ({"evaluators": [{"task": "piqa"}, {"task": "piqa"}]}, r"repeated: \['piqa'\]"),
        ({"evaluators": [{"task": "piqa", "bogus": 1}]}, r"unknown keys \['bogus'\]"),
        ({"evaluators": ["piqa"]}, "expected a mapping"),
        ({"interval": 5}, r"unknown keys \['interval'\]"),
    ],
)
def test_evaluator_config_checks(data, message):
    with pytest.raises(ConfigError, match=message):
        EvaluatorConfig.from_dict(data)


def test_label_defaults_to_task():
    assert TaskEvalConfig(task="piqa").label == "piqa"


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        EvaluatorConfig.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("evaluators: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        EvaluatorConfig.from_yaml(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top"):
        EvaluatorConfig.from_yaml(bad)


@pytest.mark.parametrize("name", ["olmo_inloop.yaml", "demo.yaml"])
def test_shipped_configs_load_and_name_real_tasks(name):
    path = REPO / "configs" / name
    config = DemoConfig.from_yaml(path).evaluation if name == "demo.yaml" else EvaluatorConfig.from_yaml(path)
    assert config.evaluators
    for ev in config.evaluators:
        if ev.type == "downstream":  # `lm` entries name domains, not tasks
            get_task(ev.task)
