"""One rank of the metric tester (`metric_tester.run_job_in_processes`), started by the launcher: joins the
process group from torchrun's environment, runs the pickled job as `job(rank, world_size)` and writes its
JSON result to `<out>/rank<r>.json`.

    python tests/support/workers/metric_ranks.py --job JOB.pt --backend gloo --out DIR
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = torch.load(args.job, weights_only=False)  # the tester's own pickle, written just before
    dist.init_process_group(args.backend, timeout=timedelta(seconds=60))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        (args.out / f"rank{rank}.json").write_text(json.dumps(job(rank, world_size)))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
