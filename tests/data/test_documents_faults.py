"""Bad `documents` files (OLMo-core's padded documents) named with the file: a negative token id, a named
pipe given as a file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluators"))
from test_perplexity_documents import EOS, evaluate, write_files  # noqa: E402

from inloop_eval.errors import LMDataError  # noqa: E402


def test_a_negative_token_id_is_named_with_its_file_and_document(tmp_path):
    write_files(tmp_path)
    with (tmp_path / "b-0.npy").open("wb") as f:
        np.save(f, np.array([9, 10, EOS, 11, -1, EOS], dtype=np.int32))
    with pytest.raises(LMDataError, match=r"label 'b' file .*b-0.npy document 1: token id -1 at position 4 is negative"):
        evaluate(tmp_path)


def test_a_named_pipe_is_not_reported_missing(tmp_path):
    write_files(tmp_path)
    (tmp_path / "b-0.npy").unlink()
    os.mkfifo(tmp_path / "b-0.npy")
    with pytest.raises(LMDataError, match=r"label 'b': .*b-0.npy is not a regular file \(a named pipe"):
        evaluate(tmp_path)
