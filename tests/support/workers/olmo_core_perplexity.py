"""OLMo-core's perplexity callback and this project's replacement, each in a real OLMo-core `Trainer` (the tiny
model of `olmo_core_train`), on the same small numpy validation files; in process or under torchrun:

    torchrun --nproc_per_node 2 tests/support/workers/olmo_core_perplexity.py --data-root DIR --work DIR --out DIR

Every rank writes `<out>/rank<r>.json`: {"theirs": logged, "ours": logged}, the metrics each run's trainer
handed its callbacks per step.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import olmo_core.distributed.parallel as olmo_core_parallel
import torch.distributed as dist
from olmo_core.data import NumpyPaddedFSLDatasetConfig, TokenizerConfig
from olmo_core.train.callbacks import LMEvaluatorCallbackConfig

from inloop_eval.integrations.olmo_core.callback import InLoopPerplexityCallbackConfig
from workers.olmo_core_train import SEQ_LEN, train

STEPS = 2
# label -> documents in each of its files (23 in all: not a whole number of eval batches at 1 or 2 ranks).
DOCUMENTS = {"c4_en-validation": [9, 4], "wiki-validation": [7], "code-validation": [3]}
TRAILING = 5  # tokens after the last EOS of the first file, which belong to no document


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
    # OLMo-core keeps one world mesh per process, built by the first DDP train module; the second run of this
    # process builds its own over the same ranks.
    olmo_core_parallel._WORLD_MESH = None
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    args.work.mkdir(parents=True, exist_ok=True)
    result = both_runs(args.work, args.data_root)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
