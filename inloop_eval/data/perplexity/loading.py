"""Loading the domain sets of a perplexity evaluation so that every rank ends with the same labels.

Under torch.distributed, a label that fails on any rank (a file missing on one node, an I/O error) is dropped
on every rank, agreed by one all-reduce of a failure flag per label, before any forward pass. Every rank makes
the same collectives whatever fails where (`inloop_eval.distributed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inloop_eval.data.perplexity.documents import load_documents_domain
from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.domain_set import DomainSet, load_memmap_domain, text_domain
from inloop_eval.data.perplexity.sources import unreadable
from inloop_eval.data.perplexity.token_cache import (
    TextSource,
    TextTokens,
    cached_text_tokens,
    locate_text_domain,
)
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import TaskFailedOnAnotherRank, agree_failures, world
from inloop_eval.errors import LMDataError


@dataclass
class LoadedDomains:
    """Labels loaded on every rank. domains: label -> its sequences, in config order. errors: label -> why it
    is not loaded: this rank's own error, or TaskFailedOnAnotherRank where it failed on another rank only."""

    domains: dict[str, DomainSet]
    errors: dict[str, Exception]


def domain_error(label: str, exc: Exception) -> LMDataError:
    """`exc`, raised while loading `label`, as an LMDataError that names the label (and the file, where the
    operating system named one)."""
    if isinstance(exc, LMDataError):
        return exc
    if isinstance(exc, OSError) and exc.filename is not None:
        error = unreadable(label, exc.filename, exc)
    else:
        error = LMDataError(f"label {label!r}: loading failed ({type(exc).__name__}: {exc})")
    error.__cause__ = exc
    return error


def load_domains(
    configs: Sequence[LMDomainConfig],
    seq_len: int,
    cap: Callable[[LMDomainConfig], int | None],
    tokenizer: TokenizerLike,
    byte_table: np.ndarray | None,
    cache_dir: Path,
) -> LoadedDomains:
    """Load the domains `configs` (every rank passes the same), sequences of `seq_len`, each under its token
    `cap`, so that every rank ends with the same ones. Every rank calls this and makes the same collectives
    whatever fails where: one all-reduce of a failure flag per label after reading the files (while rank 0
    also reads or builds the text caches), and, when text domains remain, one more after every rank has
    opened their caches."""
    _, rank = world()
    domains: dict[str, DomainSet] = {}
    texts: dict[str, tuple[TextSource, TextTokens | None]] = {}
    errors: dict[str, Exception] = {}
    for d in configs:
        try:
            if d.format == "memmap":
                domains[d.label] = load_memmap_domain(d, seq_len, byte_table, cap(d))
            elif d.format == "documents":
                eos = documents_eos(d, tokenizer)
                domains[d.label] = load_documents_domain(d, seq_len, byte_table, cap(d), eos)
            else:
                source = locate_text_domain(d, seq_len, tokenizer, cache_dir)
                # Rank 0 reads or builds the cache while the others wait in the agreement below.
                text = cached_text_tokens(source, tokenizer, seq_len, byte_table) if rank == 0 else None
                texts[d.label] = (source, text)
        except Exception as exc:  # agreed below: a rank that raised here must still join every collective
            errors[d.label] = domain_error(d.label, exc)
    _agree([d.label for d in configs], errors, domains, texts)
    if texts:  # the same labels on every rank once the failures are agreed
        opened = list(texts)
        for label, (source, text) in texts.items():
            try:
                if text is None:  # rank 0's cache, or this rank's own where it cannot see rank 0's
                    text = cached_text_tokens(source, tokenizer, seq_len, byte_table)
                domains[label] = text_domain(source, text, cap(source.domain))
            except Exception as exc:
                errors[label] = domain_error(label, exc)
        _agree(opened, errors, domains, {})
    ordered = {d.label: domains[d.label] for d in configs if d.label in domains}
    return LoadedDomains(ordered, {d.label: errors[d.label] for d in configs if d.label in errors})


def documents_eos(domain: LMDomainConfig, tokenizer: TokenizerLike) -> int:
    """The token that ends each document of a `documents` domain: its own `eos_token_id`, else the
    tokenizer's EOS."""
    eos = domain.eos_token_id if domain.eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise LMDataError(
            f"label {domain.label!r}: format 'documents' splits its files at the EOS token, and neither the "
            "domain nor the tokenizer names one; set the domain's `eos_token_id`"
        )
    return int(eos)


def _agree(
    labels: list[str],
    errors: dict[str, Exception],
    domains: dict[str, DomainSet],
    texts: dict[str, tuple[TextSource, TextTokens | None]],
) -> None:
    """Agree which of `labels` failed on some rank; drop those from `domains` and `texts`, and record the
    ones that failed elsewhere only in `errors`."""
    for label, rank in zip(labels, agree_failures([label in errors for label in labels]), strict=True):
        if rank is None:
            continue
        domains.pop(label, None)
        texts.pop(label, None)
        errors.setdefault(
            label,
            TaskFailedOnAnotherRank(
                f"label {label!r}: could not be loaded on rank {rank} (its log has the reason); every rank "
                "leaves it out of this evaluation and tries it again at the next"
            ),
        )
