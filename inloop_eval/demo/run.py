"""The demo run: train the reference GPT on real English text, evaluating in the loop, then write the report.

Text: the reading-comprehension passages (CoQA stories, DROP passages, SQuAD backgrounds) that the fetched
oe-eval request files carry; none of them is an evaluation task of the demo. The last `heldout_passages` of
each source are kept out of training and written to `<out_dir>/heldout/<source>.jsonl`, the perplexity
domains of the `lm` evaluator in demo.yaml (beside this module, shipped in the wheel). Tokenizer: GPT-NeoX-20B.

Runs under `torchrun` with any number of processes (DDP; gloo on CPU, NCCL on GPUs), one by default.
Rank 0 logs to W&B (offline unless `$WANDB_MODE` or the config says otherwise) and to
`<out_dir>/metrics.jsonl`, and writes `<out_dir>/report/index.html` at the end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from inloop_eval.config_fields import build_dataclass
from inloop_eval.data.fetch import fetch
from inloop_eval.data.files import write_text_atomically
from inloop_eval.data.root import default_data_root, neox_tokenizer_path, oe_eval_dir
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.distributed import init_from_env, world
from inloop_eval.errors import ConfigError, InLoopEvalError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.measured import run_and_log
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.keys import DOWNSTREAM, PERPLEXITY, SECONDS_KEY, TOKENS_KEY, TRAIN_LOSS_KEY, split_key
from inloop_eval.loggers import JSONLLogger, MetricsLogger, MultiLogger, WandbLogger, is_rank_zero
from inloop_eval.loggers.progress import EvaluationProgress, TrainingProgress
from inloop_eval.models.gpt import GPT, GPTConfig
from inloop_eval.report import write_report
from inloop_eval.tasks.splits import standard_splits

log = logging.getLogger(__name__)

# Package data (pyproject.toml), so that `inloop-eval demo` runs from an installed wheel; a checkout also has
# it as configs/demo.yaml (a link to this file).
DEFAULT_CONFIG = Path(__file__).resolve().with_name("demo.yaml")
HELDOUT_DIR = "heldout"
# torch.manual_seed takes an unsigned 64-bit seed; NumPy's generator takes none below 0.
MAX_SEED = 2**64 - 1

# Source name -> oe-eval request file and the field of its `doc` holding a passage.
CORPUS_FILES: dict[str, tuple[str, str]] = {
    "coqa": ("coqa/bpb_0shot/requests.jsonl.gz", "story"),
    "drop": ("drop/bpb_5shot/requests.jsonl.gz", "passage"),
    "squad": ("squad/bpb_5shot/requests.jsonl.gz", "query"),
}


@dataclass(kw_only=True)
class TrainConfig:
    """How the demo trains."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 16
    """Sequences per step over all processes (each of N processes takes batch_size / N)."""
    seq_len: int = 128
    """Tokens per training sequence."""
    lr: float = 3e-3
    """AdamW learning rate (cosine decay to 10%)."""
    seed: int = 0
    """Seeds the model's initialisation and the order of training windows (0 to 2**64 - 1, as torch takes)."""
    heldout_passages: int = 40
    """Passages of each source kept out of training: the perplexity domains (0: none held out)."""
    log_every: int = 20
    """Log the training loss every this many steps."""
    out_dir: str = "runs/demo"
    """The run directory: metrics.jsonl, config.json, wandb/, heldout/, report/."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, found {getattr(self, name)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"train.seed must be a whole number from 0 to 2**64 - 1, found {self.seed}")
        if self.heldout_passages < 0:
            raise ConfigError(f"train.heldout_passages must be >= 0, found {self.heldout_passages}")


@dataclass(kw_only=True)
class LoggingConfig:
    """Where the demo's figures go (rank 0 only)."""

    wandb: bool = True
    """Log to a W&B run in `<out_dir>/wandb/`."""
    wandb_mode: str | None = None
    """`offline`, `online` or `disabled`; null: `$WANDB_MODE`, else `offline` (no account needed)."""
    wandb_project: str = "inloop-eval-demo"
    """W&B project (used when the run is synced or online)."""
    report: bool = True
    """Write `<out_dir>/report/index.html` at the end (needs matplotlib: `pip install 'inloop_eval[report]'`)."""


@dataclass(kw_only=True)
class DemoConfig:
    """The demo's YAML (`DEFAULT_CONFIG`, or a copy of it): model shape, training, logging, and the evaluator."""

    model: GPTConfig = field(default_factory=GPTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    evaluation: EvaluatorConfig = field(default_factory=EvaluatorConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> DemoConfig:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"demo config {path} does not exist") from None
        unknown = sorted(set(data) - {"model", "train", "logging", "evaluation"})
        if unknown:
            raise ConfigError(f"{path}: unknown sections {unknown}; known: model, train, logging, evaluation")
        return cls(
            model=build_dataclass(GPTConfig, data.get("model", {}), f"{path}: model"),
            train=build_dataclass(TrainConfig, data.get("train", {}), f"{path}: train"),
            logging=build_dataclass(LoggingConfig, data.get("logging", {}), f"{path}: logging"),
            evaluation=EvaluatorConfig.from_dict(data.get("evaluation", {})),
        )


def load_passages(root: Path) -> dict[str, list[str]]:
    """Unique passages of each source, in file order (a passage in two sources counts for the first)."""
    seen: set[str] = set()
    out: dict[str, list[str]] = {}
    for source, (rel, key) in CORPUS_FILES.items():
        out[source] = []
        with gzip.open(oe_eval_dir(root) / rel, "rt") as f:
            for line in f:
                text = str(json.loads(line)["doc"].get(key, "")).strip()
                if text and text not in seen:
                    seen.add(text)
                    out[source].append(text)
    return out


def split_heldout(passages: dict[str, list[str]], n: int) -> tuple[list[str], dict[str, list[str]]]:
    """(training passages, held-out passages per source): the last `n` of each source are held out."""
    train: list[str] = []
    heldout: dict[str, list[str]] = {}
    for source, texts in passages.items():
        cut = max(0, len(texts) - n)
        train.extend(texts[:cut])
        if n:
            heldout[source] = texts[cut:]
    return train, heldout


def write_heldout(out_dir: Path, heldout: dict[str, list[str]]) -> None:
    """`<out_dir>/heldout/<source>.jsonl`, rewritten only when the content changed (the lm cache keys on
    the file's modification time)."""
    directory = out_dir / HELDOUT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    for source, texts in heldout.items():
        path = directory / f"{source}.jsonl"
        content = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
        if not path.is_file() or path.read_text(encoding="utf-8") != content:
            write_text_atomically(path, content)


def resolve_run_paths(evaluation: EvaluatorConfig, out_dir: Path) -> None:
    """Relative `lm` domain paths and cache directories are inside the run directory."""
    for ev in evaluation.evaluators:
        if getattr(ev, "type", "") != "lm":
            continue
        if ev.cache_dir and not Path(ev.cache_dir).expanduser().is_absolute():
            ev.cache_dir = str(out_dir / ev.cache_dir)
        for domain in ev.domains:
            domain.paths = [
                p if Path(p).expanduser().is_absolute() else str(out_dir / p) for p in domain.paths
            ]


def token_stream(texts: list[str], tokenizer: Any) -> np.ndarray:
    """All passages tokenized and joined with EOS, as one int64 array."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoded in tokenizer.encode_batch(texts):
        ids.extend(encoded)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def barrier() -> None:
    if world()[0] > 1:
        dist.barrier()


def make_logger(config: DemoConfig, out_dir: Path) -> MetricsLogger:
    loggers: list[MetricsLogger] = [JSONLLogger(out_dir)]
    if config.logging.wandb:
        loggers.append(
            WandbLogger(
                project=config.logging.wandb_project,
                name=out_dir.name,
                dir=out_dir,
                mode=config.logging.wandb_mode,
                step_globs=("train/*",),
            )
        )
    logger = MultiLogger(loggers)
    logger.log_config({**asdict(config), "world_size": world()[0]})
    return logger


def train(config: DemoConfig, data_root: Path) -> list[dict[str, float]]:
    """Train, evaluating every `eval_interval` steps and logging; returns the evaluations' figures."""
    tc = config.train
    device = init_from_env()
    world_size, rank = world()
    if tc.batch_size % world_size:
        raise ConfigError(
            f"train.batch_size {tc.batch_size} must be divisible by the number of processes {world_size}"
        )
    out_dir = Path(tc.out_dir).absolute()
    tokenizer = find_and_load_tokenizer(
        config.evaluation.tokenizer or neox_tokenizer_path(data_root), data_root
    )
    passages, heldout = split_heldout(load_passages(data_root), tc.heldout_passages)
    if is_rank_zero():
        write_heldout(out_dir, heldout)
    barrier()
    stream = token_stream(passages, tokenizer)
    log.info("training text: %d passages, %d tokens; %d processes", len(passages), len(stream), world_size)

    torch.manual_seed(tc.seed)
    model = GPT(config.model).to(device)
    trained: torch.nn.Module = model
    if world_size > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, tc.steps, eta_min=tc.lr / 10)

    evaluation = config.evaluation
    evaluation.data_root = evaluation.data_root or str(data_root)
    resolve_run_paths(evaluation, out_dir)
    evaluator = InLoopEvaluator(evaluation, tokenizer=tokenizer)
    logger = make_logger(config, out_dir)
    rng = np.random.default_rng([tc.seed, rank])
    per_rank = tc.batch_size // world_size
    evaluations: list[dict[str, float]] = []
    training_progress = TrainingProgress(tc.steps, filter(evaluator.should_run, range(tc.steps + 1)))
    try:
        for step in range(tc.steps + 1):
            if evaluator.should_run(step):
                metrics, scoring_seconds = evaluate_step(evaluator, trained, step, logger)
                evaluations.append(metrics)
                training_progress.evaluated(metrics[SECONDS_KEY], scoring_seconds)
                if is_rank_zero():
                    print(summary(training_progress.step_text(step), metrics), flush=True)
            if step == tc.steps:
                break
            starts = rng.integers(0, len(stream) - tc.seq_len - 1, size=per_rank)
            batch = torch.from_numpy(np.stack([stream[s : s + tc.seq_len + 1] for s in starts])).to(device)
            loss = train_step(trained, batch, optimizer, schedule)
            if step % tc.log_every == 0:
                mean_loss = mean_over_ranks(loss.detach())
                logger.log({TRAIN_LOSS_KEY: mean_loss, "train/lr": schedule.get_last_lr()[0]}, step)
                if is_rank_zero():
                    print(training_progress.line(step, mean_loss), flush=True)
    finally:
        logger.finish()
    return evaluations


def train_step(
    model: torch.nn.Module,
    batch_BT: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
) -> torch.Tensor:
    """One step of next-token training on `batch_BT` (B rows of T tokens: the model reads the first T - 1 and
    is scored on the last T - 1), the optimizer's and the schedule's steps taken; the mean loss."""
    logits = model(batch_BT[:, :-1])
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch_BT[:, 1:].reshape(-1)
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return loss


def evaluate_step(
    evaluator: InLoopEvaluator, model: torch.nn.Module, step: int, logger: MetricsLogger
) -> tuple[dict[str, float], float]:
    """One in-loop evaluation, with a bar per evaluator on rank 0's terminal (the summary line follows): its
    figures, and the seconds it spent scoring (`EvaluationProgress.scoring_seconds`, for the ETA)."""
    progress = EvaluationProgress(len(evaluator.evaluators), enabled=is_rank_zero(), lines=False)
    try:
        metrics = run_and_log(evaluator, model, step, logger, progress=progress)
    finally:
        progress.close()
    return metrics, progress.scoring_seconds


def start_up_line(config: DemoConfig, root: Path) -> str:
    """What the demo is about to do, printed before its first slow step (the data, the first evaluation)."""
    tc, ev = config.train, config.evaluation
    tasks = [e.label for e in ev.evaluators if getattr(e, "type", "") != "lm"]
    domains = [d.label for e in ev.evaluators if getattr(e, "type", "") == "lm" for d in e.domains]
    return (
        f"demo: training the reference GPT (n_layers {config.model.n_layers}, d_model {config.model.d_model}, "
        f"seed {tc.seed}) for {tc.steps} steps on {os.environ.get('WORLD_SIZE', 1)} process(es), evaluating every "
        f"{ev.eval_interval} steps on {', '.join(tasks) or 'no tasks'}"
        + (f" and perplexity on {', '.join(domains)}" if domains else "")
        + f"; task data in {root} (fetched on first use); run directory {Path(tc.out_dir).absolute()}. "
        "The first evaluation also tokenizes the tasks and caches their requests."
    )


def mean_over_ranks(value: torch.Tensor) -> float:
    if world()[0] > 1:
        value = value.clone()
        dist.all_reduce(value)
        value /= world()[0]
    return float(value.item())


def summary(step_text: str, metrics: dict[str, float]) -> str:
    """An evaluation's line: `step_text` (`step  50/150`), then accuracies, perplexities, time and tokens."""
    parts = [f"{step_text}  eval"]
    for key, value in metrics.items():
        task, domain = split_key(key, DOWNSTREAM), split_key(key, PERPLEXITY)
        if task is not None and task[1] in ("acc", "acc_norm"):
            parts.append(f"{task[0]}/{task[1]}={value:.3f}")
        elif domain is not None and domain[1] == "ppl":
            parts.append(f"{domain[0]}/ppl={value:.0f}")
    parts.append(f"({metrics[SECONDS_KEY]:.1f}s, {metrics[TOKENS_KEY] / 1e3:.0f}k tokens)")
    return "  ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG),
        help="demo YAML (default: the demo.yaml shipped in the package, %(default)s)",
    )
    parser.add_argument("--steps", type=int, help="override train.steps")
    parser.add_argument("--out", help="override train.out_dir (the run directory)")
    parser.add_argument(
        "--seed",
        type=seed_number,
        help="override train.seed (the model's initialisation and the order of training windows)",
    )


def seed_number(text: str) -> int:
    """`--seed`'s value: a whole number from 0 to 2**64 - 1 (torch's seeds; a traceback past them)."""
    try:
        seed = int(text)
    except ValueError:
        seed = None
    if seed is None or not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(
            f"expected a seed, a whole number from 0 to 2**64 - 1, found {text!r}"
        )
    return seed


def run(args: argparse.Namespace) -> int:
    """Fetch the data if needed, train with in-loop evaluation, write the report; prints where it is."""
    started = time.perf_counter()
    # The demo prints a one-line summary of each evaluation; the evaluator's full dict is for debugging.
    logging.getLogger("inloop_eval.evaluators.orchestrator").setLevel(logging.WARNING)
    config = DemoConfig.from_yaml(args.config)
    if args.steps is not None:
        config.train.steps = args.steps
        config.train.__post_init__()
    if args.out:
        config.train.out_dir = args.out
    if args.seed is not None:
        config.train.seed = args.seed
    root = Path(config.evaluation.data_root) if config.evaluation.data_root else default_data_root()
    if is_rank_zero():
        print(start_up_line(config, root), flush=True)
    root = fetch(root, standard_splits())
    train(config, root)
    if is_rank_zero():
        out_dir = Path(config.train.out_dir).absolute()
        print(f"metrics: {out_dir / 'metrics.jsonl'}")
        if config.logging.report:
            print(f"report: {write_report(out_dir)}")
        print(f"demo finished in {time.perf_counter() - started:.0f}s")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train_demo.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except InLoopEvalError as exc:
        print(f"train_demo.py: error: {exc}", file=sys.stderr)
        return 2
