"""Shared by the perplexity tests: a tiny seeded GPT, domain files on disk, and an independent NumPy
reference for ce / ppl / bpb written from the README's definitions (shares no code with the package)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from inloop_eval.models.gpt import GPT, GPTConfig

SEQ_LEN = 48

# Documents of very different lengths (one word to several windows), with non-ASCII text.
DOCS = [
    "Hi.",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "Naïve café crème brûlée — 日本語のテキスト 🙂.",
    "def area(r):\n    return 3.14159 * r ** 2\n\n\nclass Point:\n    x: int\n    y: int\n",
    "word " * 150,
    "A",
]


def tiny_gpt(seed: int = 0, vocab_size: int = 50304) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=128)).eval()


def write_domains(root: Path, tokenizer, *, n_tiny: int = 1) -> dict[str, Path]:
    """Files of three labels: `code` (two raw uint16 memmap files of real code tokens, the second with a
    partial last sequence), `prose` (JSONL of DOCS) and `tiny` (a memmap file of `n_tiny` sequences)."""
    root.mkdir(parents=True, exist_ok=True)
    code = Path(torch.__file__).read_text() + Path(json.__file__).read_text()
    ids = np.asarray(tokenizer.encode(code), dtype=np.uint16)
    (root / "code").mkdir(exist_ok=True)
    ids[: SEQ_LEN * 9].tofile(root / "code" / "part-0.npy")
    ids[SEQ_LEN * 9 : SEQ_LEN * 14 + 17].tofile(root / "code" / "part-1.npy")
    with (root / "prose.jsonl").open("w") as f:
        for text in DOCS:
            f.write(json.dumps({"text": text}) + "\n")
    ids[-SEQ_LEN * n_tiny :].tofile(root / "tiny.npy")
    return {"code": root / "code", "prose": root / "prose.jsonl", "tiny": root / "tiny.npy"}


def lm_entry(files: dict[str, Path], cache_dir: Path, **overrides) -> dict:
    return {
        "type": "lm",
        "seq_len": SEQ_LEN,
        "batch_tokens": overrides.pop("batch_tokens", 4 * SEQ_LEN),
        "cache_dir": str(cache_dir),
        "domains": [
            {"label": "code", "paths": [str(files["code"] / "*.npy")]},
            {"label": "prose", "paths": [str(files["prose"])], "format": "jsonl"},
            {"label": "tiny", "paths": [str(files["tiny"])]},
        ],
        **overrides,
    }


def log_softmax_np(logits_TV: np.ndarray) -> np.ndarray:
    x = logits_TV.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def sequence_nll(model, ids: np.ndarray) -> float:
    """Σ -log p(ids[t] | ids[:t]) for t >= 1, from one unbatched forward, log-softmax in float64."""
    with torch.no_grad():
        logits = model(torch.as_tensor(ids[None], dtype=torch.long))[0].numpy()
    logp = log_softmax_np(logits[:-1])
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum())


def figures(sum_nll: float, n_tokens: int, n_bytes: int) -> dict[str, float]:
    ce = sum_nll / n_tokens
    return {"ce": ce, "ppl": math.exp(ce), "bpb": sum_nll / n_bytes / math.log(2)}


def reference_memmap(model, paths: list[Path], seq_len: int, byte_table: np.ndarray) -> dict[str, float]:
    """Consecutive sequences of `seq_len` tokens of each raw uint16 file; trailing tokens unused."""
    sum_nll, n_tokens, n_bytes = 0.0, 0, 0
    for path in paths:
        tokens = np.fromfile(path, dtype=np.uint16).astype(np.int64)
        for i in range(len(tokens) // seq_len):
            seq = tokens[i * seq_len : (i + 1) * seq_len]
            sum_nll += sequence_nll(model, seq)
            n_tokens += seq_len - 1
            n_bytes += int(byte_table[seq[1:]].sum())
    return figures(sum_nll, n_tokens, n_bytes)


def reference_text(model, texts: list[str], tokenizer, seq_len: int) -> dict[str, float]:
    """Each document from EOS, every text token predicted once in windows of at most `seq_len` tokens
    (each window restarts the context from its first token); bytes are the UTF-8 bytes of the texts."""
    sum_nll, n_tokens, n_bytes = 0.0, 0, 0
    for text in texts:
        full = np.asarray([tokenizer.eos_token_id, *tokenizer.encode(text)], dtype=np.int64)
        for start in range(0, len(full) - 1, seq_len - 1):
            sum_nll += sequence_nll(model, full[start : start + seq_len])
        n_tokens += len(full) - 1
        n_bytes += len(text.encode("utf-8"))
    return figures(sum_nll, n_tokens, n_bytes)
