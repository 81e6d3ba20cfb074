"""A rank for the launcher's own tests (tests/test_launcher.py), run by `launch`:

    launch(N, [launcher_probe.py, --out DIR, --does, sum|raise|hang, --rank-that, R])

`sum`: every rank joins the gloo group the launcher's environment describes, all-reduces `rank + 1` and writes
`<out>/rank<r>.json` (what it saw). `raise`: rank R raises at once, the others wait as if in a collective.
`hang`: rank R starts a child process (its pid in `<out>/child.pid`) and sleeps past any timeout, the others
exit 0. `raise` and `hang` import no torch, so those tests cost a Python start-up per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

FOREVER_S = 3600


def sum_ranks(out: Path) -> None:
    """Join the group from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT and all-reduce `rank + 1`."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total)
        env = {
            k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
        }
        seen = {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "sum": int(total.item()),
            "env": env,
        }
        (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--does", required=True, choices=["sum", "raise", "hang"])
    parser.add_argument("--rank-that", type=int, default=0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if args.does == "sum":
        sum_ranks(args.out)
    elif rank != args.rank_that:
        if args.does == "raise":
            time.sleep(FOREVER_S)  # a peer left waiting for a collective the failed rank never joins
    elif args.does == "raise":
        raise RuntimeError(f"rank {rank} raised on purpose")
    else:
        child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({FOREVER_S})"])
        (args.out / "child.pid").write_text(str(child.pid))
        print(f"rank {rank} is hanging", file=sys.stderr, flush=True)
        time.sleep(FOREVER_S)


if __name__ == "__main__":
    main()
