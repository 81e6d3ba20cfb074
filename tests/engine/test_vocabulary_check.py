"""Token ids a model cannot take are refused before the first forward: fed to the
model they fail inside its embedding ("index out of range in self" on CPU, a device-side assert that ends
the process on CUDA). The bound is the model's input embedding (`get_input_embeddings()`, else its first
`nn.Embedding`), or for a plain callable the width of its logits from a one-token probe."""

from __future__ import annotations

import logging

import pytest
import torch
from lm_helpers import lm_entry, write_domains
from torch import Tensor, nn

from inloop_eval.engine.families import make_adapter
from inloop_eval.errors import LMDataError, ModelOutputError
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.orchestrator import InLoopEvaluator

NEOX_WIDTH = 50304  # logits as wide as the NeoX vocabulary, so that only the embedding is too small


class SmallEmbedding(nn.Module):
    """A custom language model (no `hidden_states`, not Hugging Face) whose embedding holds `rows` ids."""

    def __init__(self, rows: int, width: int = NEOX_WIDTH) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(rows, 8)
        self.head = nn.Linear(8, width)
        self.forwards = 0

    def forward(self, input_ids: Tensor) -> Tensor:
        self.forwards += 1
        return self.head(self.embed(input_ids))


class PositionsFirst(nn.Module):
    """Position embeddings registered before the token embedding, which `get_input_embeddings` names."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = nn.Embedding(64, 8)
        self.tokens = nn.Embedding(NEOX_WIDTH, 8)
        self.head = nn.Linear(8, NEOX_WIDTH)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.tokens

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.head(self.tokens(input_ids) + self.positions(positions))


def downstream(data_root, tokenizer, *, strict: bool) -> InLoopEvaluator:
    config = EvaluatorConfig(
        evaluators=[{"task": "copa", "limit": 4}], data_root=str(data_root), strict=strict, max_length=512
    )
    return InLoopEvaluator(config, tokenizer=tokenizer)


def test_the_vocabulary_of_a_module_is_its_input_embedding():
    assert make_adapter(SmallEmbedding(1000)).vocab_size == 1000  # its first (only) nn.Embedding
    assert make_adapter(PositionsFirst()).vocab_size == NEOX_WIDTH  # what get_input_embeddings() names
    assert make_adapter(lambda ids: ids).vocab_size is None  # a plain callable: probed when needed


def test_a_custom_module_too_small_fails_before_its_first_forward(data_root, neox_tokenizer, caplog):
    model = SmallEmbedding(1000)
    with pytest.raises(
        ModelOutputError,
        match=r"task 'copa' doc \d+ choice \d: token id \d+ is beyond the model's vocabulary of 1000 "
        r"\(its input embedding\); the tokenizer does not match the model",
    ):
        downstream(data_root, neox_tokenizer, strict=True).run(model)
    assert model.forwards == 0
    with caplog.at_level(logging.ERROR):
        out = downstream(data_root, neox_tokenizer, strict=False).run(model)
    assert out == {"eval/downstream/copa/failed": 1.0} and model.forwards == 0
    assert "index out of range" not in caplog.text and "vocabulary of 1000" in caplog.text


def test_a_plain_callable_is_probed_before_its_first_forward(data_root, neox_tokenizer):
    model = SmallEmbedding(1000, width=1000)
    shapes: list[tuple[int, ...]] = []

    def logits(input_ids: Tensor) -> Tensor:
        shapes.append(tuple(input_ids.shape))
        return model(input_ids)

    with pytest.raises(
        ModelOutputError,
        match=r"task 'copa' doc \d+ choice \d: expected logits over at least 50280 tokens .* found 1000; "
        r"token id \d+ cannot be fed to the model",
    ):
        downstream(data_root, neox_tokenizer, strict=True).run(logits)
    assert shapes == [(1, 1)]  # the probe only


def test_perplexity_checks_the_embedding_not_the_logits(tmp_path, neox_tokenizer):
    """Logits as wide as the tokenizer's vocabulary do not make a too-small embedding safe."""
    files = write_domains(tmp_path / "data", neox_tokenizer)
    model = SmallEmbedding(1000)
    config = EvaluatorConfig(evaluators=[lm_entry(files, tmp_path / "cache")], strict=True)
    with pytest.raises(
        LMDataError, match=r"label 'code' .* token id \d+ is beyond the model's vocabulary of 1000"
    ):
        InLoopEvaluator(config, tokenizer=neox_tokenizer).run(model)
    assert model.forwards == 0
