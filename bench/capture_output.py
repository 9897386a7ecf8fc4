"""The cost of ``capture_output=True`` per task, on no-op tasks.

::

    python bench/capture_output.py [--reps 7] [--tasks 2000] [--sequential 500] [--workers 2]

One embedded cluster; each repetition runs the same two measurements with capture off
(A) and on (B), the order swapped every other repetition so that a drift of the machine
falls on both:

* ``batch``: ``tasks`` no-op futures submitted at once, then waited for (throughput);
* ``sequential``: ``sequential`` calls of ``submit(noop).result()`` one after the other
  (latency; with capture off these take the processor's direct reply to the client,
  with capture on the agent's path, since the reply datagram has no room for output).

Reported per measurement: the median of A and of B in microseconds per task, the added
cost (B - A) per task, and a 95 % confidence interval of the mean paired difference
(t distribution over the repetitions) — the noise.  Other processes on the machine
add to both; state them with the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ab import t95
from bench.workloads import noop
from scaler_executor import ScalerExecutor


def batch(view: object, tasks: int) -> float:
    start = time.perf_counter()
    futures = [view.submit(noop) for _ in range(tasks)]  # type: ignore[attr-defined]
    wait(futures)
    for f in futures:
        f.result()
    return (time.perf_counter() - start) / tasks * 1e6


def sequential(view: object, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        view.submit(noop).result()  # type: ignore[attr-defined]
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with ScalerExecutor(max_workers=args.workers) as ex:
        views = {"A": ex.options(capture_output=False), "B": ex.options(capture_output=True)}
        for view in views.values():  # warm up: processors started, functions cached, paths taken
            batch(view, 200)
            sequential(view, 50)
        runs: dict[str, list[tuple[float, float]]] = {"batch": [], "sequential": []}
        for rep in range(args.reps):
            order = ("A", "B") if rep % 2 == 0 else ("B", "A")
            for name, measure, n in (("batch", batch, args.tasks), ("sequential", sequential, args.sequential)):
                got = {side: measure(views[side], n) for side in order}
                runs[name].append((got["A"], got["B"]))
                print(f"rep {rep} {name}: A {got['A']:.1f} us  B {got['B']:.1f} us", file=sys.stderr)
    print(f"{'measurement':<12} {'A off (us/task)':>16} {'B on (us/task)':>15} {'B-A':>8} {'95% CI of B-A':>20}")
    for name, pairs in runs.items():
        a = statistics.median(p[0] for p in pairs)
        b = statistics.median(p[1] for p in pairs)
        diffs = [p[1] - p[0] for p in pairs]
        mean = statistics.fmean(diffs)
        half = t95(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
        print(f"{name:<12} {a:>16.1f} {b:>15.1f} {b - a:>8.1f} {f'[{mean - half:.1f}, {mean + half:.1f}]':>20}")
    print(f"({args.reps} alternating repetitions, {args.workers} processors, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
