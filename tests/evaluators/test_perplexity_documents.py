"""Perplexity domains of format `documents` (OLMo-core's padded documents) on a tiny GPT: OLMo-core's CE loss
and PPL against an independent NumPy reference, their keys in both key styles, the sequences OLMo-core's
data loader reaches, and the errors for bad files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from lm_helpers import sequence_nll, tiny_gpt

from inloop_eval.errors import ConfigError, LMDataError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations.olmo_core.keys import is_olmo_core_key

SEQ_LEN = 32
EOS = 7


class IdsOnly:
    """A tokenizer that only names its EOS (token files need no encoding; no byte table: no bpb)."""

    eos_token_id = EOS
    bos_token_id = None

    def encode(self, text: str) -> list[int]:
        raise AssertionError("token files are never encoded")


def write_documents(path: Path, lengths: list[int], seed: int, trailing: int = 0) -> list[np.ndarray]:
    """A raw uint16 token file of documents of `lengths` tokens, each ending with EOS; the documents."""
    rng = np.random.default_rng(seed)
    docs = [np.append(rng.integers(8, 500, size=n - 1), EOS).astype(np.uint16) for n in lengths]
    np.concatenate([*docs, rng.integers(8, 500, size=trailing).astype(np.uint16)]).tofile(path)
    return docs


def olmo_reference(gpt, docs: list[np.ndarray]) -> dict[str, float]:
    """OLMo-core's LMEvaluator written from its definition: each document's first SEQ_LEN tokens, the mean of
    the loss at each of their positions, the last of which predicts nothing (0)."""
    sum_nll = sum(sequence_nll(gpt, d[:SEQ_LEN].astype(np.int64)) if len(d) > 1 else 0.0 for d in docs)
    ce = sum_nll / sum(min(len(d), SEQ_LEN) for d in docs)
    return {"olmo_ce_loss": ce, "olmo_ppl": math.exp(ce)}


VOCAB = 512


def model():  # noqa: ANN201
    return tiny_gpt(vocab_size=VOCAB)


def write_files(root: Path) -> dict[str, list[np.ndarray]]:
    """Label `a`: two files (documents of 1 to 80 tokens, some longer than SEQ_LEN, 3 tokens after the last
    EOS); label `b`: one file. The documents of each label, in order."""
    return {
        "a": write_documents(root / "a-0.npy", [5, 1, 80, 12], seed=0, trailing=3)
        + write_documents(root / "a-1.npy", [33, 2], seed=1),
        "b": write_documents(root / "b-0.npy", [40, 9, 31], seed=2),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict[str, list[np.ndarray]]]:
    root = tmp_path_factory.mktemp("documents")
    return root, write_files(root)


@pytest.fixture
def root(written) -> Path:
    return written[0]


@pytest.fixture
def files(written) -> dict[str, list[np.ndarray]]:
    return written[1]


def entry(root: Path, **overrides) -> dict:
    domains = [
        {"label": "a", "paths": [str(root / "a-0.npy"), str(root / "a-1.npy")], "format": "documents"},
        {"label": "b", "paths": [str(root / "b-0.npy")], "format": "documents", "eos_token_id": EOS},
    ]
    return {"type": "lm", "seq_len": SEQ_LEN, "batch_tokens": 3 * SEQ_LEN, "domains": domains, **overrides}


def evaluate(root: Path, key_style: str = "olmo_core", strict: bool = True, **overrides) -> dict[str, float]:
    config = EvaluatorConfig.from_dict(
        {"evaluators": [entry(root, **overrides)], "key_style": key_style, "strict": strict}
    )
    return InLoopEvaluator(config, tokenizer=IdsOnly()).run(model())


def test_olmo_core_figures_equal_the_reference_under_olmo_cores_keys(files, root):
    metrics = evaluate(root)
    for label, docs in files.items():
        expected = olmo_reference(model(), docs)
        assert math.isclose(metrics[f"eval/lm/{label}/CE loss"], expected["olmo_ce_loss"], rel_tol=1e-6)
        assert math.isclose(metrics[f"eval/lm/{label}/PPL"], expected["olmo_ppl"], rel_tol=1e-6)
        # our own figure beside it: Σ nll over the tokens predicted (one fewer per sequence)
        predicted = sum(min(len(d), SEQ_LEN) - 1 for d in docs)
        ce = expected["olmo_ce_loss"] * sum(min(len(d), SEQ_LEN) for d in docs) / predicted
        assert math.isclose(metrics[f"eval/lm/{label}/ce"], ce, rel_tol=1e-6)
    olmo_keys = sorted(k for k in metrics if is_olmo_core_key(k))
    assert olmo_keys == ["eval/lm/a/CE loss", "eval/lm/a/PPL", "eval/lm/b/CE loss", "eval/lm/b/PPL"]


def test_inloop_key_style_keeps_our_keys(root):
    metrics = evaluate(root, key_style="inloop")
    assert not any(is_olmo_core_key(k) for k in metrics)
    assert {"eval/lm/a/olmo_ce_loss", "eval/lm/a/olmo_ppl", "eval/lm/a/ce", "eval/lm/a/ppl"} <= metrics.keys()


def test_loader_keeps_the_sequences_olmo_cores_shuffled_loader_reaches(files, root):
    """9 documents, batches of 4: the 8 that the shuffle of epoch 1 (PCG64(seed + 1)) puts first, as
    OLMo-core's NumpyFSLDataLoader keeps them; `loader_max_batches` 1 keeps the first 4."""
    docs = files["a"] + files["b"]
    for max_batches, n_kept in ((None, 8), (1, 4)):
        order = np.arange(len(docs), dtype=np.uint32)
        np.random.Generator(np.random.PCG64(seed=3 + 1)).shuffle(order)
        kept = set(order[:n_kept].tolist())
        metrics = evaluate(root, loader_batch_instances=4, loader_seed=3, loader_max_batches=max_batches)
        for label, first in (("a", 0), ("b", len(files["a"]))):
            mine = [d for i, d in enumerate(docs) if i in kept and first <= i < first + len(files[label])]
            expected = olmo_reference(model(), mine)["olmo_ce_loss"] if mine else math.nan
            got = metrics[f"eval/lm/{label}/CE loss"]
            assert math.isclose(got, expected, rel_tol=1e-6) or (math.isnan(got) and math.isnan(expected))


def test_loader_selection_holds_while_another_label_is_retried(root, tmp_path):
    """A memmap label missing at the first evaluation and back at the second: it is scored then, and the
    `documents` labels keep the sequences the loader reached at the first (the same figures, up to the float
    rounding of other batch shapes)."""
    lm = entry(root, loader_batch_instances=4)
    lm["domains"].append({"label": "c", "paths": [str(tmp_path / "c.npy")]})
    config = EvaluatorConfig.from_dict({"evaluators": [lm], "key_style": "olmo_core"})
    evaluator = InLoopEvaluator(config, tokenizer=IdsOnly())
    first = evaluator.run(model())
    assert first["eval/lm/c/failed"] == 1.0
    np.arange(8, 8 + 2 * SEQ_LEN, dtype=np.uint16).tofile(tmp_path / "c.npy")
    second = evaluator.run(model())
    assert "eval/lm/c/failed" not in second and "eval/lm/c/ce" in second
    for key in ("eval/lm/a/CE loss", "eval/lm/b/CE loss"):
        assert math.isclose(second[key], first[key], rel_tol=1e-7)


def test_too_few_documents_for_one_loader_batch(root):
    with pytest.raises(
        LMDataError, match=r"their 9 documents are fewer than one global batch of 10 sequences"
    ):
        evaluate(root, loader_batch_instances=10)
    metrics = evaluate(root, strict=False, loader_batch_instances=10)
    assert metrics["eval/lm/a/failed"] == metrics["eval/lm/b/failed"] == 1.0


def test_loader_fields_are_checked(root):
    with pytest.raises(ConfigError, match="max_tokens cannot cap `documents` domains"):
        evaluate(root, loader_batch_instances=2, max_tokens=100)
    with pytest.raises(ConfigError, match="loader_max_batches applies with loader_batch_instances only"):
        evaluate(root, loader_max_batches=2)
    with pytest.raises(ConfigError, match="eos_token_id applies to format 'documents' only"):
        EvaluatorConfig.from_dict(
            {
                "evaluators": [
                    {"type": "lm", "domains": [{"label": "c", "paths": ["x.npy"], "eos_token_id": 3}]}
                ]
            }
        )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"label 'b': file .*b-0.npy does not exist"),
        (b"\x01\x00\x02", r"label 'b' file .*b-0.npy: 3 bytes is not a whole number of uint16 tokens"),
        (
            np.array([9, 10, 11], dtype=np.uint16).tobytes(),
            r"label 'b' file .*b-0.npy: expected documents each "
            r"ending with the EOS token 7 \(the padded documents' numpy format\), found 3 uint16 tokens and no EOS",
        ),
        (
            np.array([9, 999, EOS], dtype=np.uint16).tobytes(),
            r"label 'b' file .*b-0.npy document 0: token id 999 "
            r"is beyond the model's vocabulary of 512",
        ),
    ],
)
def test_bad_files_are_named(tmp_path, content, message):
    """With `strict` the error is raised, naming label and file; without, the label is `failed` and the
    other label still evaluated."""
    write_files(tmp_path)
    (tmp_path / "b-0.npy").unlink()
    if content is not None:
        (tmp_path / "b-0.npy").write_bytes(content)
    with pytest.raises(LMDataError, match=message):
        evaluate(tmp_path)
    metrics = evaluate(tmp_path, strict=False)
    assert metrics["eval/lm/b/failed"] == 1.0 and "eval/lm/a/CE loss" in metrics
