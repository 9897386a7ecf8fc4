"""The standard library's executor contract, run against ``ScalerExecutor`` (CONVENTIONS §25).

Ported from CPython's ``Lib/test/test_concurrent_futures/`` (``executor.py`` with 3.14's
``buffersize`` tests, ``test_process_pool.py``, ``test_shutdown.py``, ``test_wait.py``,
``test_as_completed.py``, ``test_init.py``) and extended with what a cluster-backed
executor adds: keyword forwarding past ``options``, cancellation against the daemon's
prefetch, and the lifetime of the embedded cluster's processes.

How these tests force interleavings without sleeping (CONVENTIONS §23):

* A **gate** is a file path.  ``wait_for_gate`` runs in a processor and blocks until the
  file exists (or its own deadline passes, so a failing test cannot wedge the shared
  cluster); it first drops a marker in ``started_dir``, so the test knows it is running.
  Gated tasks are how a test holds a processor, keeps futures pending, or proves that a
  call returned without waiting for outstanding work.
* What only the daemon knows (how many tasks it dispatched or dropped) is read through the
  public ``statistics()`` snapshot, polled with a deadline.
* The embedded daemon runs in its own session; every process of that cluster (daemon,
  worker, zygote, processors) shares its session id even after being re-parented, so
  "the cluster's processes are gone" is checked as "no process has that session id".

Workers import this module by name (module-level functions travel by reference), so it
must stay cheap and side-effect free to import.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import gc
import itertools
import logging
import operator
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    BrokenExecutor,
    CancelledError,
    Future,
)
from pathlib import Path
from typing import Any

import psutil
import pytest

from scaler_testing import Gate, wait_until

from scaler_executor import ClusterConfig, InitializerFailed, ScalerExecutor

# For the executors this module builds itself (not through the conftest fixtures, which it does
# not import: workers import this module too).  Fast heartbeats like the conftest's FAST, but
# more patient liveness and daemon-loss limits: on a shared 2-core machine a daemon can take
# longer than 3 s to start (it is reached within daemon_loss_timeout or the client breaks).
FAST = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=15.0)

GATE_TIMEOUT = 60.0  # a gated task gives up after this, so a broken test cannot wedge the cluster
RESULT_TIMEOUT = 60.0  # generous: the machine is slow and shared
# The daemon holds at most capacity + min(capacity * (per_processor - 1), max_prefetch) tasks at
# a worker (scheduler/policies.py: prefetch_window); with 2 processors and the default cap of 256
# that is 258.  Tests that need futures to stay PENDING submit comfortably more than this.
MAX_DISPATCHED = 2 + 256
MANY = 400

REPO_ROOT = str(Path(__file__).resolve().parents[2])




# --------------------------------------------------------------------------- task functions
# Module level, so they travel by reference and the workers import this module.


def mul(x: int, y: int) -> int:
    return x * y


def square(x: int) -> int:
    return x * x


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


def sleep_and_return(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def sleep_and_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def append_and_return(log: str, i: int) -> int:
    with open(log, "a") as f:
        f.write(f"{i}\n")
    return i


def wait_for_gate(
    gate: str,
    started_dir: str | None = None,
    value: Any = "released",
    timeout: float = GATE_TIMEOUT,
) -> Any:
    """Block until the file ``gate`` exists; return ``value`` (or a marker when the gate never opened)."""
    if started_dir is not None:
        Path(started_dir, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            return "gate timed out"
        time.sleep(0.005)
    return value


def log_then_wait_unless_first(log: str, gate: str, i: int) -> int:
    """Item 0 returns at once; every later item blocks on the gate (map close/del tests)."""
    append_and_return(log, i)
    if i:
        wait_for_gate(gate)
    return i


def first_quick_then_gated(i: int, gate: str) -> int:
    if i:
        wait_for_gate(gate)
    return i


def timeout_on_one(x: int) -> int:
    if x == 1:
        raise TimeoutError("raised by the callable, not by map")
    return x


class ContractError(Exception):
    """An exception class defined in the test module: it must come back as itself."""


def raise_contract_error(x: int) -> None:
    raise ContractError(f"bad {x}", x)


def raise_runtime_error() -> None:
    raise RuntimeError(123)  # some comment


def raiser(exception: type[BaseException], msg: str = "std") -> None:
    raise exception(msg)


class FalseyBoolException(Exception):
    def __bool__(self) -> bool:
        return False


class FalseyLenException(Exception):
    def __len__(self) -> int:
        return 0


class MyObject:
    def my_method(self) -> None:
        pass


def make_dummy_object(_: Any) -> MyObject:
    return MyObject()


INIT_STATE = "uninitialized"


def init(x: str) -> None:
    global INIT_STATE
    INIT_STATE = x


def get_init_state(_: Any = None) -> tuple[int, str]:
    return os.getpid(), INIT_STATE


def init_fail() -> None:
    raise ValueError("error in initializer")


# --------------------------------------------------------------------------- helpers




def stats(executor: ScalerExecutor) -> dict[str, Any]:
    return executor.statistics(timeout=RESULT_TIMEOUT)


def quiesce(executor: ScalerExecutor) -> None:
    """Wait until the daemon holds no task, so both processors are idle for the next test."""
    assert wait_until(lambda: stats(executor)["tasks"] == 0, 60, 0.02), (
        f"cluster not idle: {stats(executor)}"
    )


_warm: weakref.WeakSet[ScalerExecutor] = weakref.WeakSet()


def ensure_processors_live(executor: ScalerExecutor, count: int = 2) -> None:
    """Wait until ``count`` processors take tasks side by side (once per executor).

    A worker that gets tasks while some of its processors are still starting queues a second
    task behind the first in the live processor's pipe (worker/agent.py ``_assign``); a gated
    task queued that way never starts.  test_new_executor_runs_max_workers_tasks_at_once covers
    that behaviour; the other tests only need a cluster whose processors are all up.
    """
    if executor in _warm:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fs = [executor.submit(sleep_and_pid, 0.2) for _ in range(count)]
        if len({f.result(timeout=RESULT_TIMEOUT) for f in fs}) == count:
            _warm.add(executor)
            return
    raise AssertionError(f"{count} processors never ran tasks side by side")


def block_processors(executor: ScalerExecutor, gate: Gate, count: int = 2) -> list[Future[Any]]:
    """Occupy ``count`` processors with gated tasks, confirmed running (their markers exist)."""
    ensure_processors_live(executor)
    quiesce(executor)
    blockers = [executor.submit(wait_for_gate, gate.path, gate.started_dir) for _ in range(count)]
    assert wait_until(lambda: gate.started() == count, 60), (
        f"only {gate.started()} of {count} blockers started"
    )
    return blockers


def queue_behind_blockers(
    executor: ScalerExecutor, gate: Gate, log: Path
) -> tuple[list[Future[Any]], list[Future[Any]]]:
    """Hold both processors, submit MANY logged tasks, and wait until the split is settled.

    Settled: the daemon has every task, and the client has seen RUNNING for each one the
    daemon dispatched.  Nothing completes while the gate is shut, so from then on a future
    that is not running is one the daemon still holds: cancelling it must stop it for good.
    """
    blockers = block_processors(executor, gate)
    before = stats(executor)
    futures = [executor.submit(append_and_return, str(log), i) for i in range(MANY)]

    # The daemon answers a stats request while handling its batch of messages and dispatches at
    # the end of the batch, so the snapshot that first counts every submit may predate their
    # dispatch; any later snapshot (a later request) comes after it.
    assert wait_until(lambda: stats(executor)["submitted"] - before["submitted"] == MANY, 60), (
        stats(executor)
    )

    def settled() -> bool:
        dispatched = stats(executor).get("tasks_dispatched", 0)
        return sum(f.running() for f in blockers + futures) == dispatched

    assert wait_until(settled, 60), stats(executor)
    return blockers, futures


@pytest.fixture
def blocker(executor: ScalerExecutor, tmp_path: Path) -> Iterator[Future[Any]]:
    """One processor held by a gated task (released, and its result checked, at teardown)."""
    g = Gate(tmp_path / "blocker")
    (future,) = block_processors(executor, g, 1)
    yield future
    g.open()
    assert future.result(timeout=RESULT_TIMEOUT) == "released"


def daemon_session(executor: ScalerExecutor) -> int:
    """The session id of ``executor``'s embedded cluster: its daemon's pid (it calls setsid)."""
    directory = socket_dir(executor)
    for child in psutil.Process().children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if "scaler_executor.cli.daemon" in cmdline and any(
            a.startswith(directory + os.sep) for a in cmdline
        ):
            return child.pid
    raise AssertionError(f"no daemon process found for {executor!r}")


def socket_dir(executor: ScalerExecutor) -> str:
    assert executor.address.startswith("ipc://")
    return os.path.dirname(executor.address[len("ipc://") :])


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes in session ``sid``, wherever they were re-parented."""
    members = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(p.pid) == sid:
                members.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return members


def counting(consumed: list[int], limit: int | None = None) -> Iterator[int]:
    """A generator that records every element handed out."""
    for i in itertools.count() if limit is None else range(limit):
        consumed.append(i)
        yield i


def read_log(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


# =========================================================================== constructor


@pytest.mark.timeout(30)
@pytest.mark.parametrize("number", [0, -1])
def test_max_workers_must_be_positive(number: int) -> None:
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        ScalerExecutor(max_workers=number, config=FAST)


@pytest.mark.timeout(30)
def test_constructor_rejects_unsupported_arguments() -> None:
    import multiprocessing

    with pytest.raises(ValueError, match="mp_context"):
        ScalerExecutor(2, multiprocessing.get_context("spawn"), config=FAST)
    with pytest.raises(ValueError, match="max_workers"):
        ScalerExecutor(max_workers=2, address="tcp://127.0.0.1:1", config=FAST)
    with pytest.raises(ValueError, match="max_tasks_per_child"):
        ScalerExecutor(max_workers=2, max_tasks_per_child=0, config=FAST)


# =========================================================================== submit


@pytest.mark.timeout(60)
def test_submit(executor: ScalerExecutor) -> None:
    assert executor.submit(pow, 2, 8).result(timeout=RESULT_TIMEOUT) == 256
    assert executor.submit(mul, 2, y=8).result(timeout=RESULT_TIMEOUT) == 16


@pytest.mark.timeout(60)
def test_submit_forwards_every_keyword(executor: ScalerExecutor) -> None:
    kwargs = {
        "self": 2,
        "fn": 3,
        "timeout": 4,
        "priority": 5,
        "options": 6,
        "chunksize": 7,
        "args": 8,
    }
    future = executor.submit(capture, 1, **kwargs)
    assert future.result(timeout=RESULT_TIMEOUT) == ((1,), kwargs)
    # fn is positional-only: passing it by keyword is a call without a callable.
    with pytest.raises(TypeError):
        executor.submit(fn=capture, arg=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        executor.submit(arg=1)  # type: ignore[call-arg]


class Scaler:
    def __init__(self, k: int) -> None:
        self.k = k

    def scale(self, x: int) -> int:
        return self.k * x


@pytest.mark.timeout(60)
def test_lambdas_closures_and_local_functions(executor: ScalerExecutor) -> None:
    offset = 10

    def add_offset(x: int) -> int:
        return x + offset

    class Local:
        def __init__(self, k: int) -> None:
            self.k = k

        def times(self, x: int) -> int:
            return self.k * x

    assert executor.submit(lambda x: x * 3, 4).result(timeout=RESULT_TIMEOUT) == 12
    assert executor.submit(add_offset, 1).result(timeout=RESULT_TIMEOUT) == 11
    assert executor.submit(Local(5).times, 2).result(timeout=RESULT_TIMEOUT) == 10
    assert executor.submit(Scaler(3).scale, 2).result(timeout=RESULT_TIMEOUT) == 6
    assert executor.submit(functools.partial(add_offset, 5)).result(timeout=RESULT_TIMEOUT) == 15
    assert list(executor.map(lambda a, b: a - b, [5, 6], [1, 2])) == [4, 4]
    assert list(executor.map(add_offset, range(5), chunksize=2)) == [10, 11, 12, 13, 14]


@pytest.mark.timeout(60)
def test_options_view_forwards_keywords(executor: ScalerExecutor) -> None:
    view = executor.options(priority=5)
    assert view.submit(capture, 1, timeout=3).result(timeout=RESULT_TIMEOUT) == (
        (1,),
        {"timeout": 3},
    )
    assert view.submit(capture, priority=1, fn=2).result(timeout=RESULT_TIMEOUT) == (
        (),
        {"priority": 1, "fn": 2},
    )
    assert list(view.map(square, range(4))) == [0, 1, 4, 9]
    with pytest.raises(TypeError):
        executor.options(bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        view.options(bogus=1)


# =========================================================================== exceptions


@pytest.mark.timeout(60)
def test_exception_keeps_type_and_remote_traceback(executor: ScalerExecutor) -> None:
    # CPython test_process_pool.test_traceback.
    future = executor.submit(raise_runtime_error)
    with pytest.raises(RuntimeError) as info:
        future.result(timeout=RESULT_TIMEOUT)
    exc = info.value
    assert type(exc) is RuntimeError
    assert exc.args == (123,)
    cause = exc.__cause__
    assert cause is not None
    assert "raise_runtime_error" in str(cause)
    assert "raise RuntimeError(123)  # some comment" in str(cause)


@pytest.mark.timeout(60)
def test_exception_class_from_test_module(executor: ScalerExecutor) -> None:
    future = executor.submit(raise_contract_error, 7)
    exc = future.exception(timeout=RESULT_TIMEOUT)
    assert type(exc) is ContractError
    assert exc.args == ("bad 7", 7)
    assert exc.__cause__ is not None and "raise_contract_error" in str(exc.__cause__)


def _stdlib_future_swallows_falsey_exceptions() -> bool:
    future: Future[Any] = Future()
    future.set_exception(FalseyBoolException())
    try:
        future.result()
    except FalseyBoolException:
        return False
    return True


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    _stdlib_future_swallows_falsey_exceptions(),
    reason="this Python's concurrent.futures.Future itself swallows falsey exceptions (gh-132063, fixed in 3.13+)",
)
def test_falsey_exceptions_are_not_swallowed(executor: ScalerExecutor) -> None:
    # CPython gh-132063.
    with pytest.raises(FalseyBoolException, match="boolbool"):
        executor.submit(raiser, FalseyBoolException, "boolbool").result(timeout=RESULT_TIMEOUT)
    with pytest.raises(FalseyLenException, match="lenlen"):
        executor.submit(raiser, FalseyLenException, "lenlen").result(timeout=RESULT_TIMEOUT)


# =========================================================================== map


@pytest.mark.timeout(60)
def test_map_keeps_order(executor: ScalerExecutor) -> None:
    assert list(executor.map(pow, range(10), range(10))) == list(map(pow, range(10), range(10)))
    # Later items finish first; results still come in input order.
    assert list(executor.map(sleep_and_return, [0.3, 0.0, 0.15, 0.0], "abcd")) == list("abcd")


@pytest.mark.timeout(60)
def test_map_zip_semantics(executor: ScalerExecutor) -> None:
    assert list(executor.map(pow, range(10), range(3))) == [0**0, 1**1, 2**2]
    assert list(executor.map(operator.add, [1, 2, 3], itertools.count(10))) == [11, 13, 15]
    assert list(executor.map(str, [])) == []
    assert list(executor.map(str)) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunksize", [1, 2, 3, 6, 40, 50])
def test_map_chunksize_gives_the_same_results(executor: ScalerExecutor, chunksize: int) -> None:
    # CPython test_process_pool.test_map_chunksize.
    ref = list(map(pow, range(40), range(40)))
    assert list(executor.map(pow, range(40), range(40), chunksize=chunksize)) == ref


@pytest.mark.timeout(30)
@pytest.mark.parametrize("chunksize", [0, -1])
def test_map_chunksize_must_be_positive(executor: ScalerExecutor, chunksize: int) -> None:
    with pytest.raises(ValueError, match=r"chunksize must be >= 1\."):
        executor.map(pow, range(40), range(40), chunksize=chunksize)


@pytest.mark.timeout(60)
def test_map_exception_at_failing_position(executor: ScalerExecutor) -> None:
    it = executor.map(divmod, [5, 5, 5, 5], [2, 3, 0, 5])
    assert next(it) == (2, 1)
    assert next(it) == (1, 2)
    with pytest.raises(ZeroDivisionError) as info:
        next(it)
    assert info.value.__cause__ is not None


@pytest.mark.timeout(60)
def test_map_chunked_exception_at_failing_position(executor: ScalerExecutor) -> None:
    # The item before the failing one shares its chunk: it must still be yielded first
    # (CPython's test_map_exception with chunksize=3).
    it = executor.map(divmod, [5, 5, 5, 5], [2, 0, 3, 5], chunksize=3)
    assert next(it) == (2, 1)
    with pytest.raises(ZeroDivisionError):
        next(it)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [None, RESULT_TIMEOUT])
def test_map_timeout_error_from_the_callable(
    executor: ScalerExecutor, timeout: float | None
) -> None:
    # A TimeoutError raised by the callable is the task's error, not the map() timeout.
    it = executor.map(timeout_on_one, [0, 1, 2, 3], timeout=timeout)
    assert next(it) == 0
    with pytest.raises(TimeoutError, match="raised by the callable") as info:
        next(it)
    assert info.value.__cause__ is not None and "timeout_on_one" in str(info.value.__cause__)


@pytest.mark.timeout(90)
def test_map_timeout_is_measured_from_the_call(executor: ScalerExecutor, gate: Gate) -> None:
    # CPython test_map_timeout, with a gated task instead of a long sleep so the shared
    # cluster's processor is freed as soon as the test is done.
    timeout = 3.0
    quiesce(executor)
    t0 = time.monotonic()
    it = executor.map(first_quick_then_gated, [0, 1], itertools.repeat(gate.path), timeout=timeout)
    # Only the real clock decides this state: let the map's deadline pass before the first next().
    assert wait_until(lambda: time.monotonic() - t0 > timeout + 0.5, timeout + 5, 0.05)
    results = []
    t1 = time.monotonic()
    with pytest.raises(TimeoutError):
        for value in it:
            results.append(value)  # noqa: PERF402 - keeps what came before the TimeoutError
    waited = time.monotonic() - t1
    # Under heavy load item 0 may itself miss the deadline (CPython gh-110097).
    assert results in ([0], [])
    # Measured from next() instead, the gated item would have blocked for `timeout` seconds.
    assert waited < timeout, f"next() blocked {waited:.1f} s after the map's deadline had passed"
    # The remaining calls are cancelled, so the iterator is exhausted.
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.timeout(60)
def test_map_close(executor: ScalerExecutor) -> None:
    # CPython test_map_close.
    for chunksize in (1, 3):
        it = executor.map(divmod, [5, 5, 5, 5], [2, 1, 3, 5], chunksize=chunksize)
        assert next(it) == (2, 1)
        it.close()
        with pytest.raises(StopIteration):
            next(it)
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.timeout(60)
def test_map_without_buffersize_consumes_input_eagerly(executor: ScalerExecutor) -> None:
    consumed: list[int] = []
    it = executor.map(square, counting(consumed, 10))
    assert consumed == list(range(10))  # before the first next()
    assert list(it) == [x * x for x in range(10)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("buffersize", ["foo", 2.0])
def test_map_buffersize_type_validation(executor: ScalerExecutor, buffersize: Any) -> None:
    with pytest.raises(TypeError, match="buffersize must be an integer or None"):
        executor.map(str, range(4), buffersize=buffersize)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("buffersize", [0, -1])
def test_map_buffersize_value_validation(executor: ScalerExecutor, buffersize: int) -> None:
    with pytest.raises(ValueError, match="buffersize must be None or > 0"):
        executor.map(str, range(4), buffersize=buffersize)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("buffersize", [1, 2, 4, 8])
def test_map_buffersize(executor: ScalerExecutor, buffersize: int) -> None:
    assert list(executor.map(str, range(4), buffersize=buffersize)) == ["0", "1", "2", "3"]
    assert list(executor.map(operator.add, range(4), range(4), buffersize=buffersize)) == [
        0,
        2,
        4,
        6,
    ]


@pytest.mark.timeout(60)
def test_map_buffersize_on_infinite_iterables(executor: ScalerExecutor) -> None:
    res = executor.map(str, itertools.count(), buffersize=2)
    assert [next(res, None) for _ in range(3)] == ["0", "1", "2"]
    res2 = executor.map(operator.add, itertools.count(), itertools.count(), buffersize=2)
    assert [next(res2, None) for _ in range(3)] == [0, 2, 4]
    res.close()
    res2.close()


@pytest.mark.timeout(60)
def test_map_buffersize_on_empty_input(executor: ScalerExecutor) -> None:
    assert next(executor.map(str, [], buffersize=2), None) is None
    assert next(executor.map(str, buffersize=2), None) is None


@pytest.mark.timeout(60)
def test_map_buffersize_when_buffer_is_full(executor: ScalerExecutor) -> None:
    ints = iter(range(4))
    executor.map(str, ints, buffersize=2)
    assert next(ints) == 2, "should have fetched only `buffersize` elements from `ints`"


@pytest.mark.timeout(60)
def test_map_buffersize_bounds_outstanding_tasks(executor: ScalerExecutor) -> None:
    buffersize = 3
    consumed: list[int] = []
    it = executor.map(square, counting(consumed), buffersize=buffersize)
    assert len(consumed) == buffersize
    for k in range(1, 10):
        assert next(it) == (k - 1) ** 2
        # submitted (= taken from the input) minus yielded
        assert len(consumed) - k <= buffersize
    it.close()
    assert len(consumed) <= 9 + buffersize


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["close", "del"])
def test_map_buffersize_close_cancels_outstanding(
    executor: ScalerExecutor, tmp_path: Path, gate: Gate, how: str
) -> None:
    log = tmp_path / "ran.log"
    quiesce(executor)
    before = stats(executor)
    consumed: list[int] = []
    it = executor.map(
        log_then_wait_unless_first,
        itertools.repeat(str(log)),
        itertools.repeat(gate.path),
        counting(consumed),
        buffersize=MANY,
    )
    assert len(consumed) == MANY
    assert next(it) == 0  # a generator that never started has nothing to clean up (as in CPython)
    assert len(consumed) == MANY + 1
    if how == "close":
        it.close()
        with pytest.raises(StopIteration):
            next(it)
    else:
        del it
        gc.collect()
    assert len(consumed) == MANY + 1  # nothing more taken from the input
    # Every outstanding task no worker held was cancelled: by the daemon, or by the client
    # before it was ever sent (the daemon then never hears of it). Only the dispatched stay.
    assert wait_until(lambda: stats(executor)["tasks"] <= MAX_DISPATCHED, 60), stats(executor)
    gate.open()
    quiesce(executor)
    after = stats(executor)
    ran = read_log(log)
    assert len(ran) == len(set(ran))
    assert 0 in ran and max(ran) <= MANY
    assert len(ran) <= 1 + MAX_DISPATCHED, "a task cancelled by closing the map ran anyway"
    never_ran = MANY + 1 - len(ran)
    dropped_by_daemon = after["cancelled"] - before["cancelled"]
    never_sent = MANY + 1 - (after["submitted"] - before["submitted"])
    assert never_ran == dropped_by_daemon + never_sent, (never_ran, dropped_by_daemon, never_sent)


@pytest.mark.timeout(60)
def test_map_free_reference(executor: ScalerExecutor) -> None:
    # CPython issue #14406: the result iterator keeps no reference to results it yielded.
    for obj in executor.map(make_dummy_object, range(10)):
        wr = weakref.ref(obj)
        del obj
        gc.collect()
        assert wait_until(lambda wr=wr: wr() is None, 3), (
            "map's iterator still holds a yielded result"
        )


# =========================================================================== futures, cancel


@pytest.mark.timeout(60)
def test_future_is_running_once_dispatched(executor: ScalerExecutor, blocker: Future[Any]) -> None:
    assert wait_until(blocker.running, 30)
    assert not blocker.cancel()
    assert not blocker.cancelled()
    assert not blocker.done()


@pytest.mark.timeout(120)
def test_cancel_pending_future_is_final(
    executor: ScalerExecutor, tmp_path: Path, gate: Gate
) -> None:
    log = tmp_path / "ran.log"
    before = stats(executor)
    blockers, futures = queue_behind_blockers(executor, gate, log)
    running = [f for f in futures if f.running()]
    pending = [f for f in futures if not f.running() and not f.done()]
    assert len(running) + len(pending) == MANY
    assert len(pending) >= MANY - MAX_DISPATCHED
    for f in running[:5]:
        assert not f.cancel(), "cancel() of a RUNNING future must return False"
    cancelled = [f for f in reversed(pending) if f.cancel()]
    assert len(cancelled) == len(pending), "cancel() of a PENDING future must return True"
    # Final: the daemon dropped them before any could run.
    assert wait_until(
        lambda: stats(executor)["cancelled"] - before["cancelled"] == len(cancelled), 60
    ), stats(executor)
    gate.open()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in blockers] == ["released", "released"]
    for f in running:
        assert not f.cancelled()
        f.result(timeout=RESULT_TIMEOUT)
    for f in cancelled:
        assert f.cancelled() and f.done()
        with pytest.raises(CancelledError):
            f.result(timeout=0)
    quiesce(executor)
    cancelled_ids = {futures.index(f) for f in cancelled}
    ran = set(read_log(log))
    assert ran == set(range(MANY)) - cancelled_ids


# =========================================================================== wait, as_completed


@pytest.mark.timeout(60)
def test_wait_first_completed(executor: ScalerExecutor, blocker: Future[Any]) -> None:
    quick = executor.submit(square, 2)
    done, not_done = cf.wait([blocker, quick], timeout=RESULT_TIMEOUT, return_when=FIRST_COMPLETED)
    assert done == {quick}
    assert not_done == {blocker}


@pytest.mark.timeout(60)
def test_wait_first_completed_some_already_completed(
    executor: ScalerExecutor, blocker: Future[Any]
) -> None:
    finished = executor.submit(square, 2)
    finished.result(timeout=RESULT_TIMEOUT)
    done, not_done = cf.wait(
        [finished, blocker], timeout=RESULT_TIMEOUT, return_when=FIRST_COMPLETED
    )
    assert done == {finished}
    assert not_done == {blocker}


@pytest.mark.timeout(60)
def test_wait_first_exception(executor: ScalerExecutor, blocker: Future[Any]) -> None:
    finished = executor.submit(square, 2)
    finished.result(timeout=RESULT_TIMEOUT)
    failing = executor.submit(raise_contract_error, 1)
    done, not_done = cf.wait(
        [finished, failing, blocker], timeout=RESULT_TIMEOUT, return_when=FIRST_EXCEPTION
    )
    assert done == {finished, failing}
    assert not_done == {blocker}
    # One already failed: returns at once.
    done, not_done = cf.wait(
        [failing, blocker], timeout=RESULT_TIMEOUT, return_when=FIRST_EXCEPTION
    )
    assert done == {failing}
    assert not_done == {blocker}


@pytest.mark.timeout(60)
def test_wait_first_exception_without_exception_waits_for_all(executor: ScalerExecutor) -> None:
    fs = [executor.submit(sleep_and_return, 0.1 * i, i) for i in range(4)]
    done, not_done = cf.wait(fs, timeout=RESULT_TIMEOUT, return_when=FIRST_EXCEPTION)
    assert done == set(fs) and not not_done


@pytest.mark.timeout(60)
def test_wait_all_completed(executor: ScalerExecutor) -> None:
    fs = [
        executor.submit(square, 2),
        executor.submit(raise_contract_error, 1),
        executor.submit(sleep_and_return, 0.2, 3),
    ]
    done, not_done = cf.wait(fs, timeout=RESULT_TIMEOUT, return_when=ALL_COMPLETED)
    assert done == set(fs) and not not_done


@pytest.mark.timeout(60)
def test_wait_timeout(executor: ScalerExecutor, blocker: Future[Any]) -> None:
    finished = executor.submit(square, 2)
    finished.result(timeout=RESULT_TIMEOUT)
    done, not_done = cf.wait([finished, blocker], timeout=0.5, return_when=ALL_COMPLETED)
    assert done == {finished}
    assert not_done == {blocker}


@pytest.mark.timeout(60)
def test_wait_duplicate_futures(executor: ScalerExecutor) -> None:
    # CPython issue #20369.
    future = executor.submit(square, 3)
    done, not_done = cf.wait([future, future], timeout=RESULT_TIMEOUT)
    assert done == {future} and not not_done


@pytest.mark.timeout(60)
def test_as_completed(executor: ScalerExecutor) -> None:
    finished = executor.submit(square, 1)
    finished.result(timeout=RESULT_TIMEOUT)
    fs = [finished] + [executor.submit(sleep_and_return, 0.05 * i, i) for i in range(5)]
    yielded = list(cf.as_completed(fs, timeout=RESULT_TIMEOUT))
    assert len(yielded) == len(fs) and set(yielded) == set(fs)


@pytest.mark.timeout(60)
def test_as_completed_timeout(executor: ScalerExecutor, blocker: Future[Any]) -> None:
    finished = executor.submit(square, 1)
    finished.result(timeout=RESULT_TIMEOUT)
    yielded = []
    with pytest.raises(TimeoutError, match=r"1 \(of 2\) futures unfinished"):
        for f in cf.as_completed([finished, blocker], timeout=0.5):
            yielded.append(f)  # noqa: PERF402 - keeps what came before the TimeoutError
    assert yielded == [finished]


@pytest.mark.timeout(60)
def test_as_completed_duplicate_futures(executor: ScalerExecutor) -> None:
    future = executor.submit(sleep_and_return, 0.2, 1)
    assert list(cf.as_completed(itertools.repeat(future, 3), timeout=RESULT_TIMEOUT)) == [future]


# =========================================================================== callbacks


SLOW_CALLBACK_SECONDS = 4.0


@pytest.mark.timeout(90)
def test_slow_done_callback_delays_no_other_result(executor: ScalerExecutor, gate: Gate) -> None:
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()
    where: list[threading.Thread] = []

    def slow(_: Future[Any]) -> None:
        where.append(threading.current_thread())
        entered.set()
        release.wait(
            SLOW_CALLBACK_SECONDS
        )  # a slow callback: sleeps unless the test is done sooner
        returned.set()

    (first,) = block_processors(executor, gate, 1)
    first.add_done_callback(slow)  # not done yet (gated), so it runs where the future completes
    gate.open()
    try:
        assert entered.wait(RESULT_TIMEOUT)
        assert where[0] is not threading.current_thread()
        second = executor.submit(square, 3)
        assert cf.wait([second], timeout=SLOW_CALLBACK_SECONDS * 3).done == {second}
        assert not returned.is_set(), (
            f"a result waited for a {SLOW_CALLBACK_SECONDS:.0f} s done-callback to return"
        )
        assert second.result() == 9
    finally:
        release.set()
    assert returned.wait(RESULT_TIMEOUT)
    assert (
        executor.submit(square, 4).result(timeout=RESULT_TIMEOUT) == 16
    )  # heartbeats survived the callback


@pytest.mark.timeout(60)
def test_done_callback_can_submit(executor: ScalerExecutor, gate: Gate) -> None:
    chained: list[Future[Any]] = []

    def chain(f: Future[Any]) -> None:
        chained.append(executor.submit(capture, f.result()))

    (first,) = block_processors(executor, gate, 1)
    first.add_done_callback(chain)  # still gated: the callback runs where the future completes
    gate.open()
    assert wait_until(lambda: bool(chained), RESULT_TIMEOUT)
    assert chained[0].result(timeout=RESULT_TIMEOUT) == (("released",), {})


@pytest.mark.timeout(60)
def test_done_callback_exception_is_logged_not_fatal(
    executor: ScalerExecutor, gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="concurrent.futures")
    after = threading.Event()

    def bad(_: Future[Any]) -> None:
        raise RuntimeError("callback failure for the contract test")

    (first,) = block_processors(executor, gate, 1)
    first.add_done_callback(bad)
    first.add_done_callback(lambda _: after.set())
    gate.open()
    assert after.wait(RESULT_TIMEOUT), "the callback after a failing one did not run"
    assert first.result(timeout=RESULT_TIMEOUT) == "released"
    assert wait_until(
        lambda: any(
            r.exc_info and "callback failure for the contract test" in str(r.exc_info[1])
            for r in caplog.records
        ),
        10,
    ), [r.getMessage() for r in caplog.records]
    assert executor.submit(square, 5).result(timeout=RESULT_TIMEOUT) == 25


# =========================================================================== garbage collection


@pytest.mark.timeout(60)
def test_no_stale_references(executor: ScalerExecutor) -> None:
    # CPython issue #16284: the executor keeps no reference to what was submitted.
    my_object = MyObject()
    collected = threading.Event()
    _ref = weakref.ref(my_object, lambda _: collected.set())
    executor.submit(my_object.my_method)  # the future is deliberately discarded
    del my_object
    gc.collect()
    assert collected.wait(30), "stale reference not collected"


@pytest.mark.timeout(60)
def test_finished_futures_can_be_collected(executor: ScalerExecutor) -> None:
    futures = [executor.submit(make_dummy_object, i) for i in range(5)]
    for f in futures:
        f.result(timeout=RESULT_TIMEOUT)
    refs = [weakref.ref(f) for f in futures]
    results = [weakref.ref(f.result()) for f in futures]
    del futures, f
    gc.collect()
    assert wait_until(lambda: all(r() is None for r in refs + results), 3), (
        f"{sum(r() is not None for r in refs)} futures and {sum(r() is not None for r in results)} results still referenced"
    )


@pytest.mark.timeout(120)
def test_dropping_the_executor_acts_as_shutdown_nowait(gate: Gate) -> None:
    ex = ScalerExecutor(max_workers=2, config=FAST)
    wr = weakref.ref(ex)
    try:
        sid = daemon_session(ex)
        directory = socket_dir(ex)
        fs = [ex.submit(wait_for_gate, gate.path, gate.started_dir, i) for i in range(3)]
        assert wait_until(lambda: gate.started() >= 1, 60)
        assert (
            len(session_members(sid)) >= 3
        )  # daemon, worker, processor(s): the detector sees them
        del ex
        gc.collect()
        assert wr() is None
        assert not any(f.done() for f in fs), (
            "dropping the executor waited for, or failed, outstanding work"
        )
        gate.open()
        assert [f.result(timeout=RESULT_TIMEOUT) for f in fs] == [0, 1, 2]
        assert wait_until(lambda: not session_members(sid), 30), (
            f"cluster processes left: {session_members(sid)}"
        )
        assert wait_until(lambda: not os.path.exists(directory), 30)
    finally:
        gate.open()
        leftover = wr()
        if leftover is not None:
            leftover.shutdown(wait=True, cancel_futures=True)


# =========================================================================== shutdown


@pytest.mark.timeout(120)
def test_context_manager_shutdown_waits_and_is_idempotent(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    with fresh_executor(max_workers=2, config=FAST) as ex:
        sid = daemon_session(ex)
        assert list(ex.map(abs, range(-5, 5))) == [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]
        fs = [ex.submit(sleep_and_return, 0.05, i) for i in range(20)]  # CPython issue #12364
        ex.map(str, [2] * 3)  # CPython issue #12456: map left unconsumed at shutdown
        ex.submit(int).cancel()  # CPython gh-94440: cancelled right before shutdown
    # __exit__ is shutdown(wait=True): every outstanding future completed normally.
    assert all(f.done() for f in fs)
    assert [f.result(timeout=0) for f in fs] == list(range(20))
    # ... and the cluster's processes have exited by the time it returned.
    assert session_members(sid) == []
    ex.shutdown()
    ex.shutdown(wait=False)
    ex.shutdown(wait=True, cancel_futures=True)
    with pytest.raises(RuntimeError):
        ex.submit(pow, 2, 5)
    with pytest.raises(RuntimeError):
        ex.map(str, [1])
    with pytest.raises(RuntimeError):
        ex.options(priority=1).submit(pow, 2, 5)


@pytest.mark.timeout(120)
def test_shutdown_cancel_futures(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path, gate: Gate
) -> None:
    # CPython test_shutdown.test_cancel_futures, made exact: CPython submits 50 short sleeps and
    # expects "more than 20" cancelled, which depends on how far its pool ran ahead.  Here the
    # processors are held, so which futures are pending when shutdown() runs is known.
    log = tmp_path / "ran.log"
    ex = fresh_executor(max_workers=2, config=FAST)
    blockers, futures = queue_behind_blockers(ex, gate, log)
    dispatched = [f for f in futures if f.running()]
    pending = [f for f in futures if not f.running()]
    assert pending
    ex.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in pending)
    assert not any(f.cancelled() for f in blockers + dispatched)
    with pytest.raises(RuntimeError):
        ex.submit(pow, 2, 5)
    gate.open()
    ex.shutdown(wait=True)
    # The work already dispatched finished normally (not failed by the shutdown).
    assert [f.result(timeout=0) for f in blockers] == ["released", "released"]
    assert [f.result(timeout=0) for f in dispatched] == [futures.index(f) for f in dispatched]
    assert set(read_log(log)) == {futures.index(f) for f in dispatched}


@pytest.mark.timeout(120)
def test_shutdown_nowait_returns_at_once_and_work_completes(
    fresh_executor: Callable[..., ScalerExecutor], gate: Gate
) -> None:
    ex = fresh_executor(max_workers=2, config=FAST)
    sid = daemon_session(ex)
    fs = [ex.submit(wait_for_gate, gate.path, gate.started_dir, i) for i in range(4)]
    assert wait_until(lambda: gate.started() >= 1, 60)
    ex.shutdown(wait=False)
    assert not any(f.done() for f in fs), (
        "shutdown(wait=False) waited for, or failed, outstanding work"
    )
    with pytest.raises(RuntimeError):
        ex.submit(pow, 2, 5)
    gate.open()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in fs] == [0, 1, 2, 3]
    assert wait_until(lambda: not session_members(sid), 30), (
        f"cluster processes left: {session_members(sid)}"
    )


@pytest.mark.timeout(120)
def test_new_executor_runs_max_workers_tasks_at_once(
    fresh_executor: Callable[..., ScalerExecutor], gate: Gate
) -> None:
    # ProcessPoolExecutor(max_workers=2) runs two submitted calls side by side; two tasks that
    # wait for each other (a rendezvous) must not deadlock on a new executor.
    ex = fresh_executor(max_workers=2, config=FAST)
    fs = [ex.submit(wait_for_gate, gate.path, gate.started_dir, i) for i in range(2)]
    assert wait_until(lambda: gate.started() == 2, 15), (
        f"only {gate.started()} of 2 tasks started on an idle 2-worker executor: the other waits behind it"
    )
    gate.open()
    assert [f.result(timeout=RESULT_TIMEOUT) for f in fs] == [0, 1]


# =========================================================================== initializer, max_tasks_per_child


@pytest.mark.timeout(120)
def test_initializer_runs_before_tasks(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    # CPython test_init.InitializerMixin.
    ex = fresh_executor(max_workers=2, config=FAST, initializer=init, initargs=("initialized",))
    fs = [ex.submit(get_init_state) for _ in range(6)]
    states = [f.result(timeout=RESULT_TIMEOUT)[1] for f in fs] + [
        state for _, state in ex.map(get_init_state, range(4))
    ]
    assert states == ["initialized"] * 10
    assert INIT_STATE == "uninitialized"  # it ran in the processors, not here


@pytest.mark.timeout(120)
def test_failing_initializer_breaks_the_executor(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    # CPython test_init.FailingInitializerMixin.
    ex = fresh_executor(max_workers=2, config=FAST, initializer=init_fail)
    futures: list[Future[Any]] = []
    try:
        futures = [ex.submit(get_init_state) for _ in range(3)]
    except BrokenExecutor:
        pass
    for f in futures:
        with pytest.raises(BrokenExecutor) as info:
            f.result(timeout=RESULT_TIMEOUT)
        assert isinstance(info.value, InitializerFailed)
        text = "".join(traceback.format_exception(info.value))
        assert "error in initializer" in text and "init_fail" in text

    def broken() -> bool:
        try:
            ex.submit(get_init_state)
        except BrokenExecutor:
            return True
        return False

    assert wait_until(broken, RESULT_TIMEOUT)
    with pytest.raises(BrokenExecutor):
        ex.submit(get_init_state)
    assert issubclass(InitializerFailed, BrokenExecutor)


@pytest.mark.timeout(120)
def test_max_tasks_per_child_one_gives_a_new_process_per_task(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    ex = fresh_executor(max_workers=2, config=FAST, max_tasks_per_child=1)
    pids = [ex.submit(os.getpid).result(timeout=RESULT_TIMEOUT) for _ in range(4)]
    assert len(set(pids)) == 4, pids


# =========================================================================== interpreter exit

EXIT_SCRIPT = """
import atexit
import os
import time

TOKEN = os.environ["CONTRACT_EXIT_TOKEN"]


def run_last():
    # Registered before scaler_executor is imported, so it runs after the executor's own exit
    # hook (atexit is LIFO): by then the executor must refuse new work (CPython's
    # test_submit_after_interpreter_shutdown).
    try:
        executor.submit(pow, 2, 5)
    except RuntimeError as exc:
        print("refused:", exc, flush=True)


atexit.register(run_last)

import psutil

from scaler_executor import ClusterConfig, ScalerExecutor


def sleep_and_return(seconds, value):
    time.sleep(seconds)
    return value


def report(future):
    print("callback:", future.result(), flush=True)


def token_holders():
    holders = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("CONTRACT_EXIT_TOKEN") == TOKEN:
                holders.append(p.pid)
        except psutil.Error:
            pass
    return holders


if __name__ == "__main__":
    config = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=15.0)
    executor = ScalerExecutor(max_workers=2, config=config)
    processor = executor.submit(os.getpid).result(timeout=60)
    print("processor:", processor, "holders:", len(token_holders()), flush=True)
    for i in range(3):
        executor.submit(sleep_and_return, 0.5, f"apple{i}").add_done_callback(report)
    # No shutdown: interpreter exit must complete these futures and stop the cluster.
"""


@pytest.mark.timeout(120)
def test_interpreter_exit_completes_futures_and_leaves_nothing(tmp_path: Path) -> None:
    """A script that exits without shutdown: its futures complete, nothing on stderr, no process left.

    The cluster's processes are found by an environment token: every process the script starts
    (daemon, worker, zygote, processors) inherits the script's environment, and
    /proc/<pid>/environ keeps it whoever the process is re-parented to after the script exits,
    so "no live process carries the token" is sound where ancestry (lost on re-parenting to
    init) is not.  The script itself counts the token holders while its cluster runs, which
    shows the detector is not vacuous.  stdout/stderr go to files rather than pipes so that
    ``subprocess.run`` returns when the script exits, not when the last descendant closes an
    inherited pipe: a lingering process is then caught here instead of hidden as a slow run.
    """
    script = tmp_path / "exit_without_shutdown.py"
    script.write_text(textwrap.dedent(EXIT_SCRIPT))
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
    env.update(PYTHONPATH=REPO_ROOT, CONTRACT_EXIT_TOKEN=token)
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.run(
            [sys.executable, str(script)],
            check=False,
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=err,
            timeout=60,
        )

    def token_holders() -> list[int]:
        holders = []
        for p in psutil.process_iter(["status"]):
            try:
                if (
                    p.info["status"] != psutil.STATUS_ZOMBIE
                    and p.environ().get("CONTRACT_EXIT_TOKEN") == token
                ):
                    holders.append(p.pid)
            except psutil.Error:
                pass
        return holders

    left = token_holders()
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    stdout = out_path.read_text()
    stderr = err_path.read_bytes()
    assert proc.returncode == 0, (stdout, stderr)
    assert stderr == b""
    lines = stdout.splitlines()
    holders = int(lines[0].split("holders:")[1])
    assert holders >= 3, (
        f"the token detector saw only {holders} cluster processes while the script ran"
    )
    assert sorted(line for line in lines if line.startswith("callback:")) == [
        f"callback: apple{i}" for i in range(3)
    ]
    assert any(line.startswith("refused: cannot schedule new futures") for line in lines), stdout
    assert left == [], f"processes left after the script exited: {left}"


DECOY_SCRIPT = """
import sys
import tempfile
from scaler_executor import ScalerExecutor

def where(_):
    import scaler_executor
    return scaler_executor.__file__

if __name__ == "__main__":
    with ScalerExecutor(max_workers=1) as ex:
        print(ex.submit(where, 0).result())
"""


@pytest.mark.timeout(120)
def test_a_scaler_executor_folder_in_the_working_directory_is_not_imported(tmp_path: Path) -> None:
    """The cluster's processes import what the client imported, not what sits in its cwd.

    ``python -m`` puts the working directory first on sys.path; a source checkout of another
    version there was imported by the daemon and workers (then they spoke past each other).
    """
    decoy = tmp_path / "scaler_executor"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy package was imported')\n")
    script = tmp_path / "elsewhere" / "decoy_script.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(DECOY_SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
    env["PYTHONPATH"] = REPO_ROOT
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    import scaler_executor

    assert proc.stdout.strip() == scaler_executor.__file__, proc.stdout
    assert "decoy" not in proc.stderr, proc.stderr


def test_the_constructor_sweeps_directories_of_dead_embedded_clusters_only(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    """A ``scaler-PID-*`` directory whose client is dead (and whose daemon does not answer) is
    removed when the next embedded cluster starts; a live client's, and other names, stay."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    tmp = tempfile.gettempdir()
    stale = tempfile.mkdtemp(prefix=f"scaler-{dead.pid}-", dir=tmp)
    Path(stale, "daemon.sock").touch()  # a socket file nobody answers on
    live = tempfile.mkdtemp(prefix=f"scaler-{os.getpid()}-", dir=tmp)
    other = tempfile.mkdtemp(prefix="scaler-notapid-", dir=tmp)
    try:
        ex = fresh_executor(max_workers=1)
        assert ex.submit(abs, -1).result(timeout=30) == 1
        assert not os.path.exists(stale)
        assert os.path.isdir(live) and os.path.isdir(other)
    finally:
        for path in (stale, live, other):
            shutil.rmtree(path, ignore_errors=True)
