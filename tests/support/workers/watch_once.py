"""One watcher pass in a launched rank, as the sharded-loading workers run it: what it evaluated, what this rank
read of each checkpoint (`ShardRead` records by step) and what failed, as JSON-ready values."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from inloop_eval.config_fields import read_config_file
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.watch import WatchConfig, Watcher


def watch_once(config: WatchConfig, evaluator_config: Path, kind: type[Watcher] = Watcher) -> dict[str, Any]:
    """Run `kind(config, <the evaluator config file>)` and report its steps, reads and failures."""
    watcher = kind(config, EvaluatorConfig.from_dict(read_config_file(evaluator_config)))
    evaluated = watcher.run()
    reads = {str(step): [asdict(r) for r in records] for step, records in watcher.reads.items()}
    return {"evaluated": evaluated, "reads": reads, "failures": watcher.failures}
