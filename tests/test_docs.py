"""The documentation runs as written, so the pages cannot drift from the code: every Python block and every
`inloop-eval` command line of README.md and docs/*.md is run, every import path they name imports, every
repository path they name exists, every link and anchor resolves, and every docs/ page is linked from the README.

A block the line `<!-- not run: REASON -->` stands directly above is not run (it cannot run offline, or takes
minutes); such blocks are counted and listed in the test output, their `inloop-eval` lines are still checked
against the command's `--help` and their benchmark and script lines against the script's flags, and the import
paths of their Python are still imported.

The examples run in a sandbox folder, one process per page (tests/support/doc_runner.py: its import paths,
its Python blocks, then its command lines through `inloop_eval.cli.main`, the `inloop-eval` script's entry
point), with the checkout on PYTHONPATH, the task data root of the `data_root` fixture as `$INLOOP_EVAL_DATA` and
W&B offline. To keep the whole test at a minute or two, what the examples read is made small, and nothing
else is changed:
- `configs/<name>.yaml` in the sandbox is the repository's config with every task's `limit` at most LIMIT;
- `--limit N` on a command line becomes `--limit min(N, LIMIT)`;
- the placeholders on command lines name fixtures: HF_DIR a small random GPT-NeoX saved with its tokenizer,
  CKPT_DIR a folder holding it as `checkpoint-10/`, RUN_DIR, RUN_A and RUN_B run directories with two
  evaluations logged (steps 1000 and 2000), DIR the data root.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_pages import (
    REPO,
    blocks,
    cli_words,
    command_lines,
    flags,
    import_paths,
    links,
    markers_without_block,
    page_name,
    pages,
    repository_paths,
    resolves,
    script_and_flags,
)
from doc_pages import anchors as page_anchors

from inloop_eval.cli.main import build_parser

LIMIT = 4
PLACEHOLDER = re.compile(r"\b(HF_DIR|CKPT_DIR|RUN_DIR|RUN_A|RUN_B|DIR)\b")
SHELL = ("bash", "sh", "shell", "console")
PAGES = pages()
RUNNER = REPO / "tests" / "support" / "doc_runner.py"


def shell_blocks(path: Path, *, run: bool) -> list[Any]:
    return [b for b in blocks(path) if b.lang in SHELL and (b.not_run is None) == run]


def python_blocks(path: Path, *, run: bool) -> list[Any]:
    return [b for b in blocks(path) if b.lang == "python" and (b.not_run is None) == run]


PAGES_WITH_EXAMPLES = [p for p in PAGES if shell_blocks(p, run=True) or python_blocks(p, run=True) or import_paths(p)]


def capped(data: Any) -> Any:
    """A config with every task's `limit` at most LIMIT (a task entry is a mapping with a `task` key)."""
    if isinstance(data, dict):
        out = {k: capped(v) for k, v in data.items()}
        if "task" in out:
            out["limit"] = min(out.get("limit") or LIMIT, LIMIT)
        return out
    if isinstance(data, list):
        return [capped(v) for v in data]
    return data


def capped_limit(args: list[str]) -> list[str]:
    """The arguments with `--limit N` as `--limit min(N, LIMIT)`."""
    out = list(args)
    for i, word in enumerate(out[:-1]):
        if word == "--limit" and out[i + 1].isdigit():
            out[i + 1] = str(min(int(out[i + 1]), LIMIT))
    return out


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """The folder the examples run in, with the repository's configs made small (`capped`)."""
    root = tmp_path_factory.mktemp("docs_sandbox")
    (root / "configs").mkdir()
    for path in sorted((REPO / "configs").glob("*.yaml")):
        (root / "configs" / path.name).write_text(yaml.safe_dump(capped(yaml.safe_load(path.read_text()))))
    return root


@pytest.fixture(scope="module")
def environment(data_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(INLOOP_EVAL_DATA=str(data_root), WANDB_MODE="offline", WANDB_SILENT="true")
    return env


def logged_run(run_dir: Path, data_root: Path, neox_tokenizer: Any) -> None:
    """A run directory as a training run's `JSONLLogger` leaves it: the pinned model evaluated at steps 1000
    and 2000 on the demo's tasks, with outcomes."""
    from pinned_scores import pinned_model

    from inloop_eval import EvaluatorConfig, InLoopEvaluator
    from inloop_eval.integrations import run_and_log
    from inloop_eval.loggers import JSONLLogger

    tasks = ("hellaswag", "piqa", "arc_easy", "mmlu_mc")
    config = EvaluatorConfig.from_dict(
        {"evaluators": [{"task": t, "limit": LIMIT} for t in tasks], "data_root": str(data_root)}
    )
    evaluator, model, logger = InLoopEvaluator(config, tokenizer=neox_tokenizer), pinned_model(), JSONLLogger(run_dir)
    logger.log_config(config)
    for step in (1000, 2000):
        run_and_log(evaluator, model, step, logger)
    logger.finish()


@pytest.fixture(scope="module")
def placeholders(sandbox: Path, data_root: Path, hf_model_dir: Path, neox_tokenizer: Any) -> dict[str, str]:
    """What each placeholder of the command lines names (see the module docstring)."""
    checkpoints = sandbox / "fixtures" / "checkpoints"
    shutil.copytree(hf_model_dir, checkpoints / "checkpoint-10")
    runs = {name: sandbox / "fixtures" / name.lower() for name in ("RUN_A", "RUN_B", "RUN_DIR")}
    logged_run(runs["RUN_A"], data_root, neox_tokenizer)
    shutil.copytree(runs["RUN_A"], runs["RUN_B"])
    shutil.copytree(runs["RUN_A"], runs["RUN_DIR"])
    named = {"HF_DIR": hf_model_dir, "CKPT_DIR": checkpoints, "DIR": data_root, **runs}
    return {name: str(path) for name, path in named.items()}


def page_job(path: Path, placeholders: dict[str, str]) -> dict[str, Any]:
    """What `doc_runner.py` runs for a page: its import paths, its Python blocks that run, and its command lines
    that run, with the placeholders filled in and `--limit` capped."""
    commands = []
    for block in shell_blocks(path, run=True):
        for words in command_lines(block):
            args = cli_words(words)
            assert args is not None, (
                f"{block.where}: `{' '.join(words)}` is not an inloop-eval command: make the block one, or mark it "
                "<!-- not run: REASON --> on the line above its fence"
            )
            argv = capped_limit([PLACEHOLDER.sub(lambda m: placeholders[m[1]], a) for a in args])
            commands.append({"where": block.where, "argv": argv})
    return {
        "imports": [[*entry, page_name(path)] for entry in import_paths(path)],
        "blocks": [{"where": b.where, "code": b.text} for b in python_blocks(path, run=True)],
        "commands": commands,
    }


@pytest.fixture(scope="module")
def page_runs(sandbox, environment, placeholders, tmp_path_factory) -> tuple[str, str]:
    """Every page's examples, run by one `doc_runner.py` process (each block in a fresh namespace, each page
    after the other, so that Python and torch start once): its stdout and stderr, each line naming the page
    and line it is about."""
    jobs = [page_job(path, placeholders) for path in PAGES_WITH_EXAMPLES]
    job = {key: [item for j in jobs for item in j[key]] for key in ("imports", "blocks", "commands")}
    job_path = tmp_path_factory.mktemp("pages") / "job.json"
    job_path.write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(job_path)],
        cwd=sandbox,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("path", PAGES_WITH_EXAMPLES, ids=page_name)
def test_the_pages_examples_run_and_their_import_paths_import(path, page_runs, placeholders):
    stdout, stderr = page_runs
    job, page = page_job(path, placeholders), page_name(path)
    failed = [line for line in stderr.splitlines() if f" {page}:" in line or f"({page})" in line]
    assert not failed, f"{page}:\n" + "\n".join(failed) + f"\n{stderr[-8000:]}"
    ran = [line for line in stdout.splitlines() if f" {page}:" in line and " ran in " in line]
    assert len(ran) == len(job["blocks"]) + len(job["commands"]), stdout


def help_text(command: tuple[str, ...], cache: dict[tuple[str, ...], str]) -> str:
    """`inloop-eval COMMAND --help`, from the command line's own parser in this process."""
    if command not in cache:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
            build_parser(command[0]).parse_args([*command, "--help"])
        assert exited.value.code == 0, f"`inloop-eval {' '.join(command)} --help` exited {exited.value.code}"
        cache[command] = out.getvalue()
    return cache[command]


def test_commands_not_run_name_real_commands_and_flags():
    """The lines of blocks marked not to run still name commands and flags that exist."""
    cache: dict[tuple[str, ...], str] = {}
    checked = 0
    for path in PAGES:
        for block in shell_blocks(path, run=False):
            for words in command_lines(block):
                args = cli_words(words)
                if args is not None:
                    command = tuple(args[:2] if args[:1] == ["data"] else args[:1])
                    text, named = help_text(command, cache), flags(args)
                elif (script := script_and_flags(words)) is not None:
                    source, named = script
                    assert source.is_file(), f"{block.where}: {page_name(source)} does not exist"
                    text = source.read_text() + (REPO / "benchmarks" / "common.py").read_text()
                    named = [f'"{flag}"' for flag in named]
                else:
                    continue  # another program (pip, python -m venv): set-up, not ours to check
                missing = [f for f in named if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
                assert not missing, f"{block.where}: `{' '.join(words)}` names unknown flags {missing}"
                checked += 1
    assert checked >= 5, checked


def test_every_repository_path_a_page_names_exists():
    missing = [f"{page_name(p)}: {span}" for p in PAGES for span in repository_paths(p) if not resolves(span)]
    assert not missing, missing


def test_every_link_and_anchor_resolves():
    broken = []
    for path in PAGES:
        for target in links(path):
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append(f"{page_name(path)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in page_anchors(linked):
                broken.append(f"{page_name(path)}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_links_every_docs_page_and_each_exists():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md") if t.startswith("docs/")}
    docs = {p.resolve() for p in (REPO / "docs").glob("*.md")}
    assert {p for p in linked if p.suffix == ".md"} <= docs, sorted(map(str, linked - docs))
    assert docs <= linked, f"docs pages the README does not link: {sorted(p.name for p in docs - linked)}"


def ci_test_command() -> str:
    """The command `.ci/run` runs: its last line."""
    return (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]


def test_the_readme_is_a_front_page():
    """At most 300 lines, none over 200 characters but the set-up commands (one line each, to paste)."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    setup = {line for b in blocks(REPO / "README.md") if b.lang in SHELL and b.not_run for line in b.text.splitlines()}
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 200 and line not in setup]
    assert not long, f"README.md lines over 200 characters: {long}"


def test_ci_runs_the_readmes_test_command():
    assert ci_test_command() in (REPO / "README.md").read_text().splitlines()


def test_the_evaluator_configs_in_the_pages_load():
    from inloop_eval import EvaluatorConfig

    loaded = 0
    for path in PAGES:
        for block in blocks(path):
            data = yaml.safe_load(block.text) if block.lang == "yaml" and block.text.startswith("evaluators:") else None
            if data is not None:
                assert EvaluatorConfig.from_dict(data, block.where).evaluators
                loaded += 1
    assert loaded >= 2, loaded


def test_blocks_not_run_are_marked_with_a_reason_and_counted(capsys):
    stray = [m for p in PAGES for m in markers_without_block(p)]
    assert not stray, f"<!-- not run --> markers that are not directly above a fence: {stray}"
    code = [b for p in PAGES for b in blocks(p) if b.lang == "python" or b.lang in SHELL]
    not_run = [b for b in code if b.not_run is not None]
    assert all(b.not_run.strip() for b in not_run)
    first_hour = [b.where for b in blocks(REPO / "README.md") if b.lang == "python" and b.not_run is not None]
    assert not first_hour, f"the README's training-loop example must run as pasted: {first_hour}"
    lines = [f"docs: {len(code) - len(not_run)} Python and shell blocks run, {len(not_run)} not run:"]
    lines += [f"  {b.where} ({b.lang}): {b.not_run}" for b in not_run]
    with capsys.disabled():  # shown in every run's output, -q included
        print("\n" + "\n".join(lines))


def test_no_page_holds_a_merge_conflict():
    marked = [
        f"{page_name(p)}:{i}"
        for p in PAGES
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "======="
    ]
    assert not marked, marked
