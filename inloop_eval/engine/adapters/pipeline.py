"""Scoring a model split into pipeline stages: the schedule run forward only, the targets scored on the last
stage, and only their [N] figures sent to the other stages.

What every rank of a pipeline group promises (the evaluator keeps it, as for any model-parallel group,
`inloop_eval.distributed`): the same batches in the same order, because the data-parallel group given to
`InLoopEvaluator.run` holds one rank of each pipeline group, so its peers are handed the same documents.
Every batch is then cut into schedule steps of the schedule's fixed shape, `batch_rows` x `seq_len` (right
padding, and rows of padding for a short last step, neither seen by a real position under causal
attention), and every rank calls `schedule.eval` once per step. The rank holding the last stage selects the
logits at the positions read, scores the targets there (`outputs.projected_head.token_logprobs`, the one-process code) and
broadcasts a status, the log-probabilities and the greedy flags over the pipeline group: 2N + 1 floats per
batch. A failure to score on the last stage (logits of the wrong shape, narrower than the tokenizer's
vocabulary) is broadcast too, and every rank raises the same `ModelOutputError`.

Training is left as it was: torch's `eval()` runs the training schedule without backward and restores its
mode (its stages re-initialise their buffers at the next training step, as torch does at every switch); the
stage modules are put in eval mode, and the RNG streams restored, by `training_state.training_untouched`.
A schedule built with a loss function computes it in `eval()` too; it is given a target of zeros of the
step's shape, and its value is discarded.
Legend: B rows of a planned batch, R rows of a schedule step, T the step's sequence length, U distinct
positions read, N targets, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from inloop_eval.engine.adapter import AdapterNeeds, ForwardInputs, HeadWorkspace, ModelAdapter, ModelOutputs
from inloop_eval.engine.adapters.logits import input_embedding_rows
from inloop_eval.engine.outputs.pipeline_stage import ScoredTargets, share_from_last_stage
from inloop_eval.engine.outputs.projected_head import token_logprobs
from inloop_eval.errors import ConfigError, ModelOutputError


def _identity(x: Tensor) -> Tensor:
    return x


class PipelineAdapter(ModelAdapter):
    """A model split into pipeline stages (`torch.distributed.pipelining`), scored through the schedule it
    trains with. Every rank of the pipeline group builds one, with its own stages, and passes it as the
    model to `InLoopEvaluator.run(adapter, dp_group=...)` (the data-parallel group is required: it must hold
    one rank of each pipeline group).

    schedule: the pipeline schedule, any of torch's with `eval()` (tested: `ScheduleGPipe`, and
        `Schedule1F1B` built with a loss function); its `eval()` is called once per step. The last stage
        returns logits [rows, T, V] (or an object with `.logits`).
    stages: this rank's `PipelineStage`s of that schedule.
    batch_rows: rows of every step (the schedule's micro-batches together), at least its micro-batch count.
    seq_len: tokens per row of every step; also the longest request scored (`max_length`).
    pad_id: the token id of padding.
    vocab_size: token ids the first stage can embed; by default the rows of its input embedding.
    """

    def __init__(
        self,
        schedule: Any,
        stages: Sequence[Any],
        *,
        batch_rows: int,
        seq_len: int,
        pad_id: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        agree_step_shape(schedule, stages, batch_rows, seq_len)
        super().__init__(nn.ModuleList(stage.submod for stage in stages))
        self.schedule = schedule
        self.stages = list(stages)
        self.batch_rows = batch_rows
        self.max_length = seq_len
        self.pad_id = pad_id
        self.group: ProcessGroup | None = self.stages[0].group
        self.has_first = any(stage.is_first for stage in self.stages)
        self.has_last = any(stage.is_last for stage in self.stages)
        self.last_rank, self.vocab_size = self._agree_stages(vocab_size)
        self.workspace = HeadWorkspace()

    def _agree_stages(self, vocab_size: int | None) -> tuple[int, int]:
        """(group rank of the last stage, vocabulary): one all-reduce over the pipeline group."""
        embedded = input_embedding_rows(self.model[0]) if self.has_first else None
        rank = dist.get_rank(self.group)
        mine = torch.tensor(
            [rank if self.has_last else -1, embedded or -1], dtype=torch.int64, device=self.device
        )
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self.group)
        last_rank, rows = int(mine[0]), int(mine[1])
        if last_rank < 0:
            raise ConfigError("PipelineAdapter: no rank of the pipeline group holds the last stage")
        if vocab_size is None and rows < 0:
            raise ConfigError(
                "PipelineAdapter: the first stage has no nn.Embedding to read the vocabulary from; pass "
                "vocab_size= (the token ids the model can embed)"
            )
        return last_rank, vocab_size if vocab_size is not None else rows

    @property
    def needs(self) -> AdapterNeeds:
        return AdapterNeeds(peer_groups=(("pipeline", self.group),))

    def tokens_fed(self, inputs: ForwardInputs) -> int:
        """Every schedule step carries `batch_rows` x `seq_len` tokens, however narrow the batch."""
        steps = -(-inputs.input_ids_BT.shape[0] // self.batch_rows)
        return steps * self.batch_rows * self.max_length

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        """log p(target) [N] and greedy flags [N] on every rank of the pipeline group, scored on the last
        stage from the logits of the positions read (`inputs.rows_U`, `cols_U`)."""
        input_ids_BT, rows_U, cols_U = inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        n_rows, width = input_ids_BT.shape
        if width > self.max_length:
            raise ModelOutputError(
                f"PipelineAdapter: a batch of width {width} is wider than the schedule's seq_len "
                f"{self.max_length}"
            )
        selected_UV: Tensor | None = None
        failure = ""
        for start in range(0, n_rows, self.batch_rows):
            logits_RTV = self._step(input_ids_BT[start : start + self.batch_rows])
            if not self.has_last or failure:
                continue
            failure = self._check_output(logits_RTV)
            if failure:
                continue
            if selected_UV is None:
                selected_UV = logits_RTV.new_empty(rows_U.shape[0], logits_RTV.shape[-1])
            in_step_U = (rows_U >= start) & (rows_U < start + self.batch_rows)
            selected_UV[in_step_U] = logits_RTV[rows_U[in_step_U] - start, cols_U[in_step_U]]
        target_N = inputs.target_N
        scores_2N = torch.zeros(1 + 2 * target_N.shape[0], dtype=torch.float32, device=self.device)
        if self.has_last and not failure:
            try:
                assert selected_UV is not None  # at least one step ran
                logp_N, greedy_N = token_logprobs(
                    selected_UV, _identity, target_N, inputs.min_vocab, inputs.position_N, self.workspace,
                    inputs.host_targets,
                )
                scores_2N[0] = 1.0
                scores_2N[1:] = torch.cat([logp_N.float(), greedy_N.float()])
            except ModelOutputError as exc:
                failure = str(exc)
        logp_N, greedy_N = share_from_last_stage(scores_2N, failure, self.group, self.last_rank)
        return ScoredTargets(logp_N, greedy_N, self.vocab_size)

    def _step(self, input_ids_RT: Tensor) -> Any:
        """One forward-only run of the schedule on rows padded to [batch_rows, seq_len]; the last stage's
        output on its rank, None elsewhere."""
        padded_RT = torch.full(
            (self.batch_rows, self.max_length), self.pad_id, dtype=input_ids_RT.dtype, device=self.device
        )
        padded_RT[: input_ids_RT.shape[0], : input_ids_RT.shape[1]] = input_ids_RT
        args = (padded_RT,) if self.has_first else ()
        target = torch.zeros_like(padded_RT) if self.has_last else None
        out = self.schedule.eval(*args, target=target)
        return getattr(out, "logits", out)

    def _check_output(self, logits_RTV: Any) -> str:
        """'' when the last stage's output is logits [batch_rows, seq_len, V]; else what was found."""
        expected = (self.batch_rows, self.max_length)
        if isinstance(logits_RTV, Tensor) and logits_RTV.dim() == 3 and logits_RTV.shape[:2] == expected:
            return ""
        found = tuple(logits_RTV.shape) if isinstance(logits_RTV, Tensor) else type(logits_RTV).__name__
        return (
            f"pipeline output: expected the last stage to return logits of shape [{expected[0]}, "
            f"{expected[1]}, V] (a tensor or an object with .logits), found {found}"
        )


def step_shape_problem(schedule: Any, stages: Sequence[Any], batch_rows: int, seq_len: int) -> str:
    """Why this rank's pipeline arguments cannot run, or ''."""
    if not stages:
        return "stages is empty; pass this rank's PipelineStage(s)"
    if batch_rows < 1 or seq_len < 2:
        return (
            f"expected batch_rows >= 1 and seq_len >= 2 (the schedule's step shape), found batch_rows={batch_rows}, "
            f"seq_len={seq_len}"
        )
    micro = getattr(schedule, "_n_microbatches", None)
    if isinstance(micro, int) and batch_rows % micro:
        return (
            f"batch_rows={batch_rows} is not a multiple of the schedule's {micro} micro-batches; pass a "
            f"batch_rows that is (e.g. {micro * max(1, batch_rows // micro)})"
        )
    return ""


def agree_step_shape(schedule: Any, stages: Sequence[Any], batch_rows: int, seq_len: int) -> None:
    """ConfigError on every rank of the world when any rank's pipeline arguments cannot run, or the ranks
    were given different step shapes (every stage must run the same steps): gathered world-wide before the
    first collective of the pipeline group, so no rank waits for a peer that refused alone."""
    mine = (step_shape_problem(schedule, stages, batch_rows, seq_len), batch_rows, seq_len)
    if not (dist.is_available() and dist.is_initialized()):
        every = [mine]
    else:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    problems = [f"rank {r}: {p}" for r, (p, _, _) in enumerate(every) if p]
    if problems:
        raise ConfigError("PipelineAdapter: " + "; ".join(problems))
    shapes = {(rows, length) for _, rows, length in every}
    if len(shapes) > 1:
        shown = ", ".join(f"rank {r} batch_rows={rows} seq_len={length}" for r, (_, rows, length) in enumerate(every))
        raise ConfigError(
            f"PipelineAdapter: the ranks were given different step shapes ({shown}); pass the same batch_rows "
            "and seq_len on every rank"
        )

