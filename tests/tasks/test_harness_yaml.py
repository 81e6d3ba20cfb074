"""lm-evaluation-harness YAML tasks: the harness's own task files (ARC-Easy, HellaSwag with `process_docs`,
WinoGrande with multiple inputs) give the same (context, continuation) strings as the built-in tasks, from the
data root and from local JSONL / CSV / parquet files; `include:`, groups, few-shot, metrics and the safety rules."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import REPO
from pinned_scores import pinned_model

from inloop_eval.data.root import load_split
from inloop_eval.errors import ConfigError, TaskDataError, UnknownTaskError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.requests.table import build_requests
from inloop_eval.tasks import get_task, load_docs, registry, task_names
from inloop_eval.tasks.harness.loader import load_yaml
from inloop_eval.tasks.harness.suite import HarnessSuite, register_harness_tasks

N = 30

# lm-evaluation-harness lm_eval/tasks/arc/arc_easy.yaml (test split and decontamination keys left out).
ARC_EASY_YAML = """\
task: {task}
{dataset}
output_type: multiple_choice
validation_split: validation
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

# lm_eval/tasks/hellaswag/utils.py
HELLASWAG_UTILS = """\
import re

import datasets


def preprocess(text):
    text = text.strip()
    # NOTE: Brackets are artifacts of the WikiHow dataset portion of HellaSwag.
    text = text.replace(" [title]", ". ")
    text = re.sub("\\\\[.*?\\\\]", "", text)
    text = text.replace("  ", " ")
    return text


def process_docs(dataset: datasets.Dataset) -> datasets.Dataset:
    def _process_doc(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        out_doc = {
            "query": preprocess(doc["activity_label"] + ": " + ctx),
            "choices": [preprocess(ending) for ending in doc["endings"]],
            "gold": int(doc["label"]),
        }
        return out_doc

    return dataset.map(_process_doc)
"""
HELLASWAG_YAML = """\
tag:
  - multiple_choice
task: hellaswag
dataset_path: hellaswag
dataset_name: null
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: null
process_docs: !function utils.process_docs
doc_to_text: "{{query}}"
doc_to_target: "{{label}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
  - metric: acc_norm
"""

# lm_eval/tasks/winogrande/preprocess_winogrande.py and default.yaml (partial evaluation, multiple inputs).
WINOGRANDE_UTILS = """\
def doc_to_text(doc):
    answer_to_num = {"1": 0, "2": 1}
    return answer_to_num[doc["answer"]]


def doc_to_target(doc):
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def doc_to_choice(doc):
    idx = doc["sentence"].index("_")
    options = [doc["option1"], doc["option2"]]
    return [doc["sentence"][:idx] + opt for opt in options]
"""
WINOGRANDE_YAML = """\
task: winogrande
dataset_path: winogrande
dataset_name: winogrande_xl
output_type: multiple_choice
training_split: train
validation_split: validation
doc_to_text: !function preprocess_winogrande.doc_to_text
doc_to_target: !function preprocess_winogrande.doc_to_target
doc_to_choice: !function preprocess_winogrande.doc_to_choice
metric_list:
  - metric: acc
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def pairs(task, data_root, tokenizer, limit: int = N) -> list[tuple[str, str]]:
    """The (context, continuation) strings exactly as scored."""
    table = build_requests(task, load_docs(task, data_root, limit=limit), tokenizer, 4096, with_uncond=False)
    return list(zip(table.context_text, table.continuation_text, strict=True))


@pytest.fixture(scope="module")
def arc_rows(data_root) -> list[dict]:
    rows = load_split("ai2_arc", "ARC-Easy", "validation", data_root=data_root)
    return [rows[i] for i in range(N)]


def test_yaml_on_a_local_jsonl_gives_the_built_in_requests(tmp_path, data_root, neox_tokenizer, arc_rows):
    (tmp_path / "arc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arc_rows))
    dataset = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    validation: arc.jsonl"
    yaml_file = tmp_path / "arc_easy_local.yaml"
    yaml_file.write_text(ARC_EASY_YAML.format(task="arc_easy_local", dataset=dataset))
    task = get_task(f"harness:{yaml_file}")
    assert task.metrics == ("acc", "acc_norm")
    built_in = pairs(get_task("arc_easy"), data_root, neox_tokenizer)
    assert pairs(task, data_root, neox_tokenizer) == built_in
    assert built_in[0] == (
        "Question: Which technology was developed most recently?\nAnswer:",
        " cellular telephone",
    )


def test_yaml_on_the_data_root_gives_the_built_in_requests(tmp_path, data_root, neox_tokenizer):
    dataset = "dataset_path: ai2_arc\ndataset_name: ARC-Easy\ndataset_kwargs:\n  trust_remote_code: true"
    yaml_file = tmp_path / "arc.yaml"
    yaml_file.write_text(ARC_EASY_YAML.format(task="arc_easy", dataset=dataset))
    task = get_task(f"harness:{yaml_file}")
    assert pairs(task, data_root, neox_tokenizer, 100) == pairs(
        get_task("arc_easy"), data_root, neox_tokenizer, 100
    )


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_files(tmp_path, data_root, fmt):
    import datasets

    rows = load_split("piqa", "plain_text", "validation", data_root=data_root).select(range(N))
    getattr(datasets.Dataset.from_list(rows.to_list()), f"to_{fmt}")(str(tmp_path / f"piqa.{fmt}"))
    write(
        tmp_path,
        {
            "piqa.yaml": f"""\
task: piqa_{fmt}
dataset_path: {fmt}
dataset_kwargs: {{data_files: {{validation: piqa.{fmt}}}}}
output_type: multiple_choice
validation_split: validation
doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{[sol1, sol2]}}}}"
"""
        },
    )
    docs = load_docs(get_task(f"harness:{tmp_path / 'piqa.yaml'}"), data_root)
    assert docs == load_docs(get_task("piqa"), data_root, limit=N)


def test_process_docs_from_utils(tmp_path, data_root, neox_tokenizer):
    folder = write(tmp_path / "hellaswag", {"hellaswag.yaml": HELLASWAG_YAML, "utils.py": HELLASWAG_UTILS})
    task = get_task(f"harness:{folder / 'hellaswag.yaml'}")
    assert pairs(task, data_root, neox_tokenizer, 60) == pairs(
        get_task("hellaswag"), data_root, neox_tokenizer, 60
    )
    assert not list((data_root / "hellaswag" / "none" / "validation").glob("cache-*")), (
        "map wrote beside the data"
    )


def test_multiple_inputs_as_winogrande(tmp_path, data_root, neox_tokenizer):
    folder = write(
        tmp_path / "wg", {"default.yaml": WINOGRANDE_YAML, "preprocess_winogrande.py": WINOGRANDE_UTILS}
    )
    task = get_task(f"harness:{folder}#winogrande")
    assert load_docs(task, data_root, limit=N) == load_docs(get_task("winogrande"), data_root, limit=N)
    assert pairs(task, data_root, neox_tokenizer) == pairs(get_task("winogrande"), data_root, neox_tokenizer)


def test_include_group_and_registration(tmp_path, data_root, monkeypatch):
    folder = write(
        tmp_path / "suite",
        {
            "_arc_base.yaml": textwrap.dedent(
                """\
                dataset_path: ai2_arc
                output_type: multiple_choice
                validation_split: validation
                doc_to_text: "Question: {{question}}\\nAnswer:"
                doc_to_target: "{{choices.label.index(answerKey)}}"
                doc_to_choice: "{{choices.text}}"
                target_delimiter: "  "
                tag: [science]
                """
            ),
            "easy.yaml": "include: _arc_base.yaml\ntask: my_arc_easy\ndataset_name: ARC-Easy\ntarget_delimiter: ' '\n",
            "challenge.yaml": "include: _arc_base.yaml\ntask: my_arc_challenge\ndataset_name: ARC-Challenge\n",
            "group.yaml": "group: my_arc\ntask:\n  - my_arc_easy\n  - task: my_arc_challenge\n    num_fewshot: 2\n",
            "sub/boolq.yaml": textwrap.dedent(
                """\
                task: my_boolq
                group: [reading]
                dataset_path: boolq
                output_type: multiple_choice
                validation_split: validation
                doc_to_text: "{{passage}}\\nQuestion: {{question}}?\\nAnswer:"
                doc_to_target: "{{label}}"
                doc_to_choice: ["no", "yes"]
                process_docs: !function helpers.with_label
                """
            ),
            "sub/helpers.py": "def with_label(ds):\n    return ds.map(lambda d: {'label': int(d['answer'])})\n",
        },
    )
    assert load_yaml(folder / "easy.yaml")["target_delimiter"] == " "
    assert load_yaml(folder / "challenge.yaml")["target_delimiter"] == "  "
    suite = HarnessSuite.load(folder)
    assert suite.names() == ["my_arc_challenge", "my_arc_easy", "my_boolq"]
    assert suite.expand("my_arc") == ["my_arc_easy", "my_arc_challenge"]
    assert suite.expand("science") == ["my_arc_challenge", "my_arc_easy"] and suite.expand("reading") == [
        "my_boolq"
    ]
    with pytest.raises(UnknownTaskError, match="no task or group 'nope'"):
        suite.expand("nope")
    assert suite.task("my_arc_challenge").num_fewshot == 2  # the group's inline override
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    ids = register_harness_tasks(folder, prefix="h_")
    assert ids == ["h_my_arc_challenge", "h_my_arc_easy", "h_my_boolq"] and set(ids) <= set(task_names())
    easy = load_docs(get_task("h_my_arc_easy"), data_root, limit=5)
    assert easy == load_docs(get_task("arc_easy"), data_root, limit=5)
    shots = load_docs(get_task("h_my_arc_easy_3shot"), data_root, limit=5)
    assert shots == load_docs(get_task("arc_easy_3shot"), data_root, limit=5)
    boolq = load_docs(get_task("h_my_boolq"), data_root, limit=5)
    assert boolq == load_docs(get_task("boolq"), data_root, limit=5)


def test_description_fewshot_and_first_n(tmp_path, data_root):
    write(
        tmp_path,
        {
            "mmlu.yaml": textwrap.dedent(
                """\
                task: mmlu_anatomy_h
                dataset_path: hails/mmlu_no_train
                dataset_name: anatomy
                output_type: multiple_choice
                test_split: validation
                fewshot_split: dev
                fewshot_config: {sampler: first_n}
                num_fewshot: 5
                description: "The following are multiple choice questions (with answers) about {{subject.replace('_', ' ')}}.\\n\\n"
                doc_to_text: "Question: {{question.strip()}}\\n A. {{choices[0]}}\\n B. {{choices[1]}}\\n C. {{choices[2]}}\\n D. {{choices[3]}}\\nAnswer:"
                doc_to_choice: ["A", "B", "C", "D"]
                doc_to_target: answer
                metric_list: [{metric: acc}, {metric: acc_mutual_info}, {metric: brier_score}, {metric: ece}]
                """
            )
        },
    )
    task = get_task(f"harness:{tmp_path / 'mmlu.yaml'}")
    assert task.metrics == ("acc", "acc_mutual_info", "brier_score", "ece")
    assert load_docs(task, data_root) == load_docs(get_task("mmlu_anatomy_mc_5shot"), data_root)


@pytest.mark.parametrize(
    ("extra", "error", "fragment"),
    [
        ("output_type: generate_until\n", ConfigError, "output_type 'generate_until' is not supported"),
        ("metric_list: [{metric: mcc}]\n", ConfigError, "metrics ['mcc'] are not supported"),
        ("doc_to_text: '{{nope}}'\n", TaskDataError, "doc 0: doc_to_text '{{nope}}': template failed"),
        (
            "doc_to_target: '{{question}}'\n",
            TaskDataError,
            "doc 0: doc_to_target: expected one of the choices",
        ),
        ("doc_to_choice: '{{question}}'\n", TaskDataError, "doc 0: doc_to_choice: expected a list literal"),
    ],
)
def test_errors_name_the_task_document_and_key(tmp_path, data_root, extra, error, fragment):
    config = yaml.safe_load(ARC_EASY_YAML.format(task="arc_bad", dataset="dataset_path: ai2_arc"))
    config.update(dataset_name="ARC-Easy", **yaml.safe_load(extra))
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(error) as info:
        load_docs(get_task(f"harness:{tmp_path / 'bad.yaml'}"), data_root, limit=2)
    assert "task 'harness:" in str(info.value) or "task 'arc_bad'" in str(info.value)
    assert fragment in str(info.value)


def test_includes_and_functions_only_from_the_named_folder(tmp_path, data_root):
    """An `include:` outside the named folder is refused when the task is loaded, naming the file, so its
    `!function` never runs (a `!function` naming a file outside: test_a_function_given_as_a_path_...)."""
    marker = tmp_path / "ran"
    write(
        tmp_path / "elsewhere",
        {
            "base.yaml": HELLASWAG_YAML.replace("task: hellaswag", "task: hs_base"),
            "utils.py": f"open({str(marker)!r}, 'w').close()\n" + HELLASWAG_UTILS,
        },
    )
    folder = write(tmp_path / "named", {"hs.yaml": "include: ../elsewhere/base.yaml\ntask: hs\n"})
    with pytest.raises(ConfigError) as info:
        get_task(f"harness:{folder / 'hs.yaml'}")
    assert f"{tmp_path / 'elsewhere' / 'base.yaml'} (named by `include:` in {folder / 'hs.yaml'}) is outside " in str(
        info.value
    )
    assert f"the task folder {folder} that was named" in str(info.value)
    assert not marker.exists()


def test_folder_with_several_tasks_needs_a_name(tmp_path):
    write(
        tmp_path,
        {
            "a.yaml": ARC_EASY_YAML.format(task="a", dataset="dataset_path: ai2_arc"),
            "b.yaml": ARC_EASY_YAML.format(task="b", dataset="dataset_path: ai2_arc"),
        },
    )
    with pytest.raises(UnknownTaskError, match="defines 2 tasks; name one as harness:"):
        get_task(f"harness:{tmp_path}")
    assert get_task(f"harness:{tmp_path}#b").harness_name == "b"


def page_blocks(heading: str) -> list[str]:
    """The ```yaml blocks of one section of docs/tasks.md."""
    text = (REPO / "docs" / "tasks.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("```yaml\n")[1:]]


def test_the_docs_own_task_example_runs(tmp_path, monkeypatch, data_root, neox_tokenizer):
    """docs/tasks.md's YAML task and config entries, as written, load and score next to an oe-eval file."""
    task_yaml, entries = page_blocks("## Your own tasks")
    rows = [
        {"question": f"Which is a metal ({i})?", "choices": ["iron", "wood", "glass"], "answer": i % 3}
        for i in range(6)
    ]
    write(
        tmp_path / "my_tasks",
        {
            "science.yaml": task_yaml,
            "science.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
            "utils.py": "def process_docs(ds):\n    return ds.map(lambda d: {'question': d['question'].strip()})\n",
        },
    )
    monkeypatch.chdir(tmp_path)
    (doc,) = load_docs(get_task("harness:my_tasks/science.yaml"), data_root, limit=1)
    assert doc.contexts[0] == "Question: Which is a metal (0)?\nAnswer:"
    assert (doc.continuations, doc.gold) == (("iron", "wood", "glass"), (0,))
    evaluators = [dict(e, limit=6) for e in yaml.safe_load(entries)["evaluators"]]
    config = EvaluatorConfig(evaluators=evaluators, data_root=str(data_root), strict=True)
    out = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(pinned_model())
    for label in ("science", "my_science", "arc_easy_olmes"):
        assert out[f"eval/downstream/{label}/n_docs"] == 6, sorted(out)
    assert "eval/downstream/science/acc_mutual_info" in out


# ---- bounded templates, data files and messages that name the fix

LOCAL_YAML = """\
task: local
dataset_path: json
dataset_kwargs: {{data_files: {{validation: {files}}}{extra_kwargs}}}
output_type: multiple_choice
validation_split: validation
doc_to_text: {text}
doc_to_target: 0
doc_to_choice: ["yes", "no"]
{extra}"""


def local_task(
    folder: Path, *, text: str = '"{{q}}"', files: str = "rows.jsonl", extra: str = "", kwargs: str = ""
):
    write(folder, {"t.yaml": LOCAL_YAML.format(text=text, files=files, extra=extra, extra_kwargs=kwargs)})
    return get_task(f"harness:{folder / 't.yaml'}")


def with_rows(folder: Path, n: int = 3) -> Path:
    return write(folder, {"rows.jsonl": "".join(json.dumps({"q": f"q{i}?"}) + "\n" for i in range(n))})


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        # 9 ** (9 ** 5) computes at once, but the same rule refuses 9 ** (9 ** 9), which runs for minutes
        ("'{{ (9 ** (9 ** 5)) % 7 }}'", "9 ** 59049 would have about"),
        ("'{{ \"ab\" * 10 ** 6 }}'", "repeating a str of length 2 1000000 times"),
        (
            "'{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}{{q}}'",
            "more than 1000000 operations in one rendering",
        ),
    ],
)
def test_templates_that_would_compute_for_long_are_refused(tmp_path, data_root, template, fragment):
    task = local_task(with_rows(tmp_path), text=template)
    with pytest.raises(TaskDataError) as info:
        load_docs(task, data_root, limit=2)
    message = str(info.value)
    assert "doc 0: doc_to_text" in message and "template failed (TemplateBudgetError" in message
    assert template.strip("'")[:20] in message and fragment in message


def test_a_description_is_bounded_and_named_too(tmp_path, data_root):
    task = local_task(with_rows(tmp_path), extra="description: '{{ 9 ** 9999 }}'\n")
    with pytest.raises(TaskDataError) as info:
        load_docs(task, data_root)
    assert "description '{{ 9 ** 9999 }}': template failed (TemplateBudgetError: 9 ** 9999" in str(info.value)


def test_a_refused_template_fails_only_its_task(tmp_path, data_root, neox_tokenizer, caplog):
    """In the evaluator, the refused template is `failed = 1` for its task, with the template named."""
    task_yaml = with_rows(tmp_path) / "t.yaml"
    local_task(tmp_path, text="'{{ (9 ** (9 ** 9)) % 7 }}'")
    config = EvaluatorConfig(
        evaluators=[{"task": f"harness:{task_yaml}", "label": "slow"}, {"task": "copa", "limit": 4}],
        data_root=str(data_root),
    )
    out = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(pinned_model())
    assert out["eval/downstream/slow/failed"] == 1.0 and out["eval/downstream/copa/n_docs"] == 4
    assert "doc_to_text '{{ (9 ** (9 ** 9)) % 7 }}': template failed" in caplog.text


def test_the_templates_harness_tasks_use_still_render(tmp_path, data_root):
    template = (
        "'{% for c in choices %}{{ loop.index }}. {{ c.upper() }} {% endfor %}{{ 2 ** 10 }} {{ \"-\" * 3 }}'"
    )
    write(tmp_path, {"rows.jsonl": json.dumps({"q": "x", "choices": ["a", "b"]}) + "\n"})
    (doc,) = load_docs(local_task(tmp_path, text=template), data_root)
    assert doc.contexts[0] == "1. A 2. B 1024 ---"


def test_a_yaml_does_not_choose_where_datasets_writes(tmp_path, data_root, caplog):
    elsewhere = tmp_path / "elsewhere"
    task = local_task(with_rows(tmp_path / "t"), kwargs=f", cache_dir: {elsewhere}")
    assert len(load_docs(task, data_root)) == 3
    assert not elsewhere.exists()
    assert "dataset_kwargs.cache_dir ignored" in caplog.text


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"q": "fine"}\n{"q": "caf\xe9"}\n', "rows.jsonl line 2: not UTF-8 (byte 0xe9 at column 11)"),
        (b"", "rows.jsonl is empty; expected json rows"),
        (b"\n  \n", "rows.jsonl is empty; expected json rows"),
        (None, "rows.jsonl is a folder; expected a json file"),
    ],
)
def test_bad_local_data_files_are_named(tmp_path, data_root, content, fragment):
    data = tmp_path / "rows.jsonl"
    if content is None:
        data.mkdir()
    else:
        data.write_bytes(content)
    with pytest.raises(TaskDataError, match="task 'harness:.*t.yaml': data file /") as info:
        load_docs(local_task(tmp_path), data_root)
    assert fragment in str(info.value)


def test_a_folder_named_as_a_yaml_file(tmp_path):
    write(tmp_path, {"t.yaml": "include: base\ntask: t\n"})
    (tmp_path / "base").mkdir()
    with pytest.raises(
        ConfigError, match=r"harness YAML .*/base \(named by `include:` in .*t.yaml\) is a folder"
    ):
        get_task(f"harness:{tmp_path / 't.yaml'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="the folder .*/empty holds no .yaml files"):
        get_task(f"harness:{tmp_path / 'empty'}")


def test_a_function_given_as_a_path_names_the_file_it_points_at(tmp_path, data_root):
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').close()\ndef f(ds):\n    return ds\n"
    write(tmp_path / "outside", {"evil.py": evil})
    task = local_task(with_rows(tmp_path / "named"), extra="process_docs: !function ../outside/evil.f\n")
    with pytest.raises(ConfigError) as info:
        load_docs(task, data_root)
    expected = f"'../outside/evil.f' would run {tmp_path / 'outside' / 'evil.py'}, outside the task folder"
    assert expected in str(info.value) and not marker.exists()
    # A path inside the named folder is the file it names, as in the harness.
    write(tmp_path / "named" / "sub", {"helpers.py": "def f(ds):\n    return ds.select(range(2))\n"})
    task = local_task(tmp_path / "named", extra="process_docs: !function sub/helpers.f\n")
    assert len(load_docs(task, data_root)) == 2
