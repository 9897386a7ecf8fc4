"""TaskFuture: a standard Future whose condition and lists are made on first use."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, as_completed, wait
from typing import Any

import pytest

from scaler_executor.client.future import LAZY_MEMBERS, TaskFuture

pytestmark = pytest.mark.timeout(60)


def test_it_has_every_member_a_standard_future_has() -> None:
    """A Python whose Future.__init__ grows a member fails here, not in a user's wait()."""
    standard = set(vars(Future()))
    ours = set(vars(TaskFuture())) | set(LAZY_MEMBERS)
    assert standard <= ours, f"TaskFuture.__init__ misses {sorted(standard - ours)}"


def test_a_pending_future_costs_a_fraction_of_a_standard_one() -> None:
    def bytes_each(make: Any) -> float:
        n = 5_000
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = [make() for _ in range(n)]
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(kept) == n
        return (after - before) / n

    standard, ours = bytes_each(Future), bytes_each(TaskFuture)
    assert ours < 400, f"a pending TaskFuture costs {ours:.0f} B (a standard Future {standard:.0f} B)"
    assert ours < standard / 3


def test_the_lazy_members_are_made_once_and_only_when_used() -> None:
    future: TaskFuture[int] = TaskFuture()
    assert not set(LAZY_MEMBERS) & set(vars(future))
    assert not future.done() and not future.running()
    condition = future._condition
    assert future._condition is condition
    future.set_result(3)
    assert future.result() == 3 and future._condition is condition
    with pytest.raises(AttributeError, match="no attribute '_nope'"):
        future._nope  # noqa: B018


def test_threads_touching_a_fresh_future_at_once_share_one_condition() -> None:
    """Waiters that raced to make the condition must all be woken by the one set_result."""
    threads_per_future = 8
    for _ in range(200):
        future: TaskFuture[int] = TaskFuture()
        start = threading.Barrier(threads_per_future + 1)
        got: list[Any] = []

        def waiter(start: threading.Barrier, future: TaskFuture[int], got: list[Any]) -> None:
            start.wait()
            got.append(future.result(timeout=30))

        threads = [threading.Thread(target=waiter, args=(start, future, got)) for _ in range(threads_per_future)]
        for t in threads:
            t.start()
        start.wait()
        future.set_result(5)
        for t in threads:
            t.join(30)
        assert got == [5] * threads_per_future


def test_wait_as_completed_and_asyncio_see_a_normal_future() -> None:
    futures: list[TaskFuture[int]] = [TaskFuture() for _ in range(4)]
    done, not_done = wait(futures, timeout=0)
    assert not done and len(not_done) == 4

    def finish() -> None:
        for i, f in enumerate(futures):
            f.set_result(i)

    timer = threading.Timer(0.05, finish)
    timer.start()
    try:
        done, _ = wait(futures, return_when=FIRST_COMPLETED, timeout=30)
        assert done
        assert sorted(f.result() for f in as_completed(futures, timeout=30)) == [0, 1, 2, 3]
    finally:
        timer.join()

    async def awaited() -> int:
        future: TaskFuture[int] = TaskFuture()
        asyncio.get_running_loop().call_later(0.01, future.set_result, 9)
        return await asyncio.wrap_future(future)

    assert asyncio.run(awaited()) == 9
    assert isinstance(futures[0], Future)


def test_the_cancel_hook_runs_after_a_cancellation_and_never_for_a_running_future() -> None:
    heard: list[TaskFuture[Any]] = []
    called_back: list[Future[Any]] = []
    pending: TaskFuture[int] = TaskFuture()
    pending._on_cancel = heard.append
    pending.add_done_callback(called_back.append)
    assert pending.cancel()
    assert heard == [pending] and called_back == [pending]
    with pytest.raises(CancelledError):
        pending.result()

    running: TaskFuture[int] = TaskFuture()
    running._on_cancel = heard.append
    assert running.set_running_or_notify_cancel()
    assert not running.cancel()
    assert heard == [pending]

    unhooked: TaskFuture[int] = TaskFuture()
    assert unhooked.cancel() and unhooked.cancelled()
