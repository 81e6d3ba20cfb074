"""Benchmarks of the evaluator against the evaluators users would otherwise run, one module per comparison,
each measured in one process and run as `python -m benchmarks.<name>` (`--help` lists its options):
`engines` (native tasks: a naive OLMo-style loop, ai2-olmo-eval, lm-evaluation-harness), `olmo_core`
(OLMo-core's own in-loop evaluator on OLMo's labels), `metric` (the task metric alone); `common` holds what
they measure. They reach the package through its public API, and `build_requests` for the very requests
our evaluator scores."""
