"""The 2-rank runs of tests/integrations/test_olmo_core_callback.py in one launch, so that Python, torch and
OLMo-core start once for all of them: the tiny model trained with the in-loop callback (`olmo_core_train.train`),
then OLMo-core's perplexity callback and its replacement (`olmo_core_perplexity.both_runs`), each run with a
trainer of its own.

    torchrun --nproc_per_node 2 tests/support/workers/olmo_core_ranks.py --data-root DIR --work DIR --out DIR

Every rank writes `<out>/callback/rank<r>.json` (what `train` returned) and `<out>/perplexity/rank<r>.json`
(what `both_runs` returned).
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from workers.olmo_core_perplexity import both_runs
from workers.olmo_core_train import runs_in_turn, train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        runs = [
            ("callback", lambda: train(args.work / "callback", args.data_root, with_callback=True)[0]),
            ("perplexity", lambda: both_runs(args.work / "perplexity", args.data_root)),
        ]
        runs_in_turn(runs, args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
