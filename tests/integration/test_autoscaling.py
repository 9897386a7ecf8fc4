"""Autoscaling of the embedded cluster: ``ScalerExecutor(max_workers=N, min_workers=M)``.

The daemon keeps at least ``min_workers`` one-processor workers, starts up to
``max_workers`` at once when tasks queue, and stops workers idle for ``scale_down_idle``
seconds — never one that is running a task.

Worker processes are counted as the daemon's *direct* children whose command line names
``scaler_executor.cli.worker``: a worker's zygote and processors share that command line
but are the worker's descendants.  States are polled with a deadline (``wait_until``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil
import pytest
from scaler_testing import daemon_of, fast_config, wait_until

import scaler_executor
from scaler_executor import ScalerExecutor

# Fast heartbeats, idle workers stopped after 0.5 s; 5 s of silence before a peer is lost and
# 30 s before the client gives up on its daemon, so a loaded machine causes no spurious loss.
SCALING = fast_config(scale_down_idle=0.5, heartbeat_liveness=50, daemon_loss_timeout=30.0)


def nap(seconds: float, x: int) -> tuple[int, int]:
    time.sleep(seconds)
    return x * 2, os.getpid()




def worker_processes(daemon: psutil.Process) -> int:
    count = 0
    for p in daemon.children():
        try:
            if "scaler_executor.cli.worker" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                count += 1
        except psutil.NoSuchProcess:
            pass
    return count


def connected(ex: ScalerExecutor) -> int:
    return int(ex.statistics()["workers"])


@pytest.mark.timeout(120)
def test_scales_from_zero_to_max_and_back_to_zero(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    ex = fresh_executor(max_workers=4, min_workers=0, config=SCALING)
    daemon = daemon_of(ex)
    # Idle: no worker process at all.
    assert wait_until(lambda: worker_processes(daemon) == 0 and connected(ex) == 0, timeout=30)
    futures = [ex.submit(nap, 0.5, i) for i in range(40)]
    # The burst brings it to max_workers, and never beyond.
    peak = 0

    def at_max() -> bool:
        nonlocal peak
        now = connected(ex)
        peak = max(peak, now, worker_processes(daemon))
        return now == 4

    assert wait_until(at_max, timeout=60, interval=0.05), f"only {peak} workers during the burst"
    results = [f.result(timeout=90) for f in futures]
    assert [value for value, _ in results] == [2 * i for i in range(40)]
    assert len({pid for _, pid in results}) >= 4, "the burst did not spread over four workers"
    assert peak <= 4
    # After the burst and scale_down_idle, back to no worker processes.
    assert wait_until(lambda: worker_processes(daemon) == 0 and connected(ex) == 0, timeout=30), (
        worker_processes(daemon),
        ex.statistics(),
    )
    stats = ex.statistics()
    assert stats["workers_lost"] == 0 and stats["retried"] == 0, stats
    # And it comes back for the next task.
    assert ex.submit(nap, 0.0, 21).result(timeout=60)[0] == 42


@pytest.mark.timeout(120)
def test_a_busy_worker_is_never_stopped(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=4, min_workers=0, config=SCALING)
    daemon = daemon_of(ex)
    burst = [ex.submit(nap, 0.3, i) for i in range(16)]
    assert wait_until(lambda: connected(ex) == 4, timeout=60, interval=0.05)
    assert [f.result(timeout=90)[0] for f in burst] == [2 * i for i in range(16)]
    # The burst is over: idle workers are about to be stopped.  A long task starts now, on
    # one of them; the others go, the busy one stays until its task is done.
    long = ex.submit(nap, 3.0, 5)
    assert wait_until(lambda: worker_processes(daemon) == 1 and connected(ex) == 1, timeout=30), (
        worker_processes(daemon),
        ex.statistics(),
    )
    assert not long.done(), "the long task finished before scale-down reached its worker"
    assert long.result(timeout=60)[0] == 10
    info = scaler_executor.task_info(long)
    assert info is not None and info.attempts == 1, info  # not stopped and run again
    assert info.duration >= 3.0, info
    assert wait_until(lambda: worker_processes(daemon) == 0 and connected(ex) == 0, timeout=30)
    stats = ex.statistics()
    assert stats["workers_lost"] == 0 and stats["retried"] == 0, stats


@pytest.mark.timeout(120)
def test_min_workers_stay_when_idle(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=3, min_workers=1, config=SCALING)
    daemon = daemon_of(ex)
    assert wait_until(lambda: connected(ex) == 1, timeout=30)
    futures = [ex.submit(nap, 0.4, i) for i in range(12)]
    assert wait_until(lambda: connected(ex) == 3, timeout=60, interval=0.05)
    assert [f.result(timeout=90)[0] for f in futures] == [2 * i for i in range(12)]
    assert wait_until(lambda: worker_processes(daemon) == 1 and connected(ex) == 1, timeout=30)
    # It stays at min_workers: still one after several more idle periods.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert worker_processes(daemon) == 1
        time.sleep(0.1)
    assert connected(ex) == 1
