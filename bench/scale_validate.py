"""Is the scale harness's daemon the real one's?  Its CPU per task under simulated and real workers.

The issue's check before any of bench/scale.py's figures count: at 10 workers, the daemon's
CPU per task under the harness is within 15 % of what it is under real ``scaler-worker``
processes.  A script, not a test::

    PYTHONPATH=. chrt -r 1 python bench/scale_validate.py --rounds 4 --tasks 20000

Each round starts a fresh daemon per mode (``--workers 0``, pinned with ``taskset`` to the
first CPU, as in bench/scale.py) and offers it the same workload from the same simulated
client (bench/scale.py's ``Sim``: one client keeping ``--window`` tasks outstanding; each task
an inline no-op, ``cloudpickle.dumps((int, (), {}))``, that a real processor runs), with

* ``real``: ``--workers`` ``scaler-worker --processors 1`` processes, pinned with the client
  to the other CPU;
* ``sim``: as many simulated workers of 1 processor in the client's process, sending what
  real workers send (task facts with each result, a heartbeat every interval beside results,
  results held back while saturated), dealing to their processors as the agent does
  (bench/scale_worker.py), but answering at once: every simulated peer in lockstep;
* ``sim-core``: as ``sim``, but every wake-up (a processor's per top-up of tasks, the
  client's before it submits more) is CPU time on one simulated core, served in turn
  (``Sim.shared_core``), as the real workers' and the client's processes share one core;
  the time per wake-up is tuned during the warm-up (up to ``PACE_ROUNDS`` warm-ups) until a
  simulated worker takes what a real one took per task in the last real run;
* ``sim-paced``: as ``sim-core``, but each peer's wake-up is its own, drawn from an
  exponential distribution (tuned the same way): peers on cores of their own, at the rate
  of the real ones;
* ``sim-bare`` (with ``--bare``): the harness's first simulated workers (no facts, heartbeats
  only after silence), to show what faithfulness changed.

``--tap`` runs each daemon under bench/scale_tap.py and adds, per run, what the daemon
received and sent per task (messages and transmissions by type, batch sizes by powers of
two) over the measured tasks: the way to see why two modes cost the daemon differently
(the tap costs CPU of its own, so compare tapped runs' counts, not their CPU).

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
import random
import signal
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
TOPUP = 7  # tasks a processor is topped up with (worker/dealing.py MAX_DEPTH - REFILL_AT): the first guess
PACE_ROUNDS = 6  # warm-ups at most, tuning the wake-up
PACE_TOLERANCE = 0.05


def _workers_connected(sim: Sim) -> int:
    return int(sim.request_stats()["workers"])


def _tap_snapshot(daemon: DaemonProcess, path: str, sim: Sim) -> dict[str, int]:
    """The tap's counts so far (bench/scale_tap.py: SIGUSR1 appends them to ``path``)."""
    lines = 0
    if os.path.exists(path):
        with open(path) as f:
            lines = sum(1 for _ in f)
    daemon.proc.send_signal(signal.SIGUSR1)
    sim.request_stats()  # a turn of the daemon's after the signal, so the line is written
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                rows = f.read().splitlines()
            if len(rows) > lines and rows[-1].endswith("}"):
                return dict(json.loads(rows[-1]))
        time.sleep(0.01)
    raise TimeoutError("scale_validate.py: the daemon's tap wrote no counts")


def run_once(mode: str, *, workers: int, tasks: int, warm: int, window: int, workdir: str,
             prefix: list[str], worker_cpus: str, pace: float = 0.0, shared_core: bool = False,
             tap: bool = False) -> dict[str, Any]:
    """One run; ``pace``: the time per task per worker the simulated peers' wake-ups are
    tuned to during the warm-up (0: none, answered at once); ``shared_core``: the wake-ups
    are served in turn (Sim.shared_core); ``tap``: the daemon counts what it receives and
    sends (bench/scale_tap.py), per task."""
    address = f"ipc://{workdir}/daemon.sock"
    tap_path = os.path.join(workdir, "tap.jsonl") if tap else ""
    daemon = DaemonProcess(address, [], prefix, os.path.join(workdir, f"daemon-{mode}.log"), tap=tap_path)
    # Paced: every simulated peer reacts after a wake-up drawn from one exponential
    # distribution, as processes the OS schedules on a busy core do: a processor per top-up
    # of tasks (bench/scale_worker.py), the client after results came.  Its mean is tuned in
    # the warm-up until a simulated worker takes ``pace`` per task, as a real one did.
    mean = [TOPUP * pace / (workers if shared_core else 1)]  # a shared core serves every worker's top-ups
    if not pace:
        wake = lambda: 0.0  # noqa: E731
    elif shared_core:  # CPU work of one kind, served in turn: about as long each time
        wake = lambda: mean[0]  # noqa: E731
    else:
        wake = lambda: random.expovariate(1 / mean[0])  # noqa: E731
    sim = Sim(address, window=window, payload=NOOP, faithful=(mode != "sim-bare"), max_peers=workers + 8,
              wake=wake, client_wake=wake if pace else None)
    sim.shared_core = shared_core
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
        tuning = []
        for _ in range(PACE_ROUNDS if pace else 1):
            client.quota = warm
            turns0 = int(sim.request_stats()["turns"]) if pace else 0
            t0 = time.monotonic()
            sim.run_until(lambda: client.quota == 0 and client.outstanding == 0, 300, "the warm-up")
            took = workers * (time.monotonic() - t0) / warm
            if not pace:
                break
            turns = (int(sim.request_stats()["turns"]) - turns0 - 1) / warm  # less the stats request's own
            tuning.append((round(1e3 * mean[0], 3), round(1e3 * took, 3), round(turns, 4)))
            if abs(took / pace - 1) < PACE_TOLERANCE:
                break
            mean[0] *= min(4.0, max(0.25, pace / took))
        counts0 = _tap_snapshot(daemon, tap_path, sim) if tap else {}
        stats0 = sim.request_stats()
        client.quota = tasks
        load = _phase(sim, daemon, lambda: sim.run_until(
            lambda: client.quota == 0 and client.outstanding == 0, 600, "the measured tasks"))
        stats1 = sim.request_stats()
        counts1 = _tap_snapshot(daemon, tap_path, sim) if tap else {}
        finished = int(stats1["finished"]) - int(stats0["finished"])
        return {
            "mode": mode,
            "pace_ms": 1e3 * pace if pace else None,
            "wake_ms": 1e3 * mean[0] if pace else None,  # the tuned mean wake-up
            "tuning": tuning if pace else None,  # (wake ms, ms per task per worker, turns per task) per warm-up
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
            **({"per_task": {k: round((n - counts0.get(k, 0)) / tasks, 4) for k, n in sorted(counts1.items())
                             if n != counts0.get(k, 0)}} if tap else {}),
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
    p.add_argument("--tap", action="store_true",
                   help="count what the daemon receives and sends per task (bench/scale_tap.py; costs the daemon CPU "
                        "of its own: compare counts, not CPU, of tapped runs)")
    p.add_argument("--modes", default="", help="comma-separated modes to run (default: real, sim-core, sim-paced, sim "
                   "and the flags' ones)")
    p.add_argument("--json", help="append each run as a JSON line to this file")
    args = p.parse_args(argv)
    raise_nofile()
    prefix, pinned = pin()
    worker_cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))) if pinned else ""
    print(f"# daemon {'pinned: ' + ' '.join(prefix) if pinned else 'NOT pinned'}; client and workers on CPUs "
          f"{worker_cpus or 'any'}; load average {os.getloadavg()[0]:.2f}", flush=True)
    modes = ["real", "sim-core", "sim-paced", "sim", *(["sim-bare"] if args.bare else [])]
    if args.modes:
        modes = args.modes.split(",")
    rows: list[dict[str, Any]] = []
    per_task = 0.0  # a real worker's time per task, from the last real run
    if "sim-paced" in modes or "sim-core" in modes:
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
                               pace=per_task if mode.startswith("sim-") and mode != "sim-bare" else 0.0,
                               shared_core=mode == "sim-core", tap=args.tap)
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
        ratio = f"  ({medians[mode] / medians['real']:.3f} of real)" if "real" in medians else ""
        print(f"{mode:9s} median {medians[mode]:6.1f} µs CPU/task{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
