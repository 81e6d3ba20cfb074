"""OLMo 2's and OLMo 3's tokenizer, `TokenizerConfig.dolma2()`, taken from a local Hugging Face hub cache (a
real cache layout built in tmp_path), by `olmo_tokenizer` and inside a real OLMo-core Trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_cache_folders import add_to_hub_cache, widened_tokenizer_json
from olmo_core.data import TokenizerConfig
from workers.olmo_core_train import INTERVAL, LIMIT, TASKS, train

from inloop_eval.data.root import TOKENIZER_DIR
from inloop_eval.errors import TokenizerError
from inloop_eval.integrations import SECONDS_KEY
from inloop_eval.integrations.olmo_core.callback import olmo_tokenizer

DOLMA2 = TokenizerConfig.dolma2()


@pytest.fixture
def dolma2_hub_cache(data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache (under HF_HOME) holding `allenai/dolma2-tokenizer`'s tokenizer.json: the GPT-NeoX file
    widened to dolma2's vocabulary, so dolma2's EOS id lies inside it. Returns its snapshot file."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    content = widened_tokenizer_json(data_root / TOKENIZER_DIR / "gpt-neox-20b.json", DOLMA2.vocab_size)
    return add_to_hub_cache(tmp_path / "hf_home" / "hub", DOLMA2.identifier, "tokenizer.json", content)


def test_dolma2_is_taken_from_the_local_hub_cache_with_its_ids(
    dolma2_hub_cache: Path, tmp_path: Path
) -> None:
    assert (DOLMA2.identifier, DOLMA2.bos_token_id, DOLMA2.eos_token_id) == (
        "allenai/dolma2-tokenizer",
        None,
        100257,
    )
    tokenizer = olmo_tokenizer(DOLMA2, tmp_path / "no_data_root")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (None, 100257)
    assert tokenizer.vocab_size == DOLMA2.vocab_size == 100278
    assert tokenizer.name == DOLMA2.identifier
    assert tokenizer.encode(" hello world") == [23120, 1533]  # the widened GPT-NeoX file's encoding


def test_dolma2_found_nowhere_names_fetching_and_hf_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    with pytest.raises(TokenizerError) as info:
        olmo_tokenizer(DOLMA2, tmp_path / "root")
    message = str(info.value)
    assert "'allenai/dolma2-tokenizer'" in message and str(tmp_path / "empty_hub_cache") in message
    assert (
        f"run `inloop-eval data fetch --root {tmp_path / 'root'}` once with the Hugging Face hub" in message
    )
    assert "`hf download allenai/dolma2-tokenizer tokenizer.json`" in message


def test_a_trainer_with_dolma2_evaluates_with_the_cached_tokenizer(
    dolma2_hub_cache: Path, data_root: Path, tmp_path: Path
) -> None:
    result, trainer = train(tmp_path, data_root, with_callback=True, steps=INTERVAL, tokenizer=DOLMA2)
    evaluator = trainer.callbacks["inloop_eval"].evaluator
    assert evaluator.tokenizer.name == DOLMA2.identifier and evaluator.tokenizer.eos_token_id == 100257
    assert trainer.train_module.model.embeddings.weight.shape[0] == DOLMA2.padded_vocab_size()
    assert result["evaluations"] == {"0": 1, str(INTERVAL): 1}  # eval_on_startup, then the interval
    figures = result["logged"][str(INTERVAL)]
    for task in TASKS:
        assert figures[f"eval/downstream/{task}/n_docs"] == LIMIT
        assert 0.0 <= figures[f"eval/downstream/{task}/acc"] <= 1.0
    assert figures[SECONDS_KEY] > 0
