"""The config of one perplexity domain: a label and the files holding its held-out text or tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from inloop_eval.config_fields import AtLeast, check_fields, check_label, one_of, shown
from inloop_eval.errors import ConfigError

LM_FORMATS = ("memmap", "documents", "jsonl", "text")
# The formats whose files hold raw token ids.
TOKEN_FORMATS = ("memmap", "documents")
LM_DTYPES = ("uint16", "uint32")


def check_lm_label(label: str, where: str) -> None:
    """Domain labels go into keys `eval/lm/<label>/<figure>` and name folders (`make-lm`): non-empty,
    lower-case, no spaces, '/' or '..'."""
    check_label(label, where)


@dataclass(kw_only=True)
class LMDomainConfig:
    """One domain of an `lm` evaluator: a label and the files holding its held-out text or tokens."""

    label: str
    """Name in metric keys (`eval/lm/<label>/<ce|ppl|bpb>`), e.g. `code`, `books`."""
    paths: list[str]
    """Files or glob patterns (`**` recurses, `~` expands), e.g. `[~/lm/code/*.npy]`; a single string is
    taken as a one-element list."""
    format: str = "memmap"
    """`memmap`: raw token ids (OLMo's `.npy` files), read as sequences of `seq_len`; `documents`: the same
    files read as OLMo-core's `NumpyPaddedFSLDataset` reads them, each document (ending at `eos_token_id`) one
    sequence of its first `seq_len` tokens; `jsonl`: one document per line in the field `text_field` (`.gz`
    allowed); `text`: each file is one document."""
    dtype: str = "uint16"
    """Token type of raw `memmap` / `documents` files (`uint16` or `uint32`); files written by `np.save` carry
    their own."""
    eos_token_id: Annotated[int, AtLeast(0)] | None = None
    """`documents`: the token that ends each document; null: the tokenizer's EOS."""
    text_field: str = "text"
    """Field of each JSONL line holding the document (`format: jsonl`)."""
    max_tokens: Annotated[int, AtLeast(1)] | None = None
    """Cap on the predicted tokens of this domain; overrides the evaluator's `max_tokens`."""

    def __post_init__(self) -> None:
        check_fields(self, f"lm domain {shown(self.label)}")
        check_lm_label(self.label, "lm domain")
        if not self.paths or not all(self.paths):
            raise ConfigError(
                f"lm domain {self.label!r}: `paths` must list files or globs, e.g. [data/code/*.npy], "
                f"found {self.paths!r}"
            )
        one_of(self.format, LM_FORMATS, f"lm domain {self.label!r}: format")
        one_of(self.dtype, LM_DTYPES, f"lm domain {self.label!r}: dtype")
        if self.eos_token_id is not None and self.format != "documents":
            raise ConfigError(
                f"lm domain {self.label!r}: eos_token_id applies to format 'documents' only, found format "
                f"{self.format!r}; leave it out"
            )
        if not self.text_field:
            raise ConfigError(f"lm domain {self.label!r}: text_field must not be empty")
