"""Data on disk: the task data root and its manifest (`root`), materialising it (`fetch`), atomic writes
(`files`), the tokenizer wrapper (`tokenizer`), and perplexity data (`perplexity/`)."""
