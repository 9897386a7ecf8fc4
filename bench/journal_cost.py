"""What the daemon's journal costs, and how fast a daemon restarted on it resumes.

::

    PYTHONPATH=. python bench/journal_cost.py [--reps 5] [--tasks 20000] [--trips 300]
                                              [--in-flight 100000] [--dir DIR]

1. **Cost** (A/B alternated in one run, as bench/ab.py does): an embedded cluster of two
   processors without a journal and with one under each fsync policy (``turn``,
   ``interval``, ``os``), the order rotated every repetition so that a drift of the shared
   machine falls on all.  Measured per configuration: no-op throughput (``submit`` of
   ``--tasks`` no-op tasks, then ``wait``) and the round trip of one task
   (``submit(...).result()`` in a loop, median).  Without a journal the embedded cluster
   sends a sequential caller's tasks down a worker lane and takes their results straight
   from the processor; under a journal every task goes through the daemon (it must write
   it), so the baseline is also shown without lanes (``worker_lanes=False``: results still
   come straight from the processor) and without either fast path ("no fast paths": the
   client binds no reply inbox, ``client/agent.py``'s ``REPLY_INBOX`` switch, so every task
   takes the path a journaled one takes: client -> daemon -> worker -> daemon -> client).
2. **Restart to resume**: a standalone daemon with a journal and two workers, a client with
   ``--in-flight`` tasks in flight; the daemon is SIGKILLed and started again on the journal.
   Reported: the journal's load and restore in the new daemon (from its start to its first
   result delivered), and from the restart until the client's futures complete again.

Results are medians over the repetitions, with the ratio to the baseline; the machine's
load average is printed before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, wait

from bench.ab import t95
from scaler_executor import ScalerExecutor
from scaler_executor.config import ClusterConfig


def noop(x: int) -> int:
    return x


def sleepy(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x


def measure(config: ClusterConfig, journal: str | None, tasks: int, trips: int, inbox: bool = True) -> tuple[float, float]:
    from scaler_executor.client import agent

    was, agent.REPLY_INBOX = agent.REPLY_INBOX, inbox  # read when the agent starts
    try:
        return _measure(config, journal, tasks, trips)
    finally:
        agent.REPLY_INBOX = was


def _measure(config: ClusterConfig, journal: str | None, tasks: int, trips: int) -> tuple[float, float]:
    with ScalerExecutor(max_workers=2, config=config, journal=journal) as ex:
        ex.submit(noop, 0).result()  # warm: processors started, callable registered
        list(ex.map(noop, range(200)))
        started = time.perf_counter()
        futures = [ex.submit(noop, i) for i in range(tasks)]
        done, pending = wait(futures)
        assert not pending
        throughput = tasks / (time.perf_counter() - started)
        rtts = []
        for i in range(trips):
            t = time.perf_counter()
            ex.submit(noop, i).result()
            rtts.append(time.perf_counter() - t)
    return throughput, statistics.median(rtts)


def configurations() -> dict[str, tuple[ClusterConfig, bool, bool]]:
    """name -> (config, journaled, reply inbox)."""
    base = ClusterConfig(heartbeat_interval=0.5)
    return {
        "off": (base, False, True),
        "off, no lanes": (base.replace(worker_lanes=False), False, True),
        "off, no fast paths": (base.replace(worker_lanes=False), False, False),
        "turn": (base.replace(journal_fsync="turn"), True, True),
        "interval": (base.replace(journal_fsync="interval"), True, True),
        "os": (base.replace(journal_fsync="os"), True, True),
    }


def one(args: argparse.Namespace) -> None:
    """One configuration, measured once, printed as one JSON line (bench/journal_ab.py runs this
    in a fresh interpreter of each checkout, so it must run against older trees too)."""
    config, journaled, inbox = configurations()[args.one]
    directory = tempfile.mkdtemp(prefix="jcost-", dir=args.dir)
    try:
        journal = os.path.join(directory, "j") if journaled else None
        throughput, rtt = measure(config, journal, args.tasks, args.trips, inbox)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps({"throughput": throughput, "round_trip": rtt}))


def mean_ci(ratios: list[float]) -> tuple[float, float, float]:
    """The mean of the paired ratios and its 95 % confidence interval (t distribution)."""
    mean = statistics.fmean(ratios)
    if len(ratios) < 2:
        return mean, math.nan, math.nan
    half = t95(len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return mean, mean - half, mean + half


def cost(args: argparse.Namespace) -> None:
    configs = configurations()
    names = list(configs)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            config, journaled, inbox = configs[name]
            directory = tempfile.mkdtemp(prefix="jcost-", dir=args.dir)
            try:
                journal = os.path.join(directory, "j") if journaled else None
                results[name].append(measure(config, journal, args.tasks, args.trips, inbox))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            print(f"  rep {rep + 1} {name:18} {results[name][-1][0]:9.0f} tasks/s  {results[name][-1][1] * 1e6:8.0f} µs", flush=True)
    def paired(name: str, base: str, i: int) -> float:
        """The median of the per-repetition ratios (each repetition ran both, side by side)."""
        return statistics.median(a[i] / b[i] for a, b in zip(results[name], results[base], strict=True))

    def ci(name: str, base: str, i: int) -> str:
        mean, low, high = mean_ci([a[i] / b[i] for a, b in zip(results[name], results[base], strict=True)])
        return f"{mean:.3f} ({low:.3f}-{high:.3f})"

    print(f"\nload {os.getloadavg()}; medians of {args.reps} repetitions, paired: the median per-repetition ratio")
    print(
        f"{'journal':18} {'no-op tasks/s':>14} {'range':>15} {'÷ no lanes':>11} {'÷ no fast':>10}"
        f" {'round trip µs':>14} {'range':>13} {'÷ no lanes':>11} {'÷ no fast':>10}"
    )
    for name in names:
        tps = [r[0] for r in results[name]]
        rts = [r[1] * 1e6 for r in results[name]]
        print(
            f"{name:18} {statistics.median(tps):14.0f} {min(tps):7.0f}-{max(tps):<7.0f}"
            f" {paired(name, 'off, no lanes', 0):11.2f} {paired(name, 'off, no fast paths', 0):10.2f}"
            f" {statistics.median(rts):14.0f} {min(rts):6.0f}-{max(rts):<6.0f}"
            f" {paired(name, 'off, no lanes', 1):11.2f} {paired(name, 'off, no fast paths', 1):10.2f}"
        )
    print("\nmean paired ratio to 'off, no fast paths' (95 % CI): throughput, round trip")
    for name in names:
        print(f"{name:18} {ci(name, 'off, no fast paths', 0):>24} {ci(name, 'off, no fast paths', 1):>24}")


def restart_to_resume(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="jresume-", dir=args.dir)
    sock = os.path.join(directory, "d.sock")
    address = f"ipc://{sock}"
    journal = os.path.join(directory, "journal")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs: list[subprocess.Popen[bytes]] = []

    def start(*command: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", *command], env=env)
        procs.append(proc)
        return proc

    def daemon() -> subprocess.Popen[bytes]:
        if os.path.exists(sock):
            os.unlink(sock)
        proc = start("scaler_executor.cli.daemon", "--address", address, "--journal", journal, "--restart-grace", "60")
        while not os.path.exists(sock):
            time.sleep(0.005)
        return proc

    try:
        first = daemon()
        for _ in range(2):
            start("scaler_executor.cli.worker", address, "--processors", "2")
        with ScalerExecutor(address=address, config=ClusterConfig(daemon_loss_timeout=60.0)) as ex:
            futures = [ex.submit(sleepy, i, 0.001) for i in range(args.in_flight)]
            while sum(f.done() for f in futures[:2000]) < 100:  # running
                time.sleep(0.05)
            time.sleep(1.0)  # every submission written and acknowledged
            before = sum(f.done() for f in futures)
            first.send_signal(signal.SIGKILL)
            first.wait()
            killed_done = sum(f.done() for f in futures)
            restarted = time.perf_counter()
            daemon()
            bound = time.perf_counter()
            rest = [f for f in futures if not f.done()]
            done, _ = wait(rest, return_when=FIRST_COMPLETED)
            resumed = time.perf_counter()
            wait(rest)
            finished = time.perf_counter()
            assert all(f.result() == i for i, f in enumerate(futures))
        print(
            f"\nrestart to resume with {args.in_flight} tasks in flight ({args.in_flight - killed_done} not done at the kill, "
            f"{before} done before it):\n"
            f"  daemon started to bound (journal loaded and restored): {bound - restarted:.2f} s\n"
            f"  restart to the first future completed again:          {resumed - restarted:.2f} s\n"
            f"  restart to all futures completed:                     {finished - restarted:.2f} s"
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--trips", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="where journals go (default: the temp dir)")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-restart", action="store_true")
    parser.add_argument("--one", choices=list(configurations()), help="measure this configuration once, print JSON")
    args = parser.parse_args()
    if args.one:
        one(args)
        return 0
    print(f"load before: {os.getloadavg()}", flush=True)
    if not args.skip_cost:
        cost(args)
    if not args.skip_restart:
        restart_to_resume(args)
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
