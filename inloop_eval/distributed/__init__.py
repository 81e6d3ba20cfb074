"""The few collectives the evaluator makes; every rank calls each of them, in the same order.

Split by concern: `world` (this rank's place in the world and its data-parallel group, the integer
collectives and `gather_rows`, which group documents are sharded over and the checks that a model's parallel peers are handed the
same documents), `devices` (joining torchrun's process group, checking a device a flag names) and
`agreement` (failure agreement per task and per item, and the settings every rank must share). Their names
are importable from here.
"""

from inloop_eval.distributed.agreement import (
    AgreedSequence,
    TaskAgreement,
    TaskFailedOnAnotherRank,
    agree_failures,
    agree_settings,
    agreed_data_parallel,
    run_agreed,
)
from inloop_eval.distributed.devices import init_from_env, present_devices, usable_device
from inloop_eval.distributed.world import (
    DATA_PARALLEL_DIMS,
    all_reduce_max,
    all_reduce_max_many,
    all_reduce_sum,
    check_data_parallel,
    collective_device,
    data_parallel_in,
    gather_rows,
    model_parallel_dims,
    resolve_data_parallel,
    world,
)

__all__ = [
    "DATA_PARALLEL_DIMS",
    "AgreedSequence",
    "TaskAgreement",
    "TaskFailedOnAnotherRank",
    "agree_failures",
    "agree_settings",
    "agreed_data_parallel",
    "all_reduce_max",
    "all_reduce_max_many",
    "all_reduce_sum",
    "check_data_parallel",
    "collective_device",
    "data_parallel_in",
    "gather_rows",
    "init_from_env",
    "model_parallel_dims",
    "present_devices",
    "resolve_data_parallel",
    "run_agreed",
    "usable_device",
    "world",
]
