"""The watch loop: look at the checkpoint folder, evaluate each checkpoint once it has landed, log its
figures at its training step, remember what was done; again every `poll_s` seconds.

    Watcher(WatchConfig(checkpoint_dir=..., run_dir=...), evaluator_config).run()

What it promises:
- a step is done when its metrics line is in `metrics.jsonl`; anything else is tried again or recorded
  failed with the reason, and one bad checkpoint never stops the others: one that cannot be read (a missing
  shard, a damaged header, no read permission) is recorded failed and tried again once its files change or
  by a restarted watcher; one the config cannot take (a model of fewer positions than `max_length`, another
  vocabulary: checked at every checkpoint) is recorded failed and not tried again under the same config; a
  metrics line that could not be written (a full disk) leaves the step failed, to be evaluated again;
- never a partial checkpoint: only one whose completion evidence is there and which has stayed unchanged
  for `settle_s` (`completion`); one deleted or rewritten while being read is logged and skipped, nothing
  logged for it;
- exactly once: what is done is read back from the run directory at start (`ledger`), so a restarted
  watcher evaluates no step twice and skips none (policy `all`); policy `latest` evaluates the newest and
  records the ones it passes over as skipped; a step the training loop evaluated is not redone unless
  `redo_in_loop`; two folders naming one step are one step (`planning`);
- never a write into a run directory deleted under it: it stops with a `WatchError` (`run_directory`);
- the same figures and files as in the loop: the same `InLoopEvaluator` config, `run_and_log`'s figures
  (with `eval/seconds` and `eval/tokens_forwarded`), `metrics.jsonl` and `outcomes/step_<N>.npz` through
  `JSONLLogger`, W&B through `WandbLogger`, keyed by the checkpoint's step. The order is outcomes, then
  the other loggers (W&B), then the `metrics.jsonl` line, which commits the step (`ledger`); outcomes that
  could not be written (a full disk) leave the step failed, nothing else logged, to be evaluated again;
- triggered by the trainer too: with `events_dir`, a checkpoint announced by a ready event (`events`) is
  evaluated within `events_poll_s` of its event, the folder scanned only every `poll_s` seconds as the
  fallback; the event is recorded with the step's `started` entry; a duplicate event changes nothing;
- with `lease_s`, every checkpoint found and not yet evaluated is held by a lease beside it (`leases`),
  refreshed by a thread while the watcher lives, removed once the step is evaluated, skipped or failed for
  good, and when the watcher exits;
- one model in memory at a time, dropped before the next is loaded;
- under torchrun every rank loads the checkpoint and the evaluator shards the documents over the ranks, or,
  with a sharded `layout` (`--tp`, `--fsdp`), each rank loads its share of the model in that layout and the
  documents are sharded over its data-parallel ranks (`layout`); rank 0 decides what to evaluate (its
  decisions are broadcast) and alone writes; a load that fails on any rank is skipped by all; ranks that see
  different copies of a checkpoint (`completion.other_copies`) read none of it, every rank recording it
  failed, naming them.
Errors of the config or the task data, whatever the checkpoint (a task that does not exist, its data
missing, a model builder that cannot be imported), stop the watcher: no checkpoint could be evaluated.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from inloop_eval.checkpoints.builders import resolve_builder
from inloop_eval.checkpoints.formats import Checkpoint, LoadedModel, format_of
from inloop_eval.checkpoints.layout import layout_for
from inloop_eval.checkpoints.saved_shapes import shape_mismatch
from inloop_eval.checkpoints.shard_reads import ShardRead
from inloop_eval.data.root import default_data_root
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.distributed import all_reduce_max, world
from inloop_eval.engine.adapters.logits import input_embedding_rows
from inloop_eval.errors import (
    ConfigError,
    InLoopEvalError,
    LMDataError,
    ModelOutputError,
    RequestError,
    TaskDataError,
    TokenizerError,
)
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.measured import run_and_log
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.keys import SECONDS_KEY
from inloop_eval.loggers import CONFIG_FILE, JSONLLogger, MetricsLogger
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, step_path, write_step
from inloop_eval.watch.allocator import trim
from inloop_eval.watch.completion import Fingerprint, fingerprint, other_copies
from inloop_eval.watch.config import WatchConfig
from inloop_eval.watch.discovery import CheckpointUnfit, WatchError, refusal_at_start
from inloop_eval.watch.ledger import EVALUATED, FAILED, STARTED, VANISHED, History, Ledger, metrics_steps
from inloop_eval.watch.loading import load_model, recorded_vocabulary, vocabulary_mismatch
from inloop_eval.watch.planning import Plan, Planner, describe
from inloop_eval.watch.run_directory import RunDirectory
from inloop_eval.watch.summary import headline
from inloop_eval.watch.triggers import Triggers

log = logging.getLogger(__name__)

# What reading or evaluating one checkpoint may raise that stops only that checkpoint: anything a partial,
# damaged or unreadable file raises, and torch.distributed.checkpoint's CheckpointException (raised where
# OLMo-core's loader and torchtitan's read a DCP checkpoint), which derives from BaseException and so is not
# an Exception. Never KeyboardInterrupt or SystemExit.
READ_ERRORS = (Exception, CheckpointException)
# The config cannot take this checkpoint (its positions, its vocabulary): not tried again under this config.
UNFIT_ERRORS = (CheckpointUnfit, ConfigError, ModelOutputError, RequestError)
# The config or the task data is wrong whatever the checkpoint: the watcher stops.
STOP_ERRORS = (WatchError, TaskDataError, TokenizerError, LMDataError)


def config_fingerprint(evaluator_config: EvaluatorConfig, model_builder: str | None) -> str:
    """A short hash of what decides whether a checkpoint can be evaluated: the evaluator config and the
    model builder. A checkpoint one config could not take is tried again under another."""
    text = json.dumps(
        {"evaluation": evaluator_config.to_dict(), "model_builder": model_builder},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class Watcher:
    """Evaluates every checkpoint in `config.checkpoint_dir` once it has landed (see the module docstring).

    evaluator_config: the in-loop evaluator's config (its `eval_interval` is not used: every checkpoint
        counts). tokenizer: passed to `InLoopEvaluator`; None: the config's `tokenizer:`, else a Hugging
        Face checkpoint's own. loggers: more loggers (e.g. a `WandbLogger`), each called before the
        `metrics.jsonl` line; the caller finishes them.
    evaluated: the steps evaluated by `run`; failures: step -> why, for those that failed in it; reads:
        step -> what this rank read of its checkpoint in a sharded layout (`shard_reads`).
    """

    def __init__(
        self,
        config: WatchConfig,
        evaluator_config: EvaluatorConfig,
        *,
        tokenizer: TokenizerLike | None = None,
        loggers: list[MetricsLogger] | None = None,
    ) -> None:
        self.config = config
        self.evaluator_config = evaluator_config
        self.tokenizer = tokenizer
        self.run_dir = Path(config.run_dir)
        self.rank0 = world()[1] == 0
        self.device = torch.device(config.device) if config.device else default_device()
        self.layout = layout_for(config.tp, config.fsdp, self.device)
        if config.model_builder:
            resolve_builder(config.model_builder)  # a name that cannot be imported stops the watch at once
        self.config_id = config_fingerprint(evaluator_config, config.model_builder)
        # Built now when the tokenizer is known: a wrong task or tokenizer stops the watch before any read.
        self.evaluator = self.build_evaluator(tokenizer) if tokenizer or evaluator_config.tokenizer else None
        folder = Path(config.checkpoint_dir)
        formats = (config.format,) if config.format else None
        refusal = refusal_at_start(folder, formats, config.once) if self.rank0 else None
        if world()[0] > 1:  # every rank stops alike
            box = [refusal]
            dist.broadcast_object_list(box, src=0)
            refusal = box[0]
        if refusal is not None:
            raise WatchError(refusal)  # before the run directory is written: a failed start leaves nothing
        self.ledger = Ledger(self.run_dir) if self.rank0 else None
        try:
            self.jsonl = JSONLLogger(self.run_dir)
        except InLoopEvalError:
            if self.ledger is not None:
                self.ledger.close()
            raise
        self.run_directory = (
            RunDirectory(self.run_dir, [self.ledger.path, self.jsonl.path]) if self.ledger else None
        )
        self.history = self.ledger.history(self.config_id) if self.ledger else History()
        self.planner = Planner(config, self.history)
        self.triggers = Triggers(config, self.planner, self.history, self.run_dir, self.rank0)
        self.loggers = list(loggers or [])
        self.evaluated: list[int] = []
        self.failures: dict[int, str] = {}
        self.reads: dict[int, list[ShardRead]] = {}
        if self.rank0 and not (self.run_dir / CONFIG_FILE).is_file():
            self.jsonl.log_config(evaluator_config)  # an in-loop run's own config.json stays as it is

    def run(self) -> list[int]:
        """Watch until `once` has evaluated what is there, or `until_step` is handled; the steps evaluated."""
        self.triggers.start()
        try:
            while True:
                plan = self.broadcast(self.plan() if self.rank0 else None)
                if plan.error is not None:
                    raise WatchError(plan.error)
                for checkpoint, status, reason in plan.skip:
                    if status == FAILED:
                        self.fail(checkpoint, reason, retry=True)
                    else:
                        self.record(status, checkpoint, reason=reason)
                        log.info(
                            "watch: step %d (%s) not evaluated: %s", checkpoint.step, checkpoint.path, reason
                        )
                self.triggers.hold()
                for checkpoint in plan.evaluate:
                    self.evaluate(checkpoint)
                    self.triggers.hold()
                # Finished only after a pass with nothing to evaluate: what this pass evaluated (or found
                # vanished, or rewritten) is in the history the next pass reads.
                if plan.finished and not plan.evaluate:
                    return self.evaluated
                if not plan.evaluate:
                    time.sleep(self.triggers.pause_s())
        finally:
            self.close()

    def plan(self) -> Plan:
        """Rank 0: this pass's plan. Under torchrun an error that stops the watch goes to every rank in it."""
        try:
            self.check_run_directory()
            return self.planner.plan(self.triggers.announced(), scan=self.triggers.scan_due())
        except InLoopEvalError as exc:
            if world()[0] == 1:
                raise
            return Plan(error=str(exc))

    def broadcast(self, plan: Plan | None) -> Plan:
        if world()[0] == 1:
            assert plan is not None
            return plan
        box = [plan]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def record(self, status: str, checkpoint: Checkpoint, **extra: Any) -> None:
        if self.ledger is not None:
            self.check_run_directory()
            self.ledger.record(status, checkpoint, **extra)

    def check_run_directory(self) -> None:
        if self.run_directory is not None:
            self.run_directory.check()

    def evaluate(self, checkpoint: Checkpoint) -> None:
        """Load, check, evaluate and log one checkpoint; one that vanishes or fails is recorded and left."""
        event = self.planner.announced.get(checkpoint.path)
        trigger = (
            {"event": str(event.file), "run_id": event.run_id, "lineage_id": event.lineage_id}
            if event
            else {}
        )
        self.record(STARTED, checkpoint, **trigger)
        log.info("watch: evaluating step %d from %s", checkpoint.step, checkpoint.path)
        before = fingerprint(checkpoint.path)
        other = other_copies(checkpoint.path, before)
        if other is not None:
            self.fail(checkpoint, other, retry=True, files=before)
            return
        loaded, error = self.load(checkpoint)
        after = fingerprint(checkpoint.path)
        if all_reduce_max(int(after is None or after != before)):
            del loaded
            self.planner.settling.forget(checkpoint)
            log.warning(
                "watch: step %d: %s was deleted or rewritten while being read (%s); skipped, nothing logged",
                checkpoint.step,
                checkpoint.path,
                describe(error) if error else "its files changed",
            )
            self.record(VANISHED, checkpoint, reason=describe(error) if error else "files changed while read")
            return
        if all_reduce_max(int(error is not None)):
            reason = f"cannot load it: {describe(error)}" if error else "cannot load it on another rank"
            self.fail(checkpoint, reason, retry=not isinstance(error, UNFIT_ERRORS), files=before)
            return
        assert loaded is not None
        self.reads[checkpoint.step] = loaded.reads
        if loaded.reads:
            log.info(
                "watch: step %d: rank %d read %.2f of its model's %.2f MiB (%s)",
                checkpoint.step,
                world()[1],
                sum(r.nbytes for r in loaded.reads) / 2**20,
                loaded.whole / 2**20,
                self.layout.describe(),
            )
        metrics = self.evaluate_model(checkpoint, loaded, before)
        del loaded
        gc.collect()
        trim()  # the dropped model's memory back to the system before the next loads
        if metrics is not None:
            self.commit(checkpoint, metrics, before)

    def load(self, checkpoint: Checkpoint) -> tuple[LoadedModel | None, BaseException | None]:
        """The checkpoint's model, or the error its read raised (a partial or vanished read raises
        anything)."""
        try:
            return load_model(checkpoint, self.device, self.config.model_builder, self.layout), None
        except READ_ERRORS as exc:
            return None, shape_mismatch(exc, checkpoint) or exc  # a tensor of another shape: CheckpointDamaged

    def evaluate_model(
        self, checkpoint: Checkpoint, loaded: LoadedModel, files: Fingerprint | None
    ) -> dict[str, float] | None:
        """The checkpoint's figures; None, the failure recorded, when the config cannot take it or its
        evaluation fails."""
        try:
            evaluator = self.evaluator_for(checkpoint)
            self.check_vocabulary(checkpoint, loaded.model, evaluator)
            return run_and_log(
                evaluator, loaded.scored, checkpoint.step, dp_group=loaded.dp_group, in_training=False
            )
        except STOP_ERRORS:
            raise
        except UNFIT_ERRORS as exc:
            self.fail(checkpoint, f"the config cannot take it: {describe(exc)}", retry=False)
        except READ_ERRORS as exc:
            reason = f"its evaluation failed: {describe(exc)}"
            self.fail(checkpoint, reason, retry=True, files=files, trace=exc)
        return None

    def commit(self, checkpoint: Checkpoint, metrics: dict[str, float], files: Fingerprint | None) -> None:
        """Outcomes, then the other loggers, then the `metrics.jsonl` line, which alone makes the step done:
        outcomes or a line that did not land (a full disk, a file size limit) leave the step failed, tried
        again."""
        step = checkpoint.step
        evaluator = self.evaluator
        assert evaluator is not None
        if not self.rank0:
            self.log(evaluator, metrics, step)
            self.evaluated.append(step)
            return
        self.check_run_directory()
        lines_before = metrics_steps(self.run_dir).get(step, 0)
        unwritten = self.log(evaluator, metrics, step)
        if unwritten is not None:
            reason = f"{unwritten}; nothing else logged, to evaluate it again; figures: {headline(metrics)}"
            self.fail(checkpoint, reason, retry=True, files=files)
            return
        if metrics_steps(self.run_dir).get(step, 0) <= lines_before:
            reason = (
                f"its metrics line was not written to {self.jsonl.path} (a full disk or a file size limit? "
                "see "
                f"the warning above); its figures: {headline(metrics)}"
            )
            self.fail(checkpoint, reason, retry=True, files=files)
            return
        self.record(EVALUATED, checkpoint, files=len(files or {}), seconds=metrics.get(SECONDS_KEY))
        self.history.by_watcher.add(step)
        self.evaluated.append(step)
        log.info("watch: step %d in %s: %s", step, self.jsonl.path, headline(metrics))

    def fail(
        self,
        checkpoint: Checkpoint,
        reason: str,
        *,
        retry: bool,
        files: Fingerprint | None = None,
        trace: BaseException | None = None,
    ) -> None:
        """Record `checkpoint` failed: with `retry`, tried again once its files (`files` when read) change or
        by a restarted watcher; without, not again under this config. trace: an error whose traceback the
        log shows (an evaluation that failed unexpectedly; a read's failure is its message)."""
        self.planner.settling.forget(checkpoint)
        self.failures[checkpoint.step] = reason
        if retry:
            self.planner.fail(checkpoint, files)
        else:
            self.history.refused.add(checkpoint.step)
        then = (
            "tried again when its files change or by a restarted watcher"
            if retry
            else "not tried again under this config"
        )
        log.error(
            "watch: step %d (%s) failed, %s: %s",
            checkpoint.step,
            checkpoint.path,
            then,
            reason,
            exc_info=trace,
        )
        extra = {} if retry else {"config": self.config_id}
        self.record(FAILED, checkpoint, reason=reason, retry=retry, **extra)

    def log(self, evaluator: InLoopEvaluator, metrics: dict[str, float], step: int) -> str | None:
        """Outcomes, then the other loggers, then the `metrics.jsonl` line that commits the step; why the
        outcomes could not be written (rank 0), when they could not: then nothing else is logged, and the
        step stays uncommitted rather than done without them."""
        outcomes = evaluator.outcomes()
        if outcomes and self.rank0:
            directory = self.run_dir / OUTCOMES_DIR
            try:
                write_step(directory, outcomes, step)
            except (OSError, ValueError, TypeError) as exc:
                notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", []))
                where, error = step_path(directory, step), f"{type(exc).__name__}: {exc}"
                return f"its per-document outcomes were not written to {where} ({error}){notes}"
        for logger in self.loggers:
            logger.log(metrics, step)
        self.check_run_directory()
        self.jsonl.log(metrics, step)
        return None

    def build_evaluator(self, tokenizer: TokenizerLike | None) -> InLoopEvaluator:
        return InLoopEvaluator(self.evaluator_config, tokenizer=tokenizer)

    def evaluator_for(self, checkpoint: Checkpoint) -> InLoopEvaluator:
        """The evaluator, built at the first checkpoint when the config names no tokenizer (a Hugging Face
        checkpoint's own), reused for every later one (requests tokenized once)."""
        if self.evaluator is None:
            own = format_of(checkpoint).own_tokenizer(checkpoint.path)
            if own is None:
                raise CheckpointUnfit(
                    f"watch: the evaluator config names no `tokenizer:` and {checkpoint.path} holds none; "
                    "set `tokenizer:` in the config or pass --tokenizer"
                )
            root = Path(self.evaluator_config.data_root or default_data_root()).expanduser()
            self.evaluator = self.build_evaluator(find_and_load_tokenizer(checkpoint.path, root))
        return self.evaluator

    def check_vocabulary(self, checkpoint: Checkpoint, model: Any, evaluator: InLoopEvaluator) -> None:
        """CheckpointUnfit, before any forward, for a tokenizer that does not fit this checkpoint: ids past
        the model's embedding, or another vocabulary than the tokenizer the checkpoint records. Every
        checkpoint is checked: a later one may come from another tokenizer."""
        size = getattr(evaluator.tokenizer, "vocab_size", None)
        rows = input_embedding_rows(model)
        name = getattr(evaluator.tokenizer, "name", None) or self.evaluator_config.tokenizer
        if isinstance(size, int) and rows is not None and size > rows:
            raise CheckpointUnfit(
                f"watch: the tokenizer {name} has {size} tokens but the model of {checkpoint.path} embeds "
                f"{rows}: ids past {rows - 1} cannot be fed to it; set the config's `tokenizer:` to the one "
                "the model was trained with"
            )
        recorded = recorded_vocabulary(checkpoint)
        mismatch = vocabulary_mismatch(evaluator.tokenizer, recorded) if recorded is not None else None
        if mismatch:
            raise CheckpointUnfit(
                f"watch: the tokenizer {name} does not match the one {checkpoint.path} was trained with: "
                f"{mismatch}; set the config's `tokenizer:` to the checkpoint's"
            )

    def close(self) -> None:
        """Close the run directory's files; the `loggers` passed in stay open (their creator finishes
        them); release every lease."""
        self.triggers.stop()
        self.jsonl.finish()
        if self.ledger is not None:
            self.ledger.close()


def default_device() -> torch.device:
    """cuda (this rank's under torchrun) if available, else cpu."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
