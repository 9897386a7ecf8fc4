"""Graphs through the scale harness: how fast one daemon schedules a 10^5-node graph.

Issue 26's goal: a 10^5-node graph scheduled by the daemon at >= 20,000 nodes/s with
simulated workers.  Run through ``bench/scale.py --graph``::

    PYTHONPATH=. python bench/scale.py --graph tree:100000,shuffle:100000 --workers 10 --processors 4 --repeat 3

The shapes are ``bench/graph_scale.py``'s, node for node: **tree**, a pairwise reduction
of N/2 leaves (an odd node out is carried up alone), one node requested; **shuffle**,
``STAGES`` + 1 layers of N/(``STAGES`` + 1) partitions, partition i of layer s+1 over the
``FAN`` partitions ``(i + v·FAN^(s mod D)) mod n`` of layer s, every partition of the
last layer requested.  One simulated client sends what the graph client
(``client/graph.py``) sends for ``ex.get``: one ``RegisterFunction`` (the graph's
evaluator) and one ``SubmitTasks`` of every node in dependency order, each a ``TaskSpec``
with that function, its dependencies' task ids, ``TaskFlags.NO_RESULT`` unless requested.
Each node's payload is its value as an 8-byte integer (the leaf's index, 0 inside); a
simulated worker answers with its value plus its dependencies' (from the ``DepValue``
results the daemon sends with the task, as a real worker hands them to the function),
so every requested result is checked against a local evaluation, and every dispatched
task's dependencies against those its client declared.

Figures, per run (a fresh daemon, pinned as in bench/scale.py): *nodes/s*: N ÷ the wall
time from the transmission's send (encoded beforehand: the client's own pickling is
``bench/graph_scale.py``'s subject) to the last requested result; *daemon µs/node* and
*nodes/s of daemon CPU*: its CPU time (all threads) over the same span; *others % core*
as in bench/scale.py; *harness-bound* when this process was on a CPU for more than 85 %
of the span.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.scale import _VALUE, HARNESS_BOUND, DaemonProcess, Sim, _phase
from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m

STAGES = 4  # as bench/graph_scale.py
FAN = 4


def tree(nodes: int) -> tuple[list[list[int]], list[int], list[int]]:
    """(each node's dependencies, each node's own value, the requested nodes): dependency order."""
    leaves = max(2, nodes // 2)
    deps: list[list[int]] = [[] for _ in range(leaves)]
    values = list(range(leaves))
    level = list(range(leaves))
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level), 2):
            deps.append(level[j : j + 2])
            values.append(0)
            nxt.append(len(deps) - 1)
        level = nxt
    return deps, values, level


def shuffle(nodes: int) -> tuple[list[list[int]], list[int], list[int]]:
    n = max(FAN, nodes // (STAGES + 1))
    digits = 1
    while FAN**digits < n:
        digits += 1
    deps: list[list[int]] = [[] for _ in range(n)]
    values = list(range(n))
    layer = list(range(n))
    for s in range(STAGES):
        stride = FAN ** (s % digits)
        nxt = []
        for i in range(n):
            deps.append(sorted({layer[(i + v * stride) % n] for v in range(FAN)}))
            values.append(0)
            nxt.append(len(deps) - 1)
        layer = nxt
    return deps, values, layer


SHAPES = {"tree": tree, "shuffle": shuffle}


def evaluate(deps: list[list[int]], values: list[int]) -> list[int]:
    out: list[int] = []
    for i, own in enumerate(values):
        out.append(own + sum(out[d] for d in deps[i]))
    return out


def parse(text: str) -> list[tuple[str, int]]:
    cells = []
    for item in text.split(","):
        shape, _, size = item.partition(":")
        if shape not in SHAPES or not size.isdigit() or int(size) < 4:
            raise SystemExit(f"scale.py: bad --graph cell {item!r}; use SHAPE:NODES with SHAPE tree or shuffle, NODES >= 4")
        cells.append((shape, int(size)))
    return cells


def run_graph(shape: str, nodes: int, workers: int, processors: int, workdir: str, prefix: list[str] | None = None,
              duration: Any = None, timeout: float = 600.0) -> dict[str, Any]:
    """One graph through a fresh daemon and ``workers`` simulated workers; a row of figures
    and the harness's checks (all 0 when right: ``dispatched_more_than_once``,
    ``never_dispatched``, ``dep_errors``, ``values_wrong``, ``results_missing``)."""
    prefix = [] if prefix is None else prefix
    deps, own, wanted = SHAPES[shape](nodes)
    count = len(deps)
    address = f"ipc://{workdir}/daemon.sock"
    daemon = DaemonProcess(address, [], prefix, os.path.join(workdir, "daemon.log"))
    sim = Sim(address, max_peers=workers + 2, **({"duration": duration} if duration is not None else {}))
    sim.stamped = False
    row: dict[str, Any] = {"shape": shape, "nodes": count, "edges": sum(len(d) for d in deps),
                           "workers": workers, "processors": processors}
    try:
        client = sim.add(m.Role.CLIENT)
        for _ in range(workers):
            sim.add(m.Role.WORKER, processors)
        sim.run_until(lambda: all(p.welcomed for p in sim.peers), timeout, "the peers' Welcome")
        base = client.peer_id << m.TASK_ID_BITS
        fn_id = base | 1
        ids = [base | (i + 2) for i in range(count)]
        requested = set(wanted)
        specs = []
        for i in range(count):
            dep_ids = [ids[d] for d in deps[i]]
            if dep_ids:
                sim.deps_of[ids[i]] = dep_ids
            flags = 0 if i in requested else m.TaskFlags.NO_RESULT
            specs.append(m.TaskSpec(ids[i], fn_id, 0, flags, _VALUE.pack(own[i]), dep_ids, [], 0))
        values = evaluate(deps, own)
        sim.expected = {ids[i]: values[i] for i in wanted}
        frames = codec.encode([m.RegisterFunction(fn_id, b"evaluate: a simulated graph's node function"),
                               m.SubmitTasks(specs)])
        del specs
        client.outstanding = len(wanted)

        def body() -> None:
            client.frames.append(frames)
            sim.run_until(lambda: client.outstanding == 0, timeout, f"the {shape} graph's results")

        span = _phase(sim, daemon, body)
        row["nodes_per_s"] = count / span["wall"]
        row["daemon_us_per_node"] = 1e6 * span["daemon_cpu"] / count
        row["nodes_per_daemon_cpu_s"] = count / max(span["daemon_cpu"], 1e-9)
        row["daemon_core_pct"] = 100 * span["daemon_cpu"] / span["wall"]
        row["others_on_core_pct"] = 100 * span["others"]
        row["harness_bound"] = span["harness_cpu"] / span["wall"] > HARNESS_BOUND
        row["wall_s"] = span["wall"]
        row["dispatched_more_than_once"] = sum(1 for n in sim.dispatched.values() if n > 1)
        row["never_dispatched"] = count - len(sim.dispatched)
        row["dep_errors"] = sim.dep_errors
        row["values_wrong"] = sim.values_wrong
        row["results_missing"] = len(wanted) - len(sim.result_ids)
        row["results_duplicated"] = sum(1 for n in sim.result_ids.values() if n > 1)
        row["results_to_wrong_client"] = sim.wrong_client
        stats = sim.request_stats()
        row["daemon_finished"] = int(stats.get("finished", -1))
        row["daemon_tasks_left"] = int(stats.get("tasks", -1))
    finally:
        sim.close()
        daemon.stop()
    row["at"] = time.strftime("%H:%M:%S")
    return row


GRAPH_COLUMNS = [
    ("shape", "shape", "{}"), ("nodes", "nodes", "{:,}"), ("edges", "edges", "{:,}"), ("workers", "W", "{}"),
    ("processors", "P", "{}"), ("nodes_per_s", "nodes/s", "{:,.0f}"), ("daemon_us_per_node", "daemon µs/node", "{:.1f}"),
    ("nodes_per_daemon_cpu_s", "nodes/s of daemon CPU", "{:,.0f}"), ("daemon_core_pct", "daemon % core", "{:.0f}"),
    ("others_on_core_pct", "others % core", "{:.0f}"), ("harness_bound", "harness-bound", "{}"), ("repeat", "run", "{}"),
]
