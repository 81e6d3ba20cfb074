"""A folder named where a file is expected is reported as a folder, with the fix, not as a file that
"does not exist". The harness YAML cases are in test_harness_yaml.py."""

from __future__ import annotations

import pytest

from inloop_eval.data.perplexity.sources import resolve_paths
from inloop_eval.errors import LMDataError


def test_a_folder_in_a_domains_paths(tmp_path):
    (tmp_path / "web").mkdir()
    with pytest.raises(
        LMDataError, match=r"label 'web': .*/web is a folder; expected a file, or a pattern"
    ) as info:
        resolve_paths("web", [str(tmp_path / "web")])
    assert f"e.g. '{tmp_path / 'web' / '*.npy'}'" in str(info.value)
    with pytest.raises(LMDataError, match=r"label 'web': file .*/nothing.npy does not exist"):
        resolve_paths("web", [str(tmp_path / "nothing.npy")])
