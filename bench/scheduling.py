"""Scheduling benchmarks: how fast autoscaling reacts, how much one straggler costs.

A script, not a test: it prints figures.  Run from the repository root::

    PYTHONPATH=. python bench/scheduling.py                  # both
    PYTHONPATH=. python bench/scheduling.py --only straggler --repeat 5

1. **Scale-up** — a burst of 200 one-second tasks on an empty autoscaling cluster
   (``ScalerExecutor(max_workers=8, min_workers=0)``): seconds from the first submit until
   every one of the 8 workers is busy (each worker's first task start, as the task saw
   it), and until the daemon counts 8 workers; plus the burst's makespan against the ideal
   ``ceil(200 / 8) * 1 s``.

2. **Straggler** — makespan of 1,000 short (10 ms) tasks on 4 processors (``scaler-daemon
   --workers 2 --processors-per-worker 2``), with one worker slowed: its processors are
   SIGSTOPped 80 % of every 100 ms — relative to the same run without the straggler.
   With perfect dynamic balancing the cluster keeps 2 + 2 x 0.2 = 2.4 processors of 4
   (a ratio of 1.67); a static even split would give the slow worker's half 5x the time.

Tasks sleep rather than compute, so figures measure scheduling, not the 2-core CPU the
processes share; on a loaded machine they still move, so each is repeated (``--repeat``)
and the median reported.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # workers import this module's task functions by reference

import psutil

from scaler_executor import ClusterConfig, ScalerExecutor

# =========================================================================== task functions


def timed_sleep(seconds: float) -> tuple[int, float]:
    """Sleep; return (this worker's zygote pid — one per worker, start time)."""
    start = time.time()
    time.sleep(seconds)
    return os.getppid(), start


def short_sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getppid()


# =========================================================================== 1. scale-up


def scale_up(tasks: int, workers: int, seconds: float) -> dict[str, float]:
    config = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=30.0)
    with ScalerExecutor(max_workers=workers, min_workers=0, config=config) as ex:
        if ex.statistics()["workers"]:
            raise RuntimeError("the autoscaling cluster did not start empty")
        connected_at: float | None = None
        t0 = time.time()
        futures = [ex.submit(timed_sleep, seconds) for _ in range(tasks)]
        submitted = time.time() - t0
        while connected_at is None and not all(f.done() for f in futures):
            if ex.statistics()["workers"] >= workers:
                connected_at = time.time() - t0
            else:
                time.sleep(0.02)
        results = [f.result() for f in futures]
        makespan = time.time() - t0
    first_start: dict[int, float] = {}
    for worker, start in results:
        first_start[worker] = min(start, first_start.get(worker, math.inf))
    starts = sorted(first_start.values())
    if len(starts) < workers:
        raise RuntimeError(f"only {len(starts)} workers ran tasks")
    return {
        "submit_s": submitted,
        "first_busy_s": starts[0] - t0,
        "all_busy_s": starts[workers - 1] - t0,
        "all_connected_s": connected_at if connected_at is not None else math.nan,
        "makespan_s": makespan,
        "ideal_makespan_s": math.ceil(tasks / workers) * seconds,
    }


# =========================================================================== 2. straggler


class ExternalCluster:
    """``scaler-daemon --workers 2 --processors-per-worker 2`` and a client joined to it."""

    def __init__(self, workers: int, processors: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="sxbench-")
        sock = os.path.join(self.dir, "d.sock")
        self.address = f"ipc://{sock}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([ROOT, *filter(None, sys.path)]))
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "scaler_executor.cli.daemon",
                "--address", self.address,
                "--workers", str(workers),
                "--processors-per-worker", str(processors),
                "--heartbeat-interval", "0.1",
                "--heartbeat-liveness", "50",
            ],
            env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the daemon did not start")
            time.sleep(0.02)
        config = ClusterConfig(
            heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=30.0
        )
        self.ex = ScalerExecutor(address=self.address, config=config)
        while self.ex.statistics()["processors"] < workers * processors:
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the workers did not join")
            time.sleep(0.02)

    def processors_of_one_worker(self) -> list[psutil.Process]:
        agent = min(
            (
                p
                for p in psutil.Process(self.proc.pid).children()
                if "scaler_executor.cli.worker" in p.cmdline()
            ),
            key=lambda p: p.pid,
        )
        return [p for zygote in agent.children() for p in zygote.children()]

    def close(self) -> None:
        if getattr(self, "ex", None) is not None:
            self.ex.shutdown(wait=True, cancel_futures=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Straggler(threading.Thread):
    """SIGSTOP these processes for ``duty`` of every ``period`` seconds; SIGCONT on stop."""

    def __init__(
        self, victims: list[psutil.Process], duty: float = 0.8, period: float = 0.1
    ) -> None:
        super().__init__(name="straggler", daemon=True)
        self.victims = victims
        self.duty = duty
        self.period = period
        self.done = threading.Event()

    def _signal(self, sig: int) -> None:
        for p in self.victims:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self._signal(signal.SIGSTOP)
                self.done.wait(self.period * self.duty)
                self._signal(signal.SIGCONT)
                self.done.wait(self.period * (1 - self.duty))
        finally:
            self._signal(signal.SIGCONT)

    def stop(self) -> None:
        self.done.set()
        self.join()
        self._signal(signal.SIGCONT)  # whatever happened, nothing stays stopped


def makespan(ex: ScalerExecutor, tasks: int, seconds: float) -> tuple[float, dict[int, int]]:
    t0 = time.perf_counter()
    by_worker: dict[int, int] = {}
    for worker in ex.map(short_sleep, [seconds] * tasks):
        by_worker[worker] = by_worker.get(worker, 0) + 1
    return time.perf_counter() - t0, by_worker


def straggler(tasks: int, seconds: float, repeat: int) -> dict[str, Any]:
    cluster = ExternalCluster(workers=2, processors=2)
    try:
        ex = cluster.ex
        makespan(ex, 200, seconds)  # warm-up: processors up, callables cached, means known
        slow = cluster.processors_of_one_worker()
        slow_zygote = slow[0].ppid()
        plain, slowed, slow_share = [], [], []
        for _ in range(repeat):
            plain.append(makespan(ex, tasks, seconds)[0])
            thread = Straggler(slow)
            thread.start()
            try:
                elapsed, by_worker = makespan(ex, tasks, seconds)
            finally:
                thread.stop()
            slowed.append(elapsed)
            slow_share.append(by_worker.get(slow_zygote, 0) / tasks)
    finally:
        cluster.close()
    base, strag = statistics.median(plain), statistics.median(slowed)
    return {
        "ideal_s": tasks * seconds / 4,
        "baseline_s": base,
        "straggler_s": strag,
        "ratio": strag / base,
        "ratio_runs": [s / p for s, p in zip(slowed, plain)],
        "slow_worker_share": statistics.median(slow_share),
    }


# =========================================================================== main


def _timed(name: str, fn: Callable[[], Any]) -> Any:
    print(f"running {name} ...", flush=True)
    return fn()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("scale_up", "straggler"))
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per figure; the median is reported (default 3)"
    )
    parser.add_argument(
        "--burst", type=int, default=200, help="tasks in the scale-up burst (default 200)"
    )
    parser.add_argument(
        "--short-tasks", type=int, default=1000, help="tasks in the straggler run (default 1000)"
    )
    args = parser.parse_args(argv)
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    if args.only in (None, "scale_up"):
        runs = [
            _timed(f"scale-up run {i + 1}", lambda: scale_up(args.burst, 8, 1.0))
            for i in range(args.repeat)
        ]
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"\nScale-up: burst of {args.burst} x 1 s tasks, autoscaling 0 -> 8 workers (median of {len(runs)})"
        )
        print(f"  submit() of the burst          {med['submit_s'] * 1000:8.1f} ms")
        print(f"  first worker busy              {med['first_busy_s']:8.2f} s")
        print(
            f"  all 8 workers busy             {med['all_busy_s']:8.2f} s   runs: "
            + ", ".join(f"{r['all_busy_s']:.2f}" for r in runs)
        )
        print(f"  daemon counts 8 workers        {med['all_connected_s']:8.2f} s")
        print(
            f"  makespan (ideal {med['ideal_makespan_s']:.0f} s)          {med['makespan_s']:8.2f} s"
        )

    if args.only in (None, "straggler"):
        res = _timed("straggler", lambda: straggler(args.short_tasks, 0.01, args.repeat))
        print(
            f"\nStraggler: {args.short_tasks} x 10 ms tasks, 2 workers x 2 processors, one worker's "
            f"processors stopped 80 % of the time (median of {args.repeat})"
        )
        print(f"  ideal (4 processors, no overhead) {res['ideal_s']:6.2f} s")
        print(f"  without straggler                 {res['baseline_s']:6.2f} s")
        print(f"  with straggler                    {res['straggler_s']:6.2f} s")
        print(
            f"  ratio                             {res['ratio']:6.2f} x   runs: "
            + ", ".join(f"{r:.2f}" for r in res["ratio_runs"])
        )
        print("  (perfect balancing: 1.67 x; static even split: ~5 x)")
        print(
            f"  tasks run by the slowed worker    {res['slow_worker_share'] * 100:6.1f} %  (perfect balancing: 17 %)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
