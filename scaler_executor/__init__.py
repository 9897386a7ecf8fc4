"""scaler-executor: ``concurrent.futures`` at pool speed, on a cluster that can grow past one machine.

    from scaler_executor import ScalerExecutor

    with ScalerExecutor(max_workers=4) as ex:      # an embedded local cluster
        print(list(ex.map(pow, range(10), range(10))))

    with ScalerExecutor(address="tcp://scheduler:8786") as ex:   # a running cluster
        ...
"""

from __future__ import annotations

from scaler_executor._version import __version__

# Not typing.TYPE_CHECKING: this package is the first import of every process of the
# cluster, and importing typing (with re, functools, ...) here put a few ms in front of
# the daemon's start of its workers (cli/daemon.py). Type checkers read the name itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from scaler_executor.client.completion import TaskInfo
    from scaler_executor.client.executor import ScalerExecutor, get_executor, task_info
    from scaler_executor.client.pickling import ObjectRef
    from scaler_executor.config import ClusterConfig
    from scaler_executor.exceptions import (
        BrokenScalerExecutor,
        DaemonLost,
        InitializerFailed,
        NoWorkerWarning,
        PendingLimitReached,
        ProxyUnavailable,
        RemoteError,
        ResultUnreadable,
        TaskCancelled,
        TaskError,
        TaskTimeout,
        WorkerLost,
    )
    from scaler_executor.objstore.errors import ObjectStoreFull
    from scaler_executor.scheduler.stats import (
        ClientStatistics,
        ManagerStatistics,
        RecentEvent,
        Statistics,
        StoreUse,
        TaskDurations,
        TaskWindow,
        WorkerStatistics,
    )
del TYPE_CHECKING  # not a name of the package

# Imported on first use (PEP 562): the daemon and worker processes import this
# package too, and must not pay for the client's modules at start-up.
_LAZY = {
    "ScalerExecutor": "scaler_executor.client.executor",
    "ClusterConfig": "scaler_executor.config",
    "TaskInfo": "scaler_executor.client.completion",
    "ObjectRef": "scaler_executor.client.pickling",
    "ObjectStoreFull": "scaler_executor.objstore.errors",
    "task_info": "scaler_executor.client.executor",
    "get_executor": "scaler_executor.client.executor",
    **dict.fromkeys(
        (
            "Statistics", "WorkerStatistics", "ClientStatistics", "TaskDurations", "TaskWindow", "RecentEvent",
            "StoreUse", "ManagerStatistics",
        ),
        "scaler_executor.scheduler.stats",
    ),
    **dict.fromkeys(
        (
            "BrokenScalerExecutor",
            "DaemonLost",
            "InitializerFailed",
            "NoWorkerWarning",
            "PendingLimitReached",
            "ProxyUnavailable",
            "RemoteError",
            "ResultUnreadable",
            "TaskCancelled",
            "TaskError",
            "TaskTimeout",
            "WorkerLost",
        ),
        "scaler_executor.exceptions",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scaler_executor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


# Spelled out rather than built from _LAZY: type checkers only read a literal
# list, and without it they treat the TYPE_CHECKING imports above as private
# (mypy --strict: 'Module "scaler_executor" does not explicitly export ...').
# tests/unit/test_package.py keeps it and _LAZY in step.
__all__ = [
    "BrokenScalerExecutor",
    "ClientStatistics",
    "ClusterConfig",
    "DaemonLost",
    "InitializerFailed",
    "ManagerStatistics",
    "NoWorkerWarning",
    "ObjectRef",
    "ObjectStoreFull",
    "PendingLimitReached",
    "ProxyUnavailable",
    "RecentEvent",
    "RemoteError",
    "ResultUnreadable",
    "ScalerExecutor",
    "Statistics",
    "StoreUse",
    "TaskCancelled",
    "TaskDurations",
    "TaskError",
    "TaskInfo",
    "TaskTimeout",
    "TaskWindow",
    "WorkerLost",
    "WorkerStatistics",
    "__version__",
    "get_executor",
    "task_info",
]
