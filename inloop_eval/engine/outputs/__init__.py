"""The ways a model returns its outputs, one module each; every one implements `adapter.ModelOutputs`.

- `full_logits`: logits [U, V] at the positions read (any model returning logits).
- `projected_head`: hidden states [U, D] and the output head, projected chunk by chunk at the positions read
  only (the reference GPT, Hugging Face models with a plain head, torchtitan with its head skipped).
- `vocab_sharded`: this rank's slice of the vocabulary of logits sharded over a tensor-parallel group,
  scored without gathering it (a torchtitan-style `ColwiseParallel(output_layouts=Shard(-1))` head).
- `sequence_sharded`: the logits of the positions this rank holds when the sequence is split over ranks
  (OLMo-core's tensor and Ulysses context parallelism), completed by one all-reduce.
- `pipeline_stage`: scores computed on a pipeline's last stage and shared with every stage.

Adding an output form (docs/design.md, "Adding a model family"): a module with a class implementing
`ModelOutputs` (here, or in the caller's own package), an adapter whose `forward` returns it and whose
`needs` declares what the planner must honour, and one `families.register_model_family` call naming how to
recognise the model. `scoring.run_batches` is not touched.
"""
