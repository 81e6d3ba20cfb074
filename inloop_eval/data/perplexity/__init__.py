"""Perplexity data: domain sets read from token files or text (`domains`), the bytes each token adds
(`token_bytes`), and building a domain set from text (`make_lm`, the `data make-lm` command)."""
