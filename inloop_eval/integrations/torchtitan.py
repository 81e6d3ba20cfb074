"""A torchtitan validator that runs the in-loop evaluator on the model torchtitan is training, in its layout
(FSDP, HSDP, tensor parallel with the vocabulary-sharded output head).

    from inloop_eval.integrations.torchtitan import InLoopValidator

    config.validator = InLoopValidator.Config(tasks=["piqa", "arc_easy"], freq=1000)

torchtitan's `Trainer` builds `config.validator` with its runtime objects and, after each step that
`should_validate` accepts (torchtitan's rule: step 1 and every `freq` steps, 1000 by default), calls
`validate(model_parts, step)`. The validator evaluates with the trainer's tokenizer (its BOS and EOS ids as
torchtitan found them), the training sequence length as the longest context, documents sharded over
torchtitan's data-parallel "batch" mesh (dp_replicate x dp_shard: the tensor-parallel peers of a rank score
the same documents), and the model called as torchtitan's own validator calls it (its input processing and
attention masks, under its validation context). A model whose output head is skipped (`ChunkedLossWrapper`
applies it in the loss) returns hidden states, and only the positions read go through `lm_head`, once per
forward (FSDP gathers its weights on every call); a tensor-parallel head returns logits sharded on the
vocabulary, scored without gathering it (engine/layouts/vocab_sharded.py). The figures go to torchtitan's metric
logger (TensorBoard, W&B) under our keys, and stay in `last_metrics`. `loss_validation=True` also runs
torchtitan's own loss validation.

Context and pipeline parallelism are refused when the validator is built (their forward needs sharded inputs
or a schedule this validator does not drive yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torchtitan.components.validate import Validator
from torchtitan.tools.logging import logger

from inloop_eval.data.tokenizer import Tokenizer, load_tokenizer, with_special_ids
from inloop_eval.engine.adapters import input_embedding_rows
from inloop_eval.engine.layout import ForwardInputs, LayoutNeeds, ModelAdapter, ModelOutputs, refuse_layout
from inloop_eval.engine.layouts.vocab_sharded import logits_outputs, selected_logits
from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import run_and_log
from inloop_eval.integrations.callback_config import TaskCallbackFields
from inloop_eval.keys import seconds_key


class InLoopValidator(Validator):
    """torchtitan's validator slot, filled with the in-loop evaluator (see the module docstring).

    Takes the keyword arguments torchtitan's `Trainer` builds every validator with; uses `tokenizer`,
    `parallel_dims`, `seq_len`, `validation_context`, `metrics_processor` (and all of them when
    `loss_validation` runs torchtitan's own validation too).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config, TaskCallbackFields):
        """torchtitan's validator config with what to evaluate (`TaskCallbackFields`: `tasks` or `config`,
        `limit`, `batch_tokens`, `strict`, `data_root`)."""

        enable: bool = True
        """Build the validator (torchtitan builds none when False)."""

        freq: int = 1000
        """Validate at step 1 and every `freq` steps (torchtitan's rule; a `config` file's `eval_interval`
        is replaced by it)."""

        steps: int = 10
        """Batches of torchtitan's loss validation (with `loss_validation`); torchtitan's default, -1 (the
        whole set), warns that it can hang."""

        loss_validation: bool = False
        """Also run torchtitan's loss validation (`Validator.validate`, with `dataloader` and `steps`)."""

        def __post_init__(self) -> None:
            # Named bases: the slotted dataclass is a new class, which zero-argument `super()` misses.
            Validator.Config.__post_init__(self)
            TaskCallbackFields.__post_init__(self)

        def evaluator_config(self, seq_len: int) -> EvaluatorConfig:
            """The `EvaluatorConfig` this describes, evaluated every `freq` steps; its `max_length` the
            training sequence length `seq_len` (a config file may only lower it)."""
            return self.described_config(
                eval_interval=self.freq, trained_length=seq_len, trained_length_name="the training seq_len"
            )

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        check_layout(self.parallel_dims)
        self.evaluator = InLoopEvaluator(
            config.evaluator_config(self.seq_len), tokenizer=torchtitan_tokenizer(self.tokenizer)
        )
        self.last_metrics: dict[str, float] = {}

    def validate(self, model_parts: list[nn.Module], step: int) -> None:
        """torchtitan's loss validation when `loss_validation`, then every task on `model_parts[0]`; the
        figures logged at `step` by torchtitan's metric logger. Every rank calls it (torchtitan's loop
        does)."""
        if self.config.loss_validation:  # type: ignore[attr-defined]
            super().validate(model_parts, step)
        adapter = TorchTitanAdapter(
            model_parts[0],
            forward=lambda ids_BT: self.forward(model_parts, ids_BT),
            max_length=self.evaluator.config.max_length,
            seq_multiple=self.parallel_dims.seq_len_divisor,
        )
        metrics = run_and_log(
            self.evaluator,
            adapter,
            step,
            self.metrics_processor.logger,
            dp_group=data_parallel_mesh(self.parallel_dims),
        )
        self.last_metrics = metrics
        logger.info(f"in-loop eval step {step}: {len(metrics)} figures in {metrics[seconds_key()]:.1f}s")

    def forward(self, model_parts: list[nn.Module], ids_BT: Tensor) -> Any:
        """The model's output for `ids_BT`, called as torchtitan's validator calls it: each row one document
        from position 0, through `post_dataloading_process` (attention masks of the model's attention
        backend) and under the validation context."""
        positions_BT = torch.arange(ids_BT.shape[1], device=ids_BT.device).expand_as(ids_BT)
        inputs, _, extra = self.post_dataloading_process(
            {"input": ids_BT, "positions": positions_BT}, ids_BT, model_parts
        )
        with self.validation_context():
            return model_parts[0](inputs, **extra)


def check_layout(parallel_dims: Any) -> None:
    """Refuse the layouts the validator cannot evaluate yet: context and pipeline parallel."""
    for name, enabled in (("context", parallel_dims.cp_enabled), ("pipeline", parallel_dims.pp_enabled)):
        if enabled:
            refuse_layout(
                f"a torchtitan model under {name} parallelism",
                f"{name} parallelism (degree > 1) is not supported yet by InLoopValidator",
                f"set `parallelism.{name}_parallel_degree = 1`, or evaluate a checkpoint apart",
            )


def data_parallel_mesh(parallel_dims: Any) -> DeviceMesh:
    """torchtitan's data-parallel mesh: "batch" (dp_replicate x dp_shard, the mesh its data loader shards
    over), of one rank when there is no data parallelism."""
    return parallel_dims.get_optional_mesh("batch", include_singleton_axes=True)


def torchtitan_tokenizer(tokenizer: Any) -> Tokenizer:
    """Our tokenizer for torchtitan's `HuggingFaceTokenizer`: the same `tokenizer.json`, with the BOS and EOS
    ids torchtitan found (its `bos_id`, `eos_id`)."""
    path = getattr(tokenizer, "tokenizer_path", None)
    if path is None:
        raise ConfigError(
            f"InLoopValidator: the trainer's tokenizer {type(tokenizer).__name__} has no `tokenizer_path`; "
            "expected torchtitan's HuggingFaceTokenizer (a directory holding tokenizer.json)"
        )
    base = load_tokenizer(Path(path) / "tokenizer.json")
    return with_special_ids(
        base, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, name=str(path)
    )


class TorchTitanAdapter(ModelAdapter):
    """A torchtitan decoder (`model_parts[0]`, FSDP- and tensor-parallel-wrapped as trained), called through
    `forward`. Its output is either hidden states [B, T, D] (the head skipped, `_skip_lm_head`: the selected
    positions then go through `lm_head` in the same call, a vocabulary-sharded DTensor head under tensor
    parallelism) or logits [B, T, V], plain or sharded on the vocabulary. Batch widths must be a multiple of
    `seq_multiple` (sequence parallelism splits the positions over the tensor-parallel ranks)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        forward: Callable[[Tensor], Any],
        max_length: int | None,
        seq_multiple: int = 1,
    ) -> None:
        super().__init__(model)
        self.call = forward
        self.max_length = max_length
        self.vocab_size = input_embedding_rows(model)
        self.seq_multiple = max(1, seq_multiple)

    @property
    def needs(self) -> LayoutNeeds:
        return LayoutNeeds(width_multiple=self.seq_multiple)

    def forward(self, inputs: ForwardInputs) -> ModelOutputs:
        if inputs.packed:
            raise ValueError(
                "TorchTitanAdapter: packed rows were planned, but torchtitan models are never packed"
            )
        input_ids_BT, rows_U, cols_U = inputs.input_ids_BT, inputs.rows_U, inputs.cols_U
        out = self.call(input_ids_BT)
        if getattr(self.model, "_skip_lm_head", False):
            hidden_BTD = replicated_local(out, input_ids_BT, "hidden states")
            # Projected here, once per forward on every rank: FSDP gathers the head's weights on each call, so
            # the number of calls must not depend on how many positions a rank's documents have.
            return logits_outputs(self.model.lm_head(hidden_BTD[rows_U, cols_U]))
        if isinstance(out, DTensor) and any(isinstance(p, Shard) for p in out.placements):
            return selected_logits(out, rows_U, cols_U)
        return selected_logits(replicated_local(out, input_ids_BT, "logits"), rows_U, cols_U)


def replicated_local(out: Any, input_ids_BT: Tensor, what: str) -> Tensor:
    """`out` as a plain tensor [B, T, X] for the rows `input_ids_BT`: a replicated DTensor's local copy.
    ModelOutputError for any other output (sharded over the batch or the positions)."""
    if isinstance(out, DTensor):
        if not all(isinstance(p, Replicate) for p in out.placements):
            raise ModelOutputError(
                f"torchtitan model output: {what} as a DTensor with placements {tuple(out.placements)}; "
                "expected them replicated (or logits sharded on the vocabulary only)"
            )
        out = out.to_local()
    if not isinstance(out, Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(input_ids_BT.shape):
        found = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ModelOutputError(
            f"torchtitan model output: expected {what} of shape [{input_ids_BT.shape[0]}, "
            f"{input_ids_BT.shape[1]}, *], found {found}"
        )
    return out
