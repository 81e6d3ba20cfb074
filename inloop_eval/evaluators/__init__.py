"""The evaluators: the interface every kind implements (`base`: `Evaluator`, `EvalOutput`, and the
`EvalContext` each is handed), the table of kinds (`kinds`), the whole config (`config`), the orchestrator
that runs them (`orchestrator`), an evaluation as a training loop or a trainer hook calls it, timed and
logged (`measured`: `run_and_log`, `EvalSchedule`), the kinds themselves: multiple-choice tasks (`downstream`) and per-domain
perplexity (`perplexity`), and the suite averages computed after the tasks (`suites`).

A new kind of evaluation is one new module, holding its config dataclass (its `type` field's default is the
kind's `type:` in YAML) and its `Evaluator` subclass (`prepare`, `evaluate`, bare figure names per label;
its torchmetrics `Metric` named by import path and built through `base.metric_class`, so that importing and
building evaluators load no torchmetrics), and one entry in `kinds.KINDS`.
"""
