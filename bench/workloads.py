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
import statistics
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


def apply_chunk(fn: Callable[..., Any], chunk: list[Any]) -> list[Any]:
    """``[fn(x) for x in chunk]``: chunked ``map`` for contestants whose map has no chunksize."""
    return [fn(x) for x in chunk]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    value: float
    unit: str
    better: str  # "higher" or "lower"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "better": self.better}


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


WORKLOADS: dict[str, Workload] = {}


def workload(
    name: str, summary: str, sizes: dict[str, int], quick_sizes: dict[str, int]
) -> Callable[..., Any]:
    def register(
        fn: Callable[[Contestant, int, dict[str, int]], dict[str, Metric]],
    ) -> Callable[..., Any]:
        WORKLOADS[name] = Workload(name, summary, fn, sizes, quick_sizes)
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
    "fresh interpreter: import, construct, first result, shutdown (seconds)",
    sizes={},
    quick_sizes={},
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
    contestant.shutdown(ex)
    t4 = time.perf_counter()
    return {
        "import": Metric(t1 - t0, "s", "lower"),
        "construct": Metric(t2 - t1, "s", "lower"),
        "first result": Metric(t3 - t1, "s", "lower"),
        "shutdown": Metric(t4 - t3, "s", "lower"),
    }
