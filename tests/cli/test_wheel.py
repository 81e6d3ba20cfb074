"""A wheel built from the checkout is complete: it holds the demo's default config, and `inloop-eval demo` runs
from a directory outside the checkout with the package imported from that wheel alone.

The wheel is built offline with the environment's setuptools (`pip wheel --no-build-isolation`) from a copy
of the sources, so no `build/` is left in the checkout and no stale file from an earlier build gets in; it is
installed with `pip install --target` into a folder that is the only entry of PYTHONPATH. The run uses the
tiny settings of tests/cli/test_demo.py, in one process and without W&B, to stay cheap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "support" / "configs" / "demo_tiny.yaml"
PACKAGED_CONFIG = "inloop_eval/demo/demo.yaml"


def pip(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert proc.returncode == 0, (
        f"pip {' '.join(args)} failed; building the wheel offline needs setuptools>=70.1 in this "
        f"environment (the dev extra has it):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into), both outside the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "inloop_eval", source / "inloop_eval", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist, site = tmp / "dist", tmp / "site"
    pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(dist),
        str(source),
        cwd=tmp,
    )
    (wheel,) = dist.glob("inloop_eval-*.whl")
    pip("install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel), cwd=tmp)
    return wheel, site


def run_installed(site: Path, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run the installed `inloop-eval` console script with PYTHONPATH holding only `site`; its stdout."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [str(site / "bin" / "inloop-eval"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def test_the_wheel_holds_the_demo_config(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        assert PACKAGED_CONFIG in archive.namelist()
        assert archive.read(PACKAGED_CONFIG) == (REPO / PACKAGED_CONFIG).read_bytes()


def test_the_installed_demo_defaults_to_its_packaged_config(installed, tmp_path):
    _, site = installed
    # Wide enough that argparse does not wrap the path (it breaks lines at hyphens too).
    help_text = run_installed(site, ["demo", "--help"], cwd=tmp_path, env={"COLUMNS": "1000"})
    assert str(site / PACKAGED_CONFIG) in help_text


def test_demo_runs_from_the_wheel_outside_the_checkout(installed, tmp_path, data_root):
    _, site = installed
    config = yaml.safe_load(TINY.read_text())
    config["logging"]["wandb"] = False
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    env = {"INLOOP_EVAL_DATA": str(data_root), "OMP_NUM_THREADS": "1"}
    stdout = run_installed(
        site, ["demo", "--steps", "2", "--config", "demo.yaml", "--out", str(out)], cwd=tmp_path, env=env
    )
    assert f"metrics: {out / 'metrics.jsonl'}" in stdout
    metrics = (out / "metrics.jsonl").read_text()
    assert '"eval/downstream/piqa/acc"' in metrics and '"eval/lm/coqa/ppl"' in metrics
    assert (out / "report" / "index.html").is_file()
