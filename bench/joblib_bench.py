"""joblib benchmark: the ``"scaler"`` joblib backend against joblib's default ``loky``.

A script, not a test: it prints figures.  Run from the repository root::

    PYTHONPATH=. python bench/joblib_bench.py                 # 5 repeats, 2 rounds
    PYTHONPATH=. python bench/joblib_bench.py --repeat 3 --rounds 1

``Parallel(n_jobs=2)`` over 10,000 tiny calls with the ``"scaler"`` backend
(``import scaler_executor.joblib``) against joblib's default ``loky`` backend; both
use joblib's automatic batching.

Each backend runs in fresh subprocesses (``--cell NAME``), ``--rounds`` of them,
alternating with the other: one warm-up run is discarded, then the run is repeated
and the median of all timed runs reported, with the ratio scaler / loky (below 1:
scaler-executor is faster).  Figures from a busy machine are noisy; the load
average at the start is printed with them.  A cell that does not finish within
``--cell-timeout`` is reported as such.

(This was ``bench/graph_bench.py``; its tree-reduction benchmark is now the
``graph_1000`` workload of ``bench/compare.py``.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

JOBLIB_CALLS = 10_000


def tiny(x: int) -> int:
    return x * 2


def time_runs(run: Callable[[], Any], check: Callable[[Any], bool], repeat: int) -> list[float]:
    assert check(run()), "warm-up gave a wrong result"
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
        assert check(result), "wrong result"
    return times


# =========================================================================== cells (subprocesses)


def _joblib_run(backend: str | None) -> Callable[[], list[int]]:
    from joblib import Parallel, delayed, parallel_config

    def run() -> list[int]:
        if backend is None:
            return Parallel(n_jobs=2)(delayed(tiny)(i) for i in range(JOBLIB_CALLS))
        with parallel_config(backend, n_jobs=2):
            return Parallel()(delayed(tiny)(i) for i in range(JOBLIB_CALLS))

    return run


def _joblib_check(result: list[int]) -> bool:
    return result == [2 * i for i in range(JOBLIB_CALLS)]


def cell_joblib_scaler(repeat: int) -> dict[str, Any]:
    import scaler_executor.joblib as sj

    try:
        times = time_runs(_joblib_run("scaler"), _joblib_check, repeat)
    finally:
        sj.shutdown()
    return {"times": times}


def cell_joblib_loky(repeat: int) -> dict[str, Any]:
    import joblib

    times = time_runs(_joblib_run(None), _joblib_check, repeat)
    return {"times": times, "version": joblib.__version__}


CELLS: dict[str, Callable[[int], dict[str, Any]]] = {
    "joblib-scaler": cell_joblib_scaler,
    "joblib-loky": cell_joblib_loky,
}


def run_cell(name: str, repeat: int, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--cell", name, "--repeat", str(repeat)]
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return dict(json.loads(lines[-1]))


def describe(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED ({result['error']})"
    times = result["times"]
    return f"{statistics.median(times):.3f} s median (min {min(times):.3f}, max {max(times):.3f}, n={len(times)})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per cell (after one warm-up)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="fresh subprocesses per backend, alternating"
    )
    parser.add_argument(
        "--cell-timeout", type=float, default=600.0, help="seconds before a cell is given up"
    )
    parser.add_argument("--cell", choices=sorted(CELLS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(CELLS[args.cell](args.repeat)), flush=True)
        return
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"python {sys.version.split()[0]}, {len(os.sched_getaffinity(0))} CPUs, "
        f"load average {load}, rounds={args.rounds}, repeat={args.repeat}"
    )
    ours, theirs = "joblib-scaler", "joblib-loky"
    print(f"\njoblib Parallel(n_jobs=2), {JOBLIB_CALLS:,} tiny calls")
    results: dict[str, dict[str, Any]] = {}
    # Rounds alternate the backends (ABAB...), so that a change in the machine's load
    # during the run (a shared CI host) weighs on both alike.
    for _ in range(args.rounds):
        for cell in (ours, theirs):
            got = run_cell(cell, args.repeat, args.cell_timeout)
            if cell not in results or "error" in got:
                results[cell] = got
            elif "error" not in results[cell]:
                results[cell]["times"] += got["times"]
    for cell in (ours, theirs):
        version = f" [{results[cell]['version']}]" if "version" in results[cell] else ""
        print(f"  {cell:14s}{version}: {describe(results[cell])}", flush=True)
    a, b = results[ours], results[theirs]
    if "error" not in a and "error" not in b:
        ratio = statistics.median(a["times"]) / statistics.median(b["times"])
        print(f"  ratio {ours} / {theirs}: {ratio:.2f}")


if __name__ == "__main__":
    main()
