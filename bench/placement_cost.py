"""What a dispatch costs the daemon's core with 1,000 workers and N constraint keys it cannot serve.

A micro-benchmark of the pure core (``Scheduler.handle``; no sockets, no codec), to A/B two
checkouts of the library side by side::

    PYTHONPATH=. python bench/placement_cost.py --trees /work/main,. --stuck 0,10,100,1000 --rounds 3

For each round, each N and each tree (alternated; the tree order reverses every round),
a fresh interpreter with ``PYTHONPATH`` set to that tree builds a core with ``--workers``
workers (4 processors, tag ``cpu``), one client, N queued tasks each needing a tag no
worker has plus a distinct ``mem`` quantity (N *stuck* keys, none servable), and a
backlog of plain tasks that fills every worker's window.  Then ``--steps`` times: one worker
returns its oldest task (a ``TaskResults`` of one result) and the core dispatches it a
plain task in the same ``handle`` call; the figure is the median and mean wall time of that
call (``perf_counter``), i.e. a result's bookkeeping plus one dispatch pass.  A second
scenario, ``--scenario busy``, makes the stuck keys servable in principle (each worker
declares ``gpu=1``, each stuck task needs ``gpu=1``) while long-running gpu tasks hold every
worker's gpu: a freed slot does not free a gpu.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def cell(workers: int, stuck: int, steps: int, scenario: str) -> dict[str, Any]:
    import cloudpickle  # type: ignore[import-untyped]

    from scaler_executor._compat import python_version
    from scaler_executor._version import __version__
    from scaler_executor.config import ClusterConfig
    from scaler_executor.protocol import messages as m
    from scaler_executor.scheduler.core import Received, Scheduler

    def hello(role: str, name: str, capacity: int = 0, resources: dict[str, float] | None = None,
              tags: list[str] | None = None) -> m.Hello:
        return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__, name, 1,
                       "host", capacity, resources or {}, tags or [])

    core = Scheduler(ClusterConfig(heartbeat_interval=1000.0, daemon_loss_timeout=5000.0, client_timeout=10_000.0, max_prefetch=1))
    now = 1.0
    core.handle(Received(b"c", [hello(m.Role.CLIENT, "c")], now))
    client_id = core.clients[b"c"].client_id
    number = 0

    def tid() -> int:
        nonlocal number
        number += 1
        return client_id << m.TASK_ID_BITS | number

    gpu = {"gpu": 1.0, "mem": 1e6} if scenario == "busy" else {}
    peers = [b"w%d" % i for i in range(workers)]
    for peer in peers:
        core.handle(Received(peer, [hello(m.Role.WORKER, peer.decode(), 4, gpu, ["cpu"])], now))
    messages: list[Any] = []
    specs = []
    if scenario == "busy":  # one long gpu task on every worker first: every gpu held
        messages.append(m.RegisterOptions(1, m.TaskOptions({"gpu": 1.0}, [], 0, None, None)))
        specs += [m.TaskSpec(tid(), 0, 1, m.TaskFlags.INLINE_FN, b"x", [], [], 0) for _ in peers]
        core.handle(Received(b"c", [*messages, m.SubmitTasks(specs)], now))
        messages, specs = [], []
    for i in range(stuck):
        if scenario == "busy":
            options = m.TaskOptions({"gpu": 1.0, "mem": float(i + 1)}, [], 0, None, None)
        else:
            options = m.TaskOptions({"mem": float(i + 1)}, ["nowhere"], 0, None, None)
        messages.append(m.RegisterOptions(i + 2, options))
        specs.append(m.TaskSpec(tid(), 0, i + 2, m.TaskFlags.INLINE_FN, b"x", [], [], 0))
    backlog = workers * 8 + steps  # every window full, and a plain task for every step
    specs += [m.TaskSpec(tid(), 0, 0, m.TaskFlags.INLINE_FN, b"x", [], [], 0) for _ in range(backlog)]
    core.handle(Received(b"c", [*messages, m.SubmitTasks(specs)], now))
    held = {peer: [t for t in core.workers[peer].inflight if core.tasks[t].queue_key is None] for peer in peers}
    timings = []
    for step in range(steps):
        peer = peers[step % workers]
        task_id = held[peer].pop(0)
        event = Received(peer, [m.TaskResults([m.TaskResult(task_id, 0, m.Status.OK, b"r", m.TaskFacts("w", 1.0, 1.5, 0), [])])], now)
        t0 = time.perf_counter()
        core.handle(event)
        timings.append(time.perf_counter() - t0)
        held[peer] = [t for t in core.workers[peer].inflight if core.tasks[t].queue_key is None]
        now += 0.0001
    assert sum(1 for t in core.tasks.values() if t.queue_key is not None and t.worker is None) == stuck
    return {"median_us": 1e6 * statistics.median(timings), "mean_us": 1e6 * statistics.fmean(timings)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default=".", help="comma-separated checkouts to A/B (each put first on PYTHONPATH)")
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--stuck", default="0,10,100,1000", help="comma-separated numbers of stuck keys")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scenario", choices=("nowhere", "busy"), default="nowhere")
    p.add_argument("--cell", nargs=2, type=int, metavar=("WORKERS", "STUCK"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(cell(args.cell[0], args.cell[1], args.steps, args.scenario)))
        return 0
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    here = os.path.abspath(__file__)
    results: dict[tuple[str, int], list[float]] = {}
    print(f"# load average {os.getloadavg()[0]:.2f}; {args.workers} workers; scenario {args.scenario}", flush=True)
    for rnd in range(args.rounds):
        for n in (int(x) for x in args.stuck.split(",")):
            for tree in trees if rnd % 2 == 0 else trees[::-1]:
                env = dict(os.environ, PYTHONPATH=tree)
                out = subprocess.run(
                    [sys.executable, here, "--cell", str(args.workers), str(n), "--steps", str(args.steps),
                     "--scenario", args.scenario],
                    env=env, capture_output=True, text=True, check=True, cwd=tree,
                ).stdout
                row = json.loads(out.strip().splitlines()[-1])
                results.setdefault((tree, n), []).append(row["median_us"])
                print(json.dumps({"round": rnd, "tree": tree, "stuck": n, **{k: round(v, 1) for k, v in row.items()},
                                  "loadavg": os.getloadavg()[0]}), flush=True)
    for (tree, n), values in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{tree:30s} stuck={n:5d}  median of medians {statistics.median(values):8.1f} µs per result+dispatch  "
              f"({', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
