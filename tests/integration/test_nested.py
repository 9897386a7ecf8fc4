"""Nested tasks: ``scaler_executor.get_executor()`` inside a task submits sub-tasks.

A task that waits on its sub-tasks *secedes*: its processor stops counting against the
worker's capacity and the worker starts another, so more waiting parents than processors
never deadlock the cluster (Dask's ``secede``).  Every test here has a hard timeout: a
deadlock shows up as a timeout, not as a hang.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from scaler_testing import fast_config, wait_until

import scaler_executor
from scaler_executor import ScalerExecutor

# 5 s of silence before a peer is lost, 30 s before a client gives up on its daemon: the
# machine may be loaded by other suites.
TOLERANT = fast_config(heartbeat_liveness=50, daemon_loss_timeout=30.0)


# =========================================================================== task functions


def square(x: int) -> int:
    return x * x


def fail(x: int) -> None:
    raise ValueError(f"sub-task {x} failed")


def parent(base: int, children: int) -> int:
    """Submit ``children`` sub-tasks and wait for them all, holding this task's processor."""
    ex = scaler_executor.get_executor()
    futures = [ex.submit(square, base + i) for i in range(children)]
    return sum(f.result(timeout=120) for f in futures)


def grandparent(base: int, parents: int, children: int) -> int:
    ex = scaler_executor.get_executor()
    futures = [ex.submit(parent, base + 100 * i, children) for i in range(parents)]
    return sum(f.result(timeout=120) for f in futures)


def parent_of_a_failure() -> None:
    ex = scaler_executor.get_executor()
    ex.submit(fail, 7).result(timeout=60)


def same_executor_twice() -> tuple[int, int]:
    first = scaler_executor.get_executor()
    second = scaler_executor.get_executor()
    assert first is second
    return id(first), os.getpid()


def expected_parent(base: int, children: int) -> int:
    return sum((base + i) ** 2 for i in range(children))


# =========================================================================== tests


@pytest.fixture(scope="module")
def two_processors() -> Iterator[ScalerExecutor]:
    ex = ScalerExecutor(max_workers=2, config=TOLERANT)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(30)
def test_get_executor_outside_a_task_raises() -> None:
    with pytest.raises(RuntimeError, match="inside a task"):
        scaler_executor.get_executor()


@pytest.mark.timeout(90)
def test_more_waiting_parents_than_processors_do_not_deadlock(
    two_processors: ScalerExecutor,
) -> None:
    # Six parents on two processors, each waiting on ten sub-tasks: without seceding the
    # first two parents would hold both processors while their sub-tasks queue behind them.
    futures = [two_processors.submit(parent, 10 * p, 10) for p in range(6)]
    assert [f.result(timeout=80) for f in futures] == [
        expected_parent(10 * p, 10) for p in range(6)
    ]


@pytest.mark.timeout(90)
def test_two_levels_of_nesting(two_processors: ScalerExecutor) -> None:
    futures = [two_processors.submit(grandparent, 1000 * g, 3, 4) for g in range(2)]
    expected = [sum(expected_parent(1000 * g + 100 * i, 4) for i in range(3)) for g in range(2)]
    assert [f.result(timeout=80) for f in futures] == expected


@pytest.mark.timeout(60)
def test_a_sub_tasks_exception_reaches_the_caller_with_its_type(
    two_processors: ScalerExecutor,
) -> None:
    exc = two_processors.submit(parent_of_a_failure).exception(timeout=50)
    assert type(exc) is ValueError, repr(exc)
    assert "sub-task 7 failed" in str(exc)


@pytest.mark.timeout(60)
def test_tasks_of_one_process_share_one_nested_executor(two_processors: ScalerExecutor) -> None:
    ids = [two_processors.submit(same_executor_twice).result(timeout=50) for _ in range(3)]
    by_process: dict[int, set[int]] = {}
    for executor_id, pid in ids:
        by_process.setdefault(pid, set()).add(executor_id)
    assert all(len(executors) == 1 for executors in by_process.values()), by_process


@pytest.mark.timeout(60)
def test_the_cluster_returns_to_its_size_after_nested_work(two_processors: ScalerExecutor) -> None:
    assert two_processors.submit(parent, 0, 5).result(timeout=50) == expected_parent(0, 5)
    # Plain tasks still run, and the daemon's view is consistent: nothing left behind.
    assert list(two_processors.map(square, range(10))) == [x * x for x in range(10)]
    # The first item went alone (its result may come straight from the processor, counted
    # by the daemon once the worker reports it).
    assert wait_until(lambda: two_processors.statistics()["tasks"] == 0, timeout=10), two_processors.statistics()
    stats = two_processors.statistics()
    assert stats["tasks"] == 0, stats
    assert stats["processors"] == 2, stats


@pytest.mark.timeout(90)
def test_processors_forked_after_the_worker_idled_start_with_the_nested_client_imported() -> None:
    """The zygote imports get_executor's client once its worker has had no task for
    ZYGOTE_WARM_IDLE, never while tasks run; processors forked later start with it."""
    import time

    from scaler_executor.worker.agent_base import ZYGOTE_WARM_IDLE

    def nested_client_imported() -> tuple[bool, int]:
        # Nested, so pickled by value: unpickling it imports no test module (this one
        # imports scaler_executor's client).
        import os
        import sys

        return "scaler_executor.client.executor" in sys.modules, os.getpid()

    with ScalerExecutor(max_workers=1, max_tasks_per_child=1, config=TOLERANT) as ex:
        # Forked at start, before any idle time: the first processor runs without it.
        imported, first_pid = ex.submit(nested_client_imported).result(timeout=60)
        assert not imported
        # A task longer than the idle time: the worker is busy, not idle, all along
        # (the zygote, with nothing to fork, is idle), so the processor forked after
        # it still starts without the import.
        ex.submit(time.sleep, 3 * ZYGOTE_WARM_IDLE).result(timeout=60)
        imported, pid = ex.submit(nested_client_imported).result(timeout=60)
        assert not imported and pid != first_pid
        # Idle time is what the import waits for; the agent checks every few ms (at most a
        # 50 ms tick with this config), so 5x leaves a wide margin on a loaded machine.
        time.sleep(5 * ZYGOTE_WARM_IDLE)
        # The next task may run on a processor forked before the import; the one after
        # runs on a processor forked from the warm zygote.
        ex.submit(nested_client_imported).result(timeout=60)
        imported, _ = ex.submit(nested_client_imported).result(timeout=60)
        assert imported
