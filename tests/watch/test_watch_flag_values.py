"""Every number of seconds `inloop-eval watch` takes is refused at parse time when it is not a finite number
of the right sign, naming the flag and the value: `--settle nan` would never settle, `--lease nan` would
write no lease, `--poll nan` would fail after the first evaluation. `WatchConfig` refuses the same values
from Python."""

from __future__ import annotations

import pytest

from inloop_eval.cli.main import main
from inloop_eval.errors import ConfigError
from inloop_eval.watch import WatchConfig

# flag -> whether 0 is a value it takes
SECONDS_FLAGS = {"--settle": True, "--poll": False, "--events-poll": False, "--lease": False, "--hold-failed": True}


def refused(flag: str, value: str, tmp_path, capsys) -> str:
    """stderr of `inloop-eval watch ... FLAG VALUE`, which must stop at parse time (exit 2): the config it
    names does not exist, so anything past parsing would fail otherwise."""
    argv = ["watch", str(tmp_path), "--config", str(tmp_path / "none.yaml"), "--run-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, f"{flag}={value}"])
    assert stopped.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("flag", list(SECONDS_FLAGS))
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "soon"])
def test_a_number_of_seconds_that_is_not_finite_or_is_negative_is_refused_naming_the_flag(
    flag, value, tmp_path, capsys
):
    err = refused(flag, value, tmp_path, capsys)
    assert f"argument {flag}: expected a finite number of seconds" in err, err
    assert repr(value) in err, err


@pytest.mark.parametrize("flag", [f for f, zero in SECONDS_FLAGS.items() if not zero])
def test_zero_is_refused_where_it_would_spin_or_expire_at_once(flag, tmp_path, capsys):
    err = refused(flag, "0", tmp_path, capsys)
    assert f"argument {flag}: expected a finite number of seconds > 0, found '0'" in err, err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("settle_s", float("nan")),
        ("settle_s", -1.0),
        ("poll_s", float("inf")),
        ("poll_s", 0.0),
        ("events_poll_s", float("nan")),
        ("events_poll_s", 0.0),
        ("lease_s", float("nan")),
        ("lease_s", 0.0),
        ("lease_s", -5.0),
        ("hold_failed_s", float("nan")),
        ("hold_failed_s", -1.0),
    ],
)
def test_watch_config_refuses_the_same_values_naming_the_field(field, value, tmp_path):
    with pytest.raises(ConfigError, match=f"watch: {field} must be a finite number of seconds"):
        WatchConfig(checkpoint_dir=str(tmp_path), run_dir=str(tmp_path / "run"), **{"lease_s": 60.0, field: value})


def test_holding_failed_checkpoints_needs_leases(tmp_path):
    with pytest.raises(ConfigError, match=r"hold_failed_s needs lease_s \(--lease\)"):
        WatchConfig(checkpoint_dir=str(tmp_path), run_dir=str(tmp_path / "run"), hold_failed_s=60)
