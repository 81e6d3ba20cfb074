"""The demo: the reference GPT trained on real English text with in-loop evaluation, logged to JSONL and W&B,
then the report (`run`); `demo.yaml`, its default config, ships with the package (package data)."""
