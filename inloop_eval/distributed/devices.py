"""Devices: joining the process group torchrun describes, and checking that a device a flag names is one
this machine has before anything is placed on it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from inloop_eval.errors import ConfigError


def init_from_env() -> torch.device:
    """Join the process group `torchrun` describes (RANK, WORLD_SIZE), if any and not joined yet: nccl on
    the GPU of LOCAL_RANK where CUDA is available, else gloo. Returns this process's device."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group("nccl")
        else:
            dist.init_process_group("gloo")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def usable_device(name: str, flag: str) -> torch.device:
    """The device `name` names, checked present before anything is placed on it, so that a device this
    machine lacks (`cuda` on a CPU-only torch, `cuda:7` on a one-GPU machine) is one error naming `flag`
    rather than a traceback at the first forward. ConfigError naming the flag, what was found, why, and the
    devices this machine has."""
    reason = _device_absence(name)
    if reason is not None:
        raise ConfigError(
            f"{flag} {name!r} is not a device this machine has ({reason}); expected one of: "
            f"{', '.join(present_devices())}"
        )
    return torch.device(name)


def _device_absence(name: str) -> str | None:
    """Why this process cannot use the device `name` (None: it can)."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        return f"not a torch device: {str(exc).strip().splitlines()[0]}"
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu, ...
    if device.type != "cpu" and callable(getattr(backend, "is_available", None)):
        if not backend.is_available():
            built = ""
            if device.type == "cuda":
                built = f", built with CUDA {torch.version.cuda}" if torch.version.cuda else ", a CPU-only build"
            return f"this torch ({torch.__version__}{built}) sees no {device.type} device"
        count = backend.device_count() if callable(getattr(backend, "device_count", None)) else None
        if device.index is not None and count is not None and device.index >= count:
            return f"this machine has {count} {device.type} device(s), 0 to {count - 1}"
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def present_devices() -> list[str]:
    """The devices this process can use: cpu, then each GPU (`cuda`, `cuda:0`, ...) or `mps` when present."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices
