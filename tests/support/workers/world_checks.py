"""What tests/test_distributed.py launches: the checks of tests/support/workers/dist_checks.py, as
`agreement_<check>` those of tests/support/workers/agreement_checks.py (ranks that disagree, refused), and
`lm_rank_faults` (tests/support/workers/lm_rank_faults.py: a perplexity domain failing on one rank only), so
that one launch per world size runs them all and its processes start once.

    torchrun --nproc_per_node N tests/support/workers/world_checks.py --data-root DIR --out DIR --checks a,b

Every rank writes `<out>/rank<r>.json`: check name -> JSON-able result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workers import agreement_checks, dist_checks, lm_rank_faults
from workers.dist_checks import Context
from workers.launch import checks_main

AGREEMENT = "agreement_"  # the prefix of the agreement checks
CHECKS: dict[str, Callable[[Context], Any]] = {
    **dist_checks.CHECKS,
    **{AGREEMENT + name: check for name, check in agreement_checks.CHECKS.items()},
    "lm_rank_faults": lm_rank_faults.check_lm_rank_faults,
}


def main() -> None:
    checks_main(CHECKS, Context)


if __name__ == "__main__":
    main()
