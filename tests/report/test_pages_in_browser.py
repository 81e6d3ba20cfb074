"""The demo's report page and the page comparing two demo runs (seeds 0 and 1), opened in headless Chromium
at 1,400 and 800 px: every image loaded, nothing overflows its card, no image shrunk past readability, no
console errors; on the comparison page, what a reader reads: the verdict legend, config paths relative to
their common folder, bpb_gold advised only where its SNR beats the noisy figure's, and a signal table of
runs at different steps naming each run's step and still fitting the window. A screenshot of each page at each width is kept under the run directory
(`<run>/report/screenshot-<width>.png`, `<run>/comparison/screenshot-<width>.png`), and copied to
`$INLOOP_EVAL_ARTIFACTS` when that is set (CI keeps them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from browser import chromium, chromium_missing, page_problems

from inloop_eval.report.comparison import write_comparison

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "support" / "configs" / "demo_tiny.yaml"
WIDTHS = (1400, 800)

# Skipped where Chromium is missing, except under CI (.ci/run sets INLOOP_EVAL_ARTIFACTS and installs it).
pytestmark = pytest.mark.skipif(
    chromium_missing() is not None and not os.environ.get("INLOOP_EVAL_ARTIFACTS"),
    reason=str(chromium_missing()),
)


def run_demo(config: Path, out: Path, seed: int, data_root: Path) -> None:
    env = {**os.environ, "INLOOP_EVAL_DATA": str(data_root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "inloop_eval.cli", "demo", "--config", str(config), "--out", str(out)]
    cmd += ["--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory, data_root) -> tuple[Path, Path]:
    """Two tiny demo runs (tests/support/configs/demo_tiny.yaml without W&B), seeds 0 and 1."""
    base = tmp_path_factory.mktemp("browser")
    config = yaml.safe_load(TINY.read_text())
    config["logging"]["wandb"] = False
    (base / "tiny.yaml").write_text(yaml.safe_dump(config))
    runs = base / "seed0", base / "seed1"
    for seed, run in enumerate(runs):
        run_demo(base / "tiny.yaml", run, seed, data_root)
    return runs


def keep(screenshot: Path, name: str) -> None:
    artifacts = os.environ.get("INLOOP_EVAL_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(screenshot, Path(artifacts) / name)


def check(page: Path, kind: str) -> None:
    problems = []
    with chromium() as driver:
        for width in WIDTHS:
            shot = page.parent / f"screenshot-{width}.png"
            problems += [f"{width} px: {p}" for p in page_problems(driver, page, width, shot)]
            assert shot.stat().st_size > 0
            keep(shot, f"{kind}-{width}.png")
    assert not problems, f"{page}:\n" + "\n".join(problems)


def shown_text(page: Path, selector: str = "body") -> list[str]:
    """The rendered text of every element matching `selector` on `page`, at 1,400 px."""
    with chromium() as driver:
        page_problems(driver, page, WIDTHS[0])
        script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)"
        return list(driver.execute_script(script, selector))


def snr_rows(page: Path) -> dict[tuple[str, str], float]:
    """(task, figure) -> SNR as the signal table shows it (its column found by its heading)."""
    rows, column = {}, None
    for line in shown_text(page, "h2 + p + p + table tr"):
        cells = line.split("\t")
        if cells[0] == "task":
            column = cells.index("SNR")
        elif len(cells) > 3 and column is not None:
            rows[(cells[0], cells[1])] = float(cells[column]) if cells[column] != "nan" else float("nan")
    return rows


def test_the_report_page_fits_its_window_and_loads_every_image(demo_runs):
    check(demo_runs[0] / "report" / "index.html", "report")


def test_the_comparison_page_fits_its_window_and_loads_every_image(demo_runs):
    proc = subprocess.run(
        [sys.executable, "-m", "inloop_eval.cli", "report", str(demo_runs[0]), str(demo_runs[1])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check(demo_runs[0] / "comparison" / "index.html", "comparison")


def test_the_comparison_page_reads_as_it_means(demo_runs):
    a, b = demo_runs
    out = a.parent / "compared"
    proc = subprocess.run(
        [sys.executable, "-m", "inloop_eval.cli", "report", str(a), str(b), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = out / "index.html"
    (text,) = shown_text(page)
    assert "B B better" not in text and "A A better" not in text
    assert "a cell marked B means run B is better" in text
    config = "\n".join(shown_text(page, "table.config"))
    assert str(a.parent) not in config
    snr = snr_rows(page)
    for card in shown_text(page, ".card[id^='task-']"):
        task = card.splitlines()[0].strip()
        if "compare runs on bpb_gold" in card:
            noisy = [v for (t, f), v in snr.items() if t == task and f != "bpb_gold" and f"{f} " in card]
            assert noisy and snr[(task, "bpb_gold")] > min(noisy), (task, card)


def test_a_comparison_of_runs_at_different_steps_names_them_and_fits(tmp_path):
    # No step in common: long evaluated at 0, 100, 150; short at 10, 50.
    for name, steps, level in (("long", (0, 100, 150), 0.5), ("short", (10, 50), 0.4)):
        rows = [{"step": s, "eval/downstream/piqa/acc": level + s / 1000} for s in steps]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_comparison([tmp_path / "long", tmp_path / "short"], tmp_path / "out")
    (text,) = shown_text(page)
    assert "different steps: long at 150, short at 50" in text
    check(page, "comparison-steps")
