"""The journal's cost, before/after: two checkouts alternating in one run (issue 25).

::

    PYTHONPATH=. chrt -r 1 python bench/journal_ab.py --before /tmp/old-checkout --after . \\
        [--reps 12] [--configs interval,os,turn,off, no fast paths] [--tasks 20000] [--trips 300]

Each checkout needs its own virtualenv in ``.venv`` (as for bench/ab.py).  For each
repetition and configuration (bench/journal_cost.py's names) the two run one after the other,
each as ``journal_cost.py --one CONFIG`` in a fresh interpreter of its own checkout (this
tree's script, the other tree's package: the script uses only ScalerExecutor, ClusterConfig
and the client agent's ``REPLY_INBOX`` switch), the order swapped every other repetition.
Reported per configuration: the medians of no-op throughput and of the sequential round
trip on each side, and the mean paired ratio (after ÷ before) with its 95 % confidence
interval; the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.ab import summarize


def run(checkout: str, config: str, tasks: int, trips: int) -> tuple[float, float]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "journal_cost.py")
    python = os.path.join(checkout, ".venv", "bin", "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout, os.path.dirname(os.path.dirname(script))]))
    out = subprocess.run(
        [python, script, "--one", config, "--tasks", str(tasks), "--trips", str(trips)],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{checkout} {config}: exit {out.returncode}\n{out.stderr[-2000:]}")
    record = json.loads(out.stdout.strip().splitlines()[-1])
    return record["throughput"], record["round_trip"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--configs", default="interval,os,turn")
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--trips", type=int, default=300)
    args = parser.parse_args()
    sides = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    configs = args.configs.split(",")
    results: dict[str, list[tuple[tuple[float, float], tuple[float, float]]]] = {c: [] for c in configs}
    load_before = os.getloadavg()
    started = time.monotonic()
    for rep in range(args.reps):
        for config in configs:
            order = ("before", "after") if rep % 2 == 0 else ("after", "before")
            got = {side: run(sides[side], config, args.tasks, args.trips) for side in order}
            results[config].append((got["before"], got["after"]))
            print(
                f"rep {rep + 1}/{args.reps} {config:18} before {got['before'][0]:7.0f}/s {got['before'][1] * 1e6:6.0f} µs"
                f"  after {got['after'][0]:7.0f}/s {got['after'][1] * 1e6:6.0f} µs ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    print(f"\nload average before {load_before}, after {os.getloadavg()}; {args.reps} alternating repetitions")
    print(f"{'config':18} {'metric':11} {'before':>9} {'after':>9} {'after÷before':>13} {'95% CI of the mean paired ratio':>32}")
    for config in configs:
        for i, metric in enumerate(("tasks/s", "round trip")):
            scale = 1.0 if i == 0 else 1e6
            pairs = [(b[i] * scale, a[i] * scale) for b, a in results[config]]
            before, after, ratio, low, high = summarize(pairs)
            print(f"{config:18} {metric:11} {before:9.0f} {after:9.0f} {ratio:13.3f} {low:15.3f}-{high:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
