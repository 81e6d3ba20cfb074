"""Config dataclasses: every check in __post_init__, and the YAML files in configs/."""

from __future__ import annotations

import pytest
from helpers import REPO

from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.demo.run import DemoConfig
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.tasks import get_task


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": ""}, "`task` is required"),
        ({"task": "piqa", "label": "My Task"}, "lower-case without spaces"),
        ({"task": "piqa", "type": "generate"}, "type must be 'downstream', found 'generate'"),
        ({"task": "piqa", "batch_tokens": 0}, "batch_tokens must be an integer >= 1, found 0"),
        ({"task": "piqa", "limit": 0}, "limit must be an integer >= 1 or null, found 0"),
        ({"task": "piqa", "metrics": ["acc", "mcc"]}, r"unknown metrics \['mcc'\]"),
        ({"task": "piqa", "spread": True}, r"evaluator 'piqa': `spread: true` .* `limit` is not set.* set `limit: N`"),
    ],
)
def test_task_eval_config_checks(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TaskEvalConfig(**kwargs)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"eval_interval": 0}, "eval_interval must be an integer >= 1, found 0"),
        ({"max_length": 1}, "max_length must be an integer >= 2 or null, found 1"),
        ({"evaluators": [{"task": "piqa"}, {"task": "piqa"}]}, r"repeated: \['piqa'\]"),
        ({"evaluators": [{"task": "piqa", "bogus": 1}]}, r"unknown keys \['bogus'\]"),
        ({"evaluators": ["piqa"]}, r"evaluators\[0\] must be a mapping, found 'piqa'"),
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


@pytest.mark.parametrize("name", ["olmo_inloop.yaml", "olmo_inloop_small.yaml", "demo.yaml"])
def test_shipped_configs_load_and_name_real_tasks(name):
    path = REPO / "configs" / name
    config = DemoConfig.from_yaml(path).evaluation if name == "demo.yaml" else EvaluatorConfig.from_yaml(path)
    assert config.evaluators
    for ev in config.evaluators:
        if ev.type == "downstream":  # `lm` entries name domains, not tasks
            get_task(ev.task)


# --- every field checked against its annotation when the config is read ------------------------------

PIQA = {"task": "piqa"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"strict": "false", "evaluators": [PIQA]},
            "config: strict must be true or false, found 'false'; a quoted string is not a boolean",
        ),
        ({"compiler_reset": "no", "evaluators": [PIQA]}, "compiler_reset must be true or false, found 'no'"),
        ({"strict": 1, "evaluators": [PIQA]}, "strict must be true or false, found 1"),
        (
            {"evaluators": [PIQA, {"task": "copa"}, {"task": "arc_easy", "batch_tokens": "abc"}]},
            r"evaluators\[2\] \(arc_easy\): batch_tokens must be an integer >= 1, found 'abc'",
        ),
        (
            {"evaluators": [{"task": "piqa", "batch_tokens": "8192"}]},
            "found '8192'; YAML reads 8192 as a string: write 8192, without quotes",
        ),
        ({"eval_interval": 2.5, "evaluators": [PIQA]}, "eval_interval must be an integer >= 1, found 2.5"),
        ({"eval_interval": 5.0, "evaluators": [PIQA]}, "found 5.0; write 5"),
        (
            {"evaluators": [{"task": "piqa", "limit": 2.5}]},
            r"limit must be an integer >= 1 or null, found 2.5",
        ),
        (
            {"evaluators": [{"task": "piqa", "batch_tokens": True}]},
            "batch_tokens must be an integer >= 1, found true; true and false are not numbers",
        ),
        ({"evaluators": None}, "evaluators must be a list of mappings, found null"),
        ({"evaluators": {"task": "piqa"}}, "evaluators must be a list of mappings, found {'task': 'piqa'}"),
        ({"evaluators": []}, "`evaluators` lists no evaluator"),
        ({}, "`evaluators` lists no evaluator"),
        (
            {"evaluators": [{"type": "LM", "domains": [{"label": "code", "paths": ["a.npy"]}]}]},
            r"evaluators\[0\]: type must be one of \['downstream', 'lm'\], found 'LM'; did you mean 'lm'\? "
            r"\(names are case-sensitive\)",
        ),
        ({"evaluators": [{"task": "piqa", "type": "generate"}]}, "type must be one of .* found 'generate'$"),
        ({"data_root": 123, "evaluators": [PIQA]}, "data_root must be a string or null, found 123"),
        ({"tokenizer": ["a"], "evaluators": [PIQA]}, r"tokenizer must be a string or null, found \['a'\]"),
        ({"evaluators": [{"task": 7}]}, r"evaluators\[0\]: task must be a string, found 7"),
        ({"evaluators": [{"task": "piqa", "metrics": [1]}]}, r"metrics\[0\] must be a string, found 1"),
        (
            {
                "evaluators": [
                    {"type": "lm", "domains": [{"label": "code", "paths": ["a"], "max_tokens": "1e4"}]}
                ]
            },
            r"evaluators\[0\]: domains\[0\] \(code\): max_tokens must be an integer >= 1 or null, found '1e4'; "
            "YAML reads 1e4 as a string: write 10000",
        ),
        (
            {"evaluators": [{"type": "lm", "domains": [{"label": "code", "paths": [3]}]}]},
            r"paths\[0\] must be a",
        ),
    ],
)
def test_every_field_is_type_checked_naming_the_key_and_entry(data, message):
    with pytest.raises(ConfigError, match=message):
        EvaluatorConfig.from_dict(data)


def test_type_checks_apply_to_keyword_construction_too():
    with pytest.raises(
        ConfigError, match="evaluator 'piqa': limit must be an integer >= 1 or null, found 2.5"
    ):
        TaskEvalConfig(task="piqa", limit=2.5)
    with pytest.raises(ConfigError, match="strict must be true or false, found 'false'"):
        EvaluatorConfig(evaluators=[PIQA], strict="false")
    with pytest.raises(ConfigError, match="evaluators must be a list of mappings, found null"):
        EvaluatorConfig(evaluators=None)


def test_well_typed_values_are_kept():
    config = EvaluatorConfig.from_dict(
        {
            "strict": False,
            "eval_interval": 5,
            "data_root": "/data",
            "evaluators": [{"task": "piqa", "limit": 3, "metrics": "acc"}],
        }
    )
    assert (config.strict, config.eval_interval, config.data_root) == (False, 5, "/data")
    assert config.evaluators[0].limit == 3 and config.evaluators[0].metrics == ["acc"]  # a lone string
    assert EvaluatorConfig().evaluators == []  # in code, a config may be filled in later


def test_quoted_false_in_a_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text('strict: "false"\nevaluators:\n  - {task: piqa}\n')
    with pytest.raises(ConfigError, match=f"{path}: strict must be true or false, found 'false'"):
        EvaluatorConfig.from_yaml(path)
    path.write_text("evaluation:\n  evaluators: []\n")
    with pytest.raises(ConfigError, match=f"{path}: `evaluators` lists no evaluator"):
        EvaluatorConfig.from_yaml(path)


def test_a_config_path_that_is_a_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory; name a YAML file"):
        EvaluatorConfig.from_yaml(tmp_path)


@pytest.mark.parametrize("label", ["a/b", "../x", "..", "x..y", "Piqa", "my task"])
def test_explicit_labels_are_lower_case_without_spaces_slashes_or_dot_dot(label):
    with pytest.raises(ConfigError, match="must be lower-case without spaces or '/', and not contain '..'"):
        TaskEvalConfig(task="piqa", label=label)


def test_a_task_id_used_as_the_label_keeps_its_slashes():
    config = EvaluatorConfig.from_dict({"evaluators": [{"task": "harness:my_tasks/science.yaml"}]})
    assert config.evaluators[0].label == "harness:my_tasks/science.yaml"
    assert EvaluatorConfig.from_dict(config.to_dict()) == config  # and round-trips


def test_lm_domain_labels_refuse_dot_dot():
    """`make-lm` writes OUT/<label>/: a label `..` would replace OUT's parent."""
    with pytest.raises(ConfigError, match="not contain '..'"):
        LMDomainConfig(label="..", paths=["a.npy"])


def test_build_dataclass_checks_any_config_dataclass(tmp_path):
    """The demo's own sections go through the same checker: YAML 1.1 reads `3e-3` as a string."""
    path = tmp_path / "demo.yaml"
    path.write_text("train: {lr: 3e-3}\nlogging: {wandb: 'no'}\nevaluation: {evaluators: [{task: piqa}]}\n")
    with pytest.raises(ConfigError, match=f"{path}: train: lr must be a number, found '3e-3'; YAML reads"):
        DemoConfig.from_yaml(path)
    path.write_text("train: {lr: 0.003}\nlogging: {wandb: 'no'}\nevaluation: {evaluators: [{task: piqa}]}\n")
    with pytest.raises(ConfigError, match=f"{path}: logging: wandb must be true or false, found 'no'"):
        DemoConfig.from_yaml(path)


def test_key_style_is_checked():
    assert EvaluatorConfig(evaluators=[{"task": "piqa"}], key_style="olmo_core").key_style == "olmo_core"
    with pytest.raises(
        ConfigError, match=r"key_style must be one of \['inloop', 'olmo_core'\].*did you mean 'olmo_core'"
    ):
        EvaluatorConfig(evaluators=[{"task": "piqa"}], key_style="OLMo_core")


def test_a_misspelt_key_names_the_closest_known_key(tmp_path):
    """A typo in a YAML config's key is answered with the key meant, as a misspelt task id is."""
    path = tmp_path / "typo.yaml"
    path.write_text("eval_intervall: 5\nevaluators:\n  - {task: piqa, limt: 10}\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['eval_intervall'\] .*; did you mean 'eval_interval'\?"):
        EvaluatorConfig.from_yaml(path)
    path.write_text("evaluators:\n  - {task: piqa, limt: 10, batch_token: 9, zzz: 1}\n")
    with pytest.raises(
        ConfigError,
        match=r"evaluators\[0\].*unknown keys \['batch_token', 'limt', 'zzz'\] for TaskEvalConfig; "
        r"did you mean 'batch_tokens' for 'batch_token', 'limit' for 'limt'\?; known keys:",
    ):
        EvaluatorConfig.from_yaml(path)
