"""OLMo-core's perplexity callback and this project's replacement, each in a real OLMo-core `Trainer` (the tiny
model of `olmo_core_train`), on the same small numpy validation files; in process or under torchrun
(tests/support/workers/olmo_core_ranks.py). `both_runs` returns {"theirs": logged, "ours": logged, "scored":
...}: the metrics each run's trainer handed its callbacks per step, and the documents ours scored per label.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from olmo_core.data import NumpyPaddedFSLDatasetConfig, TokenizerConfig
from olmo_core.train.callbacks import LMEvaluatorCallbackConfig

from inloop_eval.integrations.olmo_core.callback import InLoopPerplexityCallbackConfig
from inloop_eval.integrations.olmo_core.keys import is_olmo_core_key
from workers.olmo_core_train import SEQ_LEN, fresh_world_mesh, train

STEPS = 2
# label -> documents in each of its files (23 in all: not a whole number of eval batches at 1 or 2 ranks).
DOCUMENTS = {"c4_en-validation": [9, 4], "wiki-validation": [7], "code-validation": [3]}
TRAILING = 5  # tokens after the last EOS of the first file, which belong to no document
N_DOCUMENTS = sum(n for files in DOCUMENTS.values() for n in files)
EVAL_STEPS = ("0", "2")  # eval_on_startup and every STEPS


def olmo_core_figures(logged: dict[str, float]) -> dict[str, float]:
    """The perplexity figures under OLMo-core's keys."""
    return {k: v for k, v in logged.items() if k.startswith("eval/lm/") and is_olmo_core_key(k)}


def assert_ours_equal_theirs(result: dict[str, Any]) -> None:
    """At every evaluated step, OLMo-core's keys of all three labels, with its values (1e-5 relative)."""
    for step in EVAL_STEPS:
        theirs, ours = olmo_core_figures(result["theirs"][step]), olmo_core_figures(result["ours"][step])
        assert len(theirs) == 2 * len(DOCUMENTS) and ours.keys() == theirs.keys(), step
        for key, value in theirs.items():
            assert math.isclose(ours[key], value, rel_tol=1e-5), (step, key, ours[key], value)


def document_files(folder: Path) -> list[tuple[Path, str]]:
    """The validation files, in the dataset's order, with their labels."""
    return [
        (folder / f"{label}-{f}.npy", label) for label, files in DOCUMENTS.items() for f in range(len(files))
    ]


def write_documents(folder: Path, tokenizer: TokenizerConfig) -> None:
    """Raw token files as OLMo's numpy datasets hold them (`tofile`, the dataset's dtype), each document
    ending with EOS, of seeded lengths from 1 token to 3 x SEQ_LEN, one of them the EOS alone."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tokenizer.padded_vocab_size() < 2**16 else np.uint32
    rng = np.random.default_rng(7)
    counts = [n for files in DOCUMENTS.values() for n in files]
    for (path, _), n_docs in zip(document_files(folder), counts, strict=True):
        docs = [np.array([tokenizer.eos_token_id])]
        for length in rng.integers(1, 3 * SEQ_LEN, size=n_docs - 1):
            docs.append(
                np.append(rng.integers(2, tokenizer.eos_token_id, size=length - 1), tokenizer.eos_token_id)
            )
        if path == document_files(folder)[0][0]:
            docs.append(rng.integers(2, tokenizer.eos_token_id, size=TRAILING))
        np.concatenate(docs).astype(dtype).tofile(path)


def olmo_core_config(work: Path, tokenizer: TokenizerConfig, **fields: Any) -> LMEvaluatorCallbackConfig:
    """OLMo-core's perplexity callback config on the files of `write_documents` (written by the caller)."""
    files = document_files(work / "ppl")
    dataset = NumpyPaddedFSLDatasetConfig(
        paths=[str(path) for path, _ in files],
        metadata=[{"label": label} for _, label in files],
        sequence_length=SEQ_LEN,
        tokenizer=tokenizer,
        work_dir=str(work / "ppl-cache"),
    )
    return LMEvaluatorCallbackConfig(
        eval_dataset=dataset, eval_interval=STEPS, eval_on_startup=True, **fields
    )


def both_runs(work: Path, data_root: Path) -> dict[str, Any]:
    """OLMo-core's callback in one run and ours (`from_olmo_core` of the same config) in another, both
    evaluating at startup and after step 2; what each trainer logged."""
    tokenizer = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_documents(work / "ppl", tokenizer)
    if dist.is_initialized():
        dist.barrier()
    theirs_config = olmo_core_config(work, tokenizer)
    ours_config = InLoopPerplexityCallbackConfig.from_olmo_core(theirs_config, data_root=str(data_root))
    theirs, _ = train(
        work / "theirs",
        data_root,
        with_callback=False,
        steps=STEPS,
        extra_callbacks={"lm_evaluator": theirs_config},
    )
    fresh_world_mesh()
    ours, trainer = train(
        work / "ours",
        data_root,
        with_callback=False,
        steps=STEPS,
        extra_callbacks={"lm_evaluator": ours_config},
    )
    outputs = trainer.callbacks["lm_evaluator"].evaluator.last_outputs.values()
    scored = {d.label: len(d) for output in outputs for d in output.detail.domains}
    return {"theirs": theirs["logged"], "ours": ours["logged"], "scored": scored}
