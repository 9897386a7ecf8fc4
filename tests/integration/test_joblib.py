"""The joblib backend ``"scaler"`` (``scaler_executor.joblib``), on the installed joblib.

Run against joblib 1.4 (``apply_async``, the 1.4 retrieval path) and the latest release
(``submit``, ``retrieve_result``).  Most tests use the process-wide embedded cluster the
backend creates; the module fixture shuts it down so that ``no_leaks`` finds nothing.
Tasks report through files or return values; the test polls with deadlines (``wait_until``).
"""

from __future__ import annotations

import inspect
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import cloudpickle
import psutil
import pytest
from scaler_testing import wait_until

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed, parallel_config

import scaler_executor.joblib as sj
from scaler_executor import ClusterConfig, ScalerExecutor, WorkerLost
from scaler_executor.exceptions import RemoteTraceback

CPUS = len(os.sched_getaffinity(0))
# Clusters these tests start themselves use the default heartbeats (as the clients the backend
# creates do) and a start-up allowance for a loaded CI machine.
CONFIG = ClusterConfig(daemon_loss_timeout=15.0)
JOBLIB_CALLS_APPLY_ASYNC = "apply_async" in inspect.getsource(joblib.parallel.Parallel._dispatch)


@pytest.fixture(scope="module", autouse=True)
def stop_embedded_cluster() -> Iterator[None]:
    yield
    sj.shutdown()


def children() -> list[psutil.Process]:
    return [
        p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE
    ]


# --------------------------------------------------------------------------- task functions


class CustomError(ValueError):
    pass


def square(x: int) -> int:
    return x * x


def sleep_then(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x


def pid_of(_: Any = None) -> int:
    return os.getpid()


def fail_on(x: int, bad: int) -> int:
    if x == bad:
        raise CustomError(f"task {x} is bad")
    return x


def interval(x: int, seconds: float) -> tuple[float, float, int]:
    start = time.monotonic()  # CLOCK_MONOTONIC is system-wide on Linux: comparable across processes
    time.sleep(seconds)
    return start, time.monotonic(), os.getpid()


def max_overlap(intervals: list[tuple[float, float, int]]) -> int:
    events = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def warm_up(n_jobs: int) -> None:
    """Run tasks until all ``n_jobs`` processors of the backend's cluster have answered."""
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while len(seen) < n_jobs and time.monotonic() < deadline:
        with parallel_config("scaler", n_jobs=n_jobs):
            seen.update(
                pid
                for _, _, pid in Parallel(batch_size=1)(
                    delayed(interval)(i, 0.2) for i in range(2 * n_jobs)
                )
            )
    assert len(seen) == n_jobs


def fail_fast_or_mark(x: int, directory: str) -> int:
    if x == 0:
        raise CustomError("first task fails")
    time.sleep(0.3)
    Path(directory, str(x)).touch()
    return x


def kill_myself() -> None:
    os.kill(os.getpid(), 9)


def nested_sum(x: int, explicit_config: bool) -> tuple[int, int, list[int], int]:
    """A task that runs Parallel itself; reports its pid, the inner pids and its children."""
    if explicit_config:
        with parallel_config("scaler", n_jobs=-1):
            inner = Parallel(batch_size=1)(delayed(pid_of)(j) for j in range(4))
    else:
        inner = Parallel(n_jobs=2)(delayed(pid_of)(j) for j in range(4))
    spawned = len(psutil.Process().children(recursive=True))
    return x, os.getpid(), inner, spawned


def nested_on_cluster(x: int) -> tuple[int, list[int]]:
    return os.getpid(), Parallel(n_jobs=2, batch_size=1)(delayed(pid_of)(j) for j in range(3))


# --------------------------------------------------------------------------- spies


class SpyBackend(sj.ScalerBackend):
    """Records which entry point joblib used and the size of every batch."""

    calls: ClassVar[list[tuple[str, int]]] = []

    def submit(self, func: Any, callback: Any = None) -> Any:
        SpyBackend.calls.append(("submit", len(func)))
        return super().submit(func, callback)

    def apply_async(self, func: Any, callback: Any = None) -> Any:
        SpyBackend.calls.append(("apply_async", len(func)))
        return sj.ScalerBackend.submit(self, func, callback)


class NoCallbackBackend(sj.ScalerBackend):
    """The retrieval path of backends without ``supports_retrieve_callback``."""

    supports_retrieve_callback = False


joblib.register_parallel_backend("scaler-spy", SpyBackend)
joblib.register_parallel_backend("scaler-nocallback", NoCallbackBackend)


# --------------------------------------------------------------------------- results


@pytest.mark.timeout(60)
def test_results_in_order() -> None:
    with parallel_config("scaler", n_jobs=2):
        assert Parallel()(delayed(square)(i) for i in range(50)) == [i * i for i in range(50)]
        # later tasks finish first: the list is still in submission order
        durations = [0.3, 0.2, 0.1, 0.0]
        assert Parallel(batch_size=1)(
            delayed(sleep_then)(i, d) for i, d in enumerate(durations)
        ) == [0, 1, 2, 3]


@pytest.mark.timeout(60)
def test_generator_is_lazy_and_ordered() -> None:
    with parallel_config("scaler", n_jobs=2):
        gen = Parallel(return_as="generator")(delayed(square)(i) for i in range(20))
        assert inspect.isgenerator(gen)
        assert next(gen) == 0
        assert list(gen) == [i * i for i in range(1, 20)]


@pytest.mark.timeout(60)
def test_generator_unordered_yields_in_completion_order() -> None:
    with parallel_config("scaler", n_jobs=2):
        gen = Parallel(return_as="generator_unordered", batch_size=1)(
            delayed(sleep_then)(i, d) for i, d in enumerate([1.0, 0.0, 0.0, 0.0])
        )
        out = list(gen)
    assert sorted(out) == [0, 1, 2, 3]
    assert out[-1] == 0  # the slow first task comes last


@pytest.mark.timeout(60)
def test_error_keeps_its_type_message_and_remote_traceback() -> None:
    with (
        parallel_config("scaler", n_jobs=2),
        pytest.raises(CustomError, match="task 3 is bad") as info,
    ):
        Parallel()(delayed(fail_on)(i, 3) for i in range(10))
    assert type(info.value) is CustomError
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "fail_on" in str(info.value.__cause__)


@pytest.mark.timeout(60)
def test_error_in_generator() -> None:
    with parallel_config("scaler", n_jobs=2):
        gen = Parallel(return_as="generator", batch_size=1)(
            delayed(fail_on)(i, 2) for i in range(5)
        )
        # raised as soon as joblib sees it (results before it may or may not come first)
        with pytest.raises(CustomError):
            list(gen)


@pytest.mark.timeout(60)
def test_retrieval_without_retrieve_callback() -> None:
    with parallel_config("scaler-nocallback", n_jobs=2):
        assert Parallel()(delayed(square)(i) for i in range(30)) == [i * i for i in range(30)]
        with pytest.raises(CustomError):
            Parallel(batch_size=1)(delayed(fail_on)(i, 1) for i in range(6))
        assert Parallel()(delayed(square)(i) for i in range(5)) == [0, 1, 4, 9, 16]


# --------------------------------------------------------------------------- n_jobs and batches


@pytest.mark.timeout(60)
def test_n_jobs_minus_one_is_the_cluster_capacity() -> None:
    sj.shutdown()  # a fresh process-wide cluster, sized by default
    with parallel_config("scaler"):
        assert joblib.effective_n_jobs(-1) == CPUS
        assert joblib.effective_n_jobs(-2) == max(CPUS - 1, 1)
        assert joblib.effective_n_jobs(None) == CPUS  # the backend's default is the whole cluster
        with Parallel(n_jobs=-1) as parallel:
            assert parallel._effective_n_jobs() == CPUS
    warm_up(CPUS)
    with parallel_config("scaler", n_jobs=-1):
        spans = Parallel(batch_size=1, pre_dispatch="all")(
            delayed(interval)(i, 0.5) for i in range(2 * CPUS)
        )
    assert max_overlap(spans) == CPUS
    assert len({pid for _, _, pid in spans}) == CPUS


@pytest.mark.timeout(60)
def test_n_jobs_one_runs_in_this_process() -> None:
    with parallel_config("scaler", n_jobs=1):
        assert Parallel()(delayed(pid_of)(i) for i in range(3)) == [os.getpid()] * 3


@pytest.mark.timeout(120)
def test_explicit_n_jobs_limits_concurrency_and_resizes_the_cluster() -> None:
    size = CPUS + 1  # more than the default cluster has: it is replaced by a larger one
    with parallel_config("scaler", n_jobs=2):
        Parallel()(delayed(square)(i) for i in range(4))
    before = {p.pid for p in children()}
    warm_up(size)  # the first call with n_jobs=size replaces the cluster
    with parallel_config("scaler", n_jobs=size):
        assert joblib.effective_n_jobs(-1) == size
        spans = Parallel(batch_size=1, pre_dispatch="all")(
            delayed(interval)(i, 0.5) for i in range(size)
        )
    assert max_overlap(spans) == size
    assert len({pid for _, _, pid in spans}) == size
    # the old cluster is gone once its call finished; the new one has size processors (+3)
    assert wait_until(lambda: not before & {p.pid for p in children()}, timeout=15)
    assert wait_until(lambda: len(children()) == size + 3, timeout=15), children()
    # a smaller n_jobs on the larger cluster: at most n_jobs batches at once
    with parallel_config("scaler", n_jobs=2):
        spans = Parallel(batch_size=1, pre_dispatch="all")(
            delayed(interval)(i, 0.3) for i in range(6)
        )
    assert max_overlap(spans) == 2
    assert wait_until(lambda: len(children()) == size + 3, timeout=5)  # not shrunk, not replaced


@pytest.mark.timeout(60)
def test_batch_size_auto_grows_for_tiny_tasks() -> None:
    SpyBackend.calls.clear()
    with parallel_config("scaler-spy", n_jobs=2):
        assert Parallel(batch_size="auto")(delayed(square)(i) for i in range(2000)) == [
            i * i for i in range(2000)
        ]
    sizes = [n for _, n in SpyBackend.calls]
    assert sum(sizes) == 2000
    assert max(sizes) > 1


@pytest.mark.timeout(60)
def test_batch_size_explicit() -> None:
    SpyBackend.calls.clear()
    with parallel_config("scaler-spy", n_jobs=2):
        out = Parallel(batch_size=7, pre_dispatch="all")(delayed(square)(i) for i in range(30))
    assert out == [i * i for i in range(30)]
    sizes = [n for _, n in SpyBackend.calls]
    assert sum(sizes) == 30 and max(sizes) == 7
    # the tail may be split smaller, depending on the joblib version
    assert sizes[:4] == [7, 7, 7, 7]


@pytest.mark.timeout(60)
def test_entry_point_used_by_this_joblib() -> None:
    SpyBackend.calls.clear()
    with parallel_config("scaler-spy", n_jobs=2):
        assert Parallel()(delayed(square)(i) for i in range(10)) == [i * i for i in range(10)]
    used = {name for name, _ in SpyBackend.calls}
    assert used == ({"apply_async"} if JOBLIB_CALLS_APPLY_ASYNC else {"submit"})


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    not JOBLIB_CALLS_APPLY_ASYNC,
    reason=f"joblib {joblib.__version__} calls submit, not apply_async",
)
def test_apply_async_path_with_errors_and_generators() -> None:
    SpyBackend.calls.clear()
    with parallel_config("scaler-spy", n_jobs=2):
        assert list(Parallel(return_as="generator")(delayed(square)(i) for i in range(10))) == [
            i * i for i in range(10)
        ]
        with pytest.raises(CustomError):
            Parallel()(delayed(fail_on)(i, 4) for i in range(8))
    assert {name for name, _ in SpyBackend.calls} == {"apply_async"}


# --------------------------------------------------------------------------- aborts and failures


@pytest.mark.timeout(60)
def test_abort_cancels_the_calls_outstanding_tasks_and_stays_usable(tmp_path: Path) -> None:
    with parallel_config("scaler", n_jobs=2):
        with pytest.raises(CustomError):
            Parallel(batch_size=1, pre_dispatch="all")(
                delayed(fail_fast_or_mark)(i, str(tmp_path)) for i in range(40)
            )
        time.sleep(1.5)  # what was not cancelled would have run by now
        ran = len(list(tmp_path.iterdir()))
        assert ran <= 4, f"{ran} of 39 tasks ran after the failure"
        assert Parallel()(delayed(square)(i) for i in range(10)) == [i * i for i in range(10)]


@pytest.mark.timeout(60)
def test_abort_leaves_other_callers_alone(
    fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path
) -> None:
    ex = fresh_executor(max_workers=2, config=CONFIG)
    other = [ex.submit(sleep_then, i, 0.5) for i in range(4)]  # queued behind the call's tasks too
    with parallel_config("scaler", executor=ex, n_jobs=2), pytest.raises(CustomError):
        Parallel(batch_size=1, pre_dispatch="all")(
            delayed(fail_fast_or_mark)(i, str(tmp_path)) for i in range(20)
        )
    assert [f.result(timeout=30) for f in other] == [0, 1, 2, 3]
    assert ex.submit(square, 3).result(timeout=30) == 9  # not shut down by the backend
    with parallel_config("scaler", executor=ex):
        assert Parallel()(delayed(square)(i) for i in range(5)) == [0, 1, 4, 9, 16]


@pytest.mark.timeout(60)
def test_abort_in_one_thread_does_not_cancel_a_concurrent_call(tmp_path: Path) -> None:
    results: dict[str, Any] = {}

    def good() -> None:
        with parallel_config("scaler", n_jobs=2):
            results["good"] = Parallel(batch_size=1)(delayed(sleep_then)(i, 0.1) for i in range(12))

    thread = threading.Thread(target=good)
    thread.start()
    time.sleep(0.2)
    with parallel_config("scaler", n_jobs=2), pytest.raises(CustomError):
        Parallel(batch_size=1)(delayed(fail_fast_or_mark)(i, str(tmp_path)) for i in range(10))
    thread.join(50)
    assert results["good"] == list(range(12))


@pytest.mark.timeout(60)
def test_killed_worker_raises_worker_lost_promptly() -> None:
    start = time.monotonic()
    with parallel_config("scaler", n_jobs=2, max_retries=0), pytest.raises(WorkerLost):
        Parallel(batch_size=1)(delayed(kill_myself)() for _ in range(4))
    assert time.monotonic() - start < 20
    with parallel_config("scaler", n_jobs=2):  # the cluster replaced its processors
        assert Parallel()(delayed(square)(i) for i in range(6)) == [i * i for i in range(6)]


@pytest.mark.timeout(90)
def test_killed_worker_with_default_retries_does_not_hang() -> None:
    with parallel_config("scaler", n_jobs=2), pytest.raises(WorkerLost) as info:
        Parallel()(delayed(kill_myself)() for _ in range(1))
    assert len(info.value.attempts) >= 2  # it was retried before giving up


@pytest.mark.timeout(60)
def test_lost_embedded_cluster_fails_the_call_and_the_next_call_starts_a_new_one() -> None:
    with parallel_config("scaler", n_jobs=2):
        assert Parallel()(delayed(square)(i) for i in range(4)) == [0, 1, 4, 9]
    daemons = [p for p in children() if "scaler_executor.cli.daemon" in " ".join(p.cmdline())]
    assert len(daemons) == 1
    with parallel_config("scaler", n_jobs=2):
        gen = Parallel(return_as="generator", batch_size=1)(
            delayed(sleep_then)(i, 0.5) for i in range(20)
        )
        assert next(gen) == 0
        daemons[0].kill()
        with pytest.raises(Exception) as info:
            list(gen)
    from concurrent.futures import BrokenExecutor

    assert isinstance(info.value, BrokenExecutor), repr(info.value)
    assert wait_until(lambda: not children(), timeout=15), children()
    with parallel_config("scaler", n_jobs=2):
        assert Parallel()(delayed(square)(i) for i in range(4)) == [0, 1, 4, 9]


# --------------------------------------------------------------------------- nesting


@pytest.mark.timeout(90)
def test_nested_parallel_runs_in_threads_of_the_task() -> None:
    # joblib's rule (as loky's): ThreadingBackend at nesting level 1, in the task's process
    with parallel_config("scaler", n_jobs=2):
        Parallel()(delayed(square)(i) for i in range(2))  # the cluster exists
        before = len(children())
        out = Parallel(batch_size=1)(delayed(nested_sum)(i, False) for i in range(4))
    assert [x for x, _, _, _ in out] == [0, 1, 2, 3]
    for _, pid, inner, spawned in out:
        assert inner == [pid] * 4  # ran in the task's own process
        assert spawned == 0  # no nested cluster, no pool
        assert pid != os.getpid()
    assert len(children()) == before


@pytest.mark.timeout(180)
def test_parallel_config_in_a_task_gets_a_pool_of_its_own() -> None:
    # as parallel_config("loky") in a loky task: the task's process starts a pool (here an
    # embedded cluster) of its own, kept for that process's life
    with parallel_config("scaler", n_jobs=2):
        out = Parallel(batch_size=1)(delayed(nested_sum)(i, True) for i in range(2))
    cluster = {p.pid for p in children()}
    for _, pid, inner, spawned in out:
        assert pid in cluster  # the outer task ran on a processor of this process's cluster
        assert spawned > 0  # the task's own daemon, worker and processors
        # which ran the inner tasks (the pool lives as long as the task's process)
        own = {p.pid for p in psutil.Process(pid).children(recursive=True)}
        assert set(inner) <= own, (inner, own)


@pytest.mark.timeout(120)
def test_nested_parallel_with_address_joins_that_cluster(
    fresh_executor: Callable[..., ScalerExecutor],
) -> None:
    # 2 outer tasks fill both processors: their nested tasks can only run because each
    # waiting outer task secedes (a plain client of the same cluster would deadlock here)
    ex = fresh_executor(max_workers=2, config=CONFIG)
    try:
        with parallel_config("scaler", address=ex.address, n_jobs=2, nested="cluster"):
            assert joblib.effective_n_jobs(-1) == 2
            out = Parallel(batch_size=1)(delayed(nested_on_cluster)(i) for i in range(2))
        for outer_pid, inner in out:
            assert outer_pid != os.getpid()
            # the nested batches ran on the cluster's other processes (the task seceded:
            # get_executor(), so none waited behind it on its own processor)
            assert outer_pid not in inner and os.getpid() not in inner
        # without nested="cluster", joblib's rule: the nested calls run in the task's threads
        with parallel_config("scaler", address=ex.address, n_jobs=2):
            out = Parallel(batch_size=1)(delayed(nested_on_cluster)(i) for i in range(2))
        for outer_pid, inner in out:
            assert inner == [outer_pid] * 3
    finally:
        sj.shutdown()  # close this process's client before the cluster stops


# --------------------------------------------------------------------------- clusters


@pytest.mark.timeout(120)
def test_embedded_cluster_is_reused_across_many_calls() -> None:
    with parallel_config("scaler", n_jobs=2):
        Parallel()(delayed(square)(i) for i in range(4))
    first = {p.pid for p in children()}
    processors: set[int] = set()
    for _ in range(30):
        with parallel_config("scaler", n_jobs=2):
            processors.update(Parallel(batch_size=1)(delayed(pid_of)(i) for i in range(4)))
        assert len(children()) == len(first)
    assert {p.pid for p in children()} == first
    assert processors <= first


@pytest.mark.timeout(60)
def test_external_executor(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    ex = fresh_executor(max_workers=2, config=CONFIG)
    assert ex.submit(square, 1).result(timeout=30) == 1  # its processors are up
    ex_pids = {p.pid for p in children()}
    with parallel_config("scaler", executor=ex):
        assert joblib.effective_n_jobs(-1) == 2
        pids = set(Parallel(batch_size=1)(delayed(pid_of)(i) for i in range(8)))
    assert pids <= ex_pids
    with parallel_config("scaler", executor=ex, max_retries=0), pytest.raises(WorkerLost):
        Parallel()(delayed(kill_myself)() for _ in range(1))
    assert ex.submit(square, 4).result(timeout=30) == 16  # still the user's, still running


@pytest.mark.timeout(60)
def test_backend_is_picklable(fresh_executor: Callable[..., ScalerExecutor]) -> None:
    backend = sj.ScalerBackend(
        address="tcp://somewhere:8786", max_retries=0, priority=3, nesting_level=1
    )
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy = pickle.loads(dumps(backend))
        assert type(copy) is sj.ScalerBackend
        assert (copy.address, copy.options, copy.nesting_level) == (
            "tcp://somewhere:8786",
            {"max_retries": 0, "priority": 3},
            1,
        )
    ex = fresh_executor(max_workers=2, config=CONFIG)
    with_executor = sj.ScalerBackend(executor=ex, task_timeout=5.0, nested="cluster")
    with parallel_config(with_executor, n_jobs=2):  # configured and used: locks, calls, leases
        assert Parallel()(delayed(square)(i) for i in range(4)) == [0, 1, 4, 9]
        copy = pickle.loads(pickle.dumps(with_executor))
    assert copy.executor is None and copy.options == {"task_timeout": 5.0}
    assert copy.nested == "cluster"
    nested, n_jobs = with_executor.get_nested_backend()
    assert (
        n_jobs is None
        and isinstance(nested, sj.ScalerBackend)
        and nested.executor is None
        and nested.nested == "cluster"
        and nested.nesting_level == (with_executor.nesting_level or 0) + 1
    )
    pickle.loads(pickle.dumps(nested))
    # the default: joblib's own rule, as loky's
    nested, n_jobs = sj.ScalerBackend(nesting_level=0).get_nested_backend()
    assert (type(nested).__name__, nested.nesting_level, n_jobs) == ("ThreadingBackend", 1, None)
    nested, n_jobs = sj.ScalerBackend(nesting_level=1).get_nested_backend()
    assert (type(nested).__name__, nested.nesting_level, n_jobs) == ("SequentialBackend", 2, None)


@pytest.mark.timeout(30)
def test_bad_backend_arguments() -> None:
    with pytest.raises(ValueError, match="not both"):
        sj.ScalerBackend(address="tcp://x:1", executor=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Executor"):
        sj.ScalerBackend(executor=object())  # type: ignore[arg-type]
