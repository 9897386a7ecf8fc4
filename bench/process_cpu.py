"""Which process a no-op task costs CPU in: two checkouts alternating, CPU per task of each.

::

    chrt -r 1 python bench/process_cpu.py --before OLD --after NEW [--mode burst|round_trip|graph|map]
                                          [--tasks N] [--reps 8]

Each cell is a fresh interpreter started in its checkout (``PYTHONPATH=<checkout>``, the
checkout's own ``.venv`` if it has one, else this interpreter) with a
``ScalerExecutor(max_workers=2)`` (embedded cluster): after a warm-up, ``--tasks`` no-op
tasks, either submitted all at once and then waited for (``burst``: throughput's cost) or
one at a time, each waited for before the next (``round_trip``), or ``bench/compare.py``'s
``graph_1000`` graph (a 999-node ``operator.add`` tree through ``ex.get``) run ``--tasks``
times (``graph``: figures per node).  Per process of the
cluster (the client, the daemon, the worker agent, the processors together), the CPU time
it ran during the tasks, from ``/proc/<pid>/task/*/schedstat`` (nanoseconds, every thread),
divided by the tasks; and the elapsed time per task.  In a burst also the CPU time of the
submitting thread during the submit loop (``time.thread_time``): the submit call's own cost.  The two checkouts alternate, the
order swapped every other repetition; reported: each side's mean, and the mean paired ratio
(after ÷ before) with its 95 % confidence interval (t distribution).

Where ``bench/ab.py`` says a row regressed, this says in which process the CPU went.
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import os
import statistics
import subprocess
import sys
import time
from typing import Any

T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
       2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
       2.052, 2.048, 2.045, 2.042]  # fmt: skip


def noop(x: int) -> int:
    return x


def tree_graph(leaves: int) -> tuple[dict[Any, Any], Any]:
    """``bench/workloads.py``'s ``graph_1000`` graph (kept here: the cell runs in either checkout)."""
    dsk: dict[Any, Any] = {("leaf", i): (operator.pos, i) for i in range(leaves)}
    keys: list[Any] = list(dsk)
    level = 0
    while len(keys) > 1:
        level += 1
        pairs = [keys[j : j + 2] for j in range(0, len(keys), 2)]
        keys = [("sum", level, j) for j in range(len(pairs))]
        for key, pair in zip(keys, pairs, strict=True):
            dsk[key] = (operator.add, *pair) if len(pair) == 2 else (operator.pos, pair[0])
    return dsk, keys[0]


def _cpu_seconds(pid: int) -> float:
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue  # the thread ended meanwhile
    return total / 1e9


def _role(pid: int, me: int, daemon: int, worker: int) -> str:
    if pid == me:
        return "client"
    if pid == daemon:
        return "daemon"
    if pid == worker:
        return "worker agent"
    return "processors"  # the zygote (idle) and the processors it forked


def cell(mode: str, tasks: int) -> dict[str, float]:
    """One measurement in this interpreter (run by ``main`` in each checkout)."""
    import psutil

    from scaler_executor import ScalerExecutor

    me = psutil.Process()
    with ScalerExecutor(max_workers=2) as ex:
        for i in range(3000):
            ex.submit(noop, i)
        for _ in range(300):
            ex.submit(noop, 0).result()
        dsk, root = tree_graph(500)
        if mode == "graph":
            for _ in range(5):
                assert ex.get(dsk, root) == sum(range(500))
        children = me.children(recursive=True)
        commands = {p.pid: " ".join(p.cmdline()) for p in children}
        daemon = next(pid for pid, command in commands.items() if "scaler_executor.cli.daemon" in command)
        # The worker agent; the zygote and the processors are its descendants, same command.
        worker = next(
            p.pid for p in children
            if "scaler_executor.cli.worker" in commands[p.pid] and "scaler_executor.cli.worker" not in commands.get(p.ppid(), "")
        )  # fmt: skip
        pids = [me.pid] + [p.pid for p in children]
        gc.disable()
        before = {pid: _cpu_seconds(pid) for pid in pids}
        t0 = time.perf_counter()
        submit_cpu = 0.0
        if mode == "burst":
            c0 = time.thread_time()
            futures = [ex.submit(noop, i) for i in range(tasks)]
            submit_cpu = time.thread_time() - c0
            for f in futures:
                f.result()
        elif mode == "graph":
            for _ in range(tasks):
                ex.get(dsk, root)
        elif mode == "map":
            for _ in ex.map(noop, range(tasks)):
                pass
        else:
            for _ in range(tasks):
                ex.submit(noop, 0).result()
        elapsed = time.perf_counter() - t0
        after = {pid: _cpu_seconds(pid) for pid in pids}
        gc.enable()
    if mode == "graph":
        tasks *= len(dsk)  # per node
    out = {"elapsed": elapsed / tasks * 1e6, "client": 0.0, "daemon": 0.0, "worker agent": 0.0, "processors": 0.0}
    for pid in pids:
        out[_role(pid, me.pid, daemon, worker)] += (after[pid] - before[pid]) / tasks * 1e6
    out["all processes"] = out["client"] + out["daemon"] + out["worker agent"] + out["processors"]
    if mode == "burst":
        out["submit (its thread)"] = submit_cpu / tasks * 1e6  # the submit loop's own CPU, part of the client's
    return out


def _python(checkout: str) -> str:
    venv = os.path.join(checkout, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def _run(checkout: str, mode: str, tasks: int) -> dict[str, float]:
    python = _python(checkout)
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--cell", mode, "--tasks", str(tasks)],
        cwd=checkout, env={**os.environ, "PYTHONPATH": os.path.abspath(checkout)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before")
    parser.add_argument("--after")
    parser.add_argument("--mode", choices=("burst", "round_trip", "graph", "map"), default="burst")
    parser.add_argument("--tasks", type=int, default=0, help="per cell (default 20,000 burst, 3,000 round trip, 40 graphs)")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--cell", choices=("burst", "round_trip", "graph", "map"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(cell(args.cell, args.tasks)))
        return 0
    if not args.before or not args.after:
        parser.error("--before and --after are required")
    tasks = args.tasks or {"burst": 20_000, "round_trip": 3_000, "graph": 40, "map": 20_000}[args.mode]
    for checkout in (args.before, args.after):
        # Every module compiled again: bench/ab.py's byte_compile says why.
        subprocess.run([_python(checkout), "-m", "compileall", "-q", "-f", os.path.join(checkout, "scaler_executor")], check=True)
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    for rep in range(args.reps):
        sides = [(args.before, before), (args.after, after)]
        for checkout, results in sides if rep % 2 == 0 else sides[::-1]:
            results.append(_run(checkout, args.mode, tasks))
    unit = "graphs of 999 nodes" if args.mode == "graph" else "tasks"
    per = "node" if args.mode == "graph" else "task"
    print(f"mode {args.mode}, {tasks} {unit} a cell, {args.reps} alternating pairs; load {os.getloadavg()[0]:.2f}; "
          f"µs per {per} (elapsed: wall-clock time per {per})")  # fmt: skip
    print(f"{'':14} {'before':>8} {'after':>8} {'after÷before':>13}  95% CI of ratio")
    for key in before[0]:
        ratios = [b[key] / a[key] for a, b in zip(before, after, strict=True) if a[key] > 0]
        mean = statistics.mean(ratios)
        half = T95[len(ratios) - 2] * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
        print(f"{key:14} {statistics.mean(a[key] for a in before):8.2f} {statistics.mean(b[key] for b in after):8.2f} "
              f"{mean:13.3f}  {mean - half:.3f} to {mean + half:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
