"""`run_and_log` and `EvalSchedule`, what every trainer callback shares: the cost figures (wall time, tokens
forwarded) added to the evaluator's, and a schedule that never evaluates twice at one step."""

from __future__ import annotations

import time

import torch
from helpers import small_evaluator
from lm_helpers import lm_entry, tiny_gpt, write_domains

from inloop_eval.engine.adapters.logits import LogitsAdapter
from inloop_eval.engine.batching import BatchShape
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.evaluators.perplexity import plan_sequences
from inloop_eval.integrations import SECONDS_KEY, TOKENS_KEY, EvalSchedule, run_and_log
from inloop_eval.keys import INTERVAL_KEY, interval_key
from inloop_eval.loggers import JSONLLogger
from inloop_eval.models.gpt import GPT, GPTConfig


def test_run_and_log_adds_wall_time_and_tokens_forwarded(data_root, neox_tokenizer, tmp_path):
    evaluator = small_evaluator(data_root, neox_tokenizer, tasks=("piqa", f"harness:{tmp_path / 'missing.yaml'}"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256))
    logger = JSONLLogger(tmp_path)
    metrics = run_and_log(evaluator, model, step=7, logger=logger)
    logger.finish()
    assert metrics[SECONDS_KEY] > 0
    assert metrics[TOKENS_KEY] == evaluator.detail("piqa").scores.tokens_forwarded > 0
    assert metrics[f"eval/downstream/harness:{tmp_path / 'missing.yaml'}/failed"] == 1.0
    again = run_and_log(evaluator, model, step=8)
    assert again[TOKENS_KEY] == metrics[TOKENS_KEY]  # each evaluation counts its own forwards only
    assert '"step": 7' in (tmp_path / "metrics.jsonl").read_text()


def test_from_the_second_evaluation_the_training_between_evaluations_is_logged(data_root, neox_tokenizer):
    """`eval/interval_seconds`: the wall time from one evaluation's end to the next one's start (the training
    between them, here a sleep), per prefix; none at the first, none where evaluations do not take turns with
    training (a watcher of checkpoints)."""
    evaluator = small_evaluator(data_root, neox_tokenizer, tasks=("piqa",))
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256))
    t0 = time.perf_counter()
    first = run_and_log(evaluator, model, step=1)
    t1 = time.perf_counter()
    assert INTERVAL_KEY not in first
    time.sleep(0.3)
    t2 = time.perf_counter()
    second = run_and_log(evaluator, model, step=2)
    t3 = time.perf_counter()
    # The first ended within [t0, t1], the second started within [t2, t3 - its own seconds].
    assert 0.3 <= t2 - t1 <= second[INTERVAL_KEY] <= t3 - second[SECONDS_KEY] - t0
    merged = run_and_log(evaluator, model, step=2, prefix="eval/merged")
    assert interval_key("eval/merged") not in merged  # its own first under that prefix
    watched = run_and_log(evaluator, model, step=3, in_training=False)
    assert INTERVAL_KEY not in watched


def test_tokens_forwarded_count_the_perplexity_domains_too(data_root, neox_tokenizer, tmp_path):
    """`eval/tokens_forwarded` is the downstream tasks' padded tokens plus the lm entries' (every batch's
    B x T, counted again from the planned batches here)."""
    files = write_domains(tmp_path / "domains", neox_tokenizer)
    evaluators = [
        {"task": "piqa", "limit": 4, "batch_tokens": 1024},
        lm_entry(files, tmp_path / "cache", max_tokens=500),
    ]
    config = EvaluatorConfig(evaluators=evaluators, data_root=str(data_root), strict=True)
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    metrics = run_and_log(evaluator, tiny_gpt(), step=1)
    lm_result = evaluator.detail("lm:" + ",".join(d["label"] for d in evaluators[1]["domains"]))
    lm_config = evaluator.config.evaluators[1]
    planned = plan_sequences(lm_result.domains, lm_result.shard, lm_config, BatchShape())
    assert lm_result.tokens_forwarded == sum(b.input_ids_BT.size for b in planned) > 0
    downstream = evaluator.detail("piqa").scores.tokens_forwarded
    assert metrics[TOKENS_KEY] == downstream + lm_result.tokens_forwarded


def test_schedule_is_due_at_accepted_steps_and_never_twice_at_one():
    class EveryOtherStep:
        def should_run(self, step: int) -> bool:
            return step % 2 == 0

    schedule = EvalSchedule(EveryOtherStep())
    assert [schedule.due(step) for step in (0, 0, 1, 2, 2, 3)] == [True, False, False, True, False, False]
    assert schedule.due(3, forced=True) and not schedule.due(3, forced=True) and not schedule.due(3)


def test_tokens_forwarded_count_the_forwards_of_a_task_that_then_failed(data_root, neox_tokenizer):
    """A task whose model call fails after some forwards reports failed = 1, and the forwards that ran are
    still counted in `eval/tokens_forwarded` (the cost was paid)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256))
    calls = []

    def failing_second_call(input_ids):
        calls.append(input_ids.numel())
        if len(calls) == 2:
            raise RuntimeError("the second forward fails")
        return model(input_ids)

    config = EvaluatorConfig(
        evaluators=[{"task": "piqa", "limit": 8, "batch_tokens": 128}], data_root=str(data_root)
    )
    evaluator = InLoopEvaluator(config, tokenizer=neox_tokenizer)
    metrics = run_and_log(evaluator, LogitsAdapter(failing_second_call, max_length=256), step=1)
    assert metrics["eval/downstream/piqa/failed"] == 1.0
    assert len(calls) == 2
    assert metrics[TOKENS_KEY] == calls[0] > 0
