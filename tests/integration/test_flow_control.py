"""Flow control end to end: a small send high-water mark, a flood of tiny tasks, no loss, no duplicate.

With ``send_hwm=100`` every ZeroMQ queue on the way (client → daemon → worker and back)
fills long before the client has finished submitting, so each hop must hold what it
cannot send and keep its order instead of dropping, blocking its event loop or
sending twice.  Each future's done-callback counts its completion: every count must
end at exactly one, and every result must be the one its call returns.
"""

from __future__ import annotations

import array
import concurrent.futures
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from scaler_testing import daemon_of, fast_config, mix_lone_submits_and_bursts, wait_until

from scaler_executor import ScalerExecutor, task_info


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
@pytest.mark.parametrize("lanes", [False, True], ids=["no-lanes", "lanes"])
def test_lone_submits_mixed_with_bursts_from_other_threads_lose_nothing(
    fresh_executor: Callable[..., ScalerExecutor], lanes: bool
) -> None:
    """Threads calling one task after another (each submit alone: a REPLY_DIRECT task,
    maybe down a lane, its result picked up by the caller) while others submit bursts
    (whose tasks are never alone) must see every result exactly once and right."""
    ex = fresh_executor(max_workers=2, config=fast_config(send_hwm=100, worker_lanes=lanes))
    assert ex.submit(echo, -1).result(timeout=30) == -1
    for i in range(50):
        assert ex.submit(echo, i).result(timeout=30) == i
    total = mix_lone_submits_and_bursts(ex, echo, join_timeout=90)
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10), ex.statistics()
    stats = ex.statistics()
    assert stats["finished"] == 1 + 50 + total, stats


@pytest.mark.timeout(60)
def test_a_failure_in_the_agents_send_path_breaks_the_executor_and_fails_the_future(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    """A bug in the send path must not lose the tasks it took out of the outbox: it breaks
    the executor and every outstanding future fails with BrokenScalerExecutor."""
    from scaler_executor.exceptions import BrokenScalerExecutor

    ex = fresh_executor(max_workers=1, config=fast_config(worker_lanes=False))  # the daemon's send path
    agent = ex._agent
    assert ex.submit(echo, 1).result(timeout=30) == 1
    # The seam is the route object (client/routes.py): its public send() fails once armed,
    # after the agent took the batch out of the outbox, as a bug in the send path would.
    route = agent.daemon
    original = route.send
    armed = threading.Event()

    def failing_send(batch: list[Any]) -> None:
        if armed.is_set() and any(type(x).__name__ == "SubmitTasks" for x in batch):
            raise RuntimeError("injected failure in the send path")
        original(batch)

    route.send = failing_send  # type: ignore[method-assign]
    armed.set()
    future = ex.submit(echo, 2)
    with pytest.raises(BrokenScalerExecutor, match="injected failure"):
        future.result(timeout=30)
    with pytest.raises(BrokenScalerExecutor):
        ex.submit(echo, 3)


class _Ratio:
    """A result type whose pickle looks up a global (so unpickling it runs the class's code,
    here ``__setstate__``, which notes the thread it runs on)."""

    unpickled_on: list[threading.Thread] = []  # noqa: RUF012 - the test's record, on purpose

    def __init__(self, n: int) -> None:
        self.n = n

    def __setstate__(self, state: dict[str, Any]) -> None:
        _Ratio.unpickled_on.append(threading.current_thread())
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ratio) and other.n == self.n


def make_ratio(n: int) -> _Ratio:
    return _Ratio(n)


def when_released(n: int, release: str) -> int:
    """Return ``n`` once the file ``release`` exists (the test decides when a task ends)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.005)
    return n


def via_agent(future: Future[Any]) -> Any:
    """The result as the agent thread completes it: ``wait()`` does not read the reply
    socket itself, as ``result()`` on a sequential caller's future does."""
    assert not concurrent.futures.wait([future], timeout=30).not_done
    return future.result()


@pytest.mark.timeout(120)
def test_results_and_done_callbacks_never_run_on_the_thread_holding_the_agent_role(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    """Every result the agent thread reads is completed on another pool thread, whether its
    unpickling runs the user's code (a class) or not, and so is every done-callback: the
    thread that holds the socket runs no user code.  (Futures are waited on with
    ``wait()``: ``result()`` would read them itself.)"""
    ex = fresh_executor(max_workers=1, config=fast_config())
    agent_thread = ex._agent.completer.agent_thread
    assert agent_thread is not None and agent_thread.is_alive()
    _Ratio.unpickled_on.clear()
    for i in range(20):
        assert via_agent(ex.submit(echo, i)) == i
        ratio = via_agent(ex.submit(make_ratio, i))
        assert ratio == _Ratio(i)
    ran_on: list[threading.Thread] = []
    done = threading.Event()

    def callback(future: Future[int]) -> None:
        ran_on.append(threading.current_thread())
        done.set()

    release = tmp_path / "release-7"
    future = ex.submit(when_released, 7, str(release))
    future.add_done_callback(callback)  # registered while the task cannot have finished
    release.touch()
    assert future.result(timeout=30) == 7
    assert done.wait(10)
    assert ran_on and ran_on[0] is not agent_thread, f"a done-callback ran on the agent thread: {ran_on}"
    assert len(_Ratio.unpickled_on) == 20 and agent_thread not in _Ratio.unpickled_on, _Ratio.unpickled_on
    assert ex._agent.completer.agent_thread is agent_thread, "the agent role stays on its thread"
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)


@pytest.mark.timeout(60)
def test_a_quiet_result_that_fails_to_unpickle_fails_its_future_on_a_pool_thread(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    """The caller's own completion path (a result it picked up, completed ``quietly`` on
    its thread) settles failures too: a payload that cannot be unpickled fails the
    future, and the future's done-callback runs on a pool thread, never on the thread
    that read the result."""
    from scaler_executor.protocol import messages as m

    ex = fresh_executor(max_workers=1, config=fast_config())
    agent = ex._agent
    release = tmp_path / "release-1"
    future = ex.submit(when_released, 1, str(release))  # pending until we complete it by hand
    assert wait_until(lambda: future._record is not None and future._record.where == "sent", timeout=10)
    ran_on: list[threading.Thread] = []
    future.add_done_callback(lambda f: ran_on.append(threading.current_thread()))
    truncated = m.TaskResult(future._record.n, 0, m.Status.OK, b"\x80\x05N", m.NO_FACTS, [])
    agent.completion.complete(truncated, quietly=True)
    exc = future.exception(timeout=10)
    assert exc is not None and any("while unpickling the result" in note for note in getattr(exc, "__notes__", [])), exc
    assert wait_until(lambda: bool(ran_on), timeout=10)
    assert ran_on[0] is not threading.current_thread() and ran_on[0].name.startswith("scaler-client-"), ran_on
    release.touch()  # let the task end; its real result finds the future settled and is dropped


def fail(n: int) -> int:
    raise ValueError(f"boom {n}")


def blob(n: int) -> bytes:
    return b"x" * n


def slow_echo(n: int, seconds: float) -> int:
    time.sleep(seconds)  # the workload: a task longer than reply.DIRECT_SECONDS
    return n


@pytest.mark.timeout(120)
def test_a_sequential_callers_results_come_straight_from_the_processor(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    """A task submitted while no other is outstanding has its result sent by the processor
    to the client's reply socket (protocol/reply.py): the daemon counts it delivered and
    sends nothing.  Results too large, tasks too long and tasks submitted together take the
    daemon's path; every future completes once, with the right value or exception."""
    from scaler_executor.protocol import reply

    ex = fresh_executor(max_workers=2, config=fast_config())
    agent = ex._agent
    assert ex.submit(echo, -1).result(timeout=30) == -1
    assert agent.inbox.path and os.path.exists(agent.inbox.path), "the embedded client binds a reply socket"

    def delivered() -> int:
        return int(ex.statistics()["delivered_direct"])

    def quick(futures: list[Future[Any]]) -> int:
        """How many ran under DIRECT_SECONDS by the processor's clock (a loaded machine can
        stretch a no-op past it): exactly those may have come straight back."""
        infos = [task_info(f) for f in futures]
        assert all(info is not None and info.worker for info in infos), infos
        return sum(1 for info in infos if info is not None and info.duration < reply.DIRECT_SECONDS)

    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)  # the first's report is in
    base = delivered()
    lone: list[Future[Any]] = []
    for i in range(50):
        lone.append(ex.submit(echo, i))
        assert lone[-1].result(timeout=30) == i
    lone.append(ex.submit(fail, 3))
    with pytest.raises(ValueError, match="boom 3"):
        lone[-1].result(timeout=30)
    direct = quick(lone)
    assert direct >= 40, f"only {direct} of 51 no-op tasks ran under {reply.DIRECT_SECONDS} s"
    # The daemon hears of a delivered result from the worker agent, off the caller's path:
    # its books balance once it holds no task.
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)
    assert delivered() == base + direct, "lone results and errors come straight from the processor"
    base += direct

    assert ex.submit(blob, reply.MAX_PAYLOAD + 1).result(timeout=30) == b"x" * (reply.MAX_PAYLOAD + 1)
    assert ex.submit(slow_echo, 5, reply.DIRECT_SECONDS * 3).result(timeout=30) == 5
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)
    assert delivered() == base, "a large result or a long task takes the daemon's path"

    counts: dict[int, int] = {}
    futures = [ex.submit(echo, i) for i in range(200)]
    for f in futures:
        f.add_done_callback(lambda f: counts.__setitem__(f.result(), counts.get(f.result(), 0) + 1))
    assert [f.result(timeout=60) for f in futures] == list(range(200))
    assert wait_until(lambda: len(counts) == 200, timeout=10)
    assert set(counts.values()) == {1}
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10), ex.statistics()
    # The first was submitted alone; under load a later one can be too (the earlier ones
    # already done): exactly those are offered the pick-up, and only they may reply directly.
    alone = [f for f in futures if f._pickup is not None]
    assert 1 <= len(alone) < 200
    assert delivered() == base + quick(alone), "only a task submitted alone may reply directly"
    assert ex.statistics()["finished"] == 1 + 50 + 2 + 200


@pytest.mark.timeout(60)
def test_results_take_the_daemons_path_when_the_reply_socket_cannot_be_written(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    """A processor that cannot send to the reply socket (here: its file removed; in life
    also a full queue or a client gone) reports the result the normal way: nothing lost."""
    from scaler_executor.protocol import reply

    ex = fresh_executor(max_workers=1, config=fast_config())
    agent = ex._agent
    assert ex.submit(echo, 0).result(timeout=30) == 0  # the first can take longer (imports)
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)  # its report is in
    start = ex.statistics()["delivered_direct"]
    lone = [ex.submit(echo, i) for i in range(1)]
    for i in range(1, 5):
        assert lone[-1].result(timeout=30) == i - 1
        lone.append(ex.submit(echo, i))
    assert lone[-1].result(timeout=30) == 4
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)
    before = ex.statistics()["delivered_direct"]
    quick = [f for f in lone if (info := task_info(f)) is not None and info.duration < reply.DIRECT_SECONDS]
    assert before == start + len(quick) and quick, "the reply socket works before it is removed"
    os.unlink(agent.inbox.path)
    for i in range(20):
        assert ex.submit(echo, i).result(timeout=30) == i
    with pytest.raises(ValueError, match="boom 7"):
        ex.submit(fail, 7).result(timeout=30)
    assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=10)
    assert ex.statistics()["delivered_direct"] == before


def _in_pick_up(agent: Any, future: Future[Any]) -> Callable[[], bool]:
    return lambda: agent.inbox.picking is future


@pytest.mark.timeout(60)
def test_a_caller_reads_only_up_to_its_own_result_and_the_agent_reads_the_rest(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    """Datagrams queued behind the caller's own result stay for the agent thread, which
    completes their futures once it watches the socket again: none is lost."""
    import pickle

    from scaler_executor.protocol import messages as m
    from scaler_executor.protocol import reply

    ex = fresh_executor(max_workers=1, config=fast_config())
    agent = ex._agent
    assert ex.submit(echo, 0).result(timeout=30) == 0
    release = tmp_path / "release"
    future = ex.submit(when_released, 1, str(release))  # alone: it may be picked up
    other = ex.submit(when_released, 2, str(release))  # queued behind it on the one processor
    assert future._pickup is not None
    reads: list[tuple[str, int]] = []
    original_read = agent.inbox.read

    def recording_read(*wanted: Any) -> Any:
        results = original_read(*wanted)
        reads.append((threading.current_thread().name, len(results)))
        return results

    agent.inbox.read = recording_read
    got: list[Any] = []
    caller = threading.Thread(target=lambda: got.append(future.result(timeout=30)), name="caller")
    now = time.time()
    # Once the caller is picking up, the socket is out of the agent's poll set: both
    # datagrams wait in it until the caller reads, and it reads only up to its own.
    caller.start()
    assert wait_until(_in_pick_up(agent, future), timeout=30), "the caller never took the socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for f, value in ((future, 98), (other, 99)):
            task_id = agent.core.base | f._record.n
            result = m.TaskResult(task_id, 0, m.Status.OK, pickle.dumps(value), m.TaskFacts("w", now, now, 0), [])
            sender.sendto(reply.encode(result), agent.inbox.path)
    caller.join(timeout=30)
    assert got == [98], got
    assert reads[0] == ("caller", 1), reads  # its own result, and no further read
    assert not concurrent.futures.wait([other], timeout=30).not_done, "the second datagram was lost"
    assert other.result() == 99
    assert [n for name, n in reads[1:] if n] == [1] and reads[1][0] != "caller", reads  # the agent thread's
    release.touch()  # the real results find their futures settled and are dropped


@pytest.mark.timeout(60)
def test_a_waiting_caller_reads_its_result_from_the_reply_socket_itself(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    """``result()`` on a sequential caller's future takes the reply socket from the agent
    thread and reads its result there (done-callbacks still run on a pool thread);
    afterwards the agent watches the socket again."""
    import pickle

    from scaler_executor.protocol import messages as m
    from scaler_executor.protocol import reply

    ex = fresh_executor(max_workers=1, config=fast_config())
    agent = ex._agent
    assert ex.submit(echo, 0).result(timeout=30) == 0
    release = tmp_path / "release"
    future = ex.submit(when_released, 1, str(release))  # alone: it may be picked up
    assert future._pickup is not None
    readers: list[str] = []
    original_read = agent.inbox.read

    def recording_read(*wanted: Any) -> Any:
        readers.append(threading.current_thread().name)
        return original_read(*wanted)

    agent.inbox.read = recording_read
    got: list[Any] = []
    callback_threads: list[threading.Thread] = []
    future.add_done_callback(lambda f: callback_threads.append(threading.current_thread()))
    caller = threading.Thread(target=lambda: got.append(future.result(timeout=30)), name="caller")
    caller.start()
    assert wait_until(_in_pick_up(agent, future), timeout=10), "result() did not take the reply socket"
    # What a processor sends: a datagram with the result (the real task is still running).
    task_id = agent.core.base | future._record.n
    now = time.time()
    datagram = reply.encode(m.TaskResult(task_id, 0, m.Status.OK, pickle.dumps(99), m.TaskFacts("w", now, now, 0), []))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(datagram, agent.inbox.path)
    caller.join(timeout=30)
    assert got == [99], got
    assert readers == ["caller"], readers
    assert wait_until(lambda: bool(callback_threads), timeout=10)
    assert callback_threads[0].name.startswith("scaler-client-"), callback_threads
    assert agent.inbox.picking is None
    release.touch()  # the real result finds the future settled and is dropped
    # The agent watches the socket again: a result it reads completes a future nobody waits on.
    follow = ex.submit(echo, 5)
    assert not concurrent.futures.wait([follow], timeout=30).not_done
    assert follow.result() == 5


@pytest.mark.timeout(60)
def test_a_caller_picking_up_is_woken_by_every_other_ending(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    """A thread waiting on the reply socket must not miss its future's ending any other
    way: a result through the daemon (a long task), a timeout, a cancel, a dead daemon."""
    from scaler_executor.exceptions import DaemonLost

    ex = fresh_executor(max_workers=1, config=fast_config(unsatisfiable_timeout=120.0))
    agent = ex._agent
    assert ex.submit(echo, 0).result(timeout=30) == 0
    # A long task's result takes the daemon's path: the agent completes it, the waiter wakes.
    assert ex.submit(slow_echo, 3, 0.1).result(timeout=30) == 3
    # A timeout gives the socket back.
    slow = ex.submit(slow_echo, 4, 1.0)
    with pytest.raises(concurrent.futures.TimeoutError):
        slow.result(timeout=0.05)
    assert agent.inbox.picking is None
    assert slow.result(timeout=30) == 4
    # A cancel: a task no worker can take stays pending in the daemon.
    pending = ex.options(tags=["nowhere"]).submit(echo, 6)
    assert pending._pickup is not None
    errors: list[BaseException] = []

    def wait_for(f: Future[Any]) -> None:
        try:
            f.result(timeout=30)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_for, args=(pending,))
    waiter.start()
    assert wait_until(_in_pick_up(agent, pending), timeout=10)
    assert pending.cancel()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and len(errors) == 1
    assert isinstance(errors[0], concurrent.futures.CancelledError), errors
    # The daemon dies while a caller waits: the future fails, the caller returns.
    stuck = ex.options(tags=["nowhere"]).submit(echo, 7)
    waiter = threading.Thread(target=wait_for, args=(stuck,))
    waiter.start()
    assert wait_until(_in_pick_up(agent, stuck), timeout=10)
    daemon_of(ex).kill()
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "a caller picking up hung when the daemon died"
    assert len(errors) == 2 and isinstance(errors[1], DaemonLost), errors


class _RecordingPoll:
    """select.poll that notes each timeout it is called with (0: a spinning poll)."""

    def __init__(self, calls: list[Any]) -> None:
        import select

        self._poll = select.poll()
        self._calls = calls

    def register(self, fd: int, events: int) -> None:
        self._poll.register(fd, events)

    def poll(self, timeout: Any = None) -> Any:
        self._calls.append(timeout)
        return self._poll.poll(timeout)


def gated_echo(gate: str, n: int, seconds: float) -> int:
    """``n`` once the file ``gate`` exists, ``seconds`` later."""
    while not os.path.exists(gate):
        time.sleep(0.001)
    time.sleep(seconds)
    return n


def _picked_up(ex: ScalerExecutor, gates: Path, n: int, seconds: float = 0.0, timeout: float = 30) -> Any:
    """``ex.submit(...).result(timeout)`` of a task that ends only once the caller waits in
    its pick-up (``inbox.picking``, the seam tests wait for): otherwise a caller slowed by
    a busy machine finds its result read and settled by the agent thread and never polls,
    which is right but not what these tests look at."""
    gate = gates / f"open-{n}"
    future = ex.submit(gated_echo, str(gate), n, seconds)
    inbox = ex._agent.inbox
    opener = threading.Thread(
        target=lambda: wait_until(lambda: inbox.picking is future, timeout=timeout) and gate.touch(), daemon=True
    )
    opener.start()
    try:
        return future.result(timeout=timeout)
    finally:
        gate.touch()  # whatever happened, the task ends
        opener.join(timeout)


@pytest.mark.timeout(60)
def test_a_caller_spins_only_while_results_come_within_the_spin_window(
    fresh_executor: Callable[..., ScalerExecutor], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A picking-up caller polls without sleeping (timeout 0) for PICKUP_SPIN_SECONDS
    while its last wait was that short, and every ending still ends the spin; after a
    longer wait it blocks at once, and it spins again after a short one."""
    import select
    import types

    import scaler_executor.client.routes as agent_module

    if not agent_module.SPIN_WORTHWHILE:
        pytest.skip("one CPU: the caller never spins")
    calls: list[Any] = []
    monkeypatch.setattr(
        agent_module, "select", types.SimpleNamespace(poll=lambda: _RecordingPoll(calls), POLLIN=select.POLLIN)
    )
    ex = fresh_executor(max_workers=1, config=fast_config())
    agent = ex._agent
    # A window longer than any wait here: every wait below spins from start to end.
    monkeypatch.setattr(agent_module, "PICKUP_SPIN_SECONDS", 60.0)
    assert ex.submit(echo, 0).result(timeout=30) == 0
    assert agent.inbox.spin
    calls.clear()
    assert _picked_up(ex, tmp_path, 1) == 1  # a quick task: from the reply socket
    assert calls and set(calls) == {0}, calls
    calls.clear()
    assert _picked_up(ex, tmp_path, 2, 0.1) == 2  # through the daemon: the waiter ends the spin
    assert calls and set(calls) == {0}, calls
    calls.clear()
    slow = ex.submit(slow_echo, 3, 2.0)
    with pytest.raises(concurrent.futures.TimeoutError):
        slow.result(timeout=0.5)  # the deadline ends the spin (long enough to start polling under load)
    assert calls and set(calls) == {0}, calls
    assert slow.result(timeout=30) == 3
    # A window shorter than a 0.2 s task: that wait turns spinning off ...
    monkeypatch.setattr(agent_module, "PICKUP_SPIN_SECONDS", 0.05)
    assert _picked_up(ex, tmp_path, 4, 0.2) == 4
    assert not agent.inbox.spin
    # ... so the next caller blocks in poll at once; its short wait turns spinning back on.
    monkeypatch.setattr(agent_module, "PICKUP_SPIN_SECONDS", 60.0)
    calls.clear()
    assert _picked_up(ex, tmp_path, 5) == 5
    assert calls and 0 not in calls, calls
    assert agent.inbox.spin
    calls.clear()
    assert _picked_up(ex, tmp_path, 6) == 6
    assert calls and set(calls) == {0}, calls
