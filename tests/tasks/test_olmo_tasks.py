"""`olmo:<label>` against ai2-olmo-eval 0.9.0 itself: for the first documents of a spread of OLMo's labels,
our requests (context and continuation token ids, gold, doc and choice ids, the characters and bytes OLMo
normalises by, and the unconditional "domain conditional" requests) equal the samples OLMo's own task
builds, with the real GPT-NeoX tokenizer on the real data of the fetched data root.

OLMo's task classes read their package's copy of the data; here they read the same data root as ours
(its two loaders are pointed at it, and cut to the documents compared so that the test stays fast), so
that the comparison is of rendering and tokenization only.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from olmo_eval import metrics as olmo_metrics
from olmo_eval import tasks as olmo_tasks
from olmo_eval.tokenizer import HFTokenizer
from olmo_eval_data import olmo_eval_reads

from inloop_eval.cli import main
from inloop_eval.data.fetch import EXTRA_SPLITS
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.data.tokenizer import load_tokenizer
from inloop_eval.errors import UnknownTaskError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.olmo_core.keys import olmo_core_key
from inloop_eval.requests.cache import docs_digest
from inloop_eval.requests.table import build_requests
from inloop_eval.tasks import Doc, get_task, load_docs
from inloop_eval.tasks.olmo.formats import OWN_FORMATS
from inloop_eval.tasks.olmo.labels import MMLU_LABELS, OE_EVAL_LABELS, olmo_labels
from inloop_eval.tasks.olmo.mmlu import OLMO_CATEGORIES, OLMoMMLU, olmo_category_subjects
from inloop_eval.tasks.olmo.oe_eval import OLMoOEEvalTask
from inloop_eval.tasks.splits import standard_splits

transformers = importlib.import_module("transformers")

MAX_LENGTH = 2048  # OLMo's default model_ctx_len
N_DOCS = 8  # OLMo's `_var` MMLU labels render each question 7 times

# A spread of every kind of label: OLMo's own formats (all of them), its MMLU (zero-shot, `_var` on the
# validation and test splits, letter keys, `_fast`, the bpb variants including `_bpb_var`, which OLMo
# builds with the 5-shot prompt), and its oe-eval files (rc, mc, partial scoring, n-way, bpb over an rc
# file, gold-answer files whose labels are None, strings or lists, contexts with trailing whitespace).
OWN_LABELS = sorted(OWN_FORMATS)
MMLU_SPREAD = [
    "mmlu_humanities",
    "mmlu_stem_var",
    "mmlu_humanities_test_rc_var",
    "mmlu_other_mc_5shot_test",
    "mmlu_stem_val_mc_5shot_fast",
    "mmlu_social_sciences_val_bpb_var",
    "mmlu_other_var_bpb",
    "mmlu_stem_test_bpb_5shot",
]
OE_EVAL_SPREAD = [
    "arc_easy_rc_5shot",
    "arc_challenge_val_mc_5shot",
    "winogrande_rc_5shot",
    "hellaswag_rc_5shot_bpb",
    "csqa_val_mc_5shot_fast",
    "copycolors_10way",
    "boolq_mc_5shot_bpb",
    "medqa_en_rc_5shot",
    "gsm8k_gold_bpb_5shot",
    "codex_humaneval_gold_bpb_0shot",
    "naturalqs_bpb_5shot",
]


@pytest.fixture(scope="session")
def olmo_tokenizer(data_root: Path) -> HFTokenizer:
    """OLMo's tokenizer wrapper over the same GPT-NeoX file (EOS 0, no BOS), as OLMo-core builds it."""
    return HFTokenizer(str(neox_tokenizer_path(data_root)), eos_token_id=0, pad_token_id=1)


@pytest.fixture
def olmo_reads_data_root(data_root: Path) -> Iterator[None]:
    """Point OLMo's data loaders at our data root, keeping the first N_DOCS documents (OLMo's dev splits
    whole, for its few-shot prompts), as the OLMo-core benchmark does."""
    with olmo_eval_reads(data_root, N_DOCS):
        yield


def olmo_requests(label: str, tokenizer: HFTokenizer, max_length: int = MAX_LENGTH) -> list[tuple]:
    """OLMo's samples of its first N_DOCS documents as (doc_id, cont_id, context ids, continuation ids,
    is gold, domain-conditional ids, cont_str_len, cont_byte_len), sorted."""
    task = olmo_tasks.build_task(label, tokenizer, model_ctx_len=max_length)
    out = []
    for s in task.samples:
        if s["doc_id"] >= N_DOCS:
            continue
        context = tuple(s["query"][: s["ctx_len"]])
        dc = tuple(s["dc_query"][: s["dc_len"]])
        if s.get("fast_mc"):  # one sample per document; each choice is one token scored after the context
            for cont_id, token in enumerate(s["choices"]):
                out.append(
                    (s["doc_id"], cont_id, context, (token,), cont_id == s["label_id"], dc, None, None)
                )
            continue
        is_gold = s["cont_id"] == s["label_id"]
        lengths = (s["cont_str_len"], s["cont_byte_len"])
        out.append((s["doc_id"], s["cont_id"], context, tuple(s["continuation"]), is_gold, dc, *lengths))
    return sorted(out)


def our_requests(
    label: str, tokenizer: Any, data_root: Path, *, fast: bool = False, max_length: int = MAX_LENGTH
) -> list[tuple]:
    """Our requests of the first N_DOCS documents, in the shape of `olmo_requests`."""
    task = get_task(f"olmo:{label}")
    docs = load_docs(task, data_root, limit=N_DOCS)
    assert [d.index for d in docs] == list(range(N_DOCS))
    table = build_requests(task, docs, tokenizer, max_length, with_uncond=True)
    out = []
    for r in range(len(table)):
        u = table.uncond_id[r]
        assert tuple(table.uncond.continuation(u)) == tuple(table.pairs.continuation(r))
        lengths = (None, None) if fast else (int(table.n_chars[r]), int(table.n_bytes[r]))
        out.append(
            (
                int(table.doc_id[r]),
                int(table.cont_id[r]),
                tuple(int(t) for t in table.pairs.context(r)),
                tuple(int(t) for t in table.pairs.continuation(r)),
                bool(table.is_gold[r]),
                tuple(int(t) for t in table.uncond.context(u)),
                *lengths,
            )
        )
    return sorted(out)


@pytest.mark.parametrize("label", OWN_LABELS + MMLU_SPREAD + OE_EVAL_SPREAD)
def test_requests_equal_olmo_eval(
    label: str, data_root: Path, neox_tokenizer: Any, olmo_tokenizer: HFTokenizer, olmo_reads_data_root: None
) -> None:
    expected = olmo_requests(label, olmo_tokenizer)
    fast = label.endswith("_fast")
    assert {r[0] for r in expected} == set(range(N_DOCS))
    assert our_requests(label, neox_tokenizer, data_root, fast=fast) == expected


@pytest.mark.parametrize("label", ["hellaswag", "winogrande", "mmlu_stem_mc_5shot", "arc_easy_rc_5shot"])
def test_requests_equal_olmo_eval_with_bos(data_root: Path, olmo_reads_data_root: None, label: str) -> None:
    """A tokenizer with BOS: OLMo puts it before every context and never before a domain conditional."""
    path = neox_tokenizer_path(data_root)
    ours = load_tokenizer(path, bos_token="<|endoftext|>")
    assert ours.bos_token_id == 0
    olmo = HFTokenizer(str(path), eos_token_id=0, pad_token_id=1, bos_token_id=0)
    expected = olmo_requests(label, olmo)
    assert all(r[2][0] == 0 and r[5][0] != 0 for r in expected)
    assert our_requests(label, ours, data_root) == expected


@pytest.mark.parametrize("label", ["arc_easy_rc_5shot", "mmlu_stem_mc_5shot", "hellaswag"])
def test_truncated_contexts_equal_olmo_eval(
    label: str, data_root: Path, neox_tokenizer: Any, olmo_tokenizer: HFTokenizer, olmo_reads_data_root: None
) -> None:
    """A model context of 48 tokens: OLMo keeps the last tokens of context + continuation[:-1]."""
    expected = olmo_requests(label, olmo_tokenizer, max_length=48)
    assert any(len(r[2]) + len(r[3]) - 1 == 48 for r in expected)  # some were cut
    assert our_requests(label, neox_tokenizer, data_root, max_length=48) == expected


def _olmo_spec(label: str) -> tuple[type, dict[str, Any]]:
    """OLMo's class of a label and its arguments, its class's defaults filled in."""
    entry = olmo_tasks.LABEL_TO_TASK_MAP[label]
    cls, kwargs = entry if isinstance(entry, tuple) else (entry, {})
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return cls, {**defaults, **kwargs}


def test_every_olmo_label_resolves_with_olmos_settings() -> None:
    assert sorted(olmo_tasks.LABEL_TO_TASK_MAP) == olmo_labels()
    assert len(olmo_labels()) == 252
    assert (len(OWN_FORMATS), len(MMLU_LABELS), len(OE_EVAL_LABELS)) == (19, 75, 158)
    for label in olmo_labels():
        cls, spec = _olmo_spec(label)
        task = get_task(f"olmo:{label}")
        assert task.name == f"olmo:{label}"
        assert task.olmo_metric_type == (spec.get("metric_type") or cls.metric_type), label
        assert task.pair_encoding == "olmo"
        gold_only = task.olmo_metric_type in ("ce_loss", "bpb")
        assert (task.prompt_format == "gold") == gold_only, label
        if cls is olmo_tasks.OEEvalTask:
            assert (task.task_dir, task.variant, task.fast_mc) == (
                spec["dataset_path"],
                spec["dataset_name"],
                spec["fast_mc"],
            ), label
        elif cls is olmo_tasks.MMLU:
            assert (task.split, task.prompt_variations, task.mc_labels, task.fast_mc) == (
                spec["split"],
                spec["prompt_variations"],
                spec["mc_labels"],
                spec.get("fast_mc", False),
            ), label
            assert task.dataset_name == olmo_mmlu_subjects(spec["dataset_name"]), label
        else:
            assert type(task) is OWN_FORMATS[label]
            assert (task.dataset_path, task.dataset_name, task.split) == (
                spec["dataset_path"],
                spec["dataset_name"],
                spec.get("split", "validation"),
            ), label


def olmo_mmlu_subjects(category: str) -> tuple[str, ...]:
    """OLMo's subjects of a category, in its order (its `MMLU.__init__` loop)."""
    return tuple(
        name
        for sub in olmo_tasks.MMLU._categories[category]
        for name, cats in olmo_tasks.MMLU._subcategories.items()
        if sub in cats
    )


def test_mmlu_categories_follow_olmos_subject_order() -> None:
    for category in OLMO_CATEGORIES:
        assert olmo_category_subjects(category) == olmo_mmlu_subjects(category)
    assert sum(len(olmo_category_subjects(c)) for c in OLMO_CATEGORIES) == 57


def test_unknown_olmo_label_names_the_closest() -> None:
    with pytest.raises(UnknownTaskError, match=r"olmo:hellaswag_rc_5shot\b"):
        get_task("olmo:hellaswag_rc_5shoot")


def test_cli_lists_every_olmo_label(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("olmo:")}
    assert listed == {f"olmo:{label}" for label in olmo_labels()}


def test_oe_eval_reads_a_config_whose_uncond_offset_is_null(data_root: Path) -> None:
    """boolq's oe-eval configs hold `"uncond_docid_offset": null` (reading them raised a TypeError)."""
    docs = load_docs(get_task("oe_eval:boolq:mc_5shot"), data_root, limit=3)
    assert [(d.index, d.n_choices) for d in docs] == [(0, 2), (1, 2), (2, 2)]


def test_request_cache_key_covers_pair_encoding_and_document_uncond_contexts() -> None:
    """Documents that differ only in their unconditional contexts, or tasks only in their pair encoding,
    tokenize differently, so their cached request tables must not be shared."""
    task = get_task("olmo:hellaswag")
    doc = Doc(
        0, ("A man is sitting on a roof. He",), ("starts pulling up roofing.",), (0,), uncond_contexts=("He",)
    )
    other = dataclasses.replace(doc, uncond_contexts=("roof. He",))
    assert docs_digest(task, [doc]) != docs_digest(task, [other])
    harness = get_task("olmo:hellaswag")
    harness.pair_encoding = "harness"
    assert docs_digest(task, [doc]) != docs_digest(harness, [doc])


def test_fetch_list_holds_every_split_olmo_labels_read() -> None:
    fetched = set(standard_splits()) | set(EXTRA_SPLITS)
    for label in olmo_labels():
        task = get_task(f"olmo:{label}")
        if isinstance(task, OLMoOEEvalTask):
            continue  # oe-eval request files, unpacked from the wheel as a whole
        few_shot = isinstance(task, OLMoMMLU) and task.prompt_variations is not None
        splits = [task.split, "dev"] if few_shot else [task.split]
        for subset in task.subsets():
            for split in splits:
                assert (task.dataset_path, subset, split) in fetched, (label, subset, split)


def test_loglikelihoods_equal_olmo_evals_forward(
    hf_model_dir: Path,
    data_root: Path,
    olmo_tokenizer: HFTokenizer,
    olmo_reads_data_root: None,
    tmp_path: Path,
) -> None:
    """End to end: `inloop-eval evaluate --samples` on a tiny random GPT-NeoX scores each request of
    `olmo:` labels as OLMo-core does (its batch from OLMo's `collate_fn`, one forward, `ICLMetric.update`'s
    sum of log-probabilities), to 1e-5 relative."""
    labels = ["arc_easy_rc_5shot", "hellaswag", "mmlu_stem_var"]
    samples = tmp_path / "samples.jsonl"
    cmd = [sys.executable, "-m", "inloop_eval.cli", "evaluate", "--model", str(hf_model_dir), "--strict"]
    cmd += ["--tasks", ",".join(f"olmo:{label}" for label in labels), "--limit", str(N_DOCS)]
    cmd += ["--data-root", str(data_root), "--samples", str(samples), "--batch-tokens", "2048"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ours = {(s["task"], s["doc_id"], s["cont_id"]): s["ll"] for s in map(json.loads, samples.open())}

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_model_dir).eval()
    max_length = model.config.max_position_embeddings
    expected = {}
    for label in labels:
        task = olmo_tasks.build_task(label, olmo_tokenizer, model_ctx_len=max_length)
        batch = task.collate_fn([s for s in task.samples if s["doc_id"] < N_DOCS])
        with torch.no_grad():
            logits = model(batch["input_ids"]).logits
        for i, (doc_id, cont_id) in enumerate(
            zip(batch["doc_id"].tolist(), batch["cont_id"].tolist(), strict=True)
        ):
            start, n = int(batch["ctx_len"][i]) - 1, int(batch["cont_len"][i])
            cont = batch["continuation"][i][:n]
            expected[(f"olmo:{label}", doc_id, cont_id)] = -float(
                F.cross_entropy(logits[i, start : start + n], cont, reduction="sum")
            )
    assert ours.keys() == expected.keys()
    for key, ll in expected.items():
        assert ours[key] == pytest.approx(ll, rel=1e-5), key


# One label per OLMo metric type that OLMo's map uses: acc, len_norm (own format, oe-eval file, MMLU
# variation), f1, ce_loss and bpb.
FIGURE_LABELS = (
    "piqa",
    "hellaswag",
    "arc_easy_rc_5shot",
    "mmlu_stem_var",
    "rte",
    "arc_easy_ppl",
    "mmlu_stem_bpb",
)


def test_olmo_figures_equal_olmo_evals_metric(
    hf_model_dir: Path,
    data_root: Path,
    neox_tokenizer: Any,
    olmo_tokenizer: HFTokenizer,
    olmo_reads_data_root: None,
) -> None:
    """Every figure OLMo-core's downstream evaluator would log for an `olmo:` label (ai2-olmo-eval's own
    `ICLMetric(metric_type)` over OLMo's batch and the same model's logits) equals the figure our evaluator
    reports under OLMo-core's key (`key_style: olmo_core`): accuracies and F1 exactly, CE / BPB / soft
    figures to 1e-5 (our loglikelihood sums are float64, OLMo's float32)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_model_dir).eval()
    entries = [{"task": f"olmo:{label}", "limit": N_DOCS, "batch_tokens": 4096} for label in FIGURE_LABELS]
    config = EvaluatorConfig(evaluators=entries, data_root=str(data_root), strict=True, key_style="olmo_core")
    ours = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)

    max_length = model.config.max_position_embeddings
    for label in FIGURE_LABELS:
        task = olmo_tasks.build_task(label, olmo_tokenizer, model_ctx_len=max_length)
        assert task.metric_type == get_task(f"olmo:{label}").olmo_metric_type
        metric = olmo_metrics.ICLMetric(metric_type=task.metric_type)
        batch = task.collate_fn([s for s in task.samples if s["doc_id"] < N_DOCS])
        with torch.no_grad():
            metric.update(batch, model(batch["input_ids"]).logits)
        expected = {olmo_core_key(label, k): float(v) for k, v in metric.compute().items()}
        assert expected, label
        for key, value in expected.items():
            exact = "accuracy" in key or "F1" in key
            assert ours[key] == (value if exact else pytest.approx(value, rel=1e-5, abs=1e-6)), key
        # Our own figures stay beside OLMo's, under our keys.
        assert f"eval/downstream/olmo:{label}/n_docs" in ours
    assert not any(k.startswith("eval/downstream/olmo:") and "(" in k for k in ours)


def test_key_style_inloop_keeps_olmo_figures_under_our_keys(
    hf_model_dir: Path, data_root: Path, neox_tokenizer: Any
) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_model_dir).eval()
    config = EvaluatorConfig(
        evaluators=[{"task": "olmo:piqa", "label": "piqa_olmo", "limit": 4}], data_root=str(data_root)
    )
    ours = InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)
    assert {"eval/downstream/piqa_olmo/len_norm_v1", "eval/downstream/piqa_olmo/soft_log_v2"} <= set(ours)
    assert "eval/downstream/piqa_olmo/acc" in ours and not any("(" in k for k in ours)
