"""`inloop-eval report RUN_A RUN_B` with one damaged outcomes file: the other steps' verdicts are drawn and
the damaged step is named on the page."""

from __future__ import annotations

import re

from test_comparison_page import write_run

from inloop_eval.loggers.outcomes import OUTCOMES_DIR, step_path
from inloop_eval.report.comparison import write_comparison


def test_a_damaged_step_is_skipped_and_named_the_others_drawn(tmp_path):
    write_run(tmp_path / "a", 0.5, 0, [100, 200, 300])
    write_run(tmp_path / "b", 0.65, 1, [100, 200, 300])
    damaged = step_path(tmp_path / "b" / OUTCOMES_DIR, 200)
    damaged.write_bytes(damaged.read_bytes()[:100])
    page = write_comparison([tmp_path / "a", tmp_path / "b"], tmp_path / "out").read_text()
    card = re.search(r"id='task-piqa'>(.*?)</div>", page, re.S).group(1)
    assert re.findall(r"<th class='l'>(\d+)</th>", card) == ["100", "300"]  # a verdict row per step
    assert f"B = b: step 200 skipped: outcomes file {damaged}: not a readable .npz archive" in page
