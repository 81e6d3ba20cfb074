"""The demo: a small GPT trained on generated text with in-loop evaluation, logged to JSONL and W&B
(`run`)."""
