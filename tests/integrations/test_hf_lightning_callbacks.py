"""The Hugging Face `Trainer` and Lightning callbacks, each in a real run of a tiny model for a few steps:
the figures logged at the evaluated steps, the model back in training mode."""

from __future__ import annotations

import csv
import importlib

import torch
from helpers import small_evaluator, tiny_neox

from inloop_eval.integrations import TOKENS_KEY
from inloop_eval.models.gpt import GPT, GPTConfig

STEPS, INTERVAL = 4, 2


def token_batches(tokenizer, n: int, seq_len: int = 32) -> torch.Tensor:
    text = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun. " * 40
    ids = torch.tensor(tokenizer.encode(text)[: n * seq_len]).view(n, seq_len)
    return ids


def test_hf_trainer_callback_logs_eval_keys(data_root, neox_tokenizer, tmp_path):
    transformers = importlib.import_module("transformers")
    from inloop_eval.integrations.hf.callback import InLoopEvalCallback

    model = tiny_neox(layers=1, max_positions=256)
    ids = token_batches(neox_tokenizer, 2 * STEPS)
    train = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train)
    trainer.add_callback(InLoopEvalCallback(small_evaluator(data_root, neox_tokenizer), trainer=trainer))
    trainer.train()

    evals = [r for r in trainer.state.log_history if "eval/downstream/piqa/acc" in r]
    assert [r["step"] for r in evals] == list(range(0, STEPS + 1, INTERVAL))
    assert all(r["eval/downstream/piqa/n_docs"] == 4 and r[TOKENS_KEY] > 0 for r in evals)
    assert model.training  # the evaluator put the model back in training mode


def test_lightning_callback_logs_eval_keys(data_root, neox_tokenizer, tmp_path):
    L = importlib.import_module("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger

    from inloop_eval.integrations.lightning.callback import InLoopEvalCallback

    class LitGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(GPTConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            logits = self.model(batch[:, :-1])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(token_batches(neox_tokenizer, 2 * STEPS), batch_size=2)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path, name="lit"),
        callbacks=[InLoopEvalCallback(small_evaluator(data_root, neox_tokenizer), model_attr="model")],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LitGPT(), loader)

    assert "eval/downstream/piqa/acc" in trainer.callback_metrics
    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval/downstream/piqa/acc")]
    assert [int(r["step"]) for r in rows] == list(range(0, STEPS + 1, INTERVAL))
