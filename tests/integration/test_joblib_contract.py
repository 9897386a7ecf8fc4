"""joblib's backend contract, checked against joblib's own loky backend on the same program.

Each program runs twice, with ``parallel_config("loky", ...)`` and ``parallel_config("scaler",
...)``, and what the tasks report (their backend, nesting level, ``effective_n_jobs``, where
they ran, their environment, the arrays they received, the exceptions that reach the caller)
must agree.  Runs on the installed joblib and, through ``test_joblib_versions.py``, on joblib
1.4.x and 1.5.x: tests of a keyword an old joblib lacks skip there with the reason.
"""

from __future__ import annotations

import atexit
import errno
import gc
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed, parallel_config
from joblib.parallel import get_active_backend
from scaler_testing import wait_until

import scaler_executor.joblib as sj
from scaler_executor import InitializerFailed, ScalerExecutor

LOKY = "loky"
SCALER = "scaler"
BACKENDS = (LOKY, SCALER)


def _loky_takes(keyword: str) -> bool:
    try:
        with parallel_config(LOKY, **{keyword: None}):
            return True
    except TypeError:
        return False


LOKY_TAKES_INITIALIZER = _loky_takes("initializer")
needs_loky_initializer = pytest.mark.skipif(
    not LOKY_TAKES_INITIALIZER,
    reason=f"joblib {joblib.__version__}'s loky takes no initializer (joblib >= 1.5 does)",
)


_JOBLIB_FOLDER_CLEANUP = "TemporaryResourcesManager.register_folder_finalizer.<locals>._cleanup"


@pytest.fixture(scope="module", autouse=True)
def stop_pools() -> Iterator[None]:
    yield
    sj.shutdown()
    from joblib.externals.loky import get_reusable_executor
    from joblib.externals.loky.backend import resource_tracker as loky_tracker

    get_reusable_executor().shutdown(wait=True, kill_workers=True)
    # joblib registers each loky pool's memmapping folder with loky's tracker, and leaves an
    # exit handler that deletes the folder and unregisters it (also one never made). Run
    # those now, while the tracker that knows the folders runs: at the exit a new tracker,
    # started by the first of them, prints a KeyError traceback for each.
    for obj in gc.get_objects():
        if getattr(obj, "__qualname__", "") == _JOBLIB_FOLDER_CLEANUP and callable(obj):
            atexit.unregister(obj)
            obj()
    # loky leaves two resource-tracker processes (its own and multiprocessing's) running
    # until the interpreter exits; the suite's leak check wants no child left, so stop them
    # (each starts again when next needed).  Private, but no public stop exists.
    import multiprocessing.resource_tracker as mp_tracker

    for tracker in (loky_tracker._resource_tracker, mp_tracker._resource_tracker):
        if hasattr(tracker, "_stop"):
            tracker._stop()
        elif getattr(tracker, "_fd", None) is not None:  # joblib 1.4's loky
            os.close(tracker._fd)
            os.waitpid(tracker._pid, 0)
            tracker._fd = tracker._pid = None


def run(backend: str, program: Callable[..., Any], *args: Any, **config: Any) -> Any:
    config.setdefault("n_jobs", 2)
    with parallel_config(backend, **config):
        return program(backend, *args)


def both(program: Callable[..., Any], *args: Any, **config: Any) -> dict[str, Any]:
    return {backend: run(backend, program, *args, **config) for backend in BACKENDS}


# =========================================================================== nesting


def where(caller: int, task: int | None = None) -> dict[str, Any]:
    """What a Parallel call made here would use, and where "here" is."""
    backend, n_jobs = get_active_backend()
    name = type(backend).__name__
    pid = os.getpid()
    return {
        "backend": "<backend>" if name in ("LokyBackend", "ScalerBackend") else name,
        "level": backend.nesting_level,
        "config_n_jobs": n_jobs,
        "effective_n_jobs(-1)": joblib.effective_n_jobs(-1),
        "effective_n_jobs(None)": joblib.effective_n_jobs(None),
        "effective_n_jobs(2)": joblib.effective_n_jobs(2),
        "process": "caller" if pid == caller else "task" if pid == task else "other",
        "thread": "main" if threading.current_thread() is threading.main_thread() else "other",
    }


def inner(caller: int, task: int) -> dict[str, Any]:
    return where(caller, task)


def explicit_inner(backend: str, caller: int, task: int) -> dict[str, Any]:
    with parallel_config(backend, n_jobs=2):
        here = where(caller, task)
        ran = Parallel()(delayed(inner)(caller, task) for _ in range(2))
    return {"here": here, "ran": ran}


def nested_task(backend: str, mode: str, caller: int) -> dict[str, Any]:
    # Below threads both backends warn that n_jobs becomes 1 (counting the warnings is not
    # thread-safe: catch_warnings is process-wide); the n_jobs they report is compared.
    warnings.filterwarnings("ignore", message=".*cannot .*nested below threads")
    warnings.filterwarnings("ignore", message=".*cannot start a cluster below the threads")
    task = os.getpid()
    me = where(caller, task)
    if mode == "Parallel(n_jobs=2)":
        ran = Parallel(n_jobs=2)(delayed(inner)(caller, task) for _ in range(2))
    elif mode == "Parallel()":
        ran = Parallel()(delayed(inner)(caller, task) for _ in range(2))
    elif mode == "parallel_config in the task":
        ran = [explicit_inner(backend, caller, task)]
    else:  # parallel_config in a thread of a nested call
        ran = Parallel(n_jobs=2)(delayed(explicit_inner)(backend, caller, task) for _ in range(2))
    return {"task": me, "ran": ran}


def nesting_program(backend: str, mode: str) -> Any:
    return Parallel()(delayed(nested_task)(backend, mode, os.getpid()) for _ in range(2))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("outer_n_jobs", [2, 1], ids=["outer-n_jobs=2", "outer-n_jobs=1"])
@pytest.mark.parametrize(
    "mode",
    [
        "Parallel(n_jobs=2)",
        "Parallel()",
        "parallel_config in the task",
        "parallel_config below threads",
    ],
)
def test_nested_parallel_agrees_with_loky(mode: str, outer_n_jobs: int) -> None:
    """The nested call's backend, nesting level, n_jobs and place are loky's, also when the
    outer call runs sequentially under parallel_config(n_jobs=1)."""
    result = both(nesting_program, mode, n_jobs=outer_n_jobs)
    assert result[SCALER] == result[LOKY]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n_jobs", [-1, -2, 1, 2, 3])
def test_effective_n_jobs_at_top_level_agrees_with_loky(n_jobs: int) -> None:
    # -1: the embedded cluster's capacity, this process's CPUs, as loky's cpu_count()
    assert len(os.sched_getaffinity(0)) == joblib.cpu_count()
    with parallel_config(LOKY, n_jobs=n_jobs):
        expected = where(os.getpid())
    with parallel_config(SCALER, n_jobs=n_jobs):
        got = where(os.getpid())
    assert got == expected


@pytest.mark.timeout(60)
def test_without_n_jobs_the_backend_means_the_whole_cluster() -> None:
    """The one documented difference: loky's default n_jobs is 1, the scaler backend's -1
    (as joblib's dask backend): Parallel() and effective_n_jobs(None) use the whole cluster."""
    with parallel_config(LOKY):
        assert joblib.effective_n_jobs(None) == 1
    with parallel_config(SCALER):
        assert joblib.effective_n_jobs(None) == len(os.sched_getaffinity(0))


def cluster_nested_task(caller: int) -> dict[str, Any]:
    task = os.getpid()
    return {
        "task": where(caller, task),
        "ran": Parallel(batch_size=1)(delayed(inner)(caller, task) for _ in range(4)),
    }


@pytest.mark.timeout(120)
def test_nested_cluster_is_an_explicit_choice() -> None:
    """nested="cluster": the tasks' Parallel calls go back to the cluster, one level deeper,
    with the cluster's capacity as n_jobs (the waiting task secedes: no deadlock with every
    processor busy)."""
    sj.shutdown()
    cpus = len(os.sched_getaffinity(0))
    with parallel_config(SCALER, n_jobs=cpus, nested="cluster"):
        out = Parallel(batch_size=1)(delayed(cluster_nested_task)(os.getpid()) for _ in range(cpus))
    for report in out:
        task = report["task"]
        assert (task["backend"], task["level"], task["process"]) == ("<backend>", 1, "task")
        assert task["effective_n_jobs(-1)"] == cpus
        for ran in report["ran"]:
            # on another processor of the cluster, one level deeper again
            assert (ran["backend"], ran["level"], ran["process"]) == ("<backend>", 2, "other")
    with pytest.raises(ValueError, match="nested must be one of"):
        parallel_config(SCALER, nested="threads")


# =========================================================================== initializer

INITIALIZED: list[str] = []


def record_initializer(directory: str, tag: str, *_: str) -> None:
    INITIALIZED.append(tag)
    with open(Path(directory, f"{os.getpid()}-{tag}"), "w") as f:
        f.write(tag)


def daemons() -> set[int]:
    """The embedded clusters' daemons running now (the replaced one is gone once idle)."""
    found = set()
    for p in psutil.Process().children():
        try:
            if "scaler_executor.cli.daemon" in " ".join(p.cmdline()) and p.status() != "zombie":
                found.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def report_initialized(_: Any) -> tuple[int, list[str]]:
    return os.getpid(), list(INITIALIZED)


def initialized_program(backend: str) -> Any:
    return Parallel(batch_size=1)(delayed(report_initialized)(i) for i in range(8))


def fail_initializer() -> None:
    raise RuntimeError("initializer says no")


@pytest.mark.timeout(120)
@needs_loky_initializer
def test_initializer_runs_once_per_process_before_its_first_task_as_loky(tmp_path: Path) -> None:
    for backend in BACKENDS:
        directory = tmp_path / backend
        directory.mkdir()
        out = run(
            backend,
            initialized_program,
            initializer=record_initializer,
            initargs=(str(directory), "A"),
        )
        for pid, seen in out:
            assert seen == ["A"], (backend, seen)  # ran once, before the first task
            assert (directory / f"{pid}-A").exists()
        assert pid != os.getpid()


@pytest.mark.timeout(180)
def test_another_initializer_gets_a_new_embedded_cluster(tmp_path: Path) -> None:
    """A configuration with another initializer (or initargs) gets a new cluster, whose
    processes ran only that one; the same one again reuses the running cluster."""

    def with_init(tag: str, *extra: str) -> tuple[list[tuple[int, list[str]]], set[int]]:
        result: list[tuple[int, list[str]]] = run(
            SCALER,
            initialized_program,
            initializer=record_initializer,
            initargs=(str(tmp_path), tag, *extra),
        )
        return result, daemons()

    sj.shutdown()
    first, first_daemons = with_init("A")
    assert all(seen == ["A"] for _, seen in first)
    again, again_daemons = with_init("A")
    assert all(seen == ["A"] for _, seen in again)
    assert again_daemons == first_daemons and len(first_daemons) == 1  # reused
    second, second_daemons = with_init("B")
    assert all(seen == ["B"] for _, seen in second)  # fresh processes: only B ran there
    assert not {pid for pid, _ in second} & {pid for pid, _ in first + again}
    assert second_daemons - first_daemons  # a new cluster; the old one stops once idle
    assert wait_until(lambda: daemons().isdisjoint(first_daemons), timeout=30), daemons()
    plain = run(SCALER, initialized_program)
    assert all(seen == [] for _, seen in plain)  # no initializer: a cluster without one


@pytest.mark.timeout(120)
def test_failing_initializer_fails_the_call_and_the_next_call_works() -> None:
    with pytest.raises(InitializerFailed, match="initializer failed"):
        run(SCALER, initialized_program, initializer=fail_initializer)
    assert all(seen == [] for _, seen in run(SCALER, initialized_program))


@pytest.mark.timeout(60)
def test_initializer_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="initializer must be callable"):
        parallel_config(SCALER, initializer="not a function")
    with pytest.raises(TypeError, match="initargs must be a tuple"):
        parallel_config(SCALER, initializer=record_initializer, initargs=[str(tmp_path), "A"])
    with pytest.raises(ValueError, match=r"ScalerExecutor\(initializer=\.\.\.\)"):
        parallel_config(SCALER, address="tcp://127.0.0.1:1", initializer=record_initializer)
    with ScalerExecutor(max_workers=1) as ex, pytest.raises(ValueError, match="initializer="):
        parallel_config(SCALER, executor=ex, initializer=record_initializer)


# =========================================================================== thread limits

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMBA_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "ENABLE_IPC",
)


def thread_environment(_: Any) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in THREAD_VARIABLES}


def environment_program(backend: str) -> Any:
    return Parallel(batch_size=1)(delayed(thread_environment)(i) for i in range(4))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("limit", [None, 3], ids=["default", "inner_max_num_threads=3"])
def test_thread_limits_of_the_processes_agree_with_loky(limit: int | None) -> None:
    config: dict[str, Any] = {"n_jobs": -1}
    if limit is not None:
        config["inner_max_num_threads"] = limit
    result = both(environment_program, **config)
    assert result[SCALER] == result[LOKY]
    if limit is not None:
        assert result[SCALER][0]["OMP_NUM_THREADS"] == "3"


@pytest.mark.timeout(60)
def test_thread_limits_need_the_backends_own_processes() -> None:
    with (
        ScalerExecutor(max_workers=1) as ex,
        parallel_config(SCALER, executor=ex, n_jobs=2, inner_max_num_threads=2),
        pytest.raises(ValueError, match="OMP_NUM_THREADS"),
    ):
        Parallel()(delayed(thread_environment)(i) for i in range(2))


# =========================================================================== arrays


def array_flags(arrays: dict[str, Any], nested: list[Any]) -> dict[str, Any]:
    arrays = dict(arrays, nested=nested[0][0])
    return {name: bool(a.flags.writeable) for name, a in arrays.items()}


def arrays_program(backend: str) -> Any:
    np = pytest.importorskip("numpy")
    arrays = {
        "1 KiB": np.ones(128),
        "200 KiB": np.ones(25_600),
        "2 MiB": np.ones(262_144),
        "2 MiB of objects": np.empty(262_144, dtype=object),
    }
    return Parallel(batch_size=1)(
        delayed(array_flags)(arrays, [(np.ones(262_144),)]) for _ in range(2)
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "config",
    [{}, {"max_nbytes": None}, {"max_nbytes": "10K"}, {"max_nbytes": 100}, {"mmap_mode": "c"}],
    ids=["default", "max_nbytes=None", "max_nbytes=10K", "max_nbytes=100", "mmap_mode=c"],
)
def test_arrays_arrive_writable_or_read_only_as_with_loky(config: dict[str, Any]) -> None:
    pytest.importorskip("numpy")
    result = both(arrays_program, **config)
    assert result[SCALER] == result[LOKY]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["r+", "w+"])
def test_shared_writable_memory_maps_are_refused(mode: str) -> None:
    with (
        parallel_config(SCALER, n_jobs=2, mmap_mode=mode),
        pytest.raises(ValueError, match="mmap_mode='r'"),
    ):
        Parallel()(delayed(thread_environment)(i) for i in range(2))


# =========================================================================== prefer/require


def place(caller: int) -> tuple[str, str]:
    here = where(caller)
    return here["process"], here["backend"]


def hints_program(backend: str, hints: dict[str, str]) -> Any:
    return Parallel(**hints)(delayed(place)(os.getpid()) for _ in range(2))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "hints",
    [{"require": "sharedmem"}, {"prefer": "threads"}, {"prefer": "processes"}],
    ids=["require=sharedmem", "prefer=threads", "prefer=processes"],
)
def test_prefer_and_require_agree_with_loky(hints: dict[str, str]) -> None:
    result = both(hints_program, hints)
    assert result[SCALER] == result[LOKY]


@pytest.mark.timeout(60)
def test_a_keyword_the_backend_does_not_take_is_an_error() -> None:
    try:
        Parallel(n_jobs=1, no_such_keyword=1)
    except TypeError:
        pytest.skip(f"joblib {joblib.__version__}'s Parallel passes no keywords to backends")
    with (
        parallel_config(SCALER, n_jobs=2),
        pytest.raises(TypeError, match="does not take idle_worker_timeout"),
    ):
        Parallel(idle_worker_timeout=10)(delayed(thread_environment)(i) for i in range(2))


# =========================================================================== exceptions


def recurse(n: int) -> int:
    return recurse(n + 1)


def deep_then_value_error(depth: int) -> None:
    if depth <= 0:
        raise ValueError("at the bottom of a deep stack")
    deep_then_value_error(depth - 1)


def recursion_in_nested_threads(_: Any) -> Any:
    return Parallel(n_jobs=2)(delayed(recurse)(i) for i in range(2))


def recursion_in_own_pool(backend: str) -> Any:
    with parallel_config(backend, n_jobs=2):
        return Parallel()(delayed(recurse)(i) for i in range(2))


def file_not_found(_: Any) -> None:
    raise OSError(errno.ENOENT, "no such thing", "/nope")


def raised(program: Callable[..., Any], *args: Any) -> Callable[[str], Any]:
    def call(backend: str) -> Any:
        actual = [backend if a == "<backend>" else a for a in args]
        try:
            Parallel()(delayed(program)(*actual) for _ in range(2))
        except Exception as exc:  # noqa: BLE001 - the exception is what the test compares
            return type(exc), getattr(exc, "errno", None), getattr(exc, "filename", None)
        return None

    return call


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "program, args",
    [
        (recurse, (0,)),
        (deep_then_value_error, (700,)),
        (recursion_in_nested_threads, (0,)),
        (recursion_in_own_pool, ("<backend>",)),
        (file_not_found, (0,)),
    ],
    ids=["RecursionError", "deep stack", "in nested threads", "in a nested pool", "OSError"],
)
def test_exceptions_keep_their_type_as_with_loky(
    program: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    result = both(raised(program, *args))
    assert result[LOKY] is not None
    assert result[SCALER] == result[LOKY]


# =========================================================================== depth limit

DEPTH_PROGRAM = """
import sys
import scaler_executor.joblib
from joblib import Parallel, delayed, parallel_config

def own_pool(backend):
    with parallel_config(backend, n_jobs=2):
        return Parallel()(delayed(abs)(i) for i in range(2))

backend = sys.argv[1]
with parallel_config(backend, n_jobs=2):
    try:
        Parallel()(delayed(own_pool)(backend) for _ in range(2))
    except RuntimeError as exc:
        print("RuntimeError", "MAX_DEPTH=1" in str(exc), "LOKY_MAX_DEPTH" in str(exc))
    else:
        print("no error")
scaler_executor.joblib.shutdown()
"""


@pytest.mark.timeout(120)
def test_nested_pools_stop_at_lokys_depth_limit() -> None:
    """LOKY_MAX_DEPTH=1: a task may not start a pool of its own, with either backend."""
    import subprocess
    import sys

    from scaler_testing import child_env

    env = dict(child_env(), LOKY_MAX_DEPTH="1")
    out = {}
    for backend in BACKENDS:
        proc = subprocess.run(
            [sys.executable, "-c", DEPTH_PROGRAM, backend],
            env=env,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[backend] = proc.stdout.split()
    assert out[SCALER] == out[LOKY] == ["RuntimeError", "True", "True"]
