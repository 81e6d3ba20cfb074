"""`inloop-eval demo`'s arguments and config checked before anything runs: a seed torch cannot take is one
error naming the flag (or the config field), the range and what was found."""

from __future__ import annotations

import pytest

from inloop_eval.cli.main import main
from inloop_eval.demo.run import MAX_SEED, TrainConfig
from inloop_eval.errors import ConfigError


@pytest.mark.parametrize("seed", ["-1", str(2**64), "2**64", "1.5"])
def test_a_seed_out_of_range_is_refused_at_the_command_line(seed, tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["demo", "--seed", seed, "--out", str(tmp_path / "run")])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --seed: expected a seed, a whole number from 0 to 2**64 - 1, found {seed!r}" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1])
def test_a_config_seed_out_of_range_is_a_config_error(seed):
    with pytest.raises(ConfigError, match=rf"train.seed must be a whole number from 0 to 2\*\*64 - 1, found {seed}"):
        TrainConfig(seed=seed)
    assert TrainConfig(seed=MAX_SEED).seed == MAX_SEED
