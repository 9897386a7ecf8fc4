"""A ``dask.delayed`` pipeline on scaler-executor: load, clean, two reports sharing the cleaning.

    python examples/dask_delayed_pipeline.py

Each of 8 "files" is loaded and cleaned by its own task; two reductions (a summary and
a histogram) both use the cleaned parts, which are computed once and stay in the
cluster until both have read them.  ``dask.compute(..., scheduler=ex.get)`` runs the
graph; the slow steps (``time.sleep`` standing in for I/O) overlap on the 2 workers.
"""

from __future__ import annotations

import time

import dask
from dask import delayed

from scaler_executor import ScalerExecutor

PARTS = 8
IO_SECONDS = 0.25  # each load "reads a file" for this long


def load(i: int) -> list[int]:
    time.sleep(IO_SECONDS)
    return list(range(i * 1000, (i + 1) * 1000))


def clean(values: list[int]) -> list[int]:
    return [v for v in values if v % 7]


def summarize(parts: list[list[int]]) -> dict[str, float]:
    flat = [v for part in parts for v in part]
    return {"count": len(flat), "mean": sum(flat) / len(flat)}


def histogram(parts: list[list[int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for part in parts:
        for v in part:
            counts[v % 7] = counts.get(v % 7, 0) + 1
    return dict(sorted(counts.items()))


def main() -> None:
    cleaned = [delayed(clean)(delayed(load)(i)) for i in range(PARTS)]
    summary = delayed(summarize)(cleaned)
    hist = delayed(histogram)(cleaned)

    started = time.perf_counter()
    with ScalerExecutor(max_workers=2) as ex:
        ex.submit(abs, 0).result()  # the cluster's processes are up: time the work alone
        print(f"cluster ready in {time.perf_counter() - started:.2f} s")
        start = time.perf_counter()
        summary_value, hist_value = dask.compute(summary, hist, scheduler=ex.get)
        elapsed = time.perf_counter() - start

    print(
        f"{PARTS} loads of {IO_SECONDS} s each on 2 workers: {elapsed:.2f} s (serial: {PARTS * IO_SECONDS:.2f} s)"
    )
    print(f"summary: count={summary_value['count']} mean={summary_value['mean']:.1f}")
    print(f"histogram of v % 7: {hist_value}")


if __name__ == "__main__":
    main()
