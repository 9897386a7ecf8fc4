"""Graphs at scale: 10^3 to 10^5-node graphs through ``ex.get`` on the embedded cluster.

Issue 26.  Two shapes, with trivial node functions (builtins, so workers unpickle
nothing of ours):

``tree``
    a pairwise ``operator.add`` reduction (``bench.workloads.tree_graph``): N/2 leaves
    ``(operator.pos, i)``, then sums level by level; N - 1 nodes; one key requested.
``shuffle``
    ``STAGES`` + 1 layers of N / (``STAGES`` + 1) partitions: layer 0 is
    ``(operator.pos, i)``; partition i of layer s+1 is ``(sum, [...])`` over ``FAN``
    partitions of layer s, ``(i + v * FAN**(s mod D)) mod n`` for v < FAN (a cyclic
    butterfly: after D = log_FAN(n) layers every output depends on every input, an
    all-to-all spread over stages with FAN edges per node).  Every partition of the
    last layer is requested, as a computed shuffle's partitions would be.

Each (shape, size) *cell* runs in a fresh interpreter (``python bench/graph_scale.py
--cell SHAPE N``) with a fresh ``ScalerExecutor(max_workers=2)``: warm-up (a 199-node
tree), then, garbage collected, the graph is built (timed, and the client's USS
growth it costs), and one ``ex.get`` is timed:

* *submit*: from the call to ``GraphBatch.submit`` (the whole batch handed to the
  client's agent thread, which encodes and sends it), i.e. culling, ordering,
  pickling every node and numbering it: the client's part before anything runs;
* *end to end*: from the call to its return with the result (checked against a local
  evaluation), and *nodes/s* = N / that; *nodes/s after submit* = N / (end to end -
  submit), the cluster's rate once it has the graph (nothing runs before: the graph
  goes in one transmission);
* *client CPU*: ``time.process_time`` of the client (every thread) over the call, per
  node; *client USS*: the peak of its private memory (``Private_*`` of
  ``/proc/PID/smaps_rollup``) during the call above the value just before it, per
  node (the graph dict itself is already built; its own cost is *graph USS*);
* *daemon CPU*: CPU time of the daemon's process, all its threads (``schedstat``,
  nanoseconds, before/after the call; the worker's processes are not in it), per node; its inverse, nodes per
  second of daemon CPU, bounds what the daemon could schedule with workers that cost
  it nothing (it is *not* a simulated-worker measurement: that is ``bench/scale.py
  --graph``, whose simulated workers handle dependencies); *daemon USS*: peak growth
  over the call, per node.

Peaks come from a sampler process (not a thread: the client holds the GIL while it
pickles) reading both processes' ``smaps_rollup`` every 20 ms, so a shorter peak may
be missed.  The parent runs ``--repeat`` rounds, each over every size and shape
(the order alternating round to round), records the load average before each cell,
and prints medians::

    PYTHONPATH=. python bench/graph_scale.py                       # 10^3, 10^4, 10^5; 3 rounds
    PYTHONPATH=. python bench/graph_scale.py --sizes 1000 --repeat 1 --quick
    PYTHONPATH=. python bench/graph_scale.py --json graph_scale.json --wait-load 1.5
    PYTHONPATH=. python bench/graph_scale.py --profile tree:100000  # cProfile of the client's ex.get
    PYTHONPATH=. python bench/graph_scale.py --report graph_scale.json   # its table again
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

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # bench.workloads; the embedded cluster passes sys.path on

from bench.workloads import tree_graph  # noqa: E402  (imports no scaler_executor module)

SHAPES = ("tree", "shuffle")
SIZES = (1_000, 10_000, 100_000)
STAGES = 4  # shuffle layers after the inputs
FAN = 4  # shuffle: dependencies per partition
SAMPLE_EVERY = 0.02  # seconds between memory samples
CELL_TIMEOUT = 900.0


# --------------------------------------------------------------------------- graphs


def shuffle_graph(nodes: int) -> tuple[dict[Any, Any], list[Any], list[int]]:
    """(dsk, keys of the last layer, their expected values)."""
    n = max(FAN, nodes // (STAGES + 1))
    digits = 1
    while FAN**digits < n:
        digits += 1
    dsk: dict[Any, Any] = {("p", 0, i): (operator.pos, i) for i in range(n)}
    values = list(range(n))
    for s in range(STAGES):
        stride = FAN ** (s % digits)
        nxt = []
        for i in range(n):
            sources = [(i + v * stride) % n for v in range(FAN)]
            dsk[("p", s + 1, i)] = (sum, [("p", s, j) for j in sources])
            nxt.append(sum(values[j] for j in sources))
        values = nxt
    return dsk, [("p", STAGES, i) for i in range(n)], values


def build(shape: str, nodes: int) -> tuple[dict[Any, Any], Any, Any]:
    """(dsk, keys, expected result of ex.get(dsk, keys))."""
    if shape == "tree":
        leaves = max(2, nodes // 2)
        dsk, root = tree_graph(leaves)
        return dsk, root, sum(range(leaves))
    dsk, keys, values = shuffle_graph(nodes)
    return dsk, keys, tuple(values)


def edges(dsk: dict[Any, Any]) -> int:
    """Dependencies summed over the nodes (arguments that are keys, in lists too)."""
    count = 0
    for value in dsk.values():
        for arg in value[1:]:
            count += sum(1 for a in arg if a in dsk) if type(arg) is list else int(type(arg) is tuple and arg in dsk)
    return count


# --------------------------------------------------------------------------- memory


def uss(pid: int) -> int:
    """Private bytes of ``pid`` (``Private_Clean`` + ``Private_Dirty`` of smaps_rollup)."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Private_"):
                total += int(line.split()[1]) * 1024
    return total


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (``/proc/PID/task/*/schedstat``, nanoseconds)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # the thread ended
    return total / 1e9


def sampler_main(pids: list[int]) -> None:
    """``--sampler PID,PID``: sample until stdin says ``stop``; print (t, uss...) rows as JSON."""
    import select

    rows = []
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], SAMPLE_EVERY)
        if ready:
            break
        try:
            rows.append([time.monotonic(), *[uss(p) for p in pids]])
        except OSError:
            break
    print(json.dumps(rows), flush=True)


# --------------------------------------------------------------------------- one cell


def cell(shape: str, nodes: int, profile: bool = False) -> dict[str, Any]:
    import psutil

    from scaler_executor import ScalerExecutor
    from scaler_executor.client import pickling

    submitted: list[float] = []
    original_submit = pickling.GraphBatch.submit

    def timed_submit(self: Any) -> None:
        submitted.append(time.perf_counter())
        original_submit(self)

    pickling.GraphBatch.submit = timed_submit  # type: ignore[method-assign]
    me = os.getpid()
    with ScalerExecutor(max_workers=2) as ex:
        cluster = ex._cluster
        assert cluster is not None
        daemon = psutil.Process(cluster.process.pid)
        warm, warm_root, warm_expected = build("tree", 200)
        for _ in range(3):
            assert ex.get(warm, warm_root) == warm_expected
        submitted.clear()
        gc.collect()
        before_graph = uss(me)
        t = time.perf_counter()
        dsk, keys, expected = build(shape, nodes)
        build_s = time.perf_counter() - t
        graph_uss = uss(me) - before_graph
        gc.collect()
        sampler = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--sampler", f"{me},{daemon.pid}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(0.3)  # the sampler's interpreter starts
        client_base, daemon_base = uss(me), uss(daemon.pid)
        d0 = cpu_seconds(daemon.pid)
        c0 = time.process_time()
        t0_mono = time.monotonic()
        t0 = time.perf_counter()
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            got = prof.runcall(ex.get, dsk, keys)
        else:
            got = ex.get(dsk, keys)
        t1 = time.perf_counter()
        t1_mono = time.monotonic()
        c1 = time.process_time()
        d1 = cpu_seconds(daemon.pid)
        out, _ = sampler.communicate("stop\n", timeout=30)
        rows = [r for r in json.loads(out) if t0_mono <= r[0] <= t1_mono]
        if got != expected:
            raise AssertionError(f"{shape} {nodes}: wrong result")
    n = len(dsk)
    result = {
        "shape": shape,
        "nodes": n,
        "edges": edges(dsk),
        "build_s": build_s,
        "graph_uss_b_per_node": graph_uss / n,
        "submit_s": (submitted[0] - t0) if submitted else None,
        "end_to_end_s": t1 - t0,
        "nodes_per_s": n / (t1 - t0),
        "client_cpu_us_per_node": (c1 - c0) / n * 1e6,
        "client_uss_b_per_node": (max((r[1] for r in rows), default=client_base) - client_base) / n,
        "daemon_cpu_us_per_node": (d1 - d0) / n * 1e6,
        "daemon_uss_b_per_node": (max((r[2] for r in rows), default=daemon_base) - daemon_base) / n,
        "samples": len(rows),
        "loadavg": os.getloadavg()[0],
    }
    if profile:
        import io

        for order in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(25)
            result[f"profile_{order}"] = buf.getvalue()
    return result


# --------------------------------------------------------------------------- parent

COLUMNS = [
    ("submit_s", "submit s", "{:.3f}"),
    ("end_to_end_s", "end to end s", "{:.3f}"),
    ("nodes_per_s", "nodes/s", "{:,.0f}"),
    ("after_submit_rate", "nodes/s after submit", "{:,.0f}"),
    ("client_cpu_us_per_node", "client CPU us/node", "{:.1f}"),
    ("client_uss_b_per_node", "client USS B/node", "{:,.0f}"),
    ("daemon_cpu_us_per_node", "daemon CPU us/node", "{:.1f}"),
    ("daemon_rate", "nodes/s of daemon CPU", "{:,.0f}"),
    ("daemon_uss_b_per_node", "daemon USS B/node", "{:,.0f}"),
    ("build_s", "build dict s", "{:.3f}"),
    ("graph_uss_b_per_node", "dict USS B/node", "{:,.0f}"),
]


def run_cell(shape: str, nodes: int, profile: bool = False) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, os.path.abspath(__file__), "--cell", shape, str(nodes)]
    if profile:
        command.append("--profile-cell")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CELL_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"cell {shape} {nodes} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def wait_for_load(limit: float, deadline: float) -> None:
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        print(f"load average {os.getloadavg()[0]:.2f} > {limit}: waiting", file=sys.stderr, flush=True)
        time.sleep(min(60.0, max(1.0, deadline - time.monotonic())))


def medians(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(r["shape"], r["nodes"]) for r in results}, key=lambda k: (SHAPES.index(k[0]), k[1]))
    for shape, n in keys:
        runs = [r for r in results if (r["shape"], r["nodes"]) == (shape, n)]
        row: dict[str, Any] = {"shape": shape, "nodes": n, "edges": runs[0]["edges"], "runs": len(runs)}
        for key, _, _ in COLUMNS:
            if key in ("daemon_rate", "after_submit_rate"):
                continue
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = statistics.median(values) if values else None
        rates = [1e6 / r["daemon_cpu_us_per_node"] for r in runs if r["daemon_cpu_us_per_node"] > 0]
        row["daemon_rate"] = statistics.median(rates) if rates else None
        after = [r["nodes"] / (r["end_to_end_s"] - r["submit_s"]) for r in runs if r["submit_s"] is not None]
        row["after_submit_rate"] = statistics.median(after) if after else None
        loads = [r["loadavg"] for r in runs]
        row["loadavg"] = f"{min(loads):.2f}-{max(loads):.2f}"
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ["shape", "nodes", "edges", *[title for _, title, _ in COLUMNS], "load"]
    lines = [head]
    for row in rows:
        cells = [row["shape"], f"{row['nodes']:,}", f"{row['edges']:,}"]
        for key, _, fmt in COLUMNS:
            cells.append("—" if row[key] is None else fmt.format(row[key]))
        cells.append(row["loadavg"])
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="node counts, comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3; medians over them)")
    parser.add_argument("--quick", action="store_true", help="10^3 nodes, one round: a smoke run")
    parser.add_argument("--json", metavar="FILE", help="write every run and the medians as JSON")
    parser.add_argument("--wait-load", type=float, metavar="L", help="before each cell, wait (at most --wait-max s) for load < L")
    parser.add_argument("--wait-max", type=float, default=1200.0, help="seconds of waiting in all (default 1200)")
    parser.add_argument("--profile", metavar="SHAPE:N", help="cProfile the client's ex.get in one cell; print its top entries")
    parser.add_argument("--report", metavar="FILE", help="print the table of a --json file again")
    parser.add_argument("--cell", nargs=2, metavar=("SHAPE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--profile-cell", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sampler", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sampler:
        sampler_main([int(p) for p in args.sampler.split(",")])
        return
    if args.cell:
        print(json.dumps(cell(args.cell[0], int(args.cell[1]), args.profile_cell)))
        return
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        print(table(medians(saved["runs"])))
        return
    if args.profile:
        shape, n = args.profile.split(":")
        r = run_cell(shape, int(n), profile=True)
        print(f"{shape}, {r['nodes']:,} nodes: ex.get {r['end_to_end_s']:.2f} s (under cProfile), load {r['loadavg']:.2f}")
        print(r["profile_tottime"])
        print(r["profile_cumulative"])
        return
    sizes = [1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat
    shapes = args.shapes.split(",")
    results = []
    deadline = time.monotonic() + args.wait_max
    for rnd in range(repeat):
        order = [(s, n) for n in sizes for s in shapes]
        if rnd % 2:
            order.reverse()
        for shape, n in order:
            if args.wait_load is not None:
                wait_for_load(args.wait_load, deadline)
            r = run_cell(shape, n)
            r["round"] = rnd
            results.append(r)
            print(f"round {rnd + 1} {shape:7s} {r['nodes']:>7,} nodes: {r['end_to_end_s']:7.3f} s "
                  f"({r['nodes_per_s']:,.0f} nodes/s), submit {r['submit_s']:.3f} s, "
                  f"daemon {r['daemon_cpu_us_per_node']:.1f} us CPU/node, load {r['loadavg']:.2f}", file=sys.stderr, flush=True)  # fmt: skip
    rows = medians(results)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"graph_scale: {os.cpu_count()} CPUs, 2 processors, commit {commit or '?'}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, medians of {repeat} round(s); load average "
          f"{min(r['loadavg'] for r in results):.2f}-{max(r['loadavg'] for r in results):.2f}")  # fmt: skip
    print(table(rows))
    print("nodes/s of daemon CPU: nodes ÷ the daemon's CPU time over the call, a bound on its "
          "scheduling rate, not a simulated-worker throughput")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"commit": commit, "runs": results, "medians": rows}, f, indent=1)


if __name__ == "__main__":
    main()
