"""The watch loop: look at the checkpoint folder, evaluate each checkpoint once it has landed, log its
figures at its training step, remember what was done; again every `poll_s` seconds.

    Watcher(WatchConfig(checkpoint_dir=..., run_dir=...), evaluator_config).run()

What it promises:
- never a partial checkpoint: only one whose completion evidence is there and which has stayed unchanged
  for `settle_s` (`completion`); one deleted or rewritten while being read (an exception while loading, or
  its files changed between before and after) is logged and skipped, nothing logged for it;
- exactly once: what is done is read back from the run directory at start (`ledger`), so a restarted
  watcher evaluates no step twice and skips none (policy `all`); policy `latest` evaluates the newest and
  records the ones it passes over as skipped; a step the training loop evaluated is not redone unless
  `redo_in_loop`;
- the same figures and files as in the loop: the same `InLoopEvaluator` config, `run_and_log`'s figures
  (with `eval/seconds` and `eval/tokens_forwarded`), `metrics.jsonl` and `outcomes/step_<N>.npz` through
  `JSONLLogger`, W&B through `WandbLogger`, keyed by the checkpoint's step. The order is outcomes, then
  the other loggers (W&B), then the `metrics.jsonl` line, which commits the step (`ledger`);
- one model in memory at a time, dropped before the next is loaded;
- under torchrun every rank loads the checkpoint and the evaluator shards the documents over the ranks;
  rank 0 decides what to evaluate (its decisions are broadcast) and alone writes; a load that fails on any
  rank is skipped by all.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from inloop_eval.data.root import default_data_root
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.distributed import all_reduce_max, world
from inloop_eval.engine.adapters.logits import input_embedding_rows
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import run_and_log
from inloop_eval.keys import SECONDS_KEY
from inloop_eval.loggers import CONFIG_FILE, JSONLLogger, MetricsLogger
from inloop_eval.watch.completion import Settling, fingerprint
from inloop_eval.watch.config import WatchConfig
from inloop_eval.watch.discovery import HF, Checkpoint, WatchError, discover, no_checkpoint_error
from inloop_eval.watch.ledger import EVALUATED, FAILED, IN_LOOP, SKIPPED, STARTED, VANISHED, History, Ledger
from inloop_eval.watch.loading import evaluated_in_loop, load_model, recorded_vocabulary, vocabulary_mismatch

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """One pass's decisions (rank 0's, broadcast): what to evaluate, what to record as not evaluated, and
    whether the watcher is done."""

    evaluate: list[Checkpoint] = field(default_factory=list)
    skip: list[tuple[Checkpoint, str, str]] = field(default_factory=list)  # (checkpoint, status, reason)
    finished: bool = False


class Watcher:
    """Evaluates every checkpoint in `config.checkpoint_dir` once it has landed (see the module docstring).

    evaluator_config: the in-loop evaluator's config (its `eval_interval` is not used: every checkpoint
        counts). tokenizer: passed to `InLoopEvaluator`; None: the config's `tokenizer:`, else a Hugging
        Face checkpoint's own. loggers: more loggers (e.g. a `WandbLogger`), each called before the
        `metrics.jsonl` line; the caller finishes them.
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
        self.evaluator: InLoopEvaluator | None = None
        self.folder = Path(config.checkpoint_dir)
        self.run_dir = Path(config.run_dir)
        self.rank0 = world()[1] == 0
        self.device = torch.device(config.device) if config.device else default_device()
        self.settling = Settling(config.settle_s)
        self.ledger = Ledger(self.run_dir) if self.rank0 else None
        self.history = self.ledger.history() if self.ledger else History()
        self.jsonl = JSONLLogger(self.run_dir)
        self.loggers = list(loggers or [])
        self.failed: set[tuple[int, str]] = set()  # (step, path) that failed to load in this process
        self.vocab_checked = False
        self.said_waiting = False
        self.evaluated: list[int] = []
        if self.rank0 and not (self.run_dir / CONFIG_FILE).is_file():
            self.jsonl.log_config(evaluator_config)  # an in-loop run's own config.json stays as it is

    def run(self) -> list[int]:
        """Watch until `once` has evaluated what is there, or `until_step` is handled; the steps evaluated."""
        try:
            while True:
                plan = self.broadcast(self.plan() if self.rank0 else None)
                for checkpoint, status, reason in plan.skip:
                    self.record(status, checkpoint, reason=reason)
                    log.info(
                        "watch: step %d (%s) not evaluated: %s", checkpoint.step, checkpoint.path, reason
                    )
                for checkpoint in plan.evaluate:
                    self.evaluate(checkpoint)
                # Finished only after a pass with nothing to evaluate: what this pass evaluated (or found
                # vanished, or rewritten) is in the history the next pass reads.
                if plan.finished and not plan.evaluate:
                    return self.evaluated
                if not plan.evaluate:
                    time.sleep(self.config.poll_s if not self.config.once else min(self.config.poll_s, 0.5))
        finally:
            self.close()

    def plan(self) -> Plan:
        """Rank 0: what this pass evaluates and records, from the folder and the run directory."""
        found = self.discovered()
        plan = Plan()
        pending = [c for c in found if not self.history.done(c.step, redo_in_loop=self.config.redo_in_loop)]
        ready, waiting = self.ready_among(pending, plan)
        plan.evaluate = self.by_policy(ready, pending, plan)
        self.finish(plan, found, pending, waiting)
        return plan

    def discovered(self) -> list[Checkpoint]:
        """The checkpoints in the folder; an error for a folder that cannot hold any (or none with `once`)."""
        config = self.config
        found = discover(self.folder, (config.format,) if config.format else None)
        if not found:
            error = no_checkpoint_error(self.folder)
            # Watching, an empty folder is training that has not saved yet; one whose sub-folder holds the
            # checkpoints is the wrong folder, which waiting would never mend.
            if config.once or "watch that folder" in str(error):
                raise error
            if not self.said_waiting:
                log.info("watch: no checkpoint in %s yet; looking every %g s", self.folder, config.poll_s)
                self.said_waiting = True
        return found

    def ready_among(self, pending: list[Checkpoint], plan: Plan) -> tuple[list[Checkpoint], bool]:
        """The pending checkpoints complete and settled, and whether one is still being written; those the
        training loop evaluated itself go to `plan.skip`."""
        config, now = self.config, time.monotonic()
        ready: list[Checkpoint] = []
        waiting = False
        for checkpoint in pending:
            if (checkpoint.step, str(checkpoint.path)) in self.failed:
                continue
            if not config.redo_in_loop and evaluated_in_loop(checkpoint):
                self.history.in_loop.add(checkpoint.step)
                plan.skip.append(
                    (checkpoint, IN_LOOP, "the training loop evaluated this step (its checkpoint says so)")
                )
                continue
            is_ready, why = self.settling.ready(checkpoint, now, needs_config=not config.model_builder)
            if is_ready:
                ready.append(checkpoint)
            else:
                waiting |= why.startswith(("changed", "unchanged"))
                log.debug("watch: step %d not ready: %s", checkpoint.step, why)
        return ready, waiting

    def by_policy(self, ready: list[Checkpoint], pending: list[Checkpoint], plan: Plan) -> list[Checkpoint]:
        """What to evaluate of `ready`: all of it (policy `all`), or the newest, the older ones recorded as
        skipped (policy `latest`)."""
        if self.config.policy != "latest" or not ready:
            return ready
        newest = ready[-1]
        for checkpoint in pending:
            if checkpoint.step < newest.step and checkpoint not in [s[0] for s in plan.skip]:
                reason = f"policy latest: step {newest.step} was ready, evaluated instead"
                plan.skip.append((checkpoint, SKIPPED, reason))
                self.history.skipped.add(checkpoint.step)
        return [newest]

    def finish(self, plan: Plan, found: list[Checkpoint], pending: list[Checkpoint], waiting: bool) -> None:
        """Whether the watch ends after this pass: `until_step` handled with nothing before it left, or
        `once` with nothing still being written."""
        config = self.config
        handled = {c.step for c in found if self.history.done(c.step, redo_in_loop=config.redo_in_loop)}
        handled |= {c.step for c in plan.evaluate} | {c.step for c, _, _ in plan.skip} | {s for s, _ in self.failed}
        if config.until_step is not None and any(step >= config.until_step for step in handled):
            # Done when the last step is handled and nothing before it is left (policy `all` may evaluate
            # a later checkpoint while an earlier one is still settling).
            plan.finished = all(c.step in handled for c in found if c.step <= config.until_step)
        if config.once and not waiting:
            left = [c for c in pending if c.step not in handled]
            for checkpoint in left if not plan.evaluate else []:
                log.warning(
                    "watch --once: step %d at %s is incomplete, not evaluated", checkpoint.step, checkpoint.path
                )
            plan.finished = True

    def broadcast(self, plan: Plan | None) -> Plan:
        if world()[0] == 1:
            assert plan is not None
            return plan
        box = [plan]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def record(self, status: str, checkpoint: Checkpoint, **extra: Any) -> None:
        if self.ledger is not None:
            self.ledger.record(status, checkpoint, **extra)

    def evaluate(self, checkpoint: Checkpoint) -> None:
        """Load, check, evaluate and log one checkpoint; a checkpoint that vanishes or fails is skipped."""
        self.record(STARTED, checkpoint)
        log.info("watch: evaluating step %d from %s", checkpoint.step, checkpoint.path)
        before = fingerprint(checkpoint.path)
        model, error = None, None
        try:
            model = load_model(checkpoint, self.device, self.config.model_builder)
        except WatchError:
            raise
        except Exception as exc:  # a partial or vanished read raises anything: OSError, DCP's, safetensors'
            error = exc
        after = fingerprint(checkpoint.path)
        vanished = all_reduce_max(int(after is None or after != before))
        failed = all_reduce_max(int(error is not None))
        if vanished or failed:
            del model
            gc.collect()
            self.settling.forget(checkpoint)
            if vanished:
                log.warning(
                    "watch: step %d: %s was deleted or rewritten while being read (%s); skipped, nothing logged",
                    checkpoint.step,
                    checkpoint.path,
                    error or "its files changed",
                )
                self.record(VANISHED, checkpoint, reason=str(error or "files changed while read"))
            else:
                log.error(
                    "watch: step %d: cannot load %s (%s: %s); skipped",
                    checkpoint.step,
                    checkpoint.path,
                    type(error).__name__,
                    error,
                )
                self.failed.add((checkpoint.step, str(checkpoint.path)))
                self.record(FAILED, checkpoint, reason=f"{type(error).__name__}: {error}")
            return
        evaluator = self.evaluator_for(checkpoint)
        self.check_vocabulary(checkpoint, model, evaluator)
        metrics = run_and_log(evaluator, model, checkpoint.step)
        del model
        gc.collect()
        self.log(evaluator, metrics, checkpoint.step)
        self.record(EVALUATED, checkpoint, files=len(before or {}), seconds=metrics.get(SECONDS_KEY))
        self.history.by_watcher.add(checkpoint.step)
        self.evaluated.append(checkpoint.step)

    def log(self, evaluator: InLoopEvaluator, metrics: dict[str, float], step: int) -> None:
        """Outcomes, then the other loggers, then the `metrics.jsonl` line that commits the step."""
        outcomes = evaluator.outcomes()
        if outcomes:
            self.jsonl.log_outcomes(outcomes, step)
        for logger in self.loggers:
            logger.log(metrics, step)
        self.jsonl.log(metrics, step)

    def evaluator_for(self, checkpoint: Checkpoint) -> InLoopEvaluator:
        """The evaluator, built at the first checkpoint (a Hugging Face checkpoint's tokenizer when the config
        names none), reused for every later one (requests tokenized once)."""
        if self.evaluator is None:
            tokenizer = self.tokenizer
            if tokenizer is None and not self.evaluator_config.tokenizer:
                if checkpoint.format != HF or not (checkpoint.path / "tokenizer.json").is_file():
                    raise WatchError(
                        f"watch: the evaluator config names no `tokenizer:` and {checkpoint.path} holds none; "
                        "set `tokenizer:` in the config or pass --tokenizer"
                    )
                root = Path(self.evaluator_config.data_root or default_data_root()).expanduser()
                tokenizer = find_and_load_tokenizer(checkpoint.path, root)
            self.evaluator = InLoopEvaluator(self.evaluator_config, tokenizer=tokenizer)
        return self.evaluator

    def check_vocabulary(self, checkpoint: Checkpoint, model: Any, evaluator: InLoopEvaluator) -> None:
        """WatchError, before the first forward, for a tokenizer that does not fit the checkpoint: ids past
        the model's embedding, or another vocabulary size than the tokenizer the checkpoint records."""
        if self.vocab_checked:
            return
        size = getattr(evaluator.tokenizer, "vocab_size", None)
        rows = input_embedding_rows(model)
        name = getattr(evaluator.tokenizer, "name", None) or self.evaluator_config.tokenizer
        if isinstance(size, int) and rows is not None and size > rows:
            raise WatchError(
                f"watch: the tokenizer {name} has {size} tokens but the model of {checkpoint.path} embeds "
                f"{rows}: ids past {rows - 1} cannot be fed to it; set the config's `tokenizer:` to the one "
                "the model was trained with"
            )
        recorded = recorded_vocabulary(checkpoint)
        mismatch = vocabulary_mismatch(evaluator.tokenizer, recorded) if recorded is not None else None
        if mismatch:
            raise WatchError(
                f"watch: the tokenizer {name} does not match the one {checkpoint.path} was trained with: "
                f"{mismatch}; set the config's `tokenizer:` to the checkpoint's"
            )
        self.vocab_checked = True

    def close(self) -> None:
        """Close the run directory's files; the `loggers` passed in stay open (their creator finishes them)."""
        self.jsonl.finish()
        if self.ledger is not None:
            self.ledger.close()


def default_device() -> torch.device:
    """cuda (this rank's under torchrun) if available, else cpu."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
