"""The figures, as pure functions under thin torchmetrics shells: every figure's definition (`registry`),
each prompt format's default figures and OLMo's metric types by name, without torch (`formats`), the
multiple-choice figures and each document's outcomes (`icl`) and the task's `Metric` that keeps and syncs
its requests (`icl_metric`), OLMo's own figures (`olmo`), perplexity per domain (`perplexity`) and its
`Metric` (`perplexity_metric`), the paired statistics that compare two evaluations document by document
(`paired`, its exact McNemar tail from `binomial`), and the suite average over named tasks, each centred
on its chance level (`suite`). Only `icl_metric` and `perplexity_metric` import torchmetrics, so the
loggers and the commands that read outcomes do without it."""
