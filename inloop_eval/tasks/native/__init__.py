"""The built-in task families, one module each; importing a module registers its task ids.

Answer-text (rc) tasks, with letter-key (mc) twins made by the `letter_keys` mixin (`LetterKeys`): `arc` (ARC-Easy,
ARC-Challenge and the question-answer schema `openbookqa` and `commonsense_qa` share), `piqa`, `hellaswag`,
`sciq`, `social_iqa`, `mmlu`; `boolq` and `copa`; `winogrande` (partial scoring); `classification` (RTE, CB,
MRPC, SST-2, scored with F1); `gold_only` (the answer alone, for ce/bpb); `lambada` (greedy last word).
OLMo's renderings of these tasks are mixins over them (`inloop_eval.tasks.olmo`).
"""
