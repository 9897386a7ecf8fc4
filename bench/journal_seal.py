"""What sealing a journal segment costs (the first step of every compaction), two checkouts A/B.

::

    python bench/journal_seal.py --before /tmp/old-checkout --after . [--reps 10] [--seals 20] [--dir /tmp]

Per repetition, each checkout (its own ``.venv``, alternated, the order swapped every other
repetition) runs in a fresh interpreter: a ``JournalWriter`` (fsync ``interval``) in a fresh
directory under ``--dir`` with a thread appending one-entry turns without pause, and
``--seals`` times the "sealed" step of ``compaction()`` (the rest of the compaction abandoned).
Printed per checkout, medians over the repetitions of each repetition's median: the seal's
wall time and the longest append() during it (the time the seal holds the writer's lock, as
appends see it), and the mean paired ratio (after ÷ before) with its 95 % confidence interval.
Journal format 2 writes a seal record and fsyncs the directory under the lock (format 1: one
fsync), so the second figure is the one that can change.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
       2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
       2.052, 2.048, 2.045, 2.042]


def one(where: str, seals: int) -> dict[str, float]:
    from scaler_executor.scheduler.journal import open_journal

    with tempfile.TemporaryDirectory(dir=where) as tmp:
        writer, _ = open_journal(  # (no background compaction: the seals are the only ones)
            os.path.join(tmp, "j"), package_version="0.1.0", policy="interval", min_compact_bytes=1 << 40
        )
        stop = threading.Event()
        worst = [0.0]

        def appends() -> None:
            n = 0
            while not stop.is_set():
                began = time.perf_counter()
                writer.append([(b"k%d" % (n % 1000), b"v" * 100)])
                worst[0] = max(worst[0], time.perf_counter() - began)
                n += 1

        thread = threading.Thread(target=appends)
        thread.start()
        step_times, stalls = [], []
        try:
            for _ in range(seals):
                time.sleep(0.02)
                worst[0] = 0.0
                began = time.perf_counter()
                steps = writer.compaction()
                assert next(steps) == "sealed"
                step_times.append(time.perf_counter() - began)
                steps.close()
                stalls.append(worst[0])  # (the longest append since the seal began)
        finally:
            stop.set()
            thread.join()
            writer.close()
    return {"seal_ms": statistics.median(step_times) * 1e3, "stall_ms": statistics.median(stalls) * 1e3}


def run(checkout: str, seals: int, where: str) -> dict[str, float]:
    python = os.path.join(checkout, ".venv", "bin", "python")
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--one", "--seals", str(seals), "--dir", where],
        cwd=checkout, env=dict(os.environ, PYTHONPATH=checkout), capture_output=True, text=True, timeout=600,
    )
    if out.returncode:
        raise RuntimeError(f"{checkout}: exit {out.returncode}\n{out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before")
    parser.add_argument("--after")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seals", type=int, default=20)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--one", action="store_true", help="one repetition in this interpreter, as JSON")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.dir, args.seals)))
        return
    if not (args.before and args.after):
        parser.error("give --before and --after (or --one)")
    print("load before:", os.getloadavg())
    pairs: dict[str, list[tuple[float, float]]] = {"seal_ms": [], "stall_ms": []}
    for rep in range(args.reps):
        order = [("before", args.before), ("after", args.after)]
        got = {name: run(tree, args.seals, args.dir) for name, tree in (order if rep % 2 == 0 else order[::-1])}
        print(f"rep {rep + 1}: before {got['before']}, after {got['after']}", flush=True)
        for key in pairs:
            pairs[key].append((got["before"][key], got["after"][key]))
    print(f"{'ms':<10} {'before':>8} {'after':>8} {'after/before':>13}  95% CI of the mean paired ratio")
    for key, values in pairs.items():
        before = statistics.median(b for b, _ in values)
        after = statistics.median(a for _, a in values)
        ratios = [a / b for b, a in values]
        mean = statistics.fmean(ratios)
        half = T95[min(len(ratios) - 1, len(T95)) - 1] * statistics.stdev(ratios) / math.sqrt(len(ratios))
        print(f"{key:<10} {before:>8.2f} {after:>8.2f} {after / before:>13.3f}  {mean - half:.3f}-{mean + half:.3f}")
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
