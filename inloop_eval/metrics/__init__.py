"""The figures, as pure functions under thin shells that sync their states (`synced`): every figure's definition and each prompt
format's defaults (`registry`), the multiple-choice metric state and its sync with each document's outcomes
(`icl`), OLMo's own figures (`olmo`), perplexity per domain (`perplexity`), and the paired statistics that
compare two evaluations document by document (`paired`, its exact McNemar tail from `binomial`), and the suite average over named tasks, each
centred on its chance level (`suite`)."""
