"""`inloop-eval evaluate`: a saved Hugging Face model evaluated on tasks, alone or under torchrun.

Its flags are declared in `evaluate_flags.py` (so that `inloop-eval evaluate --help` loads no torch); here the
command in phases, each a function: the config (built once, with the flags' overrides), its task ids checked,
the device checked, the output files checked writable before anything is evaluated, the tokenizer and the
model loaded, the evaluation with its progress per task (rank 0) through `run_and_log`, the path a
training loop takes (so the figures carry `eval/seconds` and `eval/tokens_forwarded`), then on rank 0 the
summary table, the files written and where they are.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from inloop_eval.checkpoints.formats import Checkpoint, CheckpointFormat
from inloop_eval.config_fields import read_config_file
from inloop_eval.data.files import write_text_atomically
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import all_reduce_max, init_from_env, usable_device, world
from inloop_eval.errors import ConfigError, InLoopEvalError, TokenizerError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.evaluators.measured import run_and_log
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.frameworks import frameworks
from inloop_eval.keys import failed_labels
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, step_path, write_step
from inloop_eval.loggers.progress import EvaluationProgress
from inloop_eval.loggers.summary import summary_table
from inloop_eval.tasks.registry import check_task_id


def run(args: argparse.Namespace) -> int:
    """The command: 0 when every evaluation gave its figures, 1 when any failed (each named)."""
    # The table shows the figures; the evaluator's own line per step is for a training loop's log.
    logging.getLogger("inloop_eval.evaluators.orchestrator").setLevel(logging.WARNING)
    init_from_env()
    rank = world()[1]
    evaluation = evaluate_saved_model(args)
    if dist.is_initialized():
        dist.destroy_process_group()
    if evaluation.not_written:
        raise InLoopEvalError(
            f"evaluate: {'; '.join(evaluation.not_written)} (the figures are printed above)"
        )
    return failure_status(evaluation.metrics, rank)


@dataclass
class SavedModelEvaluation:
    """One saved model evaluated: its figures (every rank's), the config they were evaluated with, and on
    rank 0 the files not written (a phrase per flag; [] when all were)."""

    metrics: dict[str, float]
    config: EvaluatorConfig
    not_written: list[str]


def evaluate_saved_model(args: argparse.Namespace) -> SavedModelEvaluation:
    """The model of `args.model` evaluated in the process group joined (if any), the summary table printed
    and the files asked for written on rank 0 (the module docstring's phases)."""
    world_size, rank = world()
    config = evaluate_config(args)
    check_task_ids(config)
    device = pick_device(args.device, world_size)
    outputs = output_paths(args)
    check_outputs_writable(outputs, rank)
    tokenizer = load_evaluate_tokenizer(config, args)
    model = load_saved_model(args.model, device)
    evaluator = InLoopEvaluator(config, tokenizer=tokenizer)
    progress = EvaluationProgress(len(evaluator.evaluators), enabled=rank == 0)
    try:
        metrics = run_and_log(evaluator, model, args.step or 0, progress=progress)
    finally:
        progress.close()
    samples = gather_samples(evaluator) if args.samples else None
    not_written: list[str] = []
    if rank == 0:
        # The figures first: a file that fails to write late (a full disk) must not lose them.
        print(summary_table(metrics), flush=True)
        not_written = write_outputs(args, outputs, metrics, config, samples, evaluator, world_size)
    return SavedModelEvaluation(metrics, config, not_written)


def evaluate_config(args: argparse.Namespace) -> EvaluatorConfig:
    """The config of `--config` (or none) with the command's overrides, built and checked once."""
    tasks = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    if not tasks and not args.config:
        raise ConfigError("evaluate: name tasks with --tasks a,b or a --config with evaluators")
    data = dict(read_config_file(args.config)) if args.config else {}
    entries = [{"task": t} for t in tasks] if tasks else data.get("evaluators")
    if isinstance(entries, list):
        data["evaluators"] = [entry_overrides(entry, args) for entry in entries]
    data.update(settings_overrides(args, data))
    return EvaluatorConfig.from_dict(data, args.config or "evaluate --tasks")


def check_task_ids(config: EvaluatorConfig) -> None:
    """UnknownTaskError (naming the closest ids) for a task id the registry does not know, before the model
    and the tokenizer are loaded: a typo costs nothing."""
    for entry in config.evaluators:
        if isinstance(entry, TaskEvalConfig):
            check_task_id(entry.task)


def load_evaluate_tokenizer(config: EvaluatorConfig, args: argparse.Namespace) -> TokenizerLike:
    """The config's tokenizer (--tokenizer's, else the config's, else --model's), loaded before the model;
    a --model directory without one is told to name it with --tokenizer."""
    try:
        return config.load_tokenizer()
    except TokenizerError as exc:
        if args.tokenizer or config.tokenizer != args.model:
            raise
        raise ConfigError(
            f"evaluate: --model {args.model} holds no tokenizer (no tokenizer.json there); name one with "
            "--tokenizer: a tokenizer.json, a Hugging Face tokenizer directory, or a repository fetched or in "
            f"the local Hugging Face hub cache (e.g. --tokenizer EleutherAI/gpt-neox-20b) [{exc}]"
        ) from None


def settings_overrides(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """The config's settings that the command's flags set (the tokenizer defaults to --model's)."""
    overrides = {
        "tokenizer": args.tokenizer or data.get("tokenizer") or args.model,
        "data_root": args.data_root,
        "max_length": args.max_length,
        "strict": True if args.strict else None,
        "outcomes": True if args.outcomes else None,
    }
    return {name: value for name, value in overrides.items() if value is not None}


def entry_overrides(entry: Any, args: argparse.Namespace) -> Any:
    """One `evaluators:` entry with --limit and --spread (tasks only) and --batch-tokens applied; an entry that
    is not a mapping is left for the config's own check to report."""
    if not isinstance(entry, dict):
        return entry
    entry = dict(entry)
    if entry.get("type", TaskEvalConfig.type) == TaskEvalConfig.type:
        if args.limit is not None:
            entry["limit"] = args.limit
        if args.spread:
            entry["spread"] = True
            if entry.get("limit") is None:
                raise ConfigError(
                    f"evaluate --spread: task {entry.get('task')!r} has no limit, and --spread spreads a limit's "
                    "documents over the split; add --limit N (or a `limit:` in the config)"
                )
    if args.batch_tokens is not None:
        entry["batch_tokens"] = args.batch_tokens
    return entry


def output_paths(args: argparse.Namespace) -> dict[str, Path]:
    """Each file the command will write, by the flag that names it (`--outcomes`: its step file)."""
    if args.step is not None and not args.outcomes:
        raise ConfigError(f"evaluate: --step {args.step} files outcomes under a step; add --outcomes DIR")
    outputs = {flag: Path(p) for flag, p in (("--output", args.output), ("--samples", args.samples)) if p}
    if args.outcomes:
        outputs["--outcomes"] = step_path(Path(args.outcomes) / OUTCOMES_DIR, args.step or 0)
    return outputs


def unwritable_outputs(outputs: dict[str, Path]) -> list[str]:
    """What stops each output file from being written, found by writing a temporary file beside it (its
    folder is made as `evaluate` would make it); [] when all can be."""
    problems = []
    for flag, path in outputs.items():
        if path.is_dir():
            fix = (
                "remove it (the step's file is written there) or choose another --outcomes DIR"
                if flag == "--outcomes"
                else f"name a file, e.g. {path / 'results.json'}"
            )
            problems.append(f"{flag} {path} is a directory; {fix}")
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=path.parent):
                pass
        except OSError as exc:
            problems.append(
                f"{flag} {path}: cannot write there ({exc.strerror or exc}); choose a writable path"
            )
    return problems


def check_outputs_writable(outputs: dict[str, Path], rank: int) -> None:
    """Before evaluating, so that a whole evaluation is never lost to a bad path: rank 0 (the one that
    writes) tries the output paths and every rank stops with it, none left waiting in a collective."""
    problems = unwritable_outputs(outputs) if rank == 0 else []
    if all_reduce_max(int(bool(problems))):
        raise ConfigError(
            "evaluate: " + "; ".join(problems)
            if problems
            else f"evaluate (rank {rank}): rank 0 cannot write the output files (see its error)"
        )


def pick_device(name: str | None, world_size: int) -> torch.device:
    """`--device` (ConfigError when this machine has no such device), else cuda when there is one (this
    rank's `LOCAL_RANK` GPU under torchrun), else cpu."""
    device = (
        usable_device(name, "evaluate: --device")
        if name
        else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device.type == "cuda" and world_size > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return device


def saved_model_format(path: str, flag: str = "evaluate: --model") -> CheckpointFormat:
    """The checkpoint format of the first framework that loads saved models (`Framework.saved_models`) and
    finds every file of one at `path`; ConfigError naming `flag`, `path` and what each format lacks there."""
    formats = [p.checkpoint_format() for p in frameworks() if p.saved_models]
    titles = ", ".join(fmt.title for fmt in formats)
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path!r} is not a directory holding a saved model ({titles})")
    lacking = []
    for fmt in formats:
        missing = fmt.missing(folder, needs_config=True)
        if missing is None:
            return fmt
        lacking.append(f"{fmt.title}: {missing}")
    raise ConfigError(f"{flag} {path!r} holds no saved model ({'; '.join(lacking)})")


def load_saved_model(path: str, device: torch.device) -> Any:
    """The saved model at `path` on `device`, in eval mode, loaded by its format (`saved_model_format`)."""
    fmt = saved_model_format(path)
    return fmt.load(Checkpoint(step=0, path=Path(path), format=fmt.name), None).to(device).eval()


def gather_samples(evaluator: InLoopEvaluator) -> list[dict[str, Any]] | None:
    """Every rank's per-request records (`InLoopEvaluator.samples`), gathered on rank 0 (None on the other
    ranks) and deduplicated by (task, doc_id, cont_id): a document padded onto two ranks counts once."""
    local = evaluator.samples()
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
        dist.gather_object(local, gathered if dist.get_rank() == 0 else None, dst=0)
        if dist.get_rank() != 0:
            return None
        local = [r for part in gathered for r in part]
    unique = {(r["task"], r["doc_id"], r["cont_id"]): r for r in reversed(local)}
    return sorted(unique.values(), key=lambda r: (r["task"], r["doc_id"], r["cont_id"]))


def write_outputs(
    args: argparse.Namespace,
    outputs: dict[str, Path],
    metrics: dict[str, float],
    config: EvaluatorConfig,
    samples: list[dict[str, Any]] | None,
    evaluator: InLoopEvaluator,
    world_size: int,
) -> list[str]:
    """Rank 0: the files asked for (`--output`, `--samples`, `--outcomes`), each named once written; every
    one is tried even when an earlier fails (a full disk). Returns what was not written, a phrase a flag."""
    writes: list[tuple[str, Callable[[], object]]] = []
    if args.output:
        record = {
            "metrics": metrics,
            "model": args.model,
            "world_size": world_size,
            "config": config.to_dict(),
        }
        writes.append(("--output", lambda: write_json(outputs["--output"], record)))
    if samples is not None:
        writes.append(("--samples", lambda: write_samples(outputs["--samples"], samples)))
    outcomes = evaluator.outcomes() if args.outcomes else {}
    if outcomes:
        writes.append(
            ("--outcomes", lambda: write_step(Path(args.outcomes) / OUTCOMES_DIR, outcomes, args.step or 0))
        )
    failed = []
    for flag, write in writes:
        try:
            write()
        except OSError as exc:
            notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", []))
            failed.append(f"{flag} {outputs[flag]} not written ({exc.strerror or exc}){notes}")
            continue
        print(f"wrote {flag}: {outputs[flag]}", flush=True)
    return failed


def failure_status(metrics: dict[str, float], rank: int) -> int:
    """1 (and, on rank 0, which failed) when an evaluation failed: a batch job must not count a run whose
    figures are missing as a success; else 0."""
    failed = failed_labels(metrics)
    if not failed:
        return 0
    if rank == 0:
        print(
            f"evaluate: {len(failed)} of the evaluations failed: {', '.join(failed)} (the log above has "
            "each reason; --strict stops at the first with its traceback)",
            file=sys.stderr,
        )
    return 1


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as strict JSON: a figure that is not finite (NaN, inf) is `null`, which every parser reads."""
    metrics = {k: v if math.isfinite(v) else None for k, v in data.get("metrics", {}).items()}
    text = json.dumps({**data, "metrics": metrics}, indent=2, sort_keys=True, allow_nan=False)
    write_text_atomically(path, text)


def write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    write_text_atomically(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in samples))
