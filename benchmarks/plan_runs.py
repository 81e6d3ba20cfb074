"""The benchmark's runs: a small reference GPT per learning rate, trained on the demo's text and evaluated at
EVALUATIONS checkpoints on OLMo-core's `fast` labels and the held-out text's perplexity (`run_and_log`, outcomes
kept); its last weights and its held-out bits per byte on every held-out passage (the ground truth) kept beside."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval import InLoopEvaluator
from inloop_eval.data.root import neox_tokenizer_path
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.demo.run import load_passages, split_heldout, token_stream, train_step, write_heldout
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.measured import run_and_log
from inloop_eval.integrations.olmo_core.callback import task_set_ids
from inloop_eval.loggers import JSONLLogger
from inloop_eval.models.gpt import GPT, GPTConfig

TASK_SET = "fast"
# A factor whose direction is known at this length: each doubling trains faster.
LEARNING_RATES = (1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3, 3.2e-3)
EVALUATIONS = 8
# minerva_math_500's longest gold continuation is 1,346 tokens; a continuation is never truncated.
MAX_LENGTH = 2048
MODEL = GPTConfig(vocab_size=50304, d_model=64, n_layers=2, n_heads=2, max_seq_len=MAX_LENGTH)
HELDOUT_PASSAGES = 40
HELDOUT_SOURCES = ("coqa", "drop", "squad")
# Tokens of each held-out source the in-loop perplexity evaluator reads (the ground truth reads all of them).
PERPLEXITY_TOKENS = 512
CHECKPOINT = "model.pt"
DONE = "done.json"


def heldout_domains(cache: Path) -> list[dict[str, Any]]:
    """The `lm` domains of the held-out passages every run shares (`<cache>/heldout/<source>.jsonl`)."""
    return [
        {"label": s, "paths": [str(cache / "heldout" / f"{s}.jsonl")], "format": "jsonl"}
        for s in HELDOUT_SOURCES
    ]


def eval_config(limit: int, root: Path, cache: Path) -> EvaluatorConfig:
    """The runs' evaluation: every `fast` label at `limit` documents spread over its split, and the held-out
    text's perplexity on PERPLEXITY_TOKENS of each source."""
    tasks = [{"task": t, "limit": limit, "spread": True} for t in task_set_ids(TASK_SET)]
    perplexity = {
        "type": "lm",
        "seq_len": 128,
        "max_tokens": PERPLEXITY_TOKENS,
        "domains": heldout_domains(cache),
        "cache_dir": str(cache / "lm_cache"),
    }
    return EvaluatorConfig.from_dict(
        {
            "tokenizer": str(neox_tokenizer_path(root)),
            "data_root": str(root),
            "max_length": MAX_LENGTH,
            "eval_interval": 1,
            "evaluators": [*tasks, perplexity],
        }
    )


def heldout_config(root: Path, cache: Path) -> EvaluatorConfig:
    """The ground truth's evaluation: every held-out passage, no token cap."""
    return EvaluatorConfig.from_dict(
        {
            "tokenizer": str(neox_tokenizer_path(root)),
            "data_root": str(root),
            "evaluators": [
                {
                    "type": "lm",
                    "seq_len": 128,
                    "domains": heldout_domains(cache),
                    "cache_dir": str(cache / "lm_cache"),
                }
            ],
        }
    )


def checkpoint_steps(steps: int) -> list[int]:
    """The EVALUATIONS steps evaluated, evenly spaced, the last one included."""
    return sorted(set(np.linspace(steps // EVALUATIONS, steps, EVALUATIONS).astype(int).tolist()))


def build_run(run_dir: Path, lr: float, args: argparse.Namespace, root: Path) -> None:
    """Train one run, evaluating at its checkpoints; keep its last weights (CHECKPOINT) and its held-out bits
    per byte (DONE)."""
    cache = Path(args.cache)
    tokenizer = find_and_load_tokenizer(neox_tokenizer_path(root), root)
    passages, heldout = split_heldout(load_passages(root), HELDOUT_PASSAGES)
    write_heldout(cache, heldout)
    stream = token_stream(passages, tokenizer)
    torch.manual_seed(0)
    model = GPT(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps, eta_min=lr / 10)
    config = eval_config(args.limit, root, cache)
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    logger = JSONLLogger(run_dir)
    logger.log_config({"evaluation": config.to_dict(), "lr": lr})
    checkpoints = set(checkpoint_steps(args.steps))
    rng = np.random.default_rng(0)
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(stream) - 129, size=8)
        train_step(
            model, torch.from_numpy(np.stack([stream[s : s + 129] for s in starts])), optimizer, schedule
        )
        if step in checkpoints:
            metrics = run_and_log(evaluator, model, step, logger)
            print(f"lr {lr:g} step {step}: {metrics['eval/seconds']:.1f} s", flush=True)
    torch.save(model.state_dict(), run_dir / CHECKPOINT)
    truth = InLoopEvaluator(heldout_config(root, cache), tokenizer=tokenizer).run(model, step=args.steps)
    bpb = float(np.mean([v for k, v in truth.items() if k.endswith("/bpb")]))
    logger.finish()
    (run_dir / DONE).write_text(json.dumps({"lr": lr, "heldout_bpb": bpb, "step": args.steps}))
