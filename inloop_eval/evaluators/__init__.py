"""The evaluators: the interface every kind implements (`base`), the orchestrator that runs them
(`orchestrator`), and the kinds: multiple-choice tasks (`downstream`) and per-domain perplexity (`perplexity`)."""
