"""Cancellation and completion contract of ``ScalerExecutor``, through the public API only.

Written ahead of the client rewrite (scaler_executor/client/agent.py), to be run against it:

1. Every cancelled future is *notified* at once: ``concurrent.futures.wait`` (with and
   without a timeout), ``as_completed`` and ``scaler_executor.progress`` count it as done,
   whether it was cancelled through ``Future.cancel()`` (one, many or all of a set, also
   while a thread is already waiting) or by ``shutdown(cancel_futures=True)``.
2. ``cancel()`` returns True only for a task that never runs: user threads submit and
   cancel while results stream in, then ``shutdown(cancel_futures=True)``; no task whose
   future reports ``cancelled()`` may have written its id to the log.  Also the short
   scenario "submit 50, shutdown(cancel_futures=True) at once", repeated on fresh clusters.
3. A done-callback raising ``SystemExit``, ``KeyboardInterrupt`` or an ``Exception`` is
   logged, and the completion threads carry on.
4. Finalizers run by the garbage collector at any allocation (a low gc threshold), and
   done-callbacks that call ``gc.collect()``, while ObjectRefs, map iterators and cached
   functions die in reference cycles: nothing deadlocks.
5. ``Future.cancel()`` from many threads on the same futures, while results arrive, never
   raises.
6. A result the client cannot unpickle fails its future, with a message saying the result
   could not be read, instead of leaving it pending (and the executor keeps working).
7. ``cancel()`` of a task queued behind blockers returns True and the future is cancelled
   and done at once; ``cancel()`` of a running task returns False and its result arrives.

How the tests control ordering (no sleeps for ordering): a **gate** is a file; ``gated``
tasks drop a marker file when they start and block until the gate file exists (or their
own deadline, so a broken test cannot wedge a cluster for long).  With ``max_prefetch=1``
a 2-processor worker holds at most 3 tasks (scheduler/policies.py ``prefetch_window``:
capacity + min(capacity, max_prefetch)), so of the tasks queued behind two running blockers
all but the first few stay at the daemon, PENDING, and ``cancel()`` must succeed on them.

Every wait is bounded inside the test (a regression fails, it does not hang), every test
has a ``pytest.mark.timeout``, and the executors are made by ``make_executor``, which
shuts each down with a bound and, when the client is wedged, kills its cluster so that
nothing leaks and interpreter exit does not wait for it forever.

Workers import this module by name (module-level task functions travel by reference):
it must stay cheap and free of side effects to import.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import importlib
import io
import itertools
import logging
import os
import random
import re
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future
from pathlib import Path
from typing import Any

import pytest
from scaler_testing import Gate, fast_config, wait_until

from scaler_executor import ScalerExecutor
from scaler_executor.progress import progress

GATE_TIMEOUT = 60.0  # a gated task gives up after this, so a broken test cannot wedge its cluster
BOUND = 30.0  # the most any single wait of a test may take before it counts as a hang
SHORT = 10.0  # for what must happen "at once" (a cancelled future counted as done)
SHUTDOWN_BOUND = 30.0
QUEUED = 10  # tasks submitted behind the two blockers
HELD = 4  # of those, at most this many may have reached the worker (3 is the window; one spare)


# =========================================================================== task functions
# Module level: they travel by reference and the workers import this module.


def echo(x: Any) -> Any:
    return x


def sleep_and_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def sleep_and_return(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def append_id(log: str, i: int, seconds: float = 0.0) -> int:
    """Record that task ``i`` ran: one O_APPEND write of one line, so concurrent writers never interleave."""
    if seconds:
        time.sleep(seconds)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i


def gated(gate: str, started_dir: str, value: Any = "released", timeout: float = GATE_TIMEOUT) -> Any:
    """Drop a marker in ``started_dir``, then block until the file ``gate`` exists."""
    Path(started_dir, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            return "gate timed out"
        time.sleep(0.005)
    return value


def length(value: Any) -> int:
    return len(value)


def _rebuild_in(pid: int, kind: str, pad: bytes) -> str:
    """Unpickles only in the process that pickled it (the worker's processor)."""
    if os.getpid() != pid:
        if kind == "error":
            raise RuntimeError("undecodable-result: this value only unpickles in the worker")
        if kind == "exit":
            raise SystemExit("undecodable-result: SystemExit while unpickling")
        if kind == "interrupt":
            raise KeyboardInterrupt("undecodable-result: KeyboardInterrupt while unpickling")
        raise AssertionError(kind)
    return "rebuilt"


class Undecodable:
    """A value whose unpickling raises anywhere but in the process that pickled it."""

    def __init__(self, kind: str, pad: int) -> None:
        self.kind = kind
        self.pad = b"u" * pad

    def __reduce__(self) -> Any:
        return (_rebuild_in, (os.getpid(), self.kind, self.pad))


def make_undecodable(kind: str, pad: int) -> Undecodable:
    return Undecodable(kind, pad)


def instance_of_worker_only_module(directory: str, name: str) -> Any:
    """An instance of a class from a module only the worker can import (on a path only it has)."""
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return importlib.import_module(name).OnlyHere()


# =========================================================================== helpers




def read_ids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def in_thread(fn: Callable[[], Any], timeout: float) -> tuple[bool, Any, BaseException | None]:
    """Run ``fn`` on a daemon thread for at most ``timeout`` s: (returned, value, exception)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="cancel-contract-helper")
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("value"), box.get("error")


def bounded_shutdown(ex: ScalerExecutor, timeout: float = SHUTDOWN_BOUND, **kwargs: Any) -> bool:
    """``ex.shutdown(wait=True, **kwargs)`` on another thread; whether it returned within ``timeout``."""
    returned, _, error = in_thread(lambda: ex.shutdown(wait=True, **kwargs), timeout)
    if error is not None:
        raise error
    return returned


def salvage(ex: ScalerExecutor) -> None:
    """After a shutdown that did not return: stop the cluster by hand (the only internals used).

    Without this a wedged client leaks its daemon and workers (the module's leak check
    fails for every later test) and the agent module's atexit hook waits for it forever.
    """
    from scaler_executor.client import agent as agent_module

    agent = ex._agent
    agent_module._live_agents.discard(agent)
    ex._finalizer.detach()
    if ex._cluster is not None:
        ex._cluster.stop()  # closes the lifeline; kills the daemon's group if it does not stop
    store = agent.store
    if store is not None:
        try:
            from scaler_executor.objstore import ObjectStore

            ObjectStore.unlink_name(store.name, tempfile.gettempdir())
        except Exception:
            pass


@pytest.fixture
def make_executor() -> Iterator[Callable[..., ScalerExecutor]]:
    """Like conftest's ``fresh_executor``, but its teardown cannot hang on a wedged client.

    ``make_executor(max_workers=2, **config_changes)``; each executor is shut down with
    ``cancel_futures=True`` within SHUTDOWN_BOUND, and one that does not stop is salvaged
    and reported as an error of the test.
    """
    made: list[ScalerExecutor] = []

    def make(max_workers: int = 2, **changes: Any) -> ScalerExecutor:
        ex = ScalerExecutor(max_workers=max_workers, config=fast_config(**changes))
        made.append(ex)
        return ex

    yield make
    wedged = []
    for ex in made:
        try:
            ok = bounded_shutdown(ex, SHUTDOWN_BOUND, cancel_futures=True)
        except BaseException as exc:  # noqa: BLE001
            ok = False
            wedged.append(f"{ex!r}: shutdown raised {exc!r}")
        if not ok:
            wedged.append(f"{ex!r}: shutdown(wait=True) did not return within {SHUTDOWN_BOUND} s")
            salvage(ex)
    assert not wedged, wedged


def prime(ex: ScalerExecutor) -> None:
    """Sequential results first (a lane opens when lanes are on), then both processors
    seen running side by side, so that two gated tasks occupy both."""
    for i in range(3):
        assert ex.submit(echo, i).result(timeout=BOUND) == i
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fs = [ex.submit(sleep_and_pid, 0.2) for _ in range(2)]
        if len({f.result(timeout=BOUND) for f in fs}) == 2:
            return
    raise AssertionError("2 processors never ran tasks side by side")


def hold_processors(ex: ScalerExecutor, gate: Gate, count: int = 2) -> list[Future[Any]]:
    blockers = [ex.submit(gated, gate.path, gate.started_dir) for _ in range(count)]
    assert wait_until(lambda: gate.started() == count, 60), f"only {gate.started()} of {count} blockers started"
    return blockers


def blocked_with_queue(
    make_executor: Callable[..., ScalerExecutor], gate: Gate, log: Path, **changes: Any
) -> tuple[ScalerExecutor, list[Future[Any]], list[Future[Any]]]:
    """An executor whose 2 processors run gated blockers, with QUEUED logged tasks behind them."""
    ex = make_executor(max_prefetch=1, **changes)
    prime(ex)
    blockers = hold_processors(ex, gate)
    queued = [ex.submit(append_id, str(log), i) for i in range(QUEUED)]
    return ex, blockers, queued


def assert_counted_done(fs: list[Future[Any]], what: str, timeout: float) -> None:
    """``wait`` (with and without a timeout), ``as_completed`` and ``progress`` all count every
    future of ``fs`` as done within ``timeout``."""
    done, not_done = cf.wait(fs, timeout=timeout)
    assert not not_done, (
        f"wait(timeout={timeout}) left {len(not_done)} of {len(fs)} {what} not done: "
        f"states {sorted(f._state for f in not_done)}"
    )
    try:
        got = list(cf.as_completed(fs, timeout=timeout))
    except cf.TimeoutError:
        pytest.fail(f"as_completed over {len(fs)} {what} timed out after {timeout} s")
    assert len(got) == len(set(fs)), f"as_completed yielded {len(got)} of {len(set(fs))} {what}"
    returned, _, error = in_thread(lambda: cf.wait(fs), timeout)
    assert returned, f"wait() without a timeout over {len(fs)} {what} did not return within {timeout} s"
    assert error is None, error
    returned, value, error = in_thread(lambda: progress(fs, file=io.StringIO()), timeout)
    assert returned, f"progress() over {len(fs)} {what} did not return within {timeout} s"
    assert error is None, error
    assert value == fs


# =========================================================================== 1. cancelled means notified


@pytest.mark.timeout(150)
@pytest.mark.parametrize("which", ["one", "many", "all"])
def test_cancelled_futures_count_as_done(
    make_executor: Callable[..., ScalerExecutor], gate: Gate, tmp_path: Path, which: str
) -> None:
    log = tmp_path / "ran.log"
    ex, blockers, queued = blocked_with_queue(make_executor, gate, log)
    tail = queued[HELD:]  # never reached a worker while the gate is shut
    chosen = {"one": tail[-1:], "many": tail[::2], "all": tail}[which]
    for f in chosen:
        assert f.cancel(), "cancel() of a task queued behind two blockers must return True"
        assert f.cancelled() and f.done()

    # At once, with the gate still shut: nothing else can complete meanwhile.
    assert_counted_done(chosen, "cancelled futures", SHORT)
    first = cf.wait(blockers + chosen, timeout=SHORT, return_when=FIRST_COMPLETED)
    assert first.done == set(chosen), "wait(FIRST_COMPLETED) did not return the cancelled futures"
    try:
        early = list(itertools.islice(cf.as_completed(blockers + chosen, timeout=SHORT), len(chosen)))
    except cf.TimeoutError:
        pytest.fail("as_completed did not yield the cancelled futures while the others run")
    assert set(early) == set(chosen)

    gate.open()
    everything = blockers + queued
    assert_counted_done(everything, "futures (some cancelled)", BOUND)
    assert [b.result(timeout=0) for b in blockers] == ["released", "released"]
    for i, f in enumerate(queued):
        if f in chosen:
            with pytest.raises(CancelledError):
                f.result(timeout=0)
        else:
            assert f.result(timeout=0) == i
    assert bounded_shutdown(ex), "shutdown(wait=True) did not return"
    ran = set(read_ids(log))
    cancelled_ids = {queued.index(f) for f in chosen}
    assert not ran & cancelled_ids, f"cancelled tasks ran: {sorted(ran & cancelled_ids)}"


@pytest.mark.timeout(150)
def test_cancel_wakes_threads_already_waiting(
    make_executor: Callable[..., ScalerExecutor], gate: Gate, tmp_path: Path
) -> None:
    """Threads blocked in wait(FIRST_COMPLETED), as_completed and progress over still-pending
    futures return as soon as one (or, for progress, each) of them is cancelled."""
    ex, blockers, queued = blocked_with_queue(make_executor, gate, tmp_path / "ran.log")
    target, rest = queued[-1], queued[HELD:-1]
    waiters = [
        ("wait(FIRST_COMPLETED)", lambda: cf.wait(blockers + [target], return_when=FIRST_COMPLETED).done),
        ("as_completed", lambda: {next(cf.as_completed(blockers + [target]))}),
        ("progress", lambda: set(progress(rest, file=io.StringIO()))),
    ]
    results: dict[str, Any] = {}
    threads = []
    for name, fn in waiters:
        t = threading.Thread(target=lambda name=name, fn=fn: results.__setitem__(name, fn()), daemon=True)
        t.start()
        threads.append(t)
    time.sleep(0.2)  # let them block first (the verdict does not depend on it)
    assert target.cancel()
    for f in rest:
        assert f.cancel()
    deadline = time.monotonic() + SHORT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [name for (name, _), t in zip(waiters, threads) if t.is_alive()]
    assert not stuck, f"still blocked {SHORT} s after the cancel: {stuck}"
    assert results["wait(FIRST_COMPLETED)"] == {target}
    assert results["as_completed"] == {target}
    assert results["progress"] == set(rest)
    gate.open()
    assert [b.result(timeout=BOUND) for b in blockers] == ["released", "released"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("wait", [False, True], ids=["wait=False", "wait=True"])
def test_shutdown_cancel_futures_counts_them_done(
    make_executor: Callable[..., ScalerExecutor], gate: Gate, tmp_path: Path, wait: bool
) -> None:
    log = tmp_path / "ran.log"
    ex, blockers, queued = blocked_with_queue(make_executor, gate, log)
    tail = queued[HELD:]
    shutdown_thread = None
    if wait:
        # Blocks until the blockers finish: run it aside and open the gate once it cancelled.
        shutdown_thread = threading.Thread(
            target=lambda: ex.shutdown(wait=True, cancel_futures=True), daemon=True
        )
        shutdown_thread.start()
        assert wait_until(lambda: all(f.cancelled() for f in tail), SHORT), (
            "shutdown(cancel_futures=True) did not cancel the queued futures"
        )
    else:
        ex.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() and f.done() for f in tail), "a queued future was not cancelled"
    cancelled = [f for f in queued if f.cancelled()]

    assert_counted_done(cancelled, "futures cancelled by shutdown", SHORT)  # the gate is still shut

    gate.open()
    if shutdown_thread is not None:
        shutdown_thread.join(SHUTDOWN_BOUND)
        assert not shutdown_thread.is_alive(), "shutdown(wait=True, cancel_futures=True) did not return"
    assert_counted_done(blockers + queued, "futures after shutdown", BOUND)
    assert [b.result(timeout=0) for b in blockers] == ["released", "released"]
    assert bounded_shutdown(ex)
    ran = set(read_ids(log))
    for i, f in enumerate(queued):
        if f.cancelled():
            assert i not in ran, f"task {i} ran although its future was cancelled"
        else:
            assert f.result(timeout=0) == i and i in ran


# =========================================================================== 7. queued vs running


@pytest.mark.timeout(150)
@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "no-lanes"])
def test_cancel_queued_is_true_and_immediate_running_is_false(
    make_executor: Callable[..., ScalerExecutor], gate: Gate, tmp_path: Path, lanes: bool
) -> None:
    log = tmp_path / "ran.log"
    ex, blockers, queued = blocked_with_queue(make_executor, gate, log, worker_lanes=lanes)
    target = queued[-1]

    seen: dict[str, Any] = {}

    def user_thread() -> None:
        seen["cancel"] = target.cancel()
        seen["cancelled"] = target.cancelled()
        seen["done"] = target.done()

    returned, _, error = in_thread(user_thread, SHORT)
    assert returned and error is None, error
    assert seen == {"cancel": True, "cancelled": True, "done": True}, seen
    with pytest.raises(CancelledError):
        target.result(timeout=0)
    assert target.cancel(), "cancel() of a cancelled future returns True again"

    # The blockers run (their markers exist): cancel() must refuse, and they must finish.
    assert wait_until(lambda: all(b.running() for b in blockers), BOUND), "a running task never reported RUNNING"
    for b in blockers:
        assert b.cancel() is False, "cancel() of a running task must return False"
        assert not b.cancelled() and not b.done()
    gate.open()
    assert [b.result(timeout=BOUND) for b in blockers] == ["released", "released"]
    for i, f in enumerate(queued[:-1]):
        assert f.result(timeout=BOUND) == i
    assert bounded_shutdown(ex)
    assert sorted(read_ids(log)) == list(range(QUEUED - 1))


# =========================================================================== 2. cancel() True => never ran


STRESS_THREADS = 4
STRESS_ROUNDS = 25


@pytest.mark.timeout(240)
@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "no-lanes"])
def test_cancel_true_means_the_task_never_ran(
    make_executor: Callable[..., ScalerExecutor], tmp_path: Path, lanes: bool
) -> None:
    """User threads submit lone tasks and bursts and cancel some of them at once, after a
    result, or while waiting; at the end shutdown(cancel_futures=True) lands while the
    last bursts are in flight.  No task whose future was cancelled may have run."""
    log = tmp_path / "ran.log"
    ex = make_executor(worker_lanes=lanes)
    prime(ex)
    ids = itertools.count()
    records: list[tuple[int, Future[Any]]] = []  # (task id, future)
    said_true: set[int] = set()  # ids whose cancel() returned True at least once
    errors: list[str] = []
    finals_sent = threading.Barrier(STRESS_THREADS + 1)
    lock = threading.Lock()

    def submit(seconds: float = 0.0) -> tuple[int, Future[Any]]:
        i = next(ids)
        f = ex.submit(append_id, str(log), i, seconds)
        with lock:
            records.append((i, f))
        return i, f

    def cancel(i: int, f: Future[Any]) -> None:
        if f.cancel():
            with lock:
                said_true.add(i)

    def settle(batch: list[tuple[int, Future[Any]]]) -> None:
        deadline = time.monotonic() + BOUND
        for i, f in batch:
            try:
                got = f.result(timeout=max(0.0, deadline - time.monotonic()))
            except CancelledError:
                continue
            except cf.TimeoutError:
                errors.append(f"task {i}: no result within {BOUND} s (state {f._state})")
                continue
            if got != i:
                errors.append(f"task {i}: result {got!r}")

    def user(k: int) -> None:
        rnd = random.Random(1000 + k)
        final: list[tuple[int, Future[Any]]] = []
        try:
            for _ in range(STRESS_ROUNDS):
                shape = rnd.random()
                if shape < 0.3:  # a lone task (the lane's path, when lanes are on)
                    i, f = submit()
                    if rnd.random() < 0.5:
                        cancel(i, f)
                    settle([(i, f)])
                    continue
                batch = [submit(rnd.choice((0.0, 0.0, 0.002, 0.01))) for _ in range(rnd.randint(5, 40))]
                for i, f in batch:
                    if rnd.random() < 0.3:
                        cancel(i, f)  # at once
                first_open = next((f for _, f in batch if not f.cancelled()), None)
                if first_open is not None:
                    cf.wait([first_open], timeout=BOUND)
                for i, f in batch:
                    if rnd.random() < 0.2:
                        cancel(i, f)  # while results stream in
                settle(batch)
            final.extend(submit(rnd.choice((0.0, 0.002))) for _ in range(30))
            for i, f in final[::3]:
                cancel(i, f)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"user thread {k}: {exc!r}")
        finally:
            try:
                finals_sent.wait(BOUND)
            except threading.BrokenBarrierError:
                pass
            # Keep cancelling the last burst while shutdown runs (it may refuse nothing).
            for i, f in final:
                cancel(i, f)

    threads = [threading.Thread(target=user, args=(k,), daemon=True) for k in range(STRESS_THREADS)]
    for t in threads:
        t.start()
    try:
        finals_sent.wait(BOUND * 4)
    except threading.BrokenBarrierError:
        pass
    shut = bounded_shutdown(ex, SHUTDOWN_BOUND, cancel_futures=True)
    deadline = time.monotonic() + BOUND
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a user thread hung"
    assert shut, "shutdown(wait=True, cancel_futures=True) did not return"
    assert not errors, errors[:10]

    ran = read_ids(log)
    counts: dict[int, int] = {}
    for i in ran:
        counts[i] = counts.get(i, 0) + 1
    assert all(c == 1 for c in counts.values()), f"tasks ran twice: {[i for i, c in counts.items() if c > 1][:10]}"
    not_done = [i for i, f in records if not f.done()]
    assert not not_done, f"{len(not_done)} futures not done after shutdown: {not_done[:10]}"
    lied = sorted(i for i, f in records if (f.cancelled() or i in said_true) and i in counts)
    assert not lied, (
        f"{len(lied)} tasks ran although cancel() returned True / the future is cancelled: {lied[:10]}"
    )
    inconsistent = sorted(i for i, f in records if i in said_true and not f.cancelled())
    assert not inconsistent, f"cancel() returned True but cancelled() is False: {inconsistent[:10]}"
    for i, f in records:
        if not f.cancelled():
            assert f.result(timeout=0) == i and i in counts, f"task {i}: finished but not logged"


SHUTDOWN_ROUNDS = 10
SHUTDOWN_TASKS = 50


@pytest.mark.timeout(240)
@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "no-lanes"])
def test_shutdown_cancel_futures_right_after_submit_runs_no_cancelled_task(
    make_executor: Callable[..., ScalerExecutor], tmp_path: Path, lanes: bool
) -> None:
    """50 logged tasks to a primed 2-processor executor, then shutdown(cancel_futures=True)
    at once; on fresh clusters, SHUTDOWN_ROUNDS times (today one in ~2 rounds runs a task
    whose future reports cancelled)."""
    for r in range(SHUTDOWN_ROUNDS):
        log = tmp_path / f"round-{r}.log"
        ex = make_executor(worker_lanes=lanes)
        assert ex.submit(echo, r).result(timeout=BOUND) == r  # primed
        assert ex.submit(echo, r).result(timeout=BOUND) == r
        fs = [ex.submit(append_id, str(log), i) for i in range(SHUTDOWN_TASKS)]
        assert bounded_shutdown(ex, SHUTDOWN_BOUND, cancel_futures=True), f"round {r}: shutdown did not return"
        ran = read_ids(log)
        assert len(ran) == len(set(ran)), f"round {r}: a task ran twice: {ran}"
        assert all(f.done() for f in fs), f"round {r}: futures left not done"
        lied = [i for i, f in enumerate(fs) if f.cancelled() and i in ran]
        assert not lied, (
            f"round {r}: tasks {lied} ran although their futures report cancelled "
            f"({sum(f.cancelled() for f in fs)} of {SHUTDOWN_TASKS} cancelled, log {sorted(ran)})"
        )
        for i, f in enumerate(fs):
            if not f.cancelled():
                assert f.result(timeout=0) == i and i in ran


# =========================================================================== 3. raising done-callbacks


@pytest.mark.timeout(150)
@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, RuntimeError], ids=lambda t: t.__name__)
def test_raising_done_callback_is_logged_and_completion_goes_on(
    make_executor: Callable[..., ScalerExecutor],
    gate: Gate,
    caplog: pytest.LogCaptureFixture,
    raised: type[BaseException],
) -> None:
    caplog.set_level(logging.WARNING)
    ex = make_executor()
    prime(ex)
    token = f"callback-boom-{uuid.uuid4().hex}"

    def bad(_: Future[Any]) -> None:
        raise raised(token)

    called: list[int] = []

    def good(f: Future[Any]) -> None:
        called.append(f.result())

    # Gated, so that the callbacks are attached while the futures are pending: they run
    # where the futures complete (the client's threads), not on this thread.
    fs = [ex.submit(gated, gate.path, gate.started_dir, i) for i in range(25)]
    bad_ones, others = fs[::5], [f for k, f in enumerate(fs) if k % 5]
    for f in bad_ones:
        f.add_done_callback(bad)
    for f in others:
        f.add_done_callback(good)
    gate.open()

    done, not_done = cf.wait(others, timeout=BOUND)
    assert not not_done, (
        f"{len(not_done)} of {len(others)} futures never completed after a done-callback raised {raised.__name__}"
    )
    assert sorted(f.result() for f in others) == sorted(k for k in range(25) if k % 5)
    assert wait_until(lambda: len(called) == len(others), SHORT), f"{len(called)} of {len(others)} callbacks ran"
    # They complete in no set order: one whose callback raises may be the last to finish.
    _, bad_not_done = cf.wait(bad_ones, timeout=BOUND)
    assert not bad_not_done, f"{len(bad_not_done)} of the futures whose callback raised never completed"
    assert wait_until(
        lambda: any(
            token in r.getMessage() or (r.exc_info and r.exc_info[1] is not None and token in str(r.exc_info[1]))
            for r in caplog.records
        ),
        SHORT,
    ), f"the callback's {raised.__name__} was not logged: {[r.getMessage() for r in caplog.records][:10]}"
    assert ex.submit(echo, "after").result(timeout=BOUND) == "after"
    assert bounded_shutdown(ex), "shutdown(wait=True) did not return"


# =========================================================================== 4. finalizers under locks


GC_THREADS = 3
GC_ITERATIONS = 40
GC_SECONDS = 40.0  # each thread stops early past this (a slow machine), with what it did checked
BIG = 1 << 20


@pytest.mark.timeout(240)
def test_finalizers_run_by_gc_anywhere_do_not_deadlock(make_executor: Callable[..., ScalerExecutor]) -> None:
    ex = make_executor()
    prime(ex)
    errors: list[str] = []
    checks: list[tuple[Future[Any], Any]] = []
    lock = threading.Lock()

    def collect(_: Future[Any]) -> None:
        # In a done-callback: drop an ObjectRef cycle, then collect (finalizers run here).
        holder: dict[str, Any] = {"ref": ex.put(b"c" * BIG)}
        holder["self"] = holder
        del holder
        gc.collect()

    def user(k: int) -> None:
        stop = time.monotonic() + GC_SECONDS
        try:
            for n in range(GC_ITERATIONS):
                if time.monotonic() > stop:
                    break
                holder: dict[str, Any] = {}
                holder["self"] = holder  # a cycle: only the collector frees what hangs off it
                ref = ex.put(bytes([n % 256]) * BIG)
                holder["ref"] = ref

                def cached(x: int, _n: int = n) -> int:  # a new plain function: cached, then dropped
                    return x + _n

                holder["fn"] = cached  # only the cycle holds it once this iteration ends
                f1 = ex.submit(cached, k)
                f2 = ex.submit(length, ref)
                f1.add_done_callback(collect)
                f2.add_done_callback(collect)
                it = ex.map(echo, range(20))
                first = next(it)
                holder["map"] = it  # dropped half-consumed: its finalizer cancels the rest
                with lock:
                    checks.append((f1, k + n))
                    checks.append((f2, BIG))
                if first != 0:
                    errors.append(f"map yielded {first!r} first")
                del holder, ref, cached, it, f1, f2
                if n % 5 == 0:
                    gc.collect()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"user thread {k}: {exc!r}")

    old = gc.get_threshold()
    gc.set_threshold(10, 5, 5)  # the collector (and the finalizers) run at almost any allocation
    try:
        threads = [threading.Thread(target=user, args=(k,), daemon=True) for k in range(GC_THREADS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + GC_SECONDS + 60
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        assert not stuck, f"{stuck} user threads deadlocked"
        assert not errors, errors[:10]
        pending = []
        for f, expected in checks:
            try:
                got = f.result(timeout=BOUND)
            except cf.TimeoutError:
                pending.append(f)
                continue
            assert got == expected
        assert not pending, f"{len(pending)} of {len(checks)} futures never completed"
        gc.collect()
        assert ex.submit(echo, "after").result(timeout=BOUND) == "after"
    finally:
        gc.set_threshold(*old)
    assert bounded_shutdown(ex), "shutdown(wait=True) did not return"


# =========================================================================== 5. concurrent cancel()


CANCEL_THREADS = 4
CANCEL_ROUNDS = 300  # today a KeyError shows about once per 40 rounds (4800 futures)
CANCEL_TASKS = 120
STORM_SECONDS = 60.0  # stop early past this on a slow machine (what ran is still checked)


def cancel_storm(
    ex: ScalerExecutor, log: Path, rounds: int, lockstep: bool
) -> tuple[list[str], set[int], list[Future[Any]]]:
    """Rounds of CANCEL_TASKS logged tasks, each cancelled by CANCEL_THREADS threads at once
    while results arrive.  ``lockstep``: the threads meet at a barrier before each future, so
    they call ``cancel()`` on the same future at the same moment.  Returns (errors, ids whose
    cancel() returned True, every future in id order)."""
    errors: list[str] = []
    said_true: set[int] = set()
    lock = threading.Lock()
    everything: list[Future[Any]] = []
    stop = time.monotonic() + STORM_SECONDS
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: check-then-act races show
    try:
        for r in range(rounds):
            if time.monotonic() > stop:
                break
            base = r * CANCEL_TASKS
            fs = [ex.submit(append_id, str(log), base + i) for i in range(CANCEL_TASKS)]
            everything.extend(fs)
            barrier = threading.Barrier(CANCEL_THREADS)

            def canceller(k: int, fs: list[Future[Any]] = fs, base: int = base, r: int = r) -> None:
                order = list(range(len(fs)))
                if not lockstep:
                    random.Random(r * 100 + k).shuffle(order)
                try:
                    barrier.wait(BOUND)
                    for i in order:
                        if lockstep:
                            barrier.wait(BOUND)
                        try:
                            if fs[i].cancel():
                                with lock:
                                    said_true.add(base + i)
                        except BaseException as exc:  # noqa: BLE001
                            errors.append(f"cancel() of task {base + i} raised {exc!r}")
                except threading.BrokenBarrierError:
                    errors.append(f"round {r}: canceller {k} timed out at the barrier")

            threads = [threading.Thread(target=canceller, args=(k,), daemon=True) for k in range(CANCEL_THREADS)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + BOUND
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in threads):
                errors.append(f"round {r}: a cancelling thread hung")
                break
            for i, f in enumerate(fs):
                try:
                    f.result(timeout=BOUND)
                except CancelledError:
                    pass
                except cf.TimeoutError:
                    errors.append(f"task {base + i}: not done within {BOUND} s (state {f._state})")
    finally:
        sys.setswitchinterval(old_interval)
    return errors, said_true, everything


@pytest.mark.timeout(240)
def test_cancel_from_many_threads_at_once_never_raises(
    make_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    ex = make_executor()
    prime(ex)
    errors, said_true, everything = cancel_storm(ex, tmp_path / "ran.log", CANCEL_ROUNDS, lockstep=True)
    raised = [e for e in errors if "raised" in e]
    assert not raised, f"Future.cancel() raised {len(raised)} times, first: {raised[:5]}"
    assert not errors, errors[:5]
    inconsistent = sorted(i for i in said_true if not everything[i].cancelled())
    assert not inconsistent, f"cancel() returned True but cancelled() is False: {inconsistent[:10]}"
    assert all(f.done() for f in everything)
    assert bounded_shutdown(ex)


@pytest.mark.timeout(240)
def test_cancel_storm_cancel_true_means_the_task_never_ran(
    make_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    """Item 2 under the storm of the test above (threads not in lockstep): bursts of 120
    tasks cancelled by 4 threads while the daemon is already dispatching them."""
    log = tmp_path / "ran.log"
    ex = make_executor()
    prime(ex)
    errors, said_true, everything = cancel_storm(ex, log, 15, lockstep=False)
    assert not errors, errors[:5]
    assert bounded_shutdown(ex)
    ran = read_ids(log)
    assert len(ran) == len(set(ran)), "a task ran twice"
    lied = sorted(said_true & set(ran))
    assert not lied, f"{len(lied)} of {len(said_true)} tasks ran although cancel() returned True: {lied[:10]}"
    finished = {i for i, f in enumerate(everything) if not f.cancelled()}  # ids are submission order
    assert finished <= set(ran), f"finished tasks missing from the log: {sorted(finished - set(ran))[:10]}"


# =========================================================================== 6. undecodable results


def _result_failure_text(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {exc}"] + list(getattr(exc, "__notes__", []))
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None:
            parts.append(f"{type(linked).__name__}: {linked}")
            parts.extend(getattr(linked, "__notes__", []))
    return "\n".join(parts)


def assert_fails_as_unreadable(ex: ScalerExecutor, f: Future[Any]) -> BaseException:
    """``f.result()`` on the caller's thread raises, within BOUND, an error saying the result
    could not be read; the executor still runs tasks afterwards."""
    try:
        value = f.result(timeout=BOUND)
    except cf.TimeoutError:
        if not f.done():
            pytest.fail(f"the future is still {f._state} {BOUND} s after its task returned an undecodable result")
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt are inspected too
        error = exc
    else:
        pytest.fail(f"result() returned {value!r} for an undecodable result")
    text = _result_failure_text(error)
    assert f.done(), f"result() raised {text!r} but the future is still {f._state}"
    assert re.search(r"result", text, re.I) and re.search(
        r"could not|cannot|can't|unable|fail|unpickl|decod|read", text, re.I
    ), f"the error does not say the result could not be read: {text!r}"
    assert isinstance(error, Exception), (
        f"an undecodable result raised {type(error).__name__} into the caller; it must fail "
        f"its future with an error (chained to it) instead: {text!r}"
    )
    followers = [ex.submit(echo, i) for i in range(20)]
    done, not_done = cf.wait(followers, timeout=BOUND)
    assert not not_done, f"{len(not_done)} of 20 later tasks never completed"
    assert [g.result() for g in followers] == list(range(20))
    return error


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["error", "exit", "interrupt"])
@pytest.mark.parametrize(
    "path, pad",
    [("alone", 0), ("crowded", 0), ("crowded", 256 * 1024)],
    ids=["alone-inline", "crowded-inline", "crowded-store"],
)
def test_undecodable_result_fails_its_future(
    make_executor: Callable[..., ScalerExecutor], kind: str, path: str, pad: int
) -> None:
    """The result unpickles only in the worker's process (raising RuntimeError, SystemExit
    or KeyboardInterrupt elsewhere); submitted alone (a sequential caller: the lane and
    reply socket) or among other tasks (the daemon's path), inline or through the store."""
    ex = make_executor()
    prime(ex)
    around: list[Future[Any]] = []
    if path == "crowded":
        around = [ex.submit(sleep_and_return, 0.05, i) for i in range(6)]
    f = ex.submit(make_undecodable, kind, pad)
    if path == "crowded":
        around += [ex.submit(sleep_and_return, 0.05, i) for i in range(6, 12)]
    assert_fails_as_unreadable(ex, f)
    done, not_done = cf.wait(around, timeout=BOUND)
    assert not not_done
    assert sorted(g.result() for g in around) == list(range(len(around)))
    assert bounded_shutdown(ex), "shutdown(wait=True) did not return after an undecodable result"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["alone", "crowded"])
def test_result_of_a_class_only_the_worker_can_import(
    make_executor: Callable[..., ScalerExecutor], tmp_path: Path, path: str
) -> None:
    name = f"only_in_worker_{uuid.uuid4().hex}"
    directory = tmp_path / "worker-only"
    directory.mkdir()
    (directory / f"{name}.py").write_text("class OnlyHere:\n    pass\n")
    ex = make_executor()
    prime(ex)
    around = [ex.submit(sleep_and_return, 0.05, i) for i in range(6)] if path == "crowded" else []
    f = ex.submit(instance_of_worker_only_module, str(directory), name)
    error = assert_fails_as_unreadable(ex, f)
    assert name in _result_failure_text(error), "the error does not name the module that is missing"
    assert [g.result(timeout=BOUND) for g in around] == list(range(len(around)))
    assert bounded_shutdown(ex)
