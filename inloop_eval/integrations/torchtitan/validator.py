"""A torchtitan validator that runs the in-loop evaluator on the model torchtitan is training, as it is parallelised
(FSDP, HSDP, tensor parallel with the vocabulary-sharded output head).

    from inloop_eval.integrations.torchtitan.validator import InLoopValidator

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
vocabulary, scored without gathering it (engine/outputs/vocab_sharded.py). A llama3 or qwen3 decoder is fed
packed rows and keeps shared shots (`attention`: for each forward its RoPE reads each token's position and its
core attention runs the engine's tree attention; the masks built for its own kernel go unused). The figures go
to torchtitan's metric logger (TensorBoard, W&B) under our keys, and stay in `last_metrics`.
`loss_validation=True` also runs torchtitan's own loss validation.

Context and pipeline parallelism are refused when the validator is built (their forward needs sharded inputs
or a schedule this validator does not drive yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torchtitan.components.validate import Validator
from torchtitan.tools.logging import logger

from inloop_eval.data.tokenizer import Tokenizer, load_tokenizer, with_special_ids
from inloop_eval.engine.adapter import refuse_model
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.integrations import run_and_log
from inloop_eval.integrations.callback_config import TaskCallbackFields
from inloop_eval.integrations.torchtitan.adapter import TorchTitanAdapter
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
        check_parallel_dims(self.parallel_dims)
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


def check_parallel_dims(parallel_dims: Any) -> None:
    """Refuse the parallelisms the validator cannot evaluate yet: context and pipeline parallel."""
    for name, enabled in (("context", parallel_dims.cp_enabled), ("pipeline", parallel_dims.pp_enabled)):
        if enabled:
            refuse_model(
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
