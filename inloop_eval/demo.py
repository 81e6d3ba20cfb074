"""The demo run: train the reference GPT on real English text, evaluating in the loop.

Text: the reading-comprehension passages (CoQA stories, DROP passages, SQuAD backgrounds) that the fetched
oe-eval request files carry; none of them is an evaluation task of the demo. Tokenizer: GPT-NeoX-20B.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval.config import ConfigError, EvaluatorConfig, build_dataclass
from inloop_eval.data import default_data_root
from inloop_eval.evaluator import InLoopEvaluator
from inloop_eval.fetch import fetch, neox_tokenizer_path, oe_eval_dir
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

# oe-eval request files and the field of their `doc` holding a passage.
CORPUS_FILES: tuple[tuple[str, str], ...] = (
    ("coqa/bpb_0shot/requests.jsonl.gz", "story"),
    ("drop/bpb_5shot/requests.jsonl.gz", "passage"),
    ("squad/bpb_5shot/requests.jsonl.gz", "query"),
)


@dataclass(kw_only=True)
class TrainConfig:
    """How the demo trains."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 16
    """Sequences per step."""
    seq_len: int = 128
    """Tokens per training sequence."""
    lr: float = 3e-3
    """AdamW learning rate (cosine decay to 10%)."""
    seed: int = 0
    """Seeds the model's initialisation and the order of training windows."""
    out_dir: str = "runs/demo"
    """Where the metrics JSONL goes."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, found {getattr(self, name)}")


@dataclass(kw_only=True)
class DemoConfig:
    """configs/demo.yaml: model shape, training, and the evaluator."""

    model: GPTConfig = field(default_factory=GPTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluation: EvaluatorConfig = field(default_factory=EvaluatorConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> DemoConfig:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls(
            model=build_dataclass(GPTConfig, data.get("model", {}), f"{path}: model"),
            train=build_dataclass(TrainConfig, data.get("train", {}), f"{path}: train"),
            evaluation=EvaluatorConfig.from_dict(data.get("evaluation", {})),
        )


def load_corpus(root: Path) -> list[str]:
    """Unique passages, in file order."""
    seen: dict[str, None] = {}
    for rel, key in CORPUS_FILES:
        with gzip.open(oe_eval_dir(root) / rel, "rt") as f:
            for line in f:
                text = str(json.loads(line)["doc"].get(key, "")).strip()
                if text:
                    seen.setdefault(text, None)
    return list(seen)


def token_stream(texts: list[str], tokenizer: Any) -> np.ndarray:
    """All passages tokenized and joined with EOS, as one int64 array."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoded in tokenizer.encode_batch(texts):
        ids.extend(encoded)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def train(config: DemoConfig, data_root: Path) -> list[dict[str, float]]:
    """Train, evaluating every `eval_interval` steps; returns the logged records."""
    tc = config.train
    tokenizer = load_tokenizer(config.evaluation.tokenizer or neox_tokenizer_path(data_root))
    stream = token_stream(load_corpus(data_root), tokenizer)
    log.info("training text: %d tokens", len(stream))
    torch.manual_seed(tc.seed)
    model = GPT(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, tc.steps, eta_min=tc.lr / 10)
    evaluation = config.evaluation
    evaluation.data_root = evaluation.data_root or str(data_root)
    evaluator = InLoopEvaluator(evaluation, tokenizer=tokenizer)
    rng = np.random.default_rng(tc.seed)
    out = Path(tc.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, float]] = []
    with (out / "metrics.jsonl").open("w") as log_file:
        for step in range(tc.steps + 1):
            if evaluator.should_run(step):
                start = time.perf_counter()
                record = {"step": float(step), **evaluator.run(model, step=step)}
                record["eval/seconds"] = time.perf_counter() - start
                records.append(record)
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
                print(summary(record), flush=True)
            if step == tc.steps:
                break
            starts = rng.integers(0, len(stream) - tc.seq_len - 1, size=tc.batch_size)
            batch = torch.from_numpy(np.stack([stream[s : s + tc.seq_len + 1] for s in starts]))
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            if step % 20 == 0:
                print(f"step {step:5d}  train loss {loss.item():.3f}", flush=True)
    return records


def summary(record: dict[str, float]) -> str:
    parts = [f"step {int(record['step']):5d}  eval"]
    for key, value in record.items():
        if key.endswith(("/acc", "/acc_norm")):
            parts.append(f"{key.removeprefix('eval/downstream/')}={value:.3f}")
    parts.append(f"({record['eval/seconds']:.1f}s)")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inloop-eval demo", description=__doc__)
    parser.add_argument(
        "--config", default=str(Path(__file__).resolve().parent.parent / "configs" / "demo.yaml")
    )
    parser.add_argument("--steps", type=int, help="override train.steps")
    parser.add_argument("--out", help="override train.out_dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = DemoConfig.from_yaml(args.config)
    if args.steps is not None:
        config.train.steps = args.steps
    if args.out:
        config.train.out_dir = args.out
    root = fetch(Path(config.evaluation.data_root) if config.evaluation.data_root else default_data_root())
    train(config, root)
    print(f"metrics: {Path(config.train.out_dir) / 'metrics.jsonl'}")
    return 0
