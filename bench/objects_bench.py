"""Large arguments and results: ScalerExecutor's object store against the alternatives.

Two workloads, each timed for every contestant that can run here (2 workers each):

* **broadcast** — one 100 MB float64 array to 20 tasks, each of which sums it:
  ``ex.put`` once then a ref per task (``scaler-put``); the array by value in every
  ``submit`` (``scaler-value``, one store object per task); ``ProcessPoolExecutor`` by
  value (pickled through a pipe per task); Dask ``client.scatter`` once then the future
  per task (``dask-scatter``, if ``distributed`` imports).
* **results** — 10 tasks each building and returning a 50 MB array.

For each: the wall time from the first submit (or put/scatter) until every result is in
the caller's hands, and the **per-task overhead** ``wall × workers / tasks − compute``,
where ``compute`` is the task's own work measured inside the task with
``time.perf_counter`` (the sum; building the array). One ``memcpy`` of 50 MB on this
machine is printed for reference: a transport that copies a result once costs about that.

Run from the repository root (Dask lives in a separate environment, see
``bench/requirements-peers.txt``)::

    PYTHONPATH=. /tmp/peers/bin/python bench/objects_bench.py          # or plain python
    PYTHONPATH=. python bench/objects_bench.py --repeat 5 --only scaler-put,process-pool

Each contestant runs ``--repeat`` times in the same executor after a warm-up; the best
run is reported (the least disturbed by the rest of the machine), with the median beside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

MB = 1_000_000
WORKERS = 2
BROADCAST_BYTES, BROADCAST_TASKS = 100 * MB, 20
RESULT_BYTES, RESULT_TASKS = 50 * MB, 10


# --------------------------------------------------------------------------- task bodies


def sum_it(a: np.ndarray) -> tuple[float, float]:
    """The broadcast task: (sum, seconds spent summing)."""
    t = time.perf_counter()
    s = float(a.sum())
    return s, time.perf_counter() - t


def build(nbytes: int) -> tuple[np.ndarray, float]:
    """The results task: (array, seconds spent building it)."""
    t = time.perf_counter()
    a = np.full(nbytes // 8, 1.5)
    return a, time.perf_counter() - t


def warm(_: int) -> int:
    return os.getpid()


# --------------------------------------------------------------------------- contestants


class Contestant:
    name = ""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def broadcast(self, a: np.ndarray, tasks: int) -> list[tuple[float, float]]:
        raise NotImplementedError

    def results(self, nbytes: int, tasks: int) -> list[tuple[np.ndarray, float]]:
        raise NotImplementedError


class ScalerPut(Contestant):
    name = "scaler-put"

    def start(self) -> None:
        from scaler_executor import ScalerExecutor

        self.ex = ScalerExecutor(max_workers=WORKERS)
        list(self.ex.map(warm, range(4 * WORKERS)))
        self.ex._agent.store_ready.wait(30)

    def stop(self) -> None:
        self.ex.shutdown(wait=True)

    def broadcast(self, a: np.ndarray, tasks: int) -> list[tuple[float, float]]:
        ref = self.ex.put(a)
        return [f.result() for f in [self.ex.submit(sum_it, ref) for _ in range(tasks)]]

    def results(self, nbytes: int, tasks: int) -> list[tuple[np.ndarray, float]]:
        return [f.result() for f in [self.ex.submit(build, nbytes) for _ in range(tasks)]]


class ScalerValue(ScalerPut):
    name = "scaler-value"

    def broadcast(self, a: np.ndarray, tasks: int) -> list[tuple[float, float]]:
        return [f.result() for f in [self.ex.submit(sum_it, a) for _ in range(tasks)]]


class ProcessPool(Contestant):
    name = "process-pool"

    def start(self) -> None:
        self.ex = concurrent.futures.ProcessPoolExecutor(max_workers=WORKERS)
        list(self.ex.map(warm, range(4 * WORKERS)))

    def stop(self) -> None:
        self.ex.shutdown(wait=True)

    def broadcast(self, a: np.ndarray, tasks: int) -> list[tuple[float, float]]:
        return [f.result() for f in [self.ex.submit(sum_it, a) for _ in range(tasks)]]

    def results(self, nbytes: int, tasks: int) -> list[tuple[np.ndarray, float]]:
        return [f.result() for f in [self.ex.submit(build, nbytes) for _ in range(tasks)]]


class DaskScatter(Contestant):
    name = "dask-scatter"

    def start(self) -> None:
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit=0,
        )
        self.client = Client(self.cluster)
        self.client.gather(self.client.map(warm, range(4 * WORKERS), pure=False))

    def stop(self) -> None:
        self.client.close()
        self.cluster.close()

    def broadcast(self, a: np.ndarray, tasks: int) -> list[tuple[float, float]]:
        [data] = self.client.scatter([a])
        futures = [self.client.submit(sum_it, data, pure=False) for _ in range(tasks)]
        out = self.client.gather(futures)
        del futures, data
        return out  # type: ignore[no-any-return]

    def results(self, nbytes: int, tasks: int) -> list[tuple[np.ndarray, float]]:
        futures = [self.client.submit(build, nbytes, pure=False) for _ in range(tasks)]
        out = self.client.gather(futures)
        del futures
        return out  # type: ignore[no-any-return]


CONTESTANTS: dict[str, type[Contestant]] = {
    c.name: c for c in (ScalerPut, ScalerValue, ProcessPool, DaskScatter)
}


def available(name: str) -> str | None:
    """Why the contestant cannot run here, or None."""
    if name.startswith("dask"):
        try:
            import distributed  # noqa: F401
        except ImportError:
            return "distributed does not import in this environment (try /tmp/peers/bin/python)"
    return None


# --------------------------------------------------------------------------- measurement


def memcpy_seconds(nbytes: int, repeat: int = 7) -> float:
    src = np.full(nbytes // 8, 1.0)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in first
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return best


def timed(run: Callable[[], list[Any]], check: Callable[[list[Any]], None]) -> tuple[float, float]:
    """(wall seconds, mean in-task compute seconds) of one run."""
    gc.collect()
    t = time.perf_counter()
    out = run()
    wall = time.perf_counter() - t
    check(out)
    compute = statistics.fmean(item[1] for item in out)
    del out
    return wall, compute


def measure(name: str, repeat: int) -> dict[str, Any]:
    contestant = CONTESTANTS[name]()
    contestant.start()
    try:
        a = np.full(BROADCAST_BYTES // 8, 2.0)
        expected = 2.0 * a.size

        def check_sums(out: list[Any]) -> None:
            assert len(out) == BROADCAST_TASKS and all(s == expected for s, _ in out), out[:2]

        def check_arrays(out: list[Any]) -> None:
            assert len(out) == RESULT_TASKS
            for arr, _ in out:
                assert arr.nbytes == RESULT_BYTES and arr[0] == 1.5 and arr[-1] == 1.5
                arr.sum()  # the caller reads every byte: a lazy transport pays here

        figures: dict[str, Any] = {}
        for workload, run, check, tasks in (
            (
                "broadcast",
                lambda: contestant.broadcast(a, BROADCAST_TASKS),
                check_sums,
                BROADCAST_TASKS,
            ),
            (
                "results",
                lambda: contestant.results(RESULT_BYTES, RESULT_TASKS),
                check_arrays,
                RESULT_TASKS,
            ),
        ):
            runs = [timed(run, check) for _ in range(repeat)]
            overheads = [wall * WORKERS / tasks - compute for wall, compute in runs]
            best = min(range(repeat), key=lambda i: runs[i][0])
            figures[workload] = {
                "wall": runs[best][0],
                "wall_median": statistics.median(w for w, _ in runs),
                "compute": runs[best][1],
                "overhead": overheads[best],
                "overhead_median": statistics.median(overheads),
            }
        return figures
    finally:
        contestant.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per workload (default 3)")
    parser.add_argument("--only", default="", help="comma-separated contestants (default: all)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CONTESTANTS)
    unknown = set(names) - set(CONTESTANTS)
    if unknown:
        parser.error(f"unknown contestants {sorted(unknown)}; choose from {sorted(CONTESTANTS)}")

    print(
        f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, NumPy {np.__version__}"
    )
    print(f"# {WORKERS} workers; best of {args.repeat} runs (median in brackets)")
    copy50 = memcpy_seconds(RESULT_BYTES)
    copy100 = memcpy_seconds(BROADCAST_BYTES)
    print(
        f"# one memcpy: 50 MB {copy50 * 1e3:.1f} ms ({RESULT_BYTES / copy50 / 1e9:.1f} GB/s), 100 MB {copy100 * 1e3:.1f} ms"
    )
    print()
    header = (
        f"{'contestant':<14} | {'broadcast: wall':>16} {'compute':>8} {'overhead/task':>16} "
        f"| {'results: wall':>16} {'compute':>8} {'overhead/result':>16}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        why = available(name)
        if why:
            print(f"{name:<14} | skipped: {why}")
            continue
        f = measure(name, args.repeat)
        cells = []
        for w in (f["broadcast"], f["results"]):
            cells.append(
                f"{w['wall'] * 1e3:>7.0f} [{w['wall_median'] * 1e3:>5.0f}] ms {w['compute'] * 1e3:>5.1f} ms "
                f"{w['overhead'] * 1e3:>6.1f} [{w['overhead_median'] * 1e3:>5.1f}] ms"
            )
        print(f"{name:<14} | " + " | ".join(cells))
        sys.stdout.flush()
    print()
    print(
        "wall: first submit (or put/scatter) until every result is in hand; best [median] of the runs"
    )
    print("compute: the task's own work measured inside it (sum of 100 MB; building 50 MB), mean")
    print("overhead = wall × workers / tasks − compute")


if __name__ == "__main__":
    main()
