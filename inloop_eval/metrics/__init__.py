"""The figures, as pure functions under thin torchmetrics shells: every figure's definition and each prompt
format's defaults (`registry`), the multiple-choice metric state and its sync (`icl`), OLMo's own figures
(`olmo`), and perplexity per domain (`perplexity`)."""
