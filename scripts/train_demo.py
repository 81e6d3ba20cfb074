"""Train the reference GPT with in-loop evaluation: `python scripts/train_demo.py [--steps N]`."""

import sys

from inloop_eval.demo import main

if __name__ == "__main__":
    sys.exit(main())
