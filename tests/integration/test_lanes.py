"""Worker lanes (worker/lanes.py): a task submitted alone goes straight to a worker.

Once a sequential caller's result names its worker's lane, the client's next task
submitted alone goes down it, skipping the daemon.  What the daemon would have done for
such a task is split between the two ends, and each part is checked here end to end:
the counters (LaneDone), a result the datagram cannot carry (over the lane, with its
store objects pinned and later deleted), a dead processor or worker (the task runs again
through the daemon), a force cancel, callables released while their task is queued, and
threads mixing lone submits with bursts.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scaler_testing import fast_config, mix_lone_submits_and_bursts, wait_until

import scaler_executor
from scaler_executor import ScalerExecutor, TaskCancelled
from scaler_executor.protocol import reply


def echo(i: int) -> int:
    return i


def fail(text: str) -> None:
    raise KeyError(text)


def nap(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def ones(n: int) -> np.ndarray:
    return np.ones(n)


def die_once(marker: str) -> int:
    """Kills its processor the first time it runs; returns its pid the second time."""
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(3)
    return os.getpid()


def plus_one(x: int) -> int:
    return x + 1


def parent(n: int) -> int:
    ex = scaler_executor.get_executor()
    return sum(f.result() for f in [ex.submit(echo, i) for i in range(n)])


def lane_open(ex: ScalerExecutor) -> int:
    """Warm up until the client holds a lane (the first lone result names it) and the
    daemon has counted every warm-up task; returns how many ran (0: no lane)."""
    for i in range(20):
        assert ex.submit(echo, i).result(timeout=30) == i
        if ex._agent.lane.dealer is not None:
            # A lone task's result reaches us before the daemon's bookkeeping of it.
            assert wait_until(lambda: ex.statistics()["finished"] >= i + 1, timeout=10), ex.statistics()
            return i + 1
    return 0


def lane_worker_pid(ex: ScalerExecutor) -> int:
    path = ex._agent.lane.dealer.path
    return int(os.path.basename(path)[len("lane-") : -len(".sock")])


@pytest.mark.timeout(120)
def test_sequential_tasks_take_the_lane_and_the_daemon_counts_them(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2)
    assert lane_open(ex), "no lane after 20 lone tasks"
    before = ex.statistics()
    for i in range(100):
        assert ex.submit(echo, i).result(timeout=30) == i
    # No waiting: the worker reports lane tasks up to LANE_DONE_LINGER late, but the
    # client's request names the lane results it had, and the daemon answers once the
    # worker's LaneDone counted them (scheduler/stats_barrier.py).
    after = ex.statistics()
    assert after["finished"] - before["finished"] == 100, after
    assert after["lane"] - before["lane"] == 100, after
    assert after["submitted"] - before["submitted"] == 100, after
    assert after["delivered_direct"] - before["delivered_direct"] >= 90, after
    assert after["tasks"] == 0 and not ex._agent.lane.tasks, after
    assert after["stats_barrier_expired"] == 0, after


@pytest.mark.timeout(120)
def test_statistics_right_after_each_lane_result_count_it(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    """The worker holds a LaneDone of lane tasks that ended well for up to LANE_DONE_LINGER
    (worker/lanes.py); a caller that reads statistics() after each result still sees it
    counted, every time, including a failure and a task that outlived its running notice."""
    ex = fresh_executor(max_workers=1)
    assert lane_open(ex), "no lane after 20 lone tasks"
    base = ex.statistics()
    for i in range(40):
        if i == 20:
            with pytest.raises(KeyError):
                ex.submit(fail, "counted").result(timeout=30)
        elif i == 30:
            assert ex.submit(nap, reply.DIRECT_SECONDS * 3, i).result(timeout=30) == i
        else:
            assert ex.submit(echo, i).result(timeout=30) == i
        stats = ex.statistics()
        ended = (stats["finished"] + stats["failed"]) - (base["finished"] + base["failed"])
        assert ended == i + 1 and stats["lane"] - base["lane"] == i + 1, (i, stats)
    assert stats["failed"] - base["failed"] == 1 and stats["stats_barrier_expired"] == 0, stats


@pytest.mark.timeout(120)
def test_worker_lanes_off_sends_every_task_through_the_daemon(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(worker_lanes=False))
    for i in range(30):
        assert ex.submit(echo, i).result(timeout=30) == i
    assert ex._agent.lane.dealer is None
    assert wait_until(lambda: ex.statistics()["finished"] == 30, timeout=10), ex.statistics()
    assert ex.statistics()["lane"] == 0


@pytest.mark.timeout(120)
def test_errors_long_tasks_and_large_results_come_back_whole(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(object_store_size="256M"))
    assert lane_open(ex)
    with pytest.raises(KeyError, match="from the lane"):
        ex.submit(fail, "from the lane").result(timeout=30)
    # Longer than a datagram's reply allows: the result comes over the lane.
    assert ex.submit(nap, reply.DIRECT_SECONDS * 3, 5).result(timeout=30) == 5
    store = ex._agent.store
    assert store is not None
    baseline = store.stats().objects
    # 8 MB: the processor writes it to the store; the client pins it, reads it, releases it.
    big = ex.submit(ones, 1_000_000).result(timeout=30)
    assert big.shape == (1_000_000,) and big.sum() == 1_000_000
    assert ex._agent.lane.dealer is not None, "the lane closed"
    del big
    assert wait_until(lambda: (gc.collect() or True) and store.stats().objects == baseline, timeout=20), (
        f"a lane result's store object outlived its reader: {store.stats()}"
    )
    stats = ex.statistics()
    assert stats["lane"] >= 3 and stats["failed"] == 1, stats


@pytest.mark.timeout(120)
def test_a_task_whose_processor_dies_on_the_lane_runs_again_through_the_daemon(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    ex = fresh_executor(max_workers=2)
    assert lane_open(ex)
    before = ex.statistics()
    future = ex.submit(die_once, str(tmp_path / "died"))
    pid = future.result(timeout=60)
    assert isinstance(pid, int) and (tmp_path / "died").exists()
    assert not ex._agent.lane.tasks
    info = scaler_executor.task_info(future)
    assert info is not None and info.attempts == 2, info  # the lane's attempt counts
    assert wait_until(lambda: ex.statistics()["retried"] > before["retried"], timeout=10), ex.statistics()
    assert ex.submit(echo, 7).result(timeout=30) == 7  # and the cluster carries on


@pytest.mark.timeout(120)
def test_a_lane_whose_worker_is_killed_gives_its_task_to_the_daemon(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2)
    assert lane_open(ex)
    worker = lane_worker_pid(ex)
    future = ex.submit(nap, 2.0, 11)
    assert future.running(), "a lane task is RUNNING once sent"
    assert wait_until(lambda: bool(ex._agent.lane.tasks), timeout=5)
    os.kill(worker, signal.SIGKILL)
    assert future.result(timeout=60) == 11
    assert wait_until(lambda: ex._agent.lane.dealer is None or lane_worker_pid(ex) != worker, timeout=10)
    assert ex.submit(echo, 3).result(timeout=60) == 3


@pytest.mark.timeout(120)
def test_the_daemon_counts_a_lane_task_that_runs_a_while(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    """A lane task still running after LANE_NOTICE is announced: the daemon's task counts
    (and the worker's load) include it until it ends."""
    ex = fresh_executor(max_workers=2)
    assert lane_open(ex)
    future = ex.submit(nap, 3.0, 1)
    assert wait_until(lambda: ex.statistics().get("tasks_dispatched", 0) == 1, timeout=10), ex.statistics()
    assert ex.statistics()["tasks"] == 1
    assert future.result(timeout=30) == 1
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10), ex.statistics()
    stats = ex.statistics()
    assert stats.get("tasks_dispatched", 0) == 0 and stats["lane"] >= 1, stats


@pytest.mark.timeout(120)
def test_a_task_depending_on_a_running_lane_task_waits_for_it(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    """The daemon never holds a lane task's result: a task that takes its future as an
    argument waits in the client (PENDING, cancellable) and goes with the value."""
    ex = fresh_executor(max_workers=2)
    assert lane_open(ex)
    first = ex.submit(nap, 0.5, 41)
    assert first.running()
    second = ex.submit(plus_one, first)
    third = ex.submit(plus_one, first)
    assert not second.running() and not second.done()
    assert third.cancel(), "a task waiting for a lane task's value is still PENDING"
    assert second.result(timeout=30) == 42
    assert first.result() == 41 and third.cancelled()
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10), ex.statistics()


@pytest.mark.timeout(120)
def test_a_graph_or_map_may_take_a_running_lane_tasks_future(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2)
    assert lane_open(ex)
    first = ex.submit(nap, 0.3, 5)
    assert ex.get({"a": (plus_one, first), "b": (plus_one, "a")}, "b") == 7
    second = ex.submit(nap, 0.3, 7)
    assert list(ex.map(plus_one, [second, second])) == [8, 8]


@pytest.mark.timeout(120)
def test_force_cancel_reaches_a_running_lane_task(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=1)
    assert lane_open(ex)
    future = ex.submit(nap, 60.0, 1)
    assert future.running() and not future.cancel(), "a lane task cannot be cancelled without force"
    assert ex.cancel(future, force=True)
    with pytest.raises(TaskCancelled):
        future.result(timeout=30)
    assert ex.submit(echo, 4).result(timeout=30) == 4


@pytest.mark.timeout(120)
def test_callables_released_right_after_submit_still_run(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    """Each lambda dies as soon as submit returns: its release reaches the worker right
    behind the task, which must keep the callable until the task has run."""
    ex = fresh_executor(max_workers=1)
    assert lane_open(ex)
    for i in range(40):
        assert ex.submit(lambda i=i: i * 3).result(timeout=30) == i * 3
        gc.collect()
    # Not waited for one by one: each is alone only when the one before has finished.
    futures = []
    for i in range(20):
        futures.append(ex.submit(lambda i=i: -i))
        futures[-1].result(timeout=30)
    assert [f.result() for f in futures] == [-i for i in range(20)]
    assert ex.statistics()["failed"] == 0


@pytest.mark.timeout(120)
def test_a_lane_task_may_submit_and_wait_for_sub_tasks(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=1)
    assert lane_open(ex)
    assert ex.submit(parent, 10).result(timeout=60) == sum(range(10))


@pytest.mark.timeout(180)
def test_threads_mixing_lone_submits_and_bursts_lose_nothing(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(send_hwm=100))
    assert lane_open(ex)
    start = ex.statistics()["finished"]
    total = mix_lone_submits_and_bursts(ex, echo, join_timeout=150)
    assert wait_until(lambda: ex.statistics()["finished"] - start == total, timeout=20), ex.statistics()
    assert ex.statistics()["tasks"] == 0
