"""In-loop evaluation of a Megatron-core `GPTModel` as it trains (tensor, sequence, pipeline
with virtual stages, and data parallel): `topology` reads how the model is split (its parallel state) and refuses what is not
scored, `forward` runs Megatron's schedule forward only and scores the last stage's vocabulary-sharded
logits, `attention` routes a packed micro-batch's RoPE positions and core attention through the engine's
`tree_attention` (and keeps prefixes), `adapter` is the evaluator's thin wrapper over them, `plugin` declares it
(`inloop_eval.frameworks`). Megatron-LM's training loop has no callbacks;
it makes the two calls a plain loop makes:

    from megatron.core import parallel_state
    from inloop_eval.integrations import run_and_log
    from inloop_eval.integrations.megatron.adapter import MegatronAdapter

    adapter = MegatronAdapter(model)  # the chunks setup_model_and_optimizer returned
    ...
    if evaluator.should_run(iteration):
        metrics = run_and_log(evaluator, adapter, iteration, logger, dp_group=parallel_state.get_data_parallel_group())
"""
