"""Train the reference GPT with in-loop evaluation, log to W&B (offline) and JSONL, write the report:
`python scripts/train_demo.py [--config YAML] [--steps N] [--out DIR]`, or under
`torchrun --nproc_per_node N scripts/train_demo.py` (see configs/demo.yaml)."""

import sys

from inloop_eval.demo.run import main

if __name__ == "__main__":
    sys.exit(main())
