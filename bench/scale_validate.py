"""Is the scale harness's daemon the real one's?  Its CPU per task under simulated and real workers.

The issue's check before any of bench/scale.py's figures count: at 10 workers, the daemon's
CPU per task under the harness is within 15 % of what it is under real ``scaler-worker``
processes.  A script, not a test::

    PYTHONPATH=. python bench/scale_validate.py --rounds 4 --tasks 20000

Each round starts a fresh daemon per mode (``--workers 0``, pinned with ``taskset`` to the
first CPU, as in bench/scale.py) and offers it the same workload from the same simulated
client (bench/scale.py's ``Sim``: one client keeping ``--window`` tasks outstanding; each task
an inline no-op, ``cloudpickle.dumps((int, (), {}))``, that a real processor runs), with

* ``real``: ``--workers`` ``scaler-worker --processors 1`` processes, pinned with the client
  to the other CPU;
* ``sim``: as many simulated workers of 1 processor in the client's process, sending what
  real workers send (task facts with each result, a heartbeat every interval beside results);
* ``sim-matched`` (with ``--matched``): as ``sim``, but each simulated worker takes as long per
  task as a real one did in the last real run (``Sim``'s ``service``: the agent → processor →
  agent time a real worker spends beyond the task's own run; its facts still report a no-op),
  so the daemon sees the same rate and batches as with real workers;
* ``sim-bare`` (with ``--bare``): the harness's first simulated workers (no facts, heartbeats
  only after silence), to show what faithfulness changed.

The modes' order rotates every round (A/B alternation on a shared machine).  After the
workers join, ``--warm`` tasks run unmeasured; then the daemon's CPU
(``/proc/PID/task/*/schedstat``) over ``--tasks`` tasks ÷ tasks is the figure.  Printed:
each run (with the daemon's turns over it, and tasks that failed: 0 when right), then per
mode the median and its ratio to ``real``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import cloudpickle  # type: ignore[import-untyped]

from bench.scale import DaemonProcess, Sim, _phase, pin, raise_nofile
from scaler_executor.protocol import messages as m

NOOP = cloudpickle.dumps((int, (), {}))  # what a real processor runs: int() -> 0


def _workers_connected(sim: Sim) -> int:
    return int(sim.request_stats()["workers"])


def run_once(mode: str, *, workers: int, tasks: int, warm: int, window: int, workdir: str,
             prefix: list[str], worker_cpus: str, service: float = 0.0) -> dict[str, Any]:
    """One run; ``service``: a simulated worker's own time per task (0: answered at once)."""
    address = f"ipc://{workdir}/daemon.sock"
    daemon = DaemonProcess(address, [], prefix, os.path.join(workdir, f"daemon-{mode}.log"))
    sim = Sim(address, window=window, payload=NOOP, faithful=(mode != "sim-bare"), max_peers=workers + 8,
              service=service)
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        sim.add(m.Role.CLIENT)
        sim.run_until(lambda: all(c.welcomed for c in sim.clients), 60, "the client's Welcome")
        if mode == "real":
            taskset = ["taskset", "-c", worker_cpus] if worker_cpus else []
            for i in range(workers):
                log = open(os.path.join(workdir, f"worker{i}.log"), "wb")  # noqa: SIM115  # closed below
                logs.append(log)
                procs.append(subprocess.Popen(
                    [*taskset, sys.executable, "-m", "scaler_executor.cli.worker", address, "--processors", "1",
                     "--name", f"real-{i}"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                ))
        else:
            for _ in range(workers):
                sim.add(m.Role.WORKER, 1)
        deadline = time.monotonic() + 120
        while _workers_connected(sim) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"scale_validate.py: {workers} {mode} workers did not join within 120 s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"scale_validate.py: a real worker exited; see {workdir}/worker*.log")
            end = time.monotonic() + 0.2
            sim.run_until(lambda end=end: time.monotonic() >= end, 60, "a pause")  # type: ignore[misc]
        client = sim.clients[0]
        client.quota = warm
        sim.run_until(lambda: client.quota == 0 and client.outstanding == 0, 300, "the warm-up")
        stats0 = sim.request_stats()
        client.quota = tasks
        load = _phase(sim, daemon, lambda: sim.run_until(
            lambda: client.quota == 0 and client.outstanding == 0, 600, "the measured tasks"))
        stats1 = sim.request_stats()
        finished = int(stats1["finished"]) - int(stats0["finished"])
        return {
            "mode": mode,
            "sim_service_ms": 1e3 * service if mode != "real" else None,
            # what one real (or simulated) worker took per task, queueing at the daemon included
            "ms_per_task_per_worker": 1e3 * workers * load["wall"] / tasks,
            "us_per_task": 1e6 * load["daemon_cpu"] / tasks,
            "tasks_per_s": tasks / load["wall"],
            "daemon_core_pct": 100 * load["daemon_cpu"] / load["wall"],
            "others_on_core_pct": 100 * load["others"],
            "harness_core_pct": 100 * load["harness_cpu"] / load["wall"],
            "turns": int(stats1["turns"]) - int(stats0["turns"]),
            "finished": finished,
            "failed": int(stats1.get("failed", 0)) - int(stats0.get("failed", 0)),
        }
    finally:
        sim.close()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        daemon.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=10)
    p.add_argument("--tasks", type=int, default=20_000, help="measured tasks per run")
    p.add_argument("--warm", type=int, default=2_000, help="unmeasured tasks first, per run")
    p.add_argument("--window", type=int, default=100, help="tasks the client keeps outstanding")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--bare", action="store_true", help="also the harness's first simulated workers (sim-bare)")
    p.add_argument("--matched", action="store_true",
                   help="also sim-matched: simulated workers that take what a real worker took per task in the "
                        "last real run (workers * wall / tasks) as their own time per task (Sim's service; the "
                        "facts still report a no-op's run), so the daemon sees the same rate")
    p.add_argument("--json", help="append each run as a JSON line to this file")
    args = p.parse_args(argv)
    raise_nofile()
    prefix, pinned = pin()
    worker_cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))) if pinned else ""
    print(f"# daemon {'pinned: ' + ' '.join(prefix) if pinned else 'NOT pinned'}; client and workers on CPUs "
          f"{worker_cpus or 'any'}; load average {os.getloadavg()[0]:.2f}", flush=True)
    modes = ["real", "sim", *(["sim-bare"] if args.bare else []), *(["sim-matched"] if args.matched else [])]
    rows: list[dict[str, Any]] = []
    per_task = 0.0  # a real worker's time per task, from the last real run
    if args.matched:
        with tempfile.TemporaryDirectory(prefix="scale-validate-") as workdir:
            calib = run_once("real", workers=args.workers, tasks=args.tasks // 4, warm=args.warm, window=args.window,
                             workdir=workdir, prefix=prefix, worker_cpus=worker_cpus)
        per_task = calib["ms_per_task_per_worker"] / 1e3
        print(f"# calibration (unmeasured): a real worker took {1e3 * per_task:.3f} ms per task", flush=True)
    for rnd in range(args.rounds):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        for mode in order:
            with tempfile.TemporaryDirectory(prefix="scale-validate-") as workdir:
                row = run_once(mode, workers=args.workers, tasks=args.tasks, warm=args.warm, window=args.window,
                               workdir=workdir, prefix=prefix, worker_cpus=worker_cpus,
                               service=per_task if mode == "sim-matched" else 0.0)
            if mode == "real":
                per_task = row["ms_per_task_per_worker"] / 1e3
            row["round"] = rnd
            row["loadavg"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    medians = {mode: statistics.median(r["us_per_task"] for r in rows if r["mode"] == mode) for mode in modes}
    for mode in modes:
        ratio = medians[mode] / medians["real"]
        print(f"{mode:9s} median {medians[mode]:6.1f} µs CPU/task  ({ratio:.3f} of real)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
