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


def test_the_cancel_hook_decides_and_is_never_asked_for_a_running_future() -> None:
    asked: list[TaskFuture[Any]] = []
    called_back: list[Future[Any]] = []

    def refuse(future: TaskFuture[Any]) -> bool:
        asked.append(future)
        return False

    def grant(future: TaskFuture[Any]) -> bool:
        asked.append(future)
        return future.cancel_now()

    refused: TaskFuture[int] = TaskFuture()
    refused._on_cancel = refuse
    assert not refused.cancel() and not refused.cancelled() and asked == [refused]

    pending: TaskFuture[int] = TaskFuture()
    pending._on_cancel = grant
    pending.add_done_callback(called_back.append)
    assert pending.cancel()
    assert asked == [refused, pending] and called_back == [pending]
    assert pending.cancel(), "cancelling a cancelled future is True, without asking again"
    assert asked == [refused, pending]
    with pytest.raises(CancelledError):
        pending.result()

    running: TaskFuture[int] = TaskFuture()
    running._on_cancel = grant
    assert running.mark_running() and not running.mark_running()
    assert not running.cancel()
    assert asked == [refused, pending]

    unhooked: TaskFuture[int] = TaskFuture()
    assert unhooked.cancel() and unhooked.cancelled()


def test_a_cancelled_future_is_notified_at_once() -> None:
    """Future.cancel() alone leaves wait() and as_completed() blind to it until someone
    calls set_running_or_notify_cancel(); TaskFuture's cancel notifies at once."""
    done: TaskFuture[int] = TaskFuture()
    done.set_result(1)
    cancelled: TaskFuture[int] = TaskFuture()
    waiter = threading.Thread(target=lambda: cancelled.cancel())
    timer = threading.Timer(0.05, waiter.start)
    timer.start()
    finished, not_done = wait([done, cancelled], timeout=10)
    timer.join()
    waiter.join()
    assert not not_done and cancelled in finished
    assert list(as_completed([cancelled], timeout=10)) == [cancelled]


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, ValueError])
def test_a_raising_done_callback_is_logged_and_the_others_run(
    raised: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    future: TaskFuture[int] = TaskFuture()

    def bad(_: Future[int]) -> None:
        raise raised("from a callback")

    future.add_done_callback(bad)
    future.add_done_callback(lambda f: seen.append(f.result()))
    future.set_result(5)  # must not raise, whatever the callback raised
    assert seen == [5]
    assert "exception calling callback" in caplog.text


def test_settle_if_no_callbacks() -> None:
    plain: TaskFuture[int] = TaskFuture()
    assert plain.settle_if_no_callbacks(True, 3) and plain.result() == 3
    failing: TaskFuture[int] = TaskFuture()
    assert failing.settle_if_no_callbacks(False, ValueError("x"))
    assert isinstance(failing.exception(), ValueError)
    called: TaskFuture[int] = TaskFuture()
    called.add_done_callback(lambda f: None)
    assert called.has_callbacks()
    assert not called.settle_if_no_callbacks(True, 1) and not called.done()
    cancelled: TaskFuture[int] = TaskFuture()
    assert cancelled.cancel()
    assert cancelled.settle_if_no_callbacks(True, 1) and cancelled.cancelled()


def test_a_running_notice_racing_its_result_never_strands_the_future() -> None:
    """A RUNNING notice and the result of one task can be applied on two threads at once
    (the agent thread marks running notices, a pool thread completes results). Both go
    through mark_running(), an atomic check-and-set: neither raises, and the future ends
    FINISHED with its value. (Before it, a check-then-set on two threads raised
    InvalidStateError on the loser and stranded the future.)"""
    from scaler_executor.client.completion import settle

    n = 2000
    futures: list[TaskFuture[int]] = [TaskFuture() for _ in range(n)]
    raised: list[BaseException] = []
    gates = [threading.Barrier(2) for _ in range(n)]

    def notices() -> None:
        try:
            for future, gate in zip(futures, gates):
                gate.wait(10)
                future.mark_running()
        except BaseException as exc:  # noqa: BLE001 - reported below
            raised.append(exc)

    def results() -> None:
        try:
            for i, (future, gate) in enumerate(zip(futures, gates)):
                gate.wait(10)
                settle(future, True, i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            raised.append(exc)

    threads = [threading.Thread(target=notices), threading.Thread(target=results)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not raised, raised
    assert [f.result(0) for f in futures] == list(range(n))


def test_a_future_nobody_touched_runs_and_completes_without_its_condition() -> None:
    """A running notice and a result for a future nobody waits on, asked or gave a callback
    make none of the lazy members (they were ~1 KB and the largest cost of a notice), and
    reading the finished future's result makes none either."""
    from scaler_executor.client.completion import settle

    future: TaskFuture[int] = TaskFuture()
    assert future.mark_running() and not future.mark_running()
    assert not set(LAZY_MEMBERS) & set(vars(future))
    settle(future, True, 7)
    assert not set(LAZY_MEMBERS) & set(vars(future))
    assert future.result() == 7 and future.result(0) == 7
    assert not set(LAZY_MEMBERS) & set(vars(future))
    assert future.done() and not future.running() and not future.cancel()

    failed: TaskFuture[int] = TaskFuture()
    assert failed.settle_if_no_callbacks(False, KeyError("k"))
    assert not set(LAZY_MEMBERS) & set(vars(failed))
    with pytest.raises(KeyError):
        failed.result()
    assert isinstance(failed.exception(), KeyError)

    cancelled: TaskFuture[int] = TaskFuture()
    assert cancelled.cancel()
    assert not cancelled.mark_running()
    settle(cancelled, True, 1)
    assert cancelled.cancelled()
    with pytest.raises(CancelledError):
        cancelled.result()


def test_waiters_arriving_while_a_fresh_future_completes_are_all_woken() -> None:
    """Threads that make the condition (result(), wait(), add_done_callback) while another
    completes the future without one: each either sees it done or is woken; none hangs."""
    from scaler_executor.client.completion import settle

    def by_result(start: threading.Barrier, future: TaskFuture[int], got: list[Any]) -> None:
        start.wait(10)
        got.append(future.result(timeout=30))

    def by_wait(start: threading.Barrier, future: TaskFuture[int], got: list[Any]) -> None:
        start.wait(10)
        done, _ = wait([future], timeout=30)
        got.append(len(done))

    def by_callback(start: threading.Barrier, future: TaskFuture[int], called: list[Any]) -> None:
        start.wait(10)
        future.add_done_callback(lambda f: called.append(f.result()))

    for i in range(300):
        future: TaskFuture[int] = TaskFuture()
        start = threading.Barrier(4)
        got: list[Any] = []
        called: list[Any] = []
        threads = [
            threading.Thread(target=by_result, args=(start, future, got)),
            threading.Thread(target=by_wait, args=(start, future, got)),
            threading.Thread(target=by_callback, args=(start, future, called)),
        ]
        for t in threads:
            t.start()
        start.wait(10)
        future.mark_running()
        settle(future, True, i)
        for t in threads:
            t.join(30)
        assert sorted(got) == sorted([i, 1]) and called == [i]


def test_a_cancel_racing_a_fresh_futures_completion_has_one_winner() -> None:
    """cancel() True means the future is cancelled for good; False means it ran (its value
    is there). Never both, never neither, whichever thread makes the condition."""
    from scaler_executor.client.completion import settle

    def cancel(future: TaskFuture[int], gate: threading.Barrier, said: list[bool]) -> None:
        gate.wait(10)
        said.append(future.cancel())

    outcomes = {True: 0, False: 0}
    for i in range(2000):
        future: TaskFuture[int] = TaskFuture()
        gate = threading.Barrier(2)
        said: list[bool] = []
        t = threading.Thread(target=cancel, args=(future, gate, said))
        t.start()
        gate.wait(10)
        if i % 2:
            future.mark_running()
        settle(future, True, i)
        t.join(30)
        if said[0]:
            assert future.cancelled()
            with pytest.raises(CancelledError):
                future.result(0)
        else:
            assert future.result(0) == i
        outcomes[said[0]] += 1
    assert sum(outcomes.values()) == 2000
