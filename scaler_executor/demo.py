"""The main job: a real parallel computation on the embedded local cluster.

    python -m scaler_executor.demo [--workers N] [--limit N] [--block N]

Counts the primes below ``--limit`` by trial division in blocks, once serially
and once on a ScalerExecutor, checks both agree, and prints the speed-up and
what the cluster did.  The parallel time is the whole ``with ScalerExecutor()``
block: starting the cluster, the work, and the shutdown that waits for every
process of the cluster to exit.  The start time printed is the real one, from
``ScalerExecutor()`` to its first result (a trivial task), not the constructor's.

The default size (120 tasks; ~2.4 s of serial work on a 2-core Xeon VM, ~4 s on
an older EPYC one) keeps the cluster's fixed costs, ~0.1 s to start and ~0.01 s
to stop, small beside the work, as in a real job: with both cores free the
speed-up was 1.70-1.72x on the Xeon.  At the former default (1,200,000, 1.3 s of
serial work there) it was 1.43-1.57x: a job of a fraction of a second mostly
measures the fixed costs and the last task's tail.
On a machine other sessions keep busy there is little speed-up to show: Linux
divides the CPUs between sessions (autogroups), and the serial run's session and
the cluster's (it runs in one of its own) each get about one share (see
docs/performance.rst, "Cold start and shutdown").
"""

from __future__ import annotations

import argparse
import math
import os
import time

from scaler_executor import ScalerExecutor


def count_primes(lo: int, hi: int) -> int:
    """Primes in [lo, hi) by trial division: honest CPU work, a few ms per block."""
    count = 0
    for n in range(max(lo, 2), hi):
        if n % 2 == 0:
            count += n == 2
            continue
        for d in range(3, math.isqrt(n) + 1, 2):
            if n % d == 0:
                break
        else:
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaler_executor.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--limit", type=int, default=1_800_000)
    parser.add_argument("--block", type=int, default=15_000)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.limit < 1 or args.block < 1:
        parser.error("--workers, --limit and --block must be at least 1")
    blocks = [(lo, min(lo + args.block, args.limit)) for lo in range(0, args.limit, args.block)]

    t0 = time.perf_counter()
    serial = sum(count_primes(lo, hi) for lo, hi in blocks)
    serial_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    with ScalerExecutor(max_workers=args.workers) as ex:
        ex.submit(count_primes, 0, 0).result()  # the cluster is up once a first result is back
        started = time.perf_counter() - t0
        parallel = sum(ex.map(count_primes, *zip(*blocks, strict=True)))
        stats = ex.statistics()
        t_stop = time.perf_counter()
    parallel_s = time.perf_counter() - t0
    stop_s = time.perf_counter() - t_stop

    if parallel != serial:
        print(f"MISMATCH: serial {serial} != parallel {parallel}")
        return 1
    print(f"primes below {args.limit:,}: {parallel:,} ({len(blocks)} tasks, and a first one that times the start)")
    print(f"serial:                    {serial_s:6.2f} s")
    print(f"ScalerExecutor({args.workers} workers): {parallel_s:6.2f} s  (speed-up {serial_s / parallel_s:.2f}x)")
    print(f"  of which {started:.2f} s to start the cluster (to its first result) and {stop_s:.2f} s to stop it")
    print(f"daemon: {stats['finished']} tasks finished, {stats['failed']} failed, {stats['retried']} retried")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
