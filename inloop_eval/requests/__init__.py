"""Requests: one (context, continuation) pair tokenized as lm-evaluation-harness or OLMo does (`tokenize`),
a task's pairs in flat request tables (`table`), and the on-disk request cache (`cache`)."""
