"""What ``compare.py`` measures: the task functions, and a registry of workloads.

The task functions live here, at module level, because
``concurrent.futures.ProcessPoolExecutor`` (and Dask, and loky when pickling by
reference) sends a function by its module path: the worker imports
``bench.workloads`` and looks ``noop`` up.  ``compare.py`` puts the repository
root on ``sys.path`` so that import works in every worker, however it is started.

A workload is a function ``(contestant, workers, sizes) -> {metric: Metric}``.
Each one runs in a fresh interpreter (see ``compare.py``), so it creates its own
executor; nothing is shared between workloads or contestants.  To add one,
write the function and register it with :func:`workload`; the table picks it up.
"""

from __future__ import annotations

import gc
import operator
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # no import at run time: cold_start must time the contestant's first imports
    from bench.contestants import Contestant


# --------------------------------------------------------------------------- task functions


def noop(*args: Any) -> None:
    """The task: does nothing, so what is measured is the executor's own overhead."""


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` cut into lists of ``size`` (the last may be shorter), for ``apply_chunk``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def apply_chunk(fn: Callable[..., Any], chunk: list[Any]) -> list[Any]:
    """``[fn(x) for x in chunk]``: chunked ``map`` for contestants whose map has no chunksize."""
    return [fn(x) for x in chunk]


def sum_it(a: Any) -> tuple[float, float]:
    """broadcast_100mb's task: (sum of the array, seconds spent summing)."""
    t = time.perf_counter()
    s = float(a.sum())
    return s, time.perf_counter() - t


def build(nbytes: int, fill: float) -> tuple[Any, float]:
    """results_50mb's task: (an array of ``nbytes`` all equal to ``fill``, seconds spent building it)."""
    import numpy as np  # not at module level: cold_start must not find numpy already imported

    t = time.perf_counter()
    a = np.full(nbytes // 8, fill)
    return a, time.perf_counter() - t


def spin(n: int) -> int:
    """cpu_scaling's task: pure-Python CPU work, ``n`` loop iterations (holds the GIL throughout)."""
    x = 0
    for i in range(n):
        x += i
    return x


SUBMIT_BUDGET = 180.0  # seconds pending_memory allows for submitting its tasks


def _check_blockers(blockers: list[Any], when: str) -> None:
    """pending_memory's figures mean nothing once a worker slot is free: fail, saying why."""
    for i, f in enumerate(blockers):
        if f.done():
            try:
                outcome = f"it raised {f.exception()!r}"
            except BaseException as exc:  # cancelled, or the contestant's own error
                outcome = f"it ended with {exc!r}"
            raise AssertionError(f"blocker {i} finished before its release, {when}: {outcome}")


def block_until(release: str, started: str, timeout: float) -> int:
    """pending_memory's blocker: create ``started``, then poll until ``release`` exists.

    Occupies one worker slot.  Polling a path (not an Event) works in every contestant's
    processes; ``timeout`` bounds it so that a lost release never leaves a process behind.
    """
    with open(started, "w"):
        pass
    deadline = time.monotonic() + timeout
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} did not appear within {timeout:.0f} s")
        time.sleep(0.02)
    return os.getpid()


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    value: float | None  # None: not applicable to this contestant (the table shows "n/a")
    unit: str
    better: str  # "higher", "lower", or "" for a reference figure
    note: str = ""  # why it is n/a, or how it was measured if that varies (listed under the table)

    def to_json(self) -> dict[str, Any]:
        out = {"value": self.value, "unit": self.unit, "better": self.better}
        if self.note:
            out["note"] = self.note
        return out


def not_applicable(unit: str, better: str, why: str) -> Metric:
    """A metric this contestant has no way to produce (no put/scatter, no graphs)."""
    return Metric(None, unit, better, why)


def rate(n: int, seconds: float) -> Metric:
    return Metric(n / seconds if seconds > 0 else float("inf"), "tasks/s", "higher")


class CpuMeter:
    """CPU seconds used by this process and all its descendants between start() and stop().

    Descendants are sampled at both ends, so processes that start or end inside
    the window are missed: meant for steady-state windows (after a warm-up).
    The point on a 2-core machine: a contestant burning 3 processes' worth of CPU
    per task cannot scale the way its wall-clock rate suggests.
    """

    def __init__(self) -> None:
        import psutil  # a scaler-executor dependency, imported before any timing

        self._psutil = psutil
        self._me = psutil.Process()

    def _sample(self) -> dict[int, float]:
        times: dict[int, float] = {}
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except self._psutil.Error:
            pass
        for p in procs:
            try:
                t = p.cpu_times()
                times[p.pid] = t.user + t.system
            except self._psutil.Error:
                continue
        return times

    def start(self) -> None:
        self._before = self._sample()

    def stop(self) -> float:
        after = self._sample()
        return sum(t - self._before.get(pid, 0.0) for pid, t in after.items())


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    run: Callable[[Contestant, int, dict[str, int]], dict[str, Metric]]
    sizes: dict[str, int] = field(default_factory=dict)
    quick_sizes: dict[str, int] = field(default_factory=dict)
    # Cells compare.py runs per contestant (fresh interpreters, contestants alternating);
    # the table shows the median and the spread. One sample of a workload that runs for
    # well under a second is mostly noise on a small machine.
    repeat: int = 1


WORKLOADS: dict[str, Workload] = {}


def workload(
    name: str, summary: str, sizes: dict[str, int], quick_sizes: dict[str, int], repeat: int = 1
) -> Callable[..., Any]:
    def register(
        fn: Callable[[Contestant, int, dict[str, int]], dict[str, Metric]],
    ) -> Callable[..., Any]:
        WORKLOADS[name] = Workload(name, summary, fn, sizes, quick_sizes, repeat)
        return fn

    return register


@contextmanager
def running(contestant: Contestant, workers: int) -> Iterator[Any]:
    """An executor for the body of a workload, shut down (and waited for) after it."""
    ex = contestant.create(workers)
    try:
        yield ex
    finally:
        contestant.shutdown(ex)


def warm_up(contestant: Contestant, ex: Any, n: int) -> None:
    """Start every worker and fill every cache (function registration, connections)."""
    for f in [contestant.submit(ex, noop, i) for i in range(n)]:
        f.result()
    contestant.submit(ex, noop, 0).result()


@contextmanager
def no_gc() -> Iterator[None]:
    """No cyclic GC pauses in this process inside a timed region (workers are not affected).

    Applied to every contestant alike: a pause would land on one contestant's
    run by chance and make a single run's figures noisier.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# --------------------------------------------------------------------------- the workloads


@workload(
    "noop_submit",
    "N no-op submit() calls, then wait on every future: end-to-end throughput",
    sizes={"tasks": 10_000, "warmup": 300},
    quick_sizes={"tasks": 2_000, "warmup": 200},
)
def noop_submit(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
    n = sizes["tasks"]
    cpu = CpuMeter()
    with running(contestant, workers) as ex:
        warm_up(contestant, ex, sizes["warmup"])
        submit = contestant.submit
        with no_gc():
            cpu.start()
            t0 = time.perf_counter()
            futures = [submit(ex, noop, i) for i in range(n)]
            t1 = time.perf_counter()
            for f in futures:
                f.result()
            t2 = time.perf_counter()
            cpu_s = cpu.stop()
    return {
        "throughput": rate(n, t2 - t0),
        "submit call": Metric((t1 - t0) / n * 1e6, "µs/call", "lower"),
        "CPU, all processes": Metric(cpu_s / n * 1e6, "µs/task", "lower"),
    }


def _map_workload(chunksize: int) -> Callable[[Contestant, int, dict[str, int]], dict[str, Metric]]:
    def run(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
        n = sizes["items"]
        cpu = CpuMeter()
        with running(contestant, workers) as ex:
            warm_up(contestant, ex, sizes["warmup"])
            with no_gc():
                cpu.start()
                t0 = time.perf_counter()
                results = list(contestant.map(ex, noop, range(n), chunksize))
                t1 = time.perf_counter()
                cpu_s = cpu.stop()
        if len(results) != n:
            raise AssertionError(f"map returned {len(results)} results for {n} items")
        return {
            "throughput": Metric(n / (t1 - t0), "items/s", "higher"),
            "CPU, all processes": Metric(cpu_s / n * 1e6, "µs/item", "lower"),
        }

    return run


for _chunk, _name in ((1, "map_default"), (10, "map_chunk10"), (100, "map_chunk100")):
    workload(
        _name,
        f"list(ex.map(noop, range(N), chunksize={_chunk})): items/s",
        sizes={"items": 20_000, "warmup": 300},
        quick_sizes={"items": 4_000, "warmup": 200},
    )(_map_workload(_chunk))


@workload(
    "round_trip",
    "sequential submit(noop).result(), one task in flight: latency percentiles",
    sizes={"tasks": 2_000, "warmup": 200},
    quick_sizes={"tasks": 400, "warmup": 100},
)
def round_trip(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
    n = sizes["tasks"]
    samples = []
    with running(contestant, workers) as ex:
        submit = contestant.submit
        for _ in range(sizes["warmup"]):
            submit(ex, noop, 0).result()
        clock = time.perf_counter
        with no_gc():
            for _ in range(n):
                t0 = clock()
                submit(ex, noop, 0).result()
                samples.append(clock() - t0)
    samples_ms = [s * 1e3 for s in samples]
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {
        "median": Metric(statistics.median(samples_ms), "ms", "lower"),
        "p90": Metric(cuts[89], "ms", "lower"),
        "p99": Metric(cuts[98], "ms", "lower"),
        "max": Metric(max(samples_ms), "ms", "lower"),
    }


@workload(
    "cold_start",
    "fresh interpreter: import, construct, first result, shutdown until every process of the executor is gone (seconds)",
    sizes={},
    quick_sizes={},
    repeat=7,
)
def cold_start(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
    # compare.py imported nothing of the contestant's before this point, so the first
    # import is timed here (reported apart, excluded from "first result").
    t0 = time.perf_counter()
    contestant.load()
    t1 = time.perf_counter()
    ex = contestant.create(workers)
    t2 = time.perf_counter()
    contestant.submit(ex, noop, 0).result()
    t3 = time.perf_counter()
    import psutil  # only now: loky imports it if it can, and must pay for that itself

    before = psutil.Process().children(recursive=True)  # the executor's processes: all must go
    t_stop = time.perf_counter()
    contestant.shutdown(ex)
    t4 = time.perf_counter()
    left, t5 = _wait_gone(before, LINGER_LIMIT)
    how = (
        "from shutdown() until every process it had started has exited and no "
        "/dev/shm/scaler-PID-* region of theirs is left"
    )
    if left:
        how += f"; still running {LINGER_LIMIT:g} s after shutdown(), not counted: {', '.join(left)}"
    return {
        "import": Metric(t1 - t0, "s", "lower"),
        "construct": Metric(t2 - t1, "s", "lower"),
        "first result": Metric(t3 - t1, "s", "lower"),
        "shutdown": Metric(t4 - t_stop, "s", "lower", note="the shutdown(wait=True) call"),
        "all gone": Metric(max(t4, t5) - t_stop, "s", "lower", note=how),
    }


LINGER_LIMIT = 2.0  # seconds cold_start waits after shutdown() for the executor's processes


def _wait_gone(procs: list[Any], limit: float) -> tuple[list[str], float]:
    """Wait until ``procs`` have exited (zombies count as exited) and their stores are unlinked.

    Returns what still runs after ``limit`` s (named: e.g. a resource tracker that lives as
    long as the interpreter) and when the last of the others was seen gone."""
    import glob

    import psutil

    deadline = time.monotonic() + limit
    pids = [p.pid for p in procs]
    last_gone = time.perf_counter()
    alive = list(procs)
    while True:
        still = []
        for p in alive:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    still.append(p)
            except psutil.NoSuchProcess:
                pass
        regions = [r for pid in pids for r in glob.glob(f"/dev/shm/scaler-{pid}-*")]
        now = time.perf_counter()
        if len(still) < len(alive) or (not regions and not still):
            last_gone = now
        alive = still
        if not alive and not regions:
            return [], last_gone
        if time.monotonic() > deadline:
            named = []
            for p in alive:
                try:
                    named.append(f"{' '.join(p.cmdline())[:70]}...")
                except psutil.Error:
                    named.append(f"pid {p.pid}")
            return named + regions, last_gone
        time.sleep(0.0005)


# --------------------------------------------------------------------------- objects, CPU, graphs, memory
#
# Ported from the former bench/objects_bench.py and bench/graph_bench.py.  numpy is
# imported inside the workloads, never at module level (see cold_start).

MB = 1_000_000
SCRATCH_ENV = "BENCH_SCRATCH"  # a directory compare.py makes per cell and removes after it


def memcpy_seconds(nbytes: int, repeat: int = 7) -> float:
    """One numpy copy of ``nbytes`` in this process (best of ``repeat``, pages faulted in first)."""
    import numpy as np

    src = np.full(nbytes // 8, 1.0)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return best


@workload(
    "broadcast_100mb",
    "one 100 MB array to 20 tasks that sum it, by value in each submit and placed once "
    "(put/scatter): wall seconds",
    sizes={"mbytes": 100, "tasks": 20, "repeat": 3, "warmup": 50},
    quick_sizes={"mbytes": 100, "tasks": 20, "repeat": 1, "warmup": 50},
)
def broadcast_100mb(
    contestant: Contestant, workers: int, sizes: dict[str, int]
) -> dict[str, Metric]:
    import numpy as np

    n, repeat = sizes["tasks"], sizes["repeat"]
    a = np.full(sizes["mbytes"] * MB // 8, 2.0)
    expected = 2.0 * a.size  # exact: every partial sum is an integer below 2**53

    def check(out: list[tuple[float, float]]) -> None:
        if len(out) != n:
            raise AssertionError(f"{len(out)} results for {n} tasks")
        wrong = [s for s, _ in out if s != expected]
        if wrong:
            raise AssertionError(f"{len(wrong)} wrong sums, e.g. {wrong[0]!r} != {expected!r}")

    def by_value() -> float:
        gc.collect()
        t = time.perf_counter()
        futures = [contestant.submit(ex, sum_it, a) for _ in range(n)]
        out = contestant.gather(ex, futures)
        wall = time.perf_counter() - t
        check(out)
        return wall

    def placed_once() -> tuple[float, float]:
        gc.collect()
        t = time.perf_counter()
        handle = contestant.put(ex, a)
        futures = [contestant.submit(ex, sum_it, handle) for _ in range(n)]
        out = contestant.gather(ex, futures)
        wall = time.perf_counter() - t
        check(out)
        del futures, handle  # release the stored copy before the next run
        return wall, sum(seconds for _, seconds in out) / workers

    with running(contestant, workers) as ex:
        warm_up(contestant, ex, sizes["warmup"])
        value_s = min(by_value() for _ in range(repeat))
        metrics = {"by value": Metric(value_s, "s", "lower")}
        if contestant.put_via is not None:
            wall, compute = min(placed_once() for _ in range(repeat))
            metrics["put/scatter"] = Metric(wall, "s", "lower")
            # The floor no transport removes: the sums themselves, spread over the workers.
            metrics["put/scatter: the sums' own time ÷ workers"] = Metric(compute, "s", "")
        else:
            metrics["put/scatter"] = not_applicable("s", "lower", "no put/scatter mechanism")
    return metrics


@workload(
    "results_50mb",
    "10 tasks each return a 50 MB array: wall seconds, overhead per result beyond its "
    "compute, and that overhead in 50 MB memcpys",
    sizes={"mbytes": 50, "tasks": 10, "repeat": 3, "warmup": 50},
    quick_sizes={"mbytes": 50, "tasks": 10, "repeat": 1, "warmup": 50},
)
def results_50mb(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
    nbytes, n = sizes["mbytes"] * MB, sizes["tasks"]
    memcpy = memcpy_seconds(nbytes)  # before the executor exists: the machine's own copy speed
    runs: list[tuple[float, float]] = []  # (wall, mean build seconds)
    with running(contestant, workers) as ex:
        warm_up(contestant, ex, sizes["warmup"])
        for _ in range(sizes["repeat"]):
            gc.collect()
            t = time.perf_counter()
            futures = [contestant.submit(ex, build, nbytes, i + 0.5) for i in range(n)]
            out = contestant.gather(ex, futures)
            wall = time.perf_counter() - t
            # Checked after the clock stops, as a caller would then read them: a transport
            # that maps results lazily pays its page faults here, untimed.
            if len(out) != n:
                raise AssertionError(f"{len(out)} results for {n} tasks")
            for i, (arr, _) in enumerate(out):
                if arr.nbytes != nbytes // 8 * 8 or not (arr == i + 0.5).all():
                    raise AssertionError(f"result {i}: wrong array ({arr.nbytes} bytes, {arr[:2]})")
            runs.append((wall, statistics.fmean(s for _, s in out)))
            del futures, out
    wall, build_s = min(runs)
    overhead = wall * workers / n - build_s
    metrics = {
        "wall": Metric(wall, "s", "lower"),
        "overhead per result": Metric(overhead * 1e3, "ms", "lower"),
        "overhead ÷ one memcpy": Metric(overhead / memcpy, "×", "lower"),
    }
    if contestant.name == "scaler":  # the reference row: one figure, not one per contestant
        metrics["one 50 MB memcpy (reference)"] = Metric(memcpy * 1e3, "ms", "")
    return metrics


def _calibrate_spin(target: float) -> int:
    """Iterations for one spin() call of about ``target`` seconds in this process."""
    n = 100_000
    for _ in range(6):
        t = time.perf_counter()
        spin(n)
        took = time.perf_counter() - t
        if abs(took - target) < 0.05 * target:
            break
        n = max(1_000, int(n * target / took))
    return n


def _serial_seconds(iterations: int, repeat: int = 3) -> float:
    """Best time of one spin(iterations) call in this process (the least disturbed sample)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        spin(iterations)
        best = min(best, time.perf_counter() - t)
    return best


@workload(
    "cpu_scaling",
    "workers × 8 pure-Python tasks of ~50 ms: efficiency = serial time ÷ (wall × workers)",
    sizes={"task_ms": 50, "tasks_per_worker": 8, "repeat": 5, "warmup": 50},
    quick_sizes={"task_ms": 50, "tasks_per_worker": 8, "repeat": 3, "warmup": 50},
)
def cpu_scaling(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
    # The iteration count is calibrated once, here in the parent.  The serial time is
    # measured here again just before each run and paired with it: this machine's speed
    # for one process drifts (up to 2x on a shared 2-core VM) over seconds, so a serial
    # time taken once would bias every efficiency.  The median run is reported.
    iterations = _calibrate_spin(sizes["task_ms"] / 1e3)
    n = workers * sizes["tasks_per_worker"]
    expected = iterations * (iterations - 1) // 2
    efficiencies = []
    with running(contestant, workers) as ex:
        warm_up(contestant, ex, sizes["warmup"])
        contestant.gather(ex, [contestant.submit(ex, spin, 1000) for _ in range(workers)])
        for _ in range(sizes["repeat"]):
            gc.collect()
            serial = _serial_seconds(iterations)
            t = time.perf_counter()
            out = contestant.gather(ex, [contestant.submit(ex, spin, iterations) for _ in range(n)])
            wall = time.perf_counter() - t
            if out != [expected] * n:
                raise AssertionError("spin() returned a wrong value")
            efficiencies.append(100.0 * serial * n / (wall * workers))
    return {"efficiency": Metric(statistics.median(efficiencies), "%", "higher")}


def tree_graph(leaves: int) -> tuple[dict[Any, Any], Any]:
    """A pairwise ``operator.add`` reduction in the Dask graph format; builtins only.

    500 leaves make 999 nodes: the leaves, then sums level by level up to one root
    (an odd key out is carried up by ``operator.pos``).
    """
    dsk: dict[Any, Any] = {("leaf", i): (operator.pos, i) for i in range(leaves)}
    level = 0
    keys: list[tuple[Any, ...]] = [("leaf", i) for i in range(leaves)]
    while len(keys) > 1:
        level += 1
        nxt: list[tuple[Any, ...]] = []
        for j in range(0, len(keys), 2):
            pair = keys[j : j + 2]
            key = ("sum", level, j // 2)
            dsk[key] = (operator.add, *pair) if len(pair) == 2 else (operator.pos, pair[0])
            nxt.append(key)
        keys = nxt
    return dsk, keys[0]


@workload(
    "graph_1000",
    "a 999-node tree reduction (500 leaves) in the Dask graph format through get(): seconds",
    sizes={"leaves": 500, "repeat": 7, "warmup": 50},
    quick_sizes={"leaves": 500, "repeat": 3, "warmup": 50},
)
def graph_1000(contestant: Contestant, workers: int, sizes: dict[str, int]) -> dict[str, Metric]:
    if contestant.graph_via is None:
        why = "no task-graph interface"
        return {
            "median": not_applicable("s", "lower", why),
            "best": not_applicable("s", "lower", why),
        }
    leaves = sizes["leaves"]
    dsk, root = tree_graph(leaves)
    expected = sum(range(leaves))
    times = []
    with running(contestant, workers) as ex:
        warm_up(contestant, ex, sizes["warmup"])
        for i in range(1 + sizes["repeat"]):
            gc.collect()
            t = time.perf_counter()
            got = contestant.graph_get(ex, dsk, root)
            took = time.perf_counter() - t
            if got != expected:
                raise AssertionError(f"graph result {got!r} != {expected!r}")
            if i:  # the first run is the warm-up
                times.append(took)
    return {
        "median": Metric(statistics.median(times), "s", "lower"),
        "best": Metric(min(times), "s", "lower"),
    }


def tree_memory() -> tuple[int, str]:
    """(bytes, measure): summed USS of this process and every descendant (RSS where USS fails)."""
    import psutil

    me = psutil.Process()
    try:
        procs = [me, *me.children(recursive=True)]
    except psutil.Error:
        procs = [me]
    total, measure = 0, "USS"
    for p in procs:
        try:
            total += p.memory_full_info().uss
        except psutil.AccessDenied:
            try:
                total += p.memory_info().rss
                measure = "USS, RSS for some processes"
            except psutil.Error:
                continue
        except psutil.Error:
            continue  # exited meanwhile
    return total, measure


@workload(
    "pending_memory",
    "N no-op tasks pending behind blocked workers: memory (USS) of the whole process tree "
    "per pending task",
    sizes={"tasks": 50_000, "warmup": 200},
    quick_sizes={"tasks": 5_000, "warmup": 200},
)
def pending_memory(
    contestant: Contestant, workers: int, sizes: dict[str, int]
) -> dict[str, Metric]:
    n = sizes["tasks"]
    # A contestant whose submissions would take longer than SUBMIT_BUDGET fails at once
    # with its rate (opengris-scaler, at ~6 ms a call, timed the cell out after 10
    # minutes); the blockers outlast that budget and the settling after it.
    block_timeout = SUBMIT_BUDGET + 180.0
    tmp = tempfile.mkdtemp(prefix="bench-pending-", dir=os.environ.get(SCRATCH_ENV))
    release = os.path.join(tmp, "release")
    futures: list[Any] = []
    blockers: list[Any] = []
    try:
        with running(contestant, workers) as ex:
            warm_up(contestant, ex, sizes["warmup"])
            try:
                # One blocker per slot, each submitted once the previous one runs, so no
                # scheduler puts two on one worker while another sits idle.
                for i in range(workers):
                    started = os.path.join(tmp, f"started-{i}")
                    blockers.append(
                        contestant.submit(ex, block_until, release, started, block_timeout)
                    )
                    deadline = time.monotonic() + 60
                    while not os.path.exists(started):
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"blocker {i} of {workers} did not start in 60 s")
                        if blockers[-1].done():
                            blockers[-1].result()  # raises the blocker's error
                        time.sleep(0.01)
                time.sleep(0.5)
                gc.collect()
                before, measure = tree_memory()
                submit = contestant.submit
                t_submit = time.monotonic()
                for i in range(n):
                    futures.append(submit(ex, noop, i))
                    if i % 1000 == 999:
                        spent = time.monotonic() - t_submit
                        _check_blockers(blockers, f"after {i + 1:,} of {n:,} submissions in {spent:.0f} s")
                        projected = spent / (i + 1) * n
                        if projected > SUBMIT_BUDGET:
                            raise TimeoutError(
                                f"{(i + 1) / spent:,.0f} submissions/s: {n:,} would take ~{projected:.0f} s, "
                                f"over this workload's budget of {SUBMIT_BUDGET:.0f} s"
                            )
                # Some contestants' submit() only queues a message: wait until their
                # scheduler has every task, then settle for 0.5 s, and longer while
                # memory still grows.
                deadline = time.monotonic() + 300
                while (known := contestant.known_tasks(ex)) is not None and known < n + workers:
                    _check_blockers(blockers, f"while the scheduler took in {n:,} tasks")  # now, not in 300 s
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the scheduler knows {known} of {n + workers} tasks after 300 s"
                        )
                    time.sleep(0.2)
                time.sleep(0.5)
                gc.collect()
                after, measure2 = tree_memory()
                limit = time.monotonic() + 10
                while time.monotonic() < limit:
                    time.sleep(0.5)
                    again, measure2 = tree_memory()
                    grew, after = again - after, again
                    if grew <= 0.02 * max(after - before, 1):
                        break
                _check_blockers(blockers, "while memory settled")
            finally:
                try:
                    contestant.abandon(ex, futures)  # while the workers are still blocked
                finally:
                    with open(release, "w"):
                        pass
            # The executor shuts down here, draining what could not be cancelled; the
            # futures stay referenced until it is down (see Contestant.abandon for Dask).
        futures.clear()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    note = "" if measure == measure2 == "USS" else f"measured as {measure2}"
    return {
        "per pending task": Metric((after - before) / n / 1024, "KiB/task", "lower", note),
        "tree, workers blocked": Metric(before / 2**20, "MiB", "lower", note),
    }
