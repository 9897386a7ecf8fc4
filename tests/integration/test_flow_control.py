"""Flow control end to end: a small send high-water mark, a flood of tiny tasks, no loss, no duplicate.

With ``send_hwm=100`` every ZeroMQ queue on the way (client → daemon → worker and back)
fills long before the client has finished submitting, so each hop must hold what it
cannot send and keep its order instead of dropping, blocking its event loop or
sending twice.  Each future's done-callback counts its completion: every count must
end at exactly one, and every result must be the one its call returns.
"""

from __future__ import annotations

import array
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

import pytest
from scaler_testing import fast_config, wait_until

from scaler_executor import ScalerExecutor


def echo(i: int) -> int:
    return i


def flood(ex: ScalerExecutor, n: int, timeout: float) -> float:
    """Submit ``echo(i)`` for i < n; check every future completes once, correctly.  Returns seconds."""
    counts = array.array("I", bytes(4 * n))  # completions per future, written by its done-callback
    lock = threading.Lock()
    total = [0]

    def on_done(i: int, future: Future[int]) -> None:
        with lock:
            counts[i] += 1
            total[0] += 1

    started = time.monotonic()
    futures = []
    for i in range(n):
        future = ex.submit(echo, i)
        future.add_done_callback(partial(on_done, i))
        futures.append(future)
    assert wait_until(lambda: total[0] >= n, timeout=timeout, interval=0.1), (
        f"{n - total[0]} of {n} futures not completed after {timeout} s"
    )
    elapsed = time.monotonic() - started
    bad = [i for i, f in enumerate(futures) if f.exception() is not None or f.result() != i]
    assert not bad, f"{len(bad)} wrong results, first: {bad[0]} -> {futures[bad[0]].exception()!r}"
    # Callbacks can only run once per future; a duplicate completion would have raised in the
    # client's completion thread (InvalidStateError) and left others hanging.  Counting makes it visible.
    twice = [i for i in range(n) if counts[i] != 1]
    assert not twice, f"{len(twice)} futures completed {counts[twice[0]]} times, first: {twice[0]}"
    stats = ex.statistics()
    assert stats["finished"] == n and stats["tasks"] == 0, stats
    return elapsed


@pytest.mark.timeout(300)
def test_hwm_100_with_1e5_noop_tasks_every_future_completes_once(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(send_hwm=100))
    elapsed = flood(ex, 10**5, timeout=240)
    print(f"\n10**5 tasks with send_hwm=100: {elapsed:.1f} s ({10**5 / elapsed:,.0f} tasks/s)")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_hwm_100_with_1e6_noop_tasks_every_future_completes_once(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(send_hwm=100))
    elapsed = flood(ex, 10**6, timeout=1500)
    print(f"\n10**6 tasks with send_hwm=100: {elapsed:.1f} s ({10**6 / elapsed:,.0f} tasks/s)")


@pytest.mark.timeout(120)
def test_a_running_notice_racing_its_result_never_strands_the_future(executor: ScalerExecutor) -> None:
    """Two completion threads: one applies RUNNING notices, the other the results, for the
    same futures at once (deferred notices make them arrive together under a flood). The
    loser of PENDING -> RUNNING used to raise inside the result's completion after the
    future had left the agent's table: that future stayed RUNNING forever (a CI hang)."""
    import pickle
    import sys

    from scaler_executor.client.agent import TASK_MASK
    from scaler_executor.protocol import messages as m

    class YieldingFuture(Future):  # type: ignore[type-arg]
        """Yields the interpreter right after answering running(): between a thread's
        check and its set_running_or_notify_cancel(), the window of the race."""

        def running(self) -> bool:
            answer = super().running()
            time.sleep(0)
            return answer

    agent = executor._agent
    base = TASK_MASK - 200_000  # ids far above anything this module's executor submits
    n = 2_000
    futures = {}
    for i in range(n):
        future: Future[int] = YieldingFuture()
        futures[base + i] = future
    agent.futures.update(futures)
    payload = pickle.dumps(7)
    results = [m.TaskResult(base + i, 0, m.Status.OK, payload, m.NO_FACTS, []) for i in range(n)]
    start = threading.Barrier(2)
    raised: list[BaseException] = []

    def notices() -> None:
        try:
            for i in range(n):
                start.wait(10)  # both threads on the same future at once
                agent._mark_running([base + i])
        except BaseException as exc:  # the race, seen from the notice's side
            raised.append(exc)
            start.abort()

    def completions() -> None:
        try:
            for result in results:
                start.wait(10)
                agent._complete_result(result)
        except BaseException as exc:  # the race, seen from the result's side
            raised.append(exc)
            start.abort()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        threads = [threading.Thread(target=notices), threading.Thread(target=completions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not raised, f"a completion thread raised: {raised[0]!r}"
    stranded = [k for k, f in futures.items() if not f.done()]
    assert not stranded, f"{len(stranded)} of {n} futures never completed, e.g. {futures[stranded[0]]!r}"
    assert all(f.result() == 7 for f in futures.values())
    assert not any(k in agent.futures for k in futures)
