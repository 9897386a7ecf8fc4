"""Before/after: every compare.py cell of ScalerExecutor, two checkouts alternating in one run.

::

    python bench/ab.py --before /path/to/old/checkout --after . [--reps 5] [--only W,...]
                       [--output FILE.rst]

Each checkout needs its own virtualenv in ``.venv`` (``python -m venv .venv &&
.venv/bin/pip install -e .[test]``); its package is byte-compiled first (``byte_compile``).  For each repetition and workload the two run one
after the other, each as ``compare.py --run scaler WORKLOAD --json`` in a fresh
interpreter from its own checkout, the order swapped every other repetition so that a
drift of the machine falls on both.  Reported per metric: the median of each side, the
ratio of the medians (after ÷ before), and a 95 % confidence interval of the mean paired
ratio (t distribution over the repetitions) — the noise: a row whose interval includes
1.0 did not change measurably.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

WORKLOADS = (
    "noop_submit", "map_default", "map_chunk10", "map_chunk100", "round_trip", "cold_start",
    "broadcast_100mb", "results_50mb", "cpu_scaling", "graph_1000", "pending_memory",
)
# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
       2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
       2.052, 2.048, 2.045, 2.042]


def t95(df: int) -> float:
    return T95[df - 1] if df <= len(T95) else 1.96


def byte_compile(python: str, checkout: str) -> None:
    """Compile the checkout's package to bytecode, every module again (``-f``), as ``pip
    install`` would: with PYTHONDONTWRITEBYTECODE set, a stale ``.pyc`` is never rewritten
    and every process compiles that module at each import. Not compileall's default check:
    it compares the source's mtime in whole seconds and not its size, so a file changed
    twice within a second keeps the first change's ``.pyc``, which the importer (it does
    check the size) then refuses: a 23 % "regression" of ``map_chunk100`` measured on
    4 December was the processors compiling ``objstore/payload.py`` in the first map."""
    subprocess.run([python, "-m", "compileall", "-q", "-f", os.path.join(checkout, "scaler_executor")], check=True)


def run_cell(checkout: str, workload: str, workers: int) -> dict[str, float]:
    python = os.path.join(checkout, ".venv", "bin", "python")
    env = dict(os.environ, PYTHONPATH=checkout)
    out = subprocess.run(
        [python, os.path.join(checkout, "bench", "compare.py"), "--run", "scaler", workload,
         "--workers", str(workers), "--json"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{checkout} {workload}: exit {out.returncode}\n{out.stderr[-2000:]}")
    record = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: float(m["value"]) for name, m in record["metrics"].items()} | {
        f"{name}.better": 1.0 if m["better"] == "higher" else -1.0 for name, m in record["metrics"].items()
    }


def summarize(pairs: list[tuple[float, float]]) -> tuple[float, float, float, float, float]:
    before = statistics.median(b for b, _ in pairs)
    after = statistics.median(a for _, a in pairs)
    ratios = [a / b for b, a in pairs if b]
    mean = statistics.fmean(ratios)
    half = t95(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.inf
    return before, after, after / before if before else math.nan, mean - half, mean + half


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--output")
    args = parser.parse_args()
    sides = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    for checkout in sides.values():
        byte_compile(os.path.join(checkout, ".venv", "bin", "python"), checkout)
    workloads = args.only.split(",")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    better: dict[tuple[str, str], float] = {}
    started = time.monotonic()
    for rep in range(args.reps):
        for workload in workloads:
            order = ("before", "after") if rep % 2 == 0 else ("after", "before")
            got = {side: run_cell(sides[side], workload, args.workers) for side in order}
            for name, value in got["before"].items():
                if name.endswith(".better"):
                    better[(workload, name[: -len(".better")])] = value
                elif name in got["after"]:
                    results.setdefault((workload, name), []).append((value, got["after"][name]))
            print(f"rep {rep + 1}/{args.reps} {workload} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    rows = []
    for (workload, metric), pairs in results.items():
        before, after, ratio, low, high = summarize(pairs)
        sign = better[(workload, metric)]
        if low > 1.0 or high < 1.0:
            verdict = "better" if (low > 1.0) == (sign > 0) else "WORSE"
        else:
            verdict = "within noise"
        rows.append((workload, metric, before, after, ratio, low, high, verdict))
    header = ("workload", "metric", "before", "after", "after÷before", "95% CI of ratio", "verdict")
    lines = [header] + [
        (w, mt, f"{b:,.4g}", f"{a:,.4g}", f"{r:.3f}", f"{lo:.3f}–{hi:.3f}", v) for w, mt, b, a, r, lo, hi, v in rows
    ]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    table = "\n".join("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(line)) for line in lines)
    print(table)
    if args.output:
        rule = "  ".join("=" * w for w in widths)
        body = "\n".join("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(line)) for line in lines[1:])
        head = "  ".join(str(c).ljust(widths[i]) for i, c in enumerate(header))
        cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
        with open(args.output, "w") as f:
            f.write(
                f"Before/after ({args.reps} alternating repetitions, {args.workers} workers, {cpu}, "
                f"{os.cpu_count()} CPUs)\n\n::\n\n    python bench/ab.py --before {args.before} --after {args.after} "
                f"--reps {args.reps}\n\n{rule}\n{head}\n{rule}\n{body}\n{rule}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
