"""The Slurm adapter on a real Slurm: how fast sbatch'd workers serve, and how few calls it makes.

    PYTHONPATH=. python bench/slurm.py                    # root; starts .ci/slurm if it is not up
    PYTHONPATH=. python bench/slurm.py --rounds 3 --steady-seconds 60 --poll-interval 5

Each round starts a ``scaler-daemon --security DIR --workers 0`` on a free loopback port and a
``SlurmAdapter`` polled every 0.1 s (as a manager's loop would), then measures:

* burst → first tasks: from ``request`` of 4 workers (sbatch) to the first wave of 4 short
  (0.2 s) tasks done (on however many workers had joined);
* burst → 4 jobs served: until each of the 4 jobs has run a task, in waves of 4;
* steady state with 8 jobs running: Slurm commands run per minute (by command) over
  ``--steady-seconds``; one ``squeue`` per ``--poll-interval`` is the design.

``--drain`` adds one walltime case (about 1-2 minutes): a worker whose job has
``--slurm-time 1`` and a 50 s drain serves a stream of 1 s tasks (each notes its run in a
file); when the adapter reports it draining, one replacement job without a time limit is
requested, as the manager's daemon would ask; the stream goes on until the short job is
gone. Reported: futures failed (goal 0), tasks rerun, and how the short job ended.

The node's CPU count (``SLURM_CI_CPUS``, 8 by default in .ci/slurm) must allow 8 one-CPU jobs.
Figures vary with whatever else the machine runs: repeat and report the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from scaler_executor import ClusterConfig, ScalerExecutor
from scaler_executor.manager.adapter import (
    AdapterSetup,
    WorkerLaunch,
    WorkerState,
    WorkerTemplate,
    cluster_id,
)
from scaler_executor.manager.slurm import SlurmAdapter, SlurmOptions
from scaler_executor.security.keys import SecurityDir, load_credential

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT = ClusterConfig(daemon_loss_timeout=60.0)


def which_job(seconds: float) -> str:
    """Hold a processor for ``seconds``; say which Slurm job ran it."""
    time.sleep(seconds)
    return os.environ.get("SLURM_JOB_ID", "")


def noted(directory: str, index: int, seconds: float) -> str:
    """Note this run of task ``index`` (one file per run), hold a processor, say the job."""
    job = os.environ.get("SLURM_JOB_ID", "")
    with open(os.path.join(directory, f"{index}-{job}-{os.getpid()}-{time.time_ns()}"), "w"):
        pass
    time.sleep(seconds)
    return job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(poll_interval: float, steady_seconds: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="scaler-slurm-bench-") as tmp:
        keys = SecurityDir.init(os.path.join(tmp, "keys"))
        client_key = os.path.join(tmp, "client.cred")
        keys.issue("client", "client", client_key)
        launches = []
        prefix = f"bench-{os.getpid()}-{int(time.time())}-"
        address = f"tcp://127.0.0.1:{free_port()}"
        for i in range(8):
            path = os.path.join(tmp, f"w{i}.cred")
            keys.issue(f"{prefix}{i}", "worker", path)
            launches.append(WorkerLaunch(f"{prefix}{i}", address, load_credential(path)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
        env["PYTHONPATH"] = REPO
        daemon = subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address,
             "--security", keys.path, "--workers", "0", "--log-level", "WARNING"],
            env=env,
        )  # fmt: skip
        daemon_key = load_credential(client_key).daemon_public_key
        setup = AdapterSetup(prefix, 8, WorkerTemplate(processors=1), cluster_id(address, daemon_key))
        options = SlurmOptions(
            log_dir=os.path.join(tmp, "logs"), poll_interval=poll_interval, environment=env
        )
        adapter = SlurmAdapter(setup, options)
        try:
            states: dict[str, WorkerState] = {}
            with ScalerExecutor(address=address, credentials=client_key, config=CLIENT) as ex:
                t0 = time.monotonic()
                adapter.request(launches[:4])
                first = busy = 0.0
                jobs: set[str] = set()
                while len(jobs) < 4:  # waves of 4 short tasks until 4 jobs have each run one
                    futures = [ex.submit(which_job, 0.2) for _ in range(4)]
                    while not all(f.done() for f in futures):
                        states.update((r.name, r.state) for r in adapter.poll())
                        time.sleep(0.05)
                    if not first:
                        first = time.monotonic() - t0
                    jobs |= {f.result() for f in futures}
                busy = time.monotonic() - t0
                adapter.request(launches[4:])
                while sum(s is WorkerState.RUNNING for s in states.values()) < 8:
                    states.update((r.name, r.state) for r in adapter.poll())
                    time.sleep(0.1)
                before = dict(adapter.calls)
                t1 = time.monotonic()
                while time.monotonic() - t1 < steady_seconds:
                    states.update((r.name, r.state) for r in adapter.poll())
                    time.sleep(0.1)
                minutes = (time.monotonic() - t1) / 60
                per_minute = {
                    k: round((v - before.get(k, 0)) / minutes, 1)
                    for k, v in adapter.calls.items()
                    if v != before.get(k, 0)
                }
            return {
                "burst_to_first_wave_s": round(first, 2),
                "burst_to_4_jobs_served_s": round(busy, 2),
                "steady_calls_per_minute_8_jobs": per_minute,
            }
        finally:
            adapter.shutdown()
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)


def drain_round(poll_interval: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="scaler-slurm-bench-") as tmp:
        keys = SecurityDir.init(os.path.join(tmp, "keys"))
        client_key = os.path.join(tmp, "client.cred")
        keys.issue("client", "client", client_key)
        runs = os.path.join(tmp, "runs")
        os.mkdir(runs)
        address = f"tcp://127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
        env["PYTHONPATH"] = REPO
        stamp = f"{os.getpid()}-{int(time.time())}"
        launch = {}
        for kind in ("short", "steady"):
            name = f"bench-{kind}-{stamp}-0"
            path = os.path.join(tmp, f"{kind}.cred")
            keys.issue(name, "worker", path)
            launch[kind] = WorkerLaunch(name, address, load_credential(path))
        daemon = subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address,
             "--security", keys.path, "--workers", "0", "--log-level", "WARNING"],
            env=env,
        )  # fmt: skip
        cluster = cluster_id(address, load_credential(client_key).daemon_public_key)
        log_dir = os.path.join(tmp, "logs")
        short = SlurmAdapter(
            AdapterSetup(f"bench-short-{stamp}-", 1, WorkerTemplate(processors=1), cluster),
            SlurmOptions(log_dir=log_dir, poll_interval=poll_interval, environment=env,
                         time_limit="1", drain_seconds=50),
        )  # fmt: skip
        steady = SlurmAdapter(
            AdapterSetup(f"bench-steady-{stamp}-", 1, WorkerTemplate(processors=1), cluster),
            SlurmOptions(log_dir=log_dir, poll_interval=poll_interval, environment=env),
        )
        try:
            with ScalerExecutor(address=address, credentials=client_key, config=CLIENT) as ex:
                t0 = time.monotonic()
                short.request([launch["short"]])
                futures = []
                gone = None
                replaced = 0.0
                while gone is None:
                    if time.monotonic() - t0 > 300:
                        raise RuntimeError("the short job did not end within 300 s")
                    for report in short.poll():
                        if report.state is WorkerState.DRAINING and not replaced:
                            replaced = time.monotonic() - t0
                            steady.request([launch["steady"]])
                        elif report.state is WorkerState.GONE:
                            gone = report
                    steady.poll()
                    if sum(not f.done() for f in futures) < 2:  # a stream: always one waiting
                        futures.append(ex.submit(noted, runs, len(futures), 1.0))
                    time.sleep(0.05)
                failed = []
                for f in futures:
                    exc = f.exception(timeout=120)  # counted, not raised: the figure is how many
                    if exc is not None:
                        failed.append(f"{type(exc).__name__}: {exc}"[:200])
                ran = os.listdir(runs)
            indices = [name.split("-", 1)[0] for name in ran]
            jobs_of: dict[str, list[str]] = {}
            for name in sorted(ran, key=lambda n: int(n.rsplit("-", 1)[1])):  # by start time
                index, job = name.split("-")[:2]
                jobs_of.setdefault(index, []).append(job)
            return {
                "drain_tasks": len(futures),
                "drain_futures_failed": len(failed),
                "drain_tasks_rerun": len(indices) - len(set(indices)),
                "drain_reruns": {i: j for i, j in jobs_of.items() if len(j) > 1},  # task: its jobs
                "drain_failures": failed[:3],
                "drain_replacement_asked_s": round(replaced, 1),
                "drain_short_job_ended_s": round(time.monotonic() - t0, 1),
                "drain_short_job_end": gone.reason,
            }
        finally:
            short.shutdown()
            steady.shutdown()
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--poll-interval", type=float, default=5.0, help="the adapter's squeue interval (default 5)"
    )
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument(
        "--drain", action="store_true", help="also run the walltime-drain case (1-2 minutes)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))  # run the finally blocks
    script = os.path.join(REPO, ".ci", "slurm")
    started = subprocess.run([script, "status"]).returncode != 0
    if started:
        subprocess.run([script, "start"], check=True)
    try:
        for i in range(args.rounds):
            print(
                json.dumps({"round": i, **one_round(args.poll_interval, args.steady_seconds)}),
                flush=True,
            )
        if args.drain:
            print(json.dumps({"drain": drain_round(args.poll_interval)}), flush=True)
    finally:
        if started:
            subprocess.run([script, "stop"], check=True)


if __name__ == "__main__":
    main()
