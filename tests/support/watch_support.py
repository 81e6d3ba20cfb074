"""Checkpoints for the watcher's tests, written the way each framework writes them: a real OLMo-core
`Trainer` (with its `ConfigSaverCallback`), Hugging Face `save_pretrained` with sharded safetensors, and the
evaluator config the in-loop callback runs, so that the watcher's figures can be compared with it."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from olmo_core.data import TokenizerConfig
from olmo_core.train.callbacks import ConfigSaverCallback
from workers.olmo_core_train import SEQ_LEN, callback_config, model_config, train

from inloop_eval.data.root import TOKENIZER_DIR, neox_tokenizer_path
from inloop_eval.loggers import METRICS_FILE

TASKS = ["piqa", "arc_easy_rc_5shot"]
LIMIT = 6
OLMO_TOKENIZER = "gpt-neox-olmo-dolma-v1_5.json"


def olmo_callback(data_root: Path, interval: int):
    """The in-loop callback evaluating after every `interval` steps (not before the first or after the last)."""
    return callback_config(
        data_root,
        eval_interval=interval,
        eval_on_startup=False,
        eval_on_finish=False,
        limit=LIMIT,
        tasks=TASKS,
    )


def olmo_eval_yaml(data_root: Path, path: Path, interval: int = 2) -> Path:
    """The evaluator YAML equal to what the in-loop callback evaluates (its config, the train module's
    sequence length, OLMo's tokenizer file), for the watcher."""
    config = olmo_callback(data_root, interval).evaluator_config(SEQ_LEN).to_dict()
    config["tokenizer"] = str(data_root / TOKENIZER_DIR / OLMO_TOKENIZER)
    path.write_text(yaml.safe_dump(config))
    return path


def olmo_tokenizer_config(data_root: Path) -> TokenizerConfig:
    tokenizer = TokenizerConfig.gpt_neox_olmo_dolma_v1_5()
    tokenizer.identifier = str(data_root / TOKENIZER_DIR / OLMO_TOKENIZER)
    return tokenizer


def train_olmo_core(
    work: Path,
    data_root: Path,
    *,
    steps: int,
    save_interval: int,
    in_loop: bool,
    callbacks: dict[str, Any] | None = None,
    max_checkpoints: int | None = 3,
    **fields: Any,
) -> dict[str, Any]:
    """The tiny OLMo-core model trained by the real `Trainer`, a checkpoint every `save_interval` steps in
    `<work>/save/step<N>/`, with OLMo-core's `ConfigSaverCallback` writing the experiment config (`model`,
    `dataset.tokenizer`) into each; with `in_loop`, evaluated in the loop at every checkpoint step.
    callbacks: more callbacks by name; max_checkpoints: the checkpointer's (OLMo-core's default 3). What
    OLMo-core logged (`collected`)."""
    tokenizer = olmo_tokenizer_config(data_root)
    _, trainer = train(
        work,
        data_root,
        with_callback=in_loop,
        steps=steps,
        save_interval=save_interval,
        tokenizer=tokenizer,
        callback=olmo_callback(data_root, save_interval) if in_loop else None,
        extra_callbacks={"config_saver": ConfigSaverCallback(), **(callbacks or {})},
        fit=False,
        **fields,
    )
    trainer.callbacks["checkpointer"].max_checkpoints = max_checkpoints
    trainer.callbacks["config_saver"].config = {
        "model": model_config(tokenizer).as_config_dict(),
        "dataset": {"tokenizer": tokenizer.as_config_dict()},
    }
    trainer.fit()
    from workers.olmo_core_train import collected

    return collected(trainer)


def hf_checkpoints(folder: Path, data_root: Path, steps: list[int]) -> dict[int, Any]:
    """`<folder>/checkpoint-<N>` for each step: a tiny GPT-NeoX saved with `save_pretrained` in sharded
    safetensors (with their index) and its tokenizer; the models, by step."""
    from helpers import tiny_neox

    models = {}
    for step in steps:
        model = tiny_neox(seed=step)
        out = folder / f"checkpoint-{step}"
        model.save_pretrained(out, max_shard_size="2MB")
        shutil.copy(neox_tokenizer_path(data_root), out / "tokenizer.json")
        models[step] = model.eval()
    return models


def eval_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The `metrics.jsonl` lines holding `eval/...` figures."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if any(k.startswith("eval/") for k in r)]


def wait_for(condition, timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s` (a hang, not a slow machine)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s:.0f} s"
        time.sleep(0.1)


def single_file_checkpoints(
    folder: Path, data_root: Path, steps: list[int], *, positions: dict[int, int] | None = None
) -> Path:
    """`<folder>/checkpoint-<N>` for each step: a tiny GPT-NeoX (seeded by its step) saved with
    `save_pretrained` in one `model.safetensors`, with its tokenizer; `positions`: step -> the model's
    `max_position_embeddings` where not 512."""
    from helpers import tiny_neox

    for step in steps:
        out = folder / f"checkpoint-{step}"
        tiny_neox(seed=step, max_positions=(positions or {}).get(step, 512)).save_pretrained(out)
        shutil.copy(neox_tokenizer_path(data_root), out / "tokenizer.json")
    return folder


def dcp_checkpoints(folder: Path, steps: list[int]) -> Path:
    """`<folder>/step-<N>` for each step: a tiny GPT-NeoX's state dict (seeded by its step) saved with
    torch.distributed.checkpoint by one process (`__0_0.distcp` and `.metadata`), as torchtitan names them;
    `watch_builders:tiny_neox_model` builds the model to load them into."""
    import torch.distributed.checkpoint as dcp
    from helpers import tiny_neox

    for step in steps:
        dcp.save(tiny_neox(seed=step).state_dict(), checkpoint_id=str(folder / f"step-{step}"))
    return folder


def drop_data_offsets(path: Path) -> str:
    """Rewrite a safetensors file's header without its first tensor's `data_offsets`, padded to its length
    (a damaged file, not one still being written); the tensor's name."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    del header[name]["data_offsets"]
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    path.write_bytes(data[:8] + text.ljust(length) + data[8 + length :])
    return name


def drop_tensor(path: Path, *, cut_a_row: bool = False) -> str:
    """Save a safetensors file again without its first matrix (and its index without it, in a sharded
    checkpoint), or with `cut_a_row` with that matrix one row short: a checkpoint that does not hold what its
    config's model does; the tensor's name."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    name = next(k for k, v in tensors.items() if v.dim() == 2 and "embed" not in k)
    if cut_a_row:
        tensors[name] = tensors[name][:-1].clone()
    else:
        del tensors[name]
        index = path.parent / "model.safetensors.index.json"
        if index.is_file():  # a sharded checkpoint: its index no longer names it either
            saved = json.loads(index.read_text())
            del saved["weight_map"][name]
            index.write_text(json.dumps(saved))
    save_file(tensors, path, metadata={"format": "pt"})
    return name


def claim_a_huge_header(path: Path) -> None:
    """Rewrite a safetensors file's header length as 2**62 bytes (a damaged file)."""
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**62) + data[8:])


def without_permission_override() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: the child, even as root, obeys file permissions. Root reads
    and writes any file through two capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH); dropped from the
    bounding set before `exec`, the program run has neither. A user that is not root needs nothing."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


PR_CAPBSET_DROP = 24  # <linux/prctl.h>
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # <linux/capability.h>

# `inloop-eval <args>` under a file-size limit (its first argument, in bytes): a disk that fills, for files
# past that size; SIGXFSZ ignored so that a write fails (EFBIG) instead of killing the process.
FILE_SIZE_LIMIT = """
import resource, signal, sys
from inloop_eval.cli.main import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[2:]))
"""


def watch_cli(
    *args: str, file_size_limit: int | None = None, obey_permissions: bool = False, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`inloop-eval watch <args>` in another process, as a user runs it; with `file_size_limit`, under that
    limit (FILE_SIZE_LIMIT); with `obey_permissions`, unable to read or write what file permissions forbid,
    even as root (`without_permission_override`)."""
    from workers.launch import REPO, worker_env

    command = [sys.executable, "-m", "inloop_eval.cli", "watch", *args]
    if file_size_limit is not None:
        command = [sys.executable, "-c", FILE_SIZE_LIMIT, str(file_size_limit), "watch", *args]
    return subprocess.run(
        command,
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=without_permission_override if obey_permissions else None,
    )
