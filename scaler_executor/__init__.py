"""scaler-executor: ``concurrent.futures`` at pool speed, on a cluster that can grow past one machine.

    from scaler_executor import ScalerExecutor

    with ScalerExecutor(max_workers=4) as ex:      # an embedded local cluster
        print(list(ex.map(pow, range(10), range(10))))

    with ScalerExecutor(address="tcp://scheduler:8786") as ex:   # a running cluster
        ...
"""

from __future__ import annotations

from scaler_executor._version import __version__
from scaler_executor.client.executor import ScalerExecutor
from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import (
    BrokenScalerExecutor,
    DaemonLost,
    InitializerFailed,
    RemoteError,
    TaskCancelled,
    TaskError,
    TaskTimeout,
    WorkerLost,
)

__all__ = [
    "BrokenScalerExecutor",
    "ClusterConfig",
    "DaemonLost",
    "InitializerFailed",
    "RemoteError",
    "ScalerExecutor",
    "TaskCancelled",
    "TaskError",
    "TaskTimeout",
    "WorkerLost",
    "__version__",
]
