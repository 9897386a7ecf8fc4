"""A ``dask.array`` reduction on scaler-executor, checked against Dask's own scheduler.

    python examples/dask_array_reduction.py

``ex.get`` is a Dask scheduler: ``dask.compute(y, scheduler=ex.get)`` sends the whole
graph (here 2000 x 2000 random numbers in 500 x 500 chunks, symmetrised and averaged
over rows) to the cluster at once.  Chunks are computed and combined by the workers;
only the final 2000 numbers come back to this process.
"""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np

from scaler_executor import ScalerExecutor


def main() -> None:
    x = da.random.default_rng(2024).random((2000, 2000), chunks=500)
    y = (x + x.T).mean(axis=0)

    started = time.perf_counter()
    with ScalerExecutor(max_workers=2) as ex:
        ex.submit(abs, 0).result()  # the cluster's processes are up: time the work alone
        print(f"cluster ready in {time.perf_counter() - started:.2f} s")
        start = time.perf_counter()
        (result,) = dask.compute(y, scheduler=ex.get)
        elapsed = time.perf_counter() - start
        with dask.config.set(scheduler=ex.get):  # the same, as the default scheduler
            total = float(x.sum().compute())

    start = time.perf_counter()
    expected = y.compute(scheduler="sync")
    sync_elapsed = time.perf_counter() - start

    print(
        f"array: {x.shape[0]}x{x.shape[1]} in {x.npartitions} chunks of {x.chunksize[0]}x{x.chunksize[1]}"
    )
    print(f"scaler-executor: {elapsed:.2f} s, synchronous dask: {sync_elapsed:.2f} s")
    print(f"result: shape {result.shape}, mean {result.mean():.6f}, first {result[0]:.6f}")
    print(
        f"matches dask's synchronous scheduler: {bool(np.allclose(result, expected, rtol=1e-12))}"
    )
    print(f"sum of x: {total:.1f}")


if __name__ == "__main__":
    main()
