"""Perplexity data, from files to the domain sets every rank agrees on:
- `domain_config`: `LMDomainConfig`, one label's files and how to read them;
- `sources`: resolving paths and globs, opening memmap/.npy token files, reading JSONL and text documents;
- `token_cache`: text documents cut into windows, tokenized once into a checksummed cache;
- `documents`: token files read as OLMo-core's padded documents (format `documents`) and the sequences its
  evaluation data loader reaches;
- `domain_set`: `DomainSet` (a label's sequences and bytes), selection under a token cap, building one from
  memmap files or cached text tokens;
- `loading`: `load_domains`, every rank ending with the same labels;
- `token_bytes`: the bytes each token adds, for bits per byte;
- `make_lm`: building a domain set from text (the `data make-lm` command).
"""
