"""Before/after: the cost of one ``submit()`` call, two checkouts alternating in one run.

::

    python bench/submit_cost.py --before /path/to/old/checkout --after . [--reps 12]

Each repetition runs each checkout (its own ``.venv``, order swapped every other time) in
a fresh interpreter: an executor with 2 workers, warmed up, then ``--rounds`` bursts of
``--tasks`` no-op submits, each burst timed twice: the submitting thread's CPU time
(``time.thread_time``: what the call itself costs, the least disturbed by a loaded
machine) and the wall clock; the futures are awaited between bursts.  A repetition's
figure is the median burst, per call.  Reported as ``ab.py`` does: medians, the ratio,
and a 95 % confidence interval of the mean paired ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import summarize  # noqa: E402  (a sibling script, not a package)

CHILD = r"""
import json, statistics, sys, time
from scaler_executor import ScalerExecutor

def noop(x):
    return None

tasks, rounds = int(sys.argv[1]), int(sys.argv[2])
cpu, wall = [], []
with ScalerExecutor(2) as ex:
    for f in [ex.submit(noop, i) for i in range(300)]:
        f.result()
    for _ in range(rounds):
        c0, w0 = time.thread_time(), time.perf_counter()
        futures = [ex.submit(noop, i) for i in range(tasks)]
        c1, w1 = time.thread_time(), time.perf_counter()
        for f in futures:
            f.result()
        cpu.append((c1 - c0) / tasks * 1e6)
        wall.append((w1 - w0) / tasks * 1e6)
print(json.dumps({"cpu_us": statistics.median(cpu), "wall_us": statistics.median(wall)}))
"""


def run(checkout: str, tasks: int, rounds: int) -> dict[str, float]:
    python = os.path.join(checkout, ".venv", "bin", "python")
    out = subprocess.run(
        [python, "-c", CHILD, str(tasks), str(rounds)], cwd=checkout, env=dict(os.environ, PYTHONPATH=checkout),
        capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{checkout}: exit {out.returncode}\n{out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    sides = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    pairs: dict[str, list[tuple[float, float]]] = {"cpu_us": [], "wall_us": []}
    started = time.monotonic()
    for rep in range(args.reps):
        order = ("before", "after") if rep % 2 == 0 else ("after", "before")
        got = {side: run(sides[side], args.tasks, args.rounds) for side in order}
        for metric in pairs:
            pairs[metric].append((got["before"][metric], got["after"][metric]))
        print(f"rep {rep + 1}/{args.reps} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(f"{'metric':<28}{'before':>9}{'after':>9}{'after÷before':>14}  95% CI of ratio")
    for metric, label in (("cpu_us", "submit call, thread CPU µs"), ("wall_us", "submit call, wall µs")):
        before, after, ratio, low, high = summarize(pairs[metric])
        print(f"{label:<28}{before:>9.3f}{after:>9.3f}{ratio:>14.3f}  {low:.3f}–{high:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
