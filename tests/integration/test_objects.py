"""The object store in the executor's data path, end to end (real daemon, workers, store).

What the issue promises, row by row:

==========================================  ============================================
promise                                     test
==========================================  ============================================
small values stay inline                    test_small_values_stay_inline
large arrays: zero-copy, read-only views    test_large_array_is_a_read_only_view_of_the_store
writing into one says how to get a copy     test_writing_into_an_argument_says_how_to_copy
``options(writable=True)``: private copy    test_writable_option_gives_a_private_copy
bytes / bytearray / strided: own type       test_other_large_payloads_arrive_as_their_own_type
large results: read-only views, equal,      test_large_results_are_views_valid_after_shutdown
valid after ``shutdown()``
``ex.put``: refs anywhere, read back,       test_put_refs_as_arguments_and_read_back
freed when dropped
``map(f, repeat(big))`` stores big once     test_map_with_a_repeated_argument_stores_it_once
distinct large map arguments are freed      test_map_frees_each_distinct_argument_after_its_task
as their tasks finish
100,000 tasks: usage back to baseline       test_usage_returns_to_baseline_after_100k_tasks
a client gone: its pins deleted             test_objects_of_a_killed_client_are_deleted
store full: ObjectStoreFull at once,        test_store_full_fails_at_once_and_recovers
results inline, serves again once freed
worker without the region: network path,    test_network_path_gives_identical_values
identical values
zero-copy by memory accounting (USS/PSS)    test_zero_copy_by_memory_accounting
==========================================  ============================================

Nothing sleeps to wait for a state: where only the real clock decides (a deletion the
daemon makes after a release), the test polls with a deadline (``wait_until``). How many
objects the store holds is read from the region itself (``ObjectStore.stats()``), through
the client's own mapping (``ex._agent.store``) or a fresh ``ObjectStore.attach(name)``.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from scaler_testing import child_env, fast_config, wait_until

import scaler_executor
from scaler_executor import ScalerExecutor
from scaler_executor.objstore import ObjectStore, ObjectStoreFull

REPO = str(Path(scaler_executor.__file__).resolve().parent.parent)
MB = 1_000_000
THRESHOLD = 64 * 1024  # the default object_store_threshold


# =========================================================================== task functions
# Module level, so that workers import them by reference.


def store_objects(name: str) -> int:
    """How many objects the store ``name`` holds, seen from inside a task."""
    store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
    try:
        return store.stats().objects
    finally:
        store.close()


def mapping_of(address: int) -> str | None:
    """The path of the mapping of this process that contains ``address`` ("" if anonymous)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in parts[0].split("-"))
            if low <= address < high:
                return parts[5].strip() if len(parts) > 5 else ""
    return None


def where(a: np.ndarray) -> str | None:
    return mapping_of(a.__array_interface__["data"][0])


def describe(value: Any, name: str) -> dict[str, Any]:
    """What a task saw of its argument, and how many store objects existed meanwhile."""
    out: dict[str, Any] = {"type": type(value).__name__, "objects": store_objects(name)}
    if isinstance(value, np.ndarray):
        out.update(
            writeable=bool(value.flags.writeable),
            where=where(value),
            checksum=int(value.astype(np.int64).sum()),
            shape=value.shape,
        )
    elif isinstance(value, (bytes, bytearray)):
        out.update(length=len(value), head=bytes(value[:16]), tail=bytes(value[-16:]))
    else:
        out["value"] = value
    return out


def write_first(a: np.ndarray) -> float:
    a[0] = -1.0
    return float(a[0])


def write_and_report(a: np.ndarray, name: str) -> dict[str, Any]:
    out = describe(a, name)
    a[0] = -1.0
    out["first"] = float(a[0])
    return out


def make_range(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def total(*parts: Any) -> int:
    """Sum every array found in the arguments (through lists, dicts and Box)."""
    acc = 0
    for part in parts:
        if isinstance(part, np.ndarray):
            acc += int(part.sum())
        elif isinstance(part, (list, tuple)):
            acc += total(*part)
        elif isinstance(part, dict):
            acc += total(*part.values())
        elif isinstance(part, Box):
            acc += total(part.payload)
    return acc


def first_with_objects(a: np.ndarray, i: int, name: str) -> tuple[int, int, int]:
    return i, int(a[0]), store_objects(name)


def first_of(a: np.ndarray) -> int:
    return int(a[0])


def identity(x: Any) -> Any:
    return x


def double(a: np.ndarray) -> np.ndarray:
    return a * 2


def path_and_double(a: np.ndarray) -> tuple[str | None, bool, np.ndarray]:
    return where(a), bool(a.flags.writeable), a * 2


def hold_and_measure(a: np.ndarray, barrier: str, parties: int) -> dict[str, int]:
    """Memory of this processor before and after reading every page of ``a``, while
    ``parties`` tasks hold it at once (a file barrier: each task waits for the others)."""
    me = psutil.Process()
    before = me.memory_full_info()
    checksum = int(a.sum())  # touches every page of the array
    after = me.memory_full_info()
    pid = os.getpid()
    arrive(barrier, "held", pid, parties)
    during = me.memory_full_info()  # every party holds it now: PSS shares the pages out
    arrive(barrier, "measured", pid, parties)  # nobody lets go before everyone measured
    return {
        "pid": pid,
        "checksum": checksum,
        "uss0": before.uss,
        "pss0": before.pss,
        "rss0": before.rss,
        "uss1": after.uss,
        "rss1": after.rss,
        "pss1": during.pss,
        "uss2": during.uss,
    }


def arrive(barrier: str, stage: str, pid: int, parties: int, timeout: float = 30.0) -> None:
    Path(barrier, f"{stage}-{pid}").touch()
    deadline = time.monotonic() + timeout
    while sum(1 for f in os.listdir(barrier) if f.startswith(stage + "-")) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {stage}: only {os.listdir(barrier)} after {timeout} s")
        time.sleep(0.005)


def memory_now() -> dict[str, int]:
    info = psutil.Process().memory_full_info()
    return {"pid": os.getpid(), "uss": info.uss, "pss": info.pss, "rss": info.rss}


def hold_copy_and_measure(a: np.ndarray) -> dict[str, int]:
    a.sum()
    return memory_now()


@dataclass
class Box:
    payload: Any
    label: str


# =========================================================================== helpers


def store_of(ex: ScalerExecutor) -> ObjectStore:
    """The client's mapping of the daemon host's store (set once the handshake named it)."""
    assert ex._agent.store_ready.wait(30), "the handshake never said whether there is a store"
    store = ex._agent.store
    assert store is not None, "this client could not map the daemon's object store"
    return store  # type: ignore[no-any-return]


def usage(store: ObjectStore) -> tuple[int, int]:
    s = store.stats()
    return s.objects, s.in_use


def back_to(store: ObjectStore, baseline: tuple[int, int], timeout: float = 30.0) -> bool:
    """Poll until the store's (objects, in_use) equals ``baseline`` (deletions are asynchronous)."""
    return wait_until(
        lambda: (gc.collect() or True) and usage(store) == baseline, timeout=timeout, interval=0.05
    )




class Standalone:
    """A ``scaler-daemon`` (plus ``scaler-worker``\\ s) started by hand; ``close()`` kills all."""

    FLAGS = ("--heartbeat-interval", "0.1", "--heartbeat-liveness", "20")

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxo-")
        self.sock_path = os.path.join(self.dir, "d.sock")
        self.address = f"ipc://{self.sock_path}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: set[int] = set()

    def start(self, *argv: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, *argv], env=child_env())
        self.procs.append(proc)
        return proc

    def daemon(self, *args: str) -> subprocess.Popen[bytes]:
        proc = self.start(
            "-m", "scaler_executor.cli.daemon", "--address", self.address, *self.FLAGS, *args
        )
        assert wait_until(
            lambda: os.path.exists(self.sock_path) or proc.poll() is not None, timeout=30
        )
        assert proc.poll() is None, f"the daemon exited with {proc.returncode}"
        return proc

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return self.start("-m", "scaler_executor.cli.worker", self.address, *self.FLAGS, *args)

    def close(self) -> None:
        for proc in self.procs:
            try:
                self.seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in sorted(self.seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def standalone() -> Iterator[Standalone]:
    s = Standalone()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def ex() -> Iterator[ScalerExecutor]:
    """One embedded cluster for the tests that do not need their own: 2 processors, 512 MB store."""
    executor = ScalerExecutor(max_workers=2, config=fast_config(object_store_size="512M"))
    store_of(executor)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def baseline(ex: ScalerExecutor) -> tuple[int, int]:
    """The shared store's (objects, in_use) before the test, once earlier tests' deletions landed."""
    store = store_of(ex)
    # Empty unless an earlier test failed while holding refs (its traceback keeps them):
    # then start from what is left, so that one failure does not cascade.
    back_to(store, (0, 0), timeout=5)
    return usage(store)


# =========================================================================== round trips


@pytest.mark.timeout(60)
def test_small_values_stay_inline(ex: ScalerExecutor, baseline: tuple[int, int]) -> None:
    """Values below the threshold travel in the task message: no store object at any point."""
    store = store_of(ex)
    failed_before = ex.statistics()["failed"]
    values: list[Any] = [
        7,
        "text",
        [1, 2.5, None],
        {"k": (1, 2)},
        b"x" * 1024,
        np.arange(1000, dtype=np.float64),  # 8 KB
        bytes(THRESHOLD - 4096),  # 60 KiB: still inline, stream included
        np.ones(THRESHOLD // 8 - 512),  # 60 KiB of array
    ]
    for value in values:
        seen = ex.submit(describe, value, store.name).result(timeout=30)
        assert seen["objects"] == baseline[0], (
            f"{type(value).__name__} went through the store: {seen}"
        )
        back = ex.submit(identity, value).result(timeout=30)
        if isinstance(value, np.ndarray):
            assert np.array_equal(back, value) and back.flags.writeable  # inline: a private copy
        else:
            assert back == value
        assert usage(store) == baseline
    stats = ex.statistics()
    assert stats["failed"] == failed_before, stats


@pytest.mark.timeout(60)
def test_large_array_is_a_read_only_view_of_the_store(
    ex: ScalerExecutor, baseline: tuple[int, int]
) -> None:
    store = store_of(ex)
    a = np.random.default_rng(1).random(10 * MB // 8)
    seen = ex.submit(describe, a, store.name).result(timeout=30)
    assert seen["type"] == "ndarray" and seen["shape"] == a.shape
    assert seen["writeable"] is False
    assert seen["objects"] >= baseline[0] + 1
    # zero-copy: the task's array lives in the store's shared mapping, not in private memory
    assert seen["where"] and store.name in seen["where"], seen["where"]
    assert seen["checksum"] == int(a.astype(np.int64).sum())
    assert back_to(store, baseline), f"the argument's object was not deleted: {store.stats()}"


@pytest.mark.timeout(60)
def test_writing_into_an_argument_says_how_to_copy(
    ex: ScalerExecutor, baseline: tuple[int, int]
) -> None:
    a = np.zeros(10 * MB // 8)
    with pytest.raises(ValueError, match="read-only") as info:
        ex.submit(write_first, a).result(timeout=30)
    text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
    assert "copy" in text, f"the error does not say how to get a copy: {text!r}"
    assert a[0] == 0.0  # the caller's array is untouched
    assert back_to(store_of(ex), baseline)


@pytest.mark.timeout(60)
def test_writable_option_gives_a_private_copy(
    ex: ScalerExecutor, baseline: tuple[int, int]
) -> None:
    store = store_of(ex)
    a = np.zeros(10 * MB // 8)
    seen = ex.options(writable=True).submit(write_and_report, a, store.name).result(timeout=30)
    assert seen["writeable"] is True and seen["first"] == -1.0
    assert store.name not in (seen["where"] or ""), (
        f"a writable copy must be private: {seen['where']}"
    )
    assert a[0] == 0.0
    # map through the same view carries the option too
    assert list(ex.options(writable=True).map(write_first, [a, a])) == [-1.0, -1.0]
    assert back_to(store, baseline)


_RAW = np.random.default_rng(2).integers(0, 256, 4 * MB, dtype=np.uint8).tobytes()
_GRID = np.random.default_rng(2).random((2000, 1000))
OTHER_PAYLOADS = {
    "bytes": _RAW,
    "bytearray": bytearray(_RAW),
    "bytes-in-a-list": [_RAW],
    "rows-strided": _GRID[::2],
    "columns-strided": _GRID[:, ::3],
    "transposed-strided": _GRID.T[::2],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(OTHER_PAYLOADS))
def test_other_large_payloads_arrive_as_their_own_type(
    ex: ScalerExecutor, baseline: tuple[int, int], kind: str
) -> None:
    """Large values without out-of-band buffers travel through the store as one object
    (the pickle stream) and arrive as their own type, equal."""
    store = store_of(ex)
    value = OTHER_PAYLOADS[kind]
    seen = ex.submit(describe, value, store.name).result(timeout=30)
    assert seen["type"] == type(value).__name__, seen
    if isinstance(value, np.ndarray):
        assert seen["shape"] == value.shape and seen["checksum"] == int(
            value.astype(np.int64).sum()
        )
    elif isinstance(value, (bytes, bytearray)):
        assert (seen["length"], seen["head"], seen["tail"]) == (len(value), value[:16], value[-16:])
    assert seen["objects"] >= baseline[0] + 1, (
        f"a large {kind} argument ({_nbytes(value) / MB:.0f} MB) travelled inline, not through the store"
    )
    back = ex.submit(identity, value).result(timeout=30)
    assert type(back) is type(value)
    if isinstance(value, np.ndarray):
        assert np.array_equal(back, value)
    else:
        assert back == value
    del back
    assert back_to(store, baseline)


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, list):
        return sum(map(_nbytes, value))
    return len(value)


@pytest.mark.timeout(120)
def test_large_results_are_views_valid_after_shutdown(fresh_executor: Any) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(object_store_size="512M"))
    store = store_of(ex)
    n = 50 * MB // 8
    results = [f.result(timeout=60) for f in [ex.submit(make_range, n) for _ in range(2)]]
    expected = np.arange(n, dtype=np.int64)
    for r in results:
        assert isinstance(r, np.ndarray) and r.dtype == np.int64 and r.shape == (n,)
        assert not r.flags.writeable
        assert store.name in (where(r) or ""), "a large result should be a view of the store here"
        assert np.array_equal(r, expected)
    with pytest.raises(ValueError, match="read-only"):
        results[0][0] = 1
    ref = ex.put(expected)
    put_view = ex.get_object(ref)
    name = store.name
    ex.shutdown(wait=True)
    assert not os.path.exists(f"/dev/shm/{name}"), "the daemon should have removed its region"
    # every byte is still readable: the mappings outlive the store and its daemon
    for r in (*results, put_view):
        assert np.array_equal(r, expected)
        assert bytes(memoryview(r).cast("B")) == expected.tobytes()


def made_in_task(n: int, keep: bool = False) -> tuple[np.ndarray, int | None]:
    """A large array built by the task, and the offset of its bytes in the host's store
    as the processor sees it (None: the task built it in private memory)."""
    from scaler_executor import _compat

    a = np.full(n, 7.0)
    if keep:
        KEPT.append(a)
    store = _compat.PROCESSOR.store if _compat.PROCESSOR is not None else None
    if store is None:
        return a, None
    base, size = store.mapping
    offset = a.ctypes.data - base
    return a, offset if 0 <= offset < size else None


KEPT: list[np.ndarray] = []  # arrays a task kept after returning them (one processor's)


def write_kept() -> str:
    try:
        KEPT[-1][0] = 1.0
    except ValueError as exc:
        return str(exc)
    return "written"


def offset_in(store: ObjectStore, a: np.ndarray) -> int:
    return a.ctypes.data - store.mapping[0]


@pytest.mark.timeout(60)
def test_arrays_built_in_the_store_are_returned_without_a_copy(fresh_executor: Any) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(object_store_size="512M"))
    store = store_of(ex)
    before = usage(store)
    n = 4 * MB // 8
    # A processor puts arrays in the store from the task after the one that imports NumPy.
    results = [f.result(timeout=30) for f in [ex.submit(made_in_task, n) for _ in range(8)]]
    in_store = [(a, off) for a, off in results if off is not None]
    assert len(in_store) >= 6, [off for _, off in results]
    for a, off in results:
        assert np.array_equal(a, np.full(n, 7.0)) and not a.flags.writeable
        assert store.name in (where(a) or "")
    for a, off in in_store:
        assert offset_in(store, a) == off, "the caller should map the very bytes the task wrote"
    del results, in_store, a
    gc.collect()
    assert back_to(store, before), "every block returns once the results are dropped"


@pytest.mark.timeout(60)
def test_arrays_in_store_zero_keeps_them_private(fresh_executor: Any) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(object_store_size="512M", arrays_in_store=0))
    store = store_of(ex)
    n = 4 * MB // 8
    for a, off in [f.result(timeout=30) for f in [ex.submit(made_in_task, n) for _ in range(4)]]:
        assert off is None
        assert np.array_equal(a, np.full(n, 7.0)) and store.name in (where(a) or "")  # copied in


@pytest.mark.timeout(60)
def test_a_returned_array_kept_by_the_task_becomes_read_only(fresh_executor: Any) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(object_store_size="512M"))
    ex.submit(made_in_task, 1).result(timeout=30)  # imports NumPy in the processor
    a, off = ex.submit(made_in_task, 2 * MB // 8, True).result(timeout=30)
    assert off is not None and offset_in(store_of(ex), a) == off
    assert "read-only" in ex.submit(write_kept).result(timeout=30)
    assert (a == 7.0).all(), "what the caller reads cannot change under it"


def die_holding(n: int) -> None:
    """Build a large array (in the store, once NumPy is in), then die without freeing it."""
    a = np.full(n, 1.0)
    a.sum()
    os._exit(3)


@pytest.mark.timeout(60)
def test_a_dead_processor_gives_its_store_arrays_back(fresh_executor: Any) -> None:
    ex = fresh_executor(max_workers=1, config=fast_config(object_store_size="512M", max_retries=0))
    store = store_of(ex)
    ex.submit(made_in_task, 1).result(timeout=30)  # imports NumPy in the processor
    result, off = ex.submit(made_in_task, 2 * MB // 8).result(timeout=30)
    assert off is not None, "the processor should build large arrays in the store by now"
    del result
    assert back_to(store, (0, 0)), usage(store)
    with pytest.raises(Exception, match="processor"):
        ex.submit(die_holding, 16 * MB // 8).result(timeout=30)
    # no other task runs: the worker agent reaps the dead processor's slot itself
    assert back_to(store, (0, 0)), f"the dead processor's array still holds the store: {usage(store)}"


# =========================================================================== ex.put


@pytest.mark.timeout(60)
def test_put_refs_as_arguments_and_read_back(ex: ScalerExecutor, baseline: tuple[int, int]) -> None:
    store = store_of(ex)
    a = np.arange(2 * MB // 8, dtype=np.int64)
    b = np.full(3 * MB // 8, 3, dtype=np.int64)
    ref_a, ref_b = ex.put(a), ex.put(b)
    assert usage(store)[0] >= baseline[0] + 2
    sa, sb = int(a.sum()), int(b.sum())
    calls = [
        ((ref_a,), sa),
        (([ref_a, ref_b],), sa + sb),
        (({"x": ref_a, "y": [ref_b, ref_b]},), sa + 2 * sb),
        ((Box(ref_b, "boxed"),), sb),
        ((ref_a, [Box({"deep": ref_b}, "n")]), sa + sb),
        # A ref beside a large argument: the call's own pickle is packed into the store
        # too, and its object list holds the refs' ids before its own.
        ((ref_a, b), sa + sb),
        (([ref_b, b], ref_a), sa + 2 * sb),
    ]
    futures = [ex.submit(total, *args) for args, _ in calls]
    assert [f.result(timeout=30) for f in futures] == [want for _, want in calls]
    seen = ex.submit(describe, ref_a, store.name).result(timeout=30)
    assert seen["writeable"] is False and store.name in (seen["where"] or "")
    got = ex.get_object(ref_a)
    assert np.array_equal(got, a) and not got.flags.writeable
    assert np.array_equal(ref_b.result(), b)
    with pytest.raises(TypeError):
        ex.get_object(a)  # type: ignore[arg-type]
    del got, ref_a, ref_b, futures, calls
    assert back_to(store, baseline), f"dropped refs were not freed: {store.stats()}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["get_object", "result", "argument"])
def test_put_of_a_small_value(ex: ScalerExecutor, baseline: tuple[int, int], how: str) -> None:
    """A value below the threshold is kept in the ref itself (no store object) and reads back."""
    value = {"tiny": [1, 2.5, "x"]}
    ref = ex.put(value)
    assert usage(store_of(ex)) == baseline
    if how == "get_object":
        assert ex.get_object(ref) == value
    elif how == "result":
        assert ref.result() == value
    else:
        assert ex.submit(identity, ref).result(timeout=30) == value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["by-value", "put-ref"])
def test_writable_option_applies_to_every_argument(
    ex: ScalerExecutor, baseline: tuple[int, int], how: str
) -> None:
    """``writable=True`` gives a private writable copy whether the array came by value or
    through ``ex.put``."""
    store = store_of(ex)
    a = np.zeros(10 * MB // 8)
    arg = a if how == "by-value" else ex.put(a)
    try:
        seen = (
            ex.options(writable=True).submit(write_and_report, arg, store.name).result(timeout=30)
        )
    finally:
        del arg  # a failure's traceback must not keep the ref (and its object) alive
    assert seen["writeable"] is True and seen["first"] == -1.0, seen
    assert store.name not in (seen["where"] or "")
    assert back_to(store, baseline)


@pytest.mark.timeout(60)
def test_map_with_a_repeated_argument_stores_it_once(
    ex: ScalerExecutor, baseline: tuple[int, int]
) -> None:
    store = store_of(ex)
    n = 300
    big = np.full(1 * MB // 8, 5, dtype=np.int64)
    seen = list(ex.map(first_with_objects, repeat(big), range(n), repeat(store.name)))
    assert [i for i, _, _ in seen] == list(range(n)) and {v for _, v, _ in seen} == {5}
    most = max(objects for _, _, objects in seen)
    # stored once: one object for `big` (plus at most a result in flight), never one per task
    assert most <= baseline[0] + 2, (
        f"up to {most} objects during a map of {n} tasks sharing one array"
    )
    assert back_to(store, baseline), f"the map's shared argument was not freed: {store.stats()}"


@pytest.mark.timeout(60)
def test_map_frees_each_distinct_argument_after_its_task(fresh_executor: Any) -> None:
    """Distinct large arguments of one long map are freed as their tasks finish: with
    ``buffersize`` bounding what is in flight, store usage stays bounded too (the map may be
    infinite). A 64 MB store holds ~900 of these 70 KiB arrays; the map sends 3,000."""
    ex = fresh_executor(max_workers=2, config=fast_config(object_store_size="64M"))
    store = store_of(ex)
    ex.submit(identity, 0).result(timeout=30)
    base = usage(store)
    n, window = 3000, 100
    items = (np.full(70 * 1024 // 8, i, dtype=np.int64) for i in range(n))
    most = 0
    got = []
    try:
        for k, value in enumerate(ex.map(first_of, items, buffersize=window)):
            got.append(value)
            if k % 50 == 0:
                most = max(most, usage(store)[0])
    except ObjectStoreFull as exc:
        pytest.fail(
            f"the store filled after {len(got)} of {n} results with only {window} tasks in flight "
            f"(peak sampled {most} objects): finished tasks' arguments were not freed ({exc})"
        )
    assert got == list(range(n))
    assert most <= base[0] + 3 * window, (
        f"{most} objects in the store with {window} tasks in flight"
    )
    assert back_to(store, base)


# =========================================================================== lifetimes


def number_of(record: dict[str, Any]) -> int:
    assert len(record["data"]) == 70 * 1024
    return int.from_bytes(record["data"][:8], "little") + 0 * record["i"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_usage_returns_to_baseline_after_100k_tasks(
    ex: ScalerExecutor, baseline: tuple[int, int]
) -> None:
    """100,000 tasks, each with its own 70 KiB argument (a record holding 70 KiB of bytes:
    its pickle is above the threshold, so one store object per task; a bare ``bytes``
    argument would travel inline, see the ``bytes`` case above). Unchunked, with
    ``buffersize`` keeping 2,000 in flight: ~60 s on 2 cores."""
    store = store_of(ex)
    n, window, size = 100_000, 2000, 70 * 1024
    assert size > THRESHOLD
    items = ({"i": i, "data": i.to_bytes(8, "little") * (size // 8)} for i in range(n))
    started = time.monotonic()
    acc = count = most = 0
    for value in ex.map(number_of, items, buffersize=window):
        acc += value
        count += 1
        if count % 1000 == 0:
            most = max(most, usage(store)[0])
    elapsed = time.monotonic() - started
    assert count == n and acc == n * (n - 1) // 2
    assert most > baseline[0], "the arguments never went through the store"
    assert most <= baseline[0] + 2 * window, f"{most} objects with {window} tasks in flight"
    assert back_to(store, baseline), f"store usage did not return to {baseline}: {store.stats()}"
    print(f"\n100,000 tasks with 70 KiB arguments: {elapsed:.1f} s; peak objects sampled {most}")


CLIENT_SCRIPT = """
import sys, numpy as np
from scaler_executor import ClusterConfig, ScalerExecutor
ex = ScalerExecutor(address=sys.argv[1], config=ClusterConfig(heartbeat_interval=0.1))
refs = [ex.put(np.full(1_000_000, i, dtype=np.int64)) for i in range(3)]
ex.statistics()  # a round trip after the pins: the daemon has recorded them
assert ex._agent.store_ready.wait(30) and ex._agent.store is not None
print(ex._agent.store.name, flush=True)
sys.stdin.read()  # until killed
"""


@pytest.mark.timeout(90)
def test_objects_of_a_killed_client_are_deleted(standalone: Standalone, tmp_path: Path) -> None:
    standalone.daemon("--workers", "1", "--client-timeout", "2", "--object-store-size", "256M")
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    client = subprocess.Popen(
        [sys.executable, str(script), standalone.address],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    store = None
    try:
        assert client.stdout is not None
        name = client.stdout.readline().strip()
        assert name, f"the client printed no store name (exit code {client.poll()})"
        store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
        assert store.stats().objects == 3, store.stats()
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=10)
        deleted = wait_until(
            lambda: store.stats().objects == 0 and store.stats().in_use == 0, timeout=30
        )
        assert deleted, (
            f"the killed client's pinned objects are still in the store: {store.stats()}"
        )
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
        if store is not None:
            store.close()


# =========================================================================== store full


def big_result(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


@pytest.mark.timeout(120)
def test_store_full_fails_at_once_and_recovers(fresh_executor: Any) -> None:
    ex = fresh_executor(max_workers=2, config=fast_config(object_store_size="64M"))
    store = store_of(ex)
    ex.submit(identity, 0).result(timeout=30)
    base = usage(store)
    limit = store.stats().capacity
    huge = np.ones(100 * MB // 8)

    started = time.monotonic()
    with pytest.raises(ObjectStoreFull) as info:
        ex.put(huge)
    assert time.monotonic() - started < 2.0, "ObjectStoreFull must be raised at once"
    err = info.value
    assert err.size >= huge.nbytes and err.limit == limit and 0 <= err.in_use <= limit, vars(err)
    assert usage(store) == base, "a failed put left objects behind"

    started = time.monotonic()
    future = ex.submit(double, huge)
    exc = future.exception(timeout=5)
    assert isinstance(exc, ObjectStoreFull), repr(exc)
    assert exc.size >= huge.nbytes and exc.limit == limit
    assert time.monotonic() - started < 2.0
    assert usage(store) == base

    n = 100 * MB // 8
    r = ex.submit(big_result, n).result(timeout=60)  # does not fit: comes back inline
    assert np.array_equal(r, np.arange(n, dtype=np.int64))
    del r
    assert usage(store) == base

    first = ex.put(np.ones(40 * MB // 8))
    with pytest.raises(ObjectStoreFull) as info:
        ex.put(np.ones(40 * MB // 8))
    assert info.value.in_use >= 40 * MB
    del first
    assert back_to(store, base), f"the dropped ref was not freed: {store.stats()}"
    ok = ex.put(np.full(20 * MB // 8, 2.0))
    assert float(ex.submit(total, ok).result(timeout=30)) == 2.0 * (20 * MB // 8)
    ok2 = ex.put(np.ones(40 * MB // 8))  # the whole room is usable again
    assert ex.submit(total, ok2).result(timeout=30) == 40 * MB // 8
    store.validate()  # never a corrupted store
    del ok, ok2
    assert back_to(store, base)


# =========================================================================== network path


@pytest.mark.timeout(120)
def test_network_path_gives_identical_values(standalone: Standalone) -> None:
    """One daemon, two workers: ``net`` forced to fetch objects through the daemon, ``local``
    mapping the region; every call runs on both and must give identical values."""
    standalone.daemon("--workers", "0", "--object-store-size", "512M")
    standalone.worker("--processors", "1", "--tags", "net", "--fetch-objects-over-network")
    standalone.worker("--processors", "1", "--tags", "local")
    ex = ScalerExecutor(address=standalone.address, config=fast_config())
    try:
        store = store_of(ex)
        assert wait_until(lambda: ex.statistics()["workers"] == 2, timeout=30), ex.statistics()
        net, local = ex.options(tags={"net"}), ex.options(tags={"local"})
        a = np.random.default_rng(3).random(10 * MB // 8)
        ref = ex.put(a)

        for arg in (a, ref):
            (net_where, net_ro, net_value) = net.submit(path_and_double, arg).result(timeout=60)
            (loc_where, loc_ro, loc_value) = local.submit(path_and_double, arg).result(timeout=60)
            assert store.name in (loc_where or ""), (
                f"the local worker should map the store: {loc_where}"
            )
            assert store.name not in (net_where or ""), (
                f"the network worker mapped the store: {net_where}"
            )
            assert net_ro is False and loc_ro is False  # read-only on both paths
            assert np.array_equal(net_value, a * 2) and np.array_equal(net_value, loc_value)
            assert net_value.tobytes() == loc_value.tobytes()

        nested = {"r": ref, "l": [ref, Box(ref, "b")]}
        assert net.submit(total, nested).result(timeout=60) == local.submit(total, nested).result(
            timeout=60
        )

        raw = bytes(range(256)) * (1 * MB // 256)
        assert (
            net.submit(identity, raw).result(timeout=60)
            == raw
            == local.submit(identity, raw).result(timeout=60)
        )

        n = 50 * MB // 8
        net_big = net.submit(big_result, n).result(timeout=60)
        loc_big = local.submit(big_result, n).result(timeout=60)
        assert np.array_equal(net_big, np.arange(n)) and np.array_equal(net_big, loc_big)
        assert store.name in (where(loc_big) or "")  # the local worker's result is a store view
        del net_big, loc_big, net_value, loc_value, ref, arg, nested
        assert back_to(store, (0, 0)), f"objects left after the network path: {store.stats()}"
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


# =========================================================================== zero-copy, measured


@pytest.mark.timeout(120)
def test_zero_copy_by_memory_accounting(fresh_executor: Any, tmp_path: Path) -> None:
    """Two processors read one 200 MB array at the same time: their private memory (USS)
    barely grows and their proportional share (PSS) is a fraction of it, while RSS counts
    the 200 MB shared pages in each. Control: ``writable=True`` copies, and USS sees it."""
    size = 200 * MB
    ex = fresh_executor(max_workers=2, config=fast_config(object_store_size="512M"))
    store_of(ex)
    big = np.ones(size // 8)
    ref = ex.put(big)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    futures = [ex.submit(hold_and_measure, ref, str(barrier), 2) for _ in range(2)]
    seen = [f.result(timeout=90) for f in futures]
    assert seen[0]["pid"] != seen[1]["pid"], "both tasks ran in one processor"
    report = []
    for s in seen:
        assert s["checksum"] == size // 8
        uss_growth = max(s["uss1"], s["uss2"]) - s["uss0"]
        pss_growth = s["pss1"] - s["pss0"]
        rss_growth = s["rss1"] - s["rss0"]
        report.append(
            f"pid {s['pid']}: USS +{uss_growth / MB:.1f} MB, PSS +{pss_growth / MB:.1f} MB, RSS +{rss_growth / MB:.1f} MB"
        )
        assert rss_growth >= 0.9 * size, f"RSS should count the shared pages: {report[-1]}"
        assert uss_growth < 0.05 * size, f"the array was copied into private memory: {report[-1]}"
        # three processes (client, two processors) share the pages: ~1/3 each
        assert pss_growth < 0.5 * size, f"PSS should be a share of the pages: {report[-1]}"

    # Control: a writable copy is private memory, and the same accounting sees it.
    before = {s["pid"]: s["uss0"] for s in seen}
    del ref
    copied = ex.options(writable=True).submit(hold_copy_and_measure, big).result(timeout=90)
    assert copied["pid"] in before
    copy_growth = copied["uss"] - before[copied["pid"]]
    report.append(f"writable=True control: USS +{copy_growth / MB:.1f} MB")
    assert copy_growth >= 0.9 * size, f"the control did not see the copy: {report[-1]}"
    print("\n" + "\n".join(report))
