"""Graph and joblib benchmarks: scaler-executor against Dask distributed and loky.

A script, not a test: it prints figures.  Run from the repository root::

    PYTHONPATH=. python bench/graph_bench.py                 # both, 5 repeats each
    PYTHONPATH=. python bench/graph_bench.py --only tree --repeat 3

1. **Tree reduction** — a pairwise ``operator.add`` reduction of 500 leaves (999 graph
   nodes) through ``ScalerExecutor.get`` against Dask distributed's ``Client.get`` on a
   ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``: both 2 worker
   processes of 1 thread, both fed the same plain dict graph.  The tasks are trivial, so
   this measures per-task scheduling cost along a graph: submission, dependency
   tracking, dispatch, result hand-over between workers.
2. **joblib** — ``Parallel(n_jobs=2)`` over 10,000 tiny calls with the ``"scaler"``
   backend (``import scaler_executor.joblib``) against joblib's default ``loky`` backend.
   Both use joblib's automatic batching.

Each contestant runs in fresh subprocesses (``--cell NAME``), ``--rounds`` of them,
alternating with the other contestant: start-up (cluster, pool) happens before timing
and one warm-up run is discarded; then the run is repeated and the median of all timed
runs reported, with the ratio scaler / other (below 1: scaler-executor is faster).
Figures from a machine that is busy with other work are noisy; the load average at the
start is printed with them.
A cell that does not finish within ``--cell-timeout`` is reported as such.
"""

from __future__ import annotations

import argparse
import json
import operator
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

LEAVES = 500
JOBLIB_CALLS = 10_000


# =========================================================================== workloads


def tree_graph(leaves: int = LEAVES) -> tuple[dict[Any, Any], Any]:
    """A pairwise reduction; builtins only, so both schedulers' workers import nothing of ours."""
    dsk: dict[Any, Any] = {("leaf", i): (operator.pos, i) for i in range(leaves)}
    level, keys = 0, [("leaf", i) for i in range(leaves)]
    while len(keys) > 1:
        level += 1
        nxt = []
        for j in range(0, len(keys), 2):
            pair = keys[j : j + 2]
            key = ("sum", level, j // 2)
            dsk[key] = (operator.add, *pair) if len(pair) == 2 else (operator.pos, pair[0])
            nxt.append(key)
        keys = nxt
    return dsk, keys[0]


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


def cell_tree_scaler(repeat: int) -> dict[str, Any]:
    from scaler_executor import ScalerExecutor

    dsk, root = tree_graph()
    with ScalerExecutor(max_workers=2) as ex:
        times = time_runs(lambda: ex.get(dsk, root), lambda r: r == sum(range(LEAVES)), repeat)
    return {"times": times, "nodes": len(dsk)}


def cell_tree_dask(repeat: int) -> dict[str, Any]:
    import distributed
    from distributed import Client, LocalCluster

    dsk, root = tree_graph()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        times = time_runs(lambda: client.get(dsk, root), lambda r: r == sum(range(LEAVES)), repeat)
    return {"times": times, "nodes": len(dsk), "version": distributed.__version__}


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
    "tree-scaler": cell_tree_scaler,
    "tree-dask": cell_tree_dask,
    "joblib-scaler": cell_joblib_scaler,
    "joblib-loky": cell_joblib_loky,
}
PAIRS = {
    "tree": ("tree-scaler", "tree-dask", f"{LEAVES}-leaf tree reduction via get"),
    "joblib": (
        "joblib-scaler",
        "joblib-loky",
        f"joblib Parallel(n_jobs=2), {JOBLIB_CALLS:,} tiny calls",
    ),
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
    parser.add_argument("--only", choices=sorted(PAIRS), help="run one benchmark")
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per cell (after one warm-up)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="fresh subprocesses per contestant, alternating"
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
    for name in [args.only] if args.only else list(PAIRS):
        ours, theirs, title = PAIRS[name]
        print(f"\n{title}")
        results: dict[str, dict[str, Any]] = {}
        # Rounds alternate the contestants (ABAB...), so that a change in the machine's load
        # during the run (a shared CI host) weighs on both alike.
        for _ in range(args.rounds):
            for cell in (ours, theirs):
                got = run_cell(cell, args.repeat, args.cell_timeout)
                if cell not in results or "error" in got:
                    results[cell] = got
                elif "error" not in results[cell]:
                    results[cell]["times"] += got["times"]
        for cell in (ours, theirs):
            extra = f" (nodes={results[cell]['nodes']})" if "nodes" in results[cell] else ""
            version = f" [{results[cell]['version']}]" if "version" in results[cell] else ""
            print(f"  {cell:14s}{version}: {describe(results[cell])}{extra}", flush=True)
        a, b = results[ours], results[theirs]
        if "error" not in a and "error" not in b:
            ratio = statistics.median(a["times"]) / statistics.median(b["times"])
            print(f"  ratio {ours} / {theirs}: {ratio:.2f}")


if __name__ == "__main__":
    main()
