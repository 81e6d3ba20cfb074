"""`WatchConfig`: what the watcher watches, where it writes, and how it decides what to evaluate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inloop_eval.checkpoints.formats import checkpoint_formats
from inloop_eval.config_fields import one_of
from inloop_eval.distributed import usable_device
from inloop_eval.errors import ConfigError

POLICIES = ("all", "latest")


@dataclass(kw_only=True)
class WatchConfig:
    """The watcher's settings; the evaluation itself is the `EvaluatorConfig` used in the loop."""

    checkpoint_dir: str
    """The folder training saves checkpoints to (`checkpoint-<N>/`, `step<N>/` or `step-<N>/` inside)."""
    run_dir: str
    """Where `metrics.jsonl`, `outcomes/`, `config.json`, `wandb/` and the watcher's `watch/ledger.jsonl`
    go: the in-loop run's directory, to continue its files, or a new one."""
    policy: str = "all"
    """`all`: every checkpoint, oldest first, none skipped. `latest`: only the newest complete checkpoint;
    older ones not yet evaluated are recorded as skipped (for a watcher slower than training)."""
    settle_s: float = 10.0
    """Seconds a checkpoint must stay unchanged, its completion evidence there, before it is read."""
    poll_s: float = 5.0
    """Seconds between looks at the checkpoint folder."""
    once: bool = False
    """Evaluate the checkpoints there now (waiting out their settle time) and exit; one that is incomplete
    is named and left."""
    until_step: int | None = None
    """Training's last step: no checkpoint past it is evaluated, and the watch ends once a checkpoint at or
    past it has landed and every one up to it is handled (evaluated, skipped or failed)."""
    redo_in_loop: bool = False
    """Evaluate steps the training loop already evaluated (a metrics line in the run directory, or the
    in-loop callback's state in an OLMo-core checkpoint) again."""
    format: str | None = None
    """Only checkpoints of this format (`hf`, `olmo_core`, `torchtitan`); None: whichever the folder holds."""
    model_builder: str | None = None
    """`module:function` building the model to load weights into: required for torchtitan, optional for
    OLMo-core (default: the checkpoint's `config.json`)."""
    events_dir: str | None = None
    """A folder trainers announce finished checkpoints in (`<events_dir>/<run_id>/step-<N>.ready.json`:
    OLMo-core's `CheckpointReadyNotifierCallback`, or `write_ready_event`): an announced checkpoint is looked
    at within `events_poll_s` seconds, without its settle time (its trainer says it is finished), however
    long `poll_s`; the checkpoint folder is still scanned every `poll_s` seconds, the fallback that misses
    nothing."""
    events_poll_s: float = 1.0
    """Seconds between looks at `events_dir`."""
    lease_s: float | None = None
    """Hold each checkpoint found and not yet evaluated with a lease beside it (`leases`) that expires
    `lease_s` seconds after it was last refreshed (every `lease_s / 3` seconds while the watcher lives):
    trainers with inloop_eval's rotation helpers keep a held checkpoint on disk. None: no leases."""
    hold_failed_s: float | None = None
    """With `lease_s`: seconds a checkpoint that failed and will be tried again (once its files change, or by
    a restarted watcher) stays held past its failure, then its lease is released and training's rotation may
    delete it; None: `lease_s`. One that failed for good (the config cannot take it) is released at once."""
    device: str | None = None
    """torch device to evaluate on (default cuda if available, else cpu; under torchrun `cuda:<LOCAL_RANK>`);
    one this torch cannot use is refused at the start, not found out at every checkpoint."""

    tp: int = 1
    """Under torchrun: tensor-parallel degree of the layout the model is built in (`--tp`): each group of
    `tp` ranks splits each model, each rank reading only its share of the checkpoint (OLMo-core and
    torchtitan checkpoints). 1: no tensor parallelism."""
    fsdp: bool = False
    """Under torchrun: shard the model with FSDP2 over the data-parallel ranks (world / `tp`), each rank
    reading and holding only its shard (`--fsdp`); False: the model is replicated over them."""

    def __post_init__(self) -> None:
        one_of(self.policy, POLICIES, "watch: policy")
        if self.format is not None:
            one_of(self.format, tuple(checkpoint_formats()), "watch: format")
        seconds = {"settle_s": self.settle_s, "poll_s": self.poll_s, "events_poll_s": self.events_poll_s}
        if self.lease_s is not None:
            seconds["lease_s"] = self.lease_s
        if self.hold_failed_s is not None:
            seconds["hold_failed_s"] = self.hold_failed_s
            if self.lease_s is None:
                raise ConfigError("watch: hold_failed_s needs lease_s (--lease): without leases nothing is held")
        for name, value in seconds.items():
            zero = name in ("settle_s", "hold_failed_s")
            if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
                least = ">= 0" if zero else "> 0"
                remedy = "; leave lease_s None for no leases" if name == "lease_s" else ""
                raise ConfigError(
                    f"watch: {name} must be a finite number of seconds {least}, found {value}{remedy}"
                )
        if self.tp < 1:
            raise ConfigError(f"watch: tp must be >= 1 (the tensor-parallel degree), found {self.tp}")
        if self.device is not None:
            usable_device(self.device, "watch: --device")
