"""Checkpoints for the watcher's tests, written the way each framework writes them: a real OLMo-core
`Trainer` (with its `ConfigSaverCallback`), Hugging Face `save_pretrained` with sharded safetensors, and the
evaluator config the in-loop callback runs, so that the watcher's figures can be compared with it."""

from __future__ import annotations

import json
import shutil
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
    work: Path, data_root: Path, *, steps: int, save_interval: int, in_loop: bool, **fields: Any
) -> dict[str, Any]:
    """The tiny OLMo-core model trained by the real `Trainer`, a checkpoint every `save_interval` steps in
    `<work>/save/step<N>/`, with OLMo-core's `ConfigSaverCallback` writing the experiment config (`model`,
    `dataset.tokenizer`) into each; with `in_loop`, evaluated in the loop at every checkpoint step. What
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
        extra_callbacks={"config_saver": ConfigSaverCallback()},
        fit=False,
        **fields,
    )
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
