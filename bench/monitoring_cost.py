"""Are monitoring's two cost goals met? A verdict each, from paired A/B rounds with intervals.

    chrt -r 1 python bench/monitoring_cost.py [--goal recorder|dashboards|both]
                                              [--rounds 20] [--blocks 2] [--seconds S]

The goals (issue 24):

* **recorder**: "the daemon keeps only O(1) counters and a bounded ring of recent events
  (its cost measured: ≤ 2 % of no-op throughput)".  Two daemons run side by side, each with
  2 local workers: A with the task runs kept at their default (``history_runs`` 20,000: its
  workers record them and send them in bulk, protocol/runlog.py, and the daemon keeps the
  reports), B with them off (``--history-runs 0``: no run recorded anywhere; the workers
  still send their run times).  The counters (tasks ended per second, the coarse series,
  per result batch; the run times a worker reports, per report; the ring of 64 events
  takes nothing on a task that succeeds) cannot be turned off without losing
  ``statistics()``: their code is timed with ``timeit`` instead, on the real ``Recorder``
  and ``History``, per task, per result batch and per report (the latter two put per task
  with the batching and the reports of B's windows), and added to the A/B's figure as a
  fraction of B's daemon CPU per task.  ``--blocks`` starts
  a fresh pair of daemons per block, in swapped order, so that one instance's luck (a core,
  its memory layout) does not pass for the ring's cost.
* **dashboards**: "with three dashboards open the daemon's throughput stays within 5 % of
  none".  One daemon with ``--dashboard`` and 2 workers; one poller process runs the whole
  time with three pages' pollers (per page ``/api/snapshot`` every second and
  ``/api/history`` every 5 s, as ``dashboard.js``; each poller's phase random), switched on
  for B's rounds and off for A's, so both sides have the same processes.

Each round measures A and B for ``--seconds`` each, in alternating order (AB, BA, AB, ...):
no-op tasks through ``ex.map(chunksize=1)`` in batches of 2,000 until the time is up; the
daemon's own CPU time (user + system of its process, from ``/proc`` through psutil: what
other load on the host disturbs far less than wall-clock throughput) per task, and tasks
per second.  Per round, B's figure over A's; over the rounds, the median ratio with a 95 %
bootstrap interval (10,000 resamples of the rounds, percentile) and the mean with a
Student-t interval.  A dashboards round lasts at least two 5 s history polls' worth of time
on average (``--seconds`` 4 by default; the pollers' phases are random, so the expected
number of history builds in a window is proportional to its length).

Verdicts, one line per goal, ``met`` / ``not met`` / ``undecided``, are decided on the
daemon's CPU per task — the daemon's own cost, and the bound of its throughput where it is
the bottleneck (a no-op run: throughput ≈ 1 / daemon time per task) — and checked against
throughput: a throughput interval wholly beyond the bound makes it ``not met`` whatever
the CPU says.  ``met``: the interval's upper end is within the bound; ``not met``: its
lower end is beyond; ``undecided``: the interval straddles it (more rounds, a quieter host).
Run under ``chrt -r 1`` (the header says whether it was) and read the load it prints.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
from collections.abc import Callable, Sequence

import psutil

from scaler_executor import ScalerExecutor

BATCH = 2000  # tasks per ex.map call: ~0.1 s, so a window ends close to its time
RESAMPLES = 10_000
RECORDER_BOUND = 0.02  # the recorder's goal: ≤ 2 % of no-op throughput
DASHBOARD_BOUND = 0.05  # the dashboards' goal: within 5 % of none
PAGES = 3
# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (as bench/ab.py).
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
       2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
       2.052, 2.048, 2.045, 2.042]  # fmt: skip


def noop(x: int) -> int:
    return x


# ---------------------------------------------------------------------------- statistics


def bootstrap_median(values: Sequence[float], seed: int = 24) -> tuple[float, float, float]:
    """(median, 2.5th, 97.5th percentile of the medians of RESAMPLES resamples)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(RESAMPLES))
    return statistics.median(values), medians[int(0.025 * RESAMPLES)], medians[int(0.975 * RESAMPLES) - 1]


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, -math.inf, math.inf
    df = len(values) - 1
    half = (T95[df - 1] if df <= len(T95) else 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def verdict(low: float, high: float, bound: float) -> str:
    """For a cost (a fraction, higher is worse) against its bound."""
    if high <= bound:
        return "met"
    if low > bound:
        return "not met"
    return "undecided"


def pct(x: float) -> str:
    return f"{x * 100:+.2f} %"


# ---------------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, in seconds to the nanosecond: its threads' schedstat."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended just now
    return total / 1e9


class Daemon:
    """``scaler-daemon --workers 2`` on an ipc socket in a temporary directory."""

    def __init__(self, *flags: str) -> None:
        self.tmp = tempfile.mkdtemp(prefix="monitoring-cost-")
        self.address = f"ipc://{self.tmp}/daemon.sock"
        self.log = open(f"{self.tmp}/daemon.log", "w+b")  # noqa: SIM115  (closed in close())
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address, "--workers", "2", *flags],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.process = psutil.Process(self.popen.pid)

    def cpu(self) -> float:
        """The daemon process's own CPU seconds (user + system; not its children's), to the
        nanosecond: the sum over its threads of ``/proc/PID/task/TID/schedstat``'s time on a
        CPU (``utime`` + ``stime`` in ``/proc/PID/stat`` count 10 ms ticks, 1 µs per task
        over a 10,000-task window: coarser than the effects measured).  The daemon's threads
        live as long as it does, so none of its time leaves the sum between two readings."""
        return cpu_seconds(self.popen.pid)

    def agents_cpu(self) -> float:
        """CPU seconds of its local workers' agents (not their processors): where the task
        runs are recorded now (protocol/runlog.py)."""
        total = 0.0
        for child in self.process.children():
            try:
                if "scaler_executor.cli.worker" in " ".join(child.cmdline()):
                    total += cpu_seconds(child.pid)
            except (psutil.NoSuchProcess, FileNotFoundError):
                continue
        return total

    def ticks(self) -> float:
        """The same from ``/proc/PID/stat`` (10 ms ticks), to check ``cpu`` against."""
        times = self.process.cpu_times()
        return times.user + times.system

    def wait_for(self, pattern: bytes, seconds: float = 60.0) -> bytes:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.log.seek(0)
            found = re.findall(pattern, self.log.read())
            if found:
                return bytes(found[0])
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        raise RuntimeError(f"daemon: no {pattern!r} in its log:\n{self.log.read()[-2000:].decode(errors='replace')}")

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def batching(ex: ScalerExecutor) -> tuple[int, int]:
    """(tasks ended, result batches) so far, from the daemon's counters."""
    stats = ex.statistics()
    return int(stats["finished"]) + int(stats["failed"]), int(stats["result_batches"])


def window(ex: ScalerExecutor, daemon: Daemon, seconds: float) -> tuple[float, float]:
    """(tasks per second, daemon CPU µs per task) of no-op tasks for about ``seconds``."""
    cpu0 = daemon.cpu()
    t0 = time.perf_counter()
    tasks = 0
    while True:
        list(ex.map(noop, range(BATCH), chunksize=1))
        tasks += BATCH
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    return tasks / elapsed, (daemon.cpu() - cpu0) / tasks * 1e6


def poll(base: str, token: str, pages: int) -> None:
    """The poller process: ``pages`` pages' pollers, each on its own fixed schedule from a
    random phase, requesting only while switched on ("on"/"off" lines on stdin; EOF ends)."""
    on, stop = threading.Event(), threading.Event()

    def loop(path: str, every: float) -> None:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
        due = time.monotonic() + random.uniform(0, every)
        while not stop.wait(max(0.0, due - time.monotonic())):
            if on.is_set():
                with urllib.request.urlopen(request, timeout=30) as reply:
                    reply.read()
            due += every
            if due < time.monotonic():  # a slow answer: keep the period, skip what was missed
                due += every * math.ceil((time.monotonic() - due) / every)

    threads = [threading.Thread(target=loop, args=("/api/snapshot", 1.0)) for _ in range(pages)]
    threads += [threading.Thread(target=loop, args=("/api/history", 5.0)) for _ in range(pages)]
    for t in threads:
        t.start()
    for line in sys.stdin:
        (on.set if line.strip() == "on" else on.clear)()
    stop.set()
    for t in threads:
        t.join()


# ---------------------------------------------------------------------------- rounds


Side = Callable[[], tuple[float, float]]


def rounds(count: int, a: Side, b: Side, label: str) -> tuple[list[float], list[float]]:
    """``count`` rounds of A and B in alternating order; per round B/A of CPU per task and of
    throughput."""
    cpu_ratios, tp_ratios = [], []
    for i in range(count):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        got = {side: (a if side == "A" else b)() for side in order}
        (tp_a, cpu_a), (tp_b, cpu_b) = got["A"], got["B"]
        cpu_ratios.append(cpu_b / cpu_a)
        tp_ratios.append(tp_b / tp_a)
        print(
            f"{label} round {i + 1:2d} {''.join(order)}  A {tp_a:7.0f} tasks/s {cpu_a:6.2f} us/task   "
            f"B {tp_b:7.0f} tasks/s {cpu_b:6.2f} us/task   B/A cpu {cpu_b / cpu_a:.4f} tp {tp_b / tp_a:.4f}",
            flush=True,
        )
    return cpu_ratios, tp_ratios


def summary(name: str, ratios: list[float]) -> tuple[float, float, float]:
    med, lo, hi = bootstrap_median(ratios)
    mean, tlo, thi = t_interval(ratios)
    print(
        f"  {name:24s} median {med:.4f} (95 % bootstrap {lo:.4f} .. {hi:.4f})   "
        f"mean {mean:.4f} (95 % t {tlo:.4f} .. {thi:.4f})   n={len(ratios)}"
    )
    return med, lo, hi


# ---------------------------------------------------------------------------- the recorder


def counters_ns(batch: int) -> float:
    """ns of the core's monitoring counters for one result batch of ``batch`` no-op tasks:
    the lines of ``Scheduler._on_task_results`` that feed the counters, the recorder and the
    history's series (per batch: ``result_batches``, ``finished``/``failed``,
    ``Recorder.ended``, ``History.ended``; nothing per task since the run times and peak
    memory come summed up in the workers' ``TaskRuns``), timed on the real ``Recorder`` and
    ``History`` against the same loop without them.  Best of 7 each."""
    from scaler_executor.scheduler.history import History
    from scaler_executor.scheduler.stats import Recorder

    recorder, history = Recorder(), History()
    counters = {"result_batches": 0, "finished": 0, "failed": 0}
    items = [(0.0001 * (i + 1), 1 << 20) for i in range(batch)]  # (run time, peak memory)
    clock = [1000.0]

    def with_counters() -> None:
        now = clock[0] = clock[0] + 0.0001  # a new one-second bucket now and then, as in a run
        ended = failed = 0
        counters["result_batches"] += 1
        for _duration, _peak_memory in items:
            ended += 1
        if ended:
            counters["finished"] += ended - failed
            counters["failed"] += failed
            recorder.ended(now, ended - failed, failed)
            history.ended(now, ended - failed, failed)

    def without() -> None:
        now = clock[0] = clock[0] + 0.0001
        ended = 0
        for _duration, _peak_memory in items:
            ended += 1
        if ended:
            now += 0

    number = max(2000, 400_000 // batch)
    full = min(timeit.repeat(with_counters, number=number, repeat=7))
    base = min(timeit.repeat(without, number=number, repeat=7))
    return max(0.0, full - base) / number * 1e9


def counters_fit() -> tuple[float, float]:
    """(ns per task, ns per batch) of the counters: a line through batches of 1 and 64."""
    one, many = counters_ns(1), counters_ns(64)
    per_task = max(0.0, (many - one) / 63)
    return per_task, max(0.0, one - per_task)


def report_ns(tasks: int) -> float:
    """ns of the daemon's work on one worker's ``TaskRuns`` of ``tasks`` no-op runs (its
    handler's checks, ``History.reported``, ``Recorder.ended``/``timed``, the peak), on the
    real classes, the message made by the workers' real ``RunLog``; and, printed, the
    worker's ``RunLog.ended`` per task (the worker's cost, not the daemon's).  Best of 7."""
    from scaler_executor.protocol.runlog import DURATION_BOUNDS, MAX_REPORT_RUNS, RunLog
    from scaler_executor.scheduler.history import History
    from scaler_executor.scheduler.stats import Recorder

    log = RunLog(20_000)
    number = 2000
    ended = min(timeit.repeat(lambda: log.ended(1000.0, 1000.0001, 0, 1 << 20), number=number * 10, repeat=7))
    print(f"  worker: RunLog.ended {ended / (number * 10) * 1e9:.0f} ns per task (in the worker, off the daemon's loop)")
    for i in range(tasks):
        log.ended(1000.0 + i, 1000.0001 + i, 0, 1 << 20)
    message = log.take()
    assert message is not None
    recorder, history, peer = Recorder(), History(), b"w1"
    clock = [1000.0]

    def handle() -> None:
        now = clock[0] = clock[0] + 0.5
        count, seen, counts = message.kept, message.seen, message.durations
        if not 0 <= count <= min(seen, MAX_REPORT_RUNS) or len(message.runs) != count * 17:
            raise AssertionError
        if not (message.timed >= 0 and 0.0 <= message.longest <= message.seconds and message.peak_memory >= 0
                and len(counts) == len(DURATION_BOUNDS) + 1 and min(counts) >= 0 and sum(counts) == message.timed):
            raise AssertionError
        history.reported("w1", count, seen, message.runs)
        recorder.ended(now, 0, 0, message.timed, message.seconds, message.longest)
        recorder.timed(counts, message.seconds)
        recorder.peak_memory[peer] = message.peak_memory

    return min(timeit.repeat(handle, number=number, repeat=7)) / number * 1e9


def recorder_goal(args: argparse.Namespace) -> str:
    cpu_ratios: list[float] = []
    tp_ratios: list[float] = []
    cpu_off: list[float] = []
    tasks = [0, 0, 0.0]  # B's tasks ended, result batches and seconds over its windows
    agents: dict[str, list[float]] = {"A": [], "B": []}  # the workers' agents' CPU µs per task, per window
    per_block = max(2, args.rounds // args.blocks)
    for block in range(args.blocks):
        # A: the ring on (the default); B: off.  Started in swapped order per block.
        flags = {"A": (), "B": ("--history-runs", "0")}
        order = ("A", "B") if block % 2 == 0 else ("B", "A")
        daemons: dict[str, Daemon] = {}
        executors: dict[str, ScalerExecutor] = {}
        try:
            for side in order:
                daemons[side] = Daemon(*flags[side])
            for side in order:
                executors[side] = ScalerExecutor(address=daemons[side].address)
                list(executors[side].map(noop, range(BATCH)))  # warm: workers joined, functions sent

            def side(name: str, executors: dict[str, ScalerExecutor] = executors, daemons: dict[str, Daemon] = daemons) -> Side:
                def run() -> tuple[float, float]:
                    if name == "B":
                        before = batching(executors[name])
                    agents0, t0 = daemons[name].agents_cpu(), time.perf_counter()
                    tp, cpu = window(executors[name], daemons[name], args.seconds)
                    agents[name].append((daemons[name].agents_cpu() - agents0) / (tp * (time.perf_counter() - t0)) * 1e6)
                    if name == "B":
                        after = batching(executors[name])
                        cpu_off.append(cpu)
                        tasks[0] += after[0] - before[0]
                        tasks[1] += after[1] - before[1]
                        tasks[2] += (after[0] - before[0]) / tp
                    return tp, cpu

                return run

            ticks0 = {name: (d.cpu(), d.ticks()) for name, d in daemons.items()}
            c, t = rounds(per_block, side("A"), side("B"), f"recorder block {block + 1}")
            for name, d in daemons.items():
                ns_clock, tick_clock = d.cpu() - ticks0[name][0], d.ticks() - ticks0[name][1]
                print(f"  daemon {name}: {ns_clock:.2f} s of CPU by schedstat, {tick_clock:.2f} s by /proc/PID/stat ticks")
            cpu_ratios += c
            tp_ratios += t
        finally:
            for ex in executors.values():
                ex.shutdown()
            for d in daemons.values():
                d.close()
    print("\nrecorder: B (history_runs 0) over A (history_runs 20,000), per round:")
    _, cpu_lo, cpu_hi = summary("daemon CPU per task B/A", cpu_ratios)
    cpu_med = statistics.median(cpu_ratios)
    _, tp_lo, tp_hi = summary("throughput B/A", tp_ratios)
    tp_med = statistics.median(tp_ratios)
    # The ring's cost: A over B - 1 (a ratio B/A below 1 means the ring costs).
    ring, ring_lo, ring_hi = 1 / cpu_med - 1, 1 / cpu_hi - 1, 1 / cpu_lo - 1
    ring_tp, ring_tp_lo, ring_tp_hi = tp_med - 1, tp_lo - 1, tp_hi - 1  # throughput lost to it
    summary("workers' agents CPU/task B/A", [b / a for a, b in zip(agents["A"], agents["B"], strict=True)])
    print(f"  workers' agents: {statistics.median(agents['A']):.2f} us per task (A), {statistics.median(agents['B']):.2f} (B)")
    base = statistics.median(cpu_off)
    per_task_ns, per_batch_ns = counters_fit()
    batches_per_task = tasks[1] / tasks[0] if tasks[0] else 1.0
    # A worker reports its runs beside each heartbeat (0.5 s by default, the daemon's here):
    # at most 2 workers / 0.5 s reports a second, over B's tasks a second.
    reports_per_task = (2 / 0.5) * tasks[2] / tasks[0] if tasks[0] else 0.0
    per_report_ns = report_ns(max(1, round(1 / reports_per_task)) if reports_per_task else 1)
    print(
        f"  per TaskRuns report (timeit, best of 7): {per_report_ns:.0f} ns; at most {reports_per_task * 1000:.2f} reports "
        f"per 1,000 tasks here: {per_report_ns * reports_per_task:.1f} ns per task"
    )
    counters_ns_task = per_task_ns + per_batch_ns * batches_per_task + per_report_ns * reports_per_task
    counters = counters_ns_task / 1000 / base
    print(
        f"  counters (timeit, best of 7): {per_task_ns:.0f} ns per task + {per_batch_ns:.0f} ns per result batch; "
        f"B's windows ended {tasks[0]} tasks in {tasks[1]} batches ({tasks[0] / max(1, tasks[1]):.1f} a batch): "
        f"{counters_ns_task:.0f} ns per task, {counters * 100:.2f} % of the daemon's {base:.2f} us per task with the ring off "
        f"(in batches of 1, the worst case: {(per_task_ns + per_batch_ns) / 1000 / base * 100:.2f} %)"
    )
    total, total_lo, total_hi = ring + counters, ring_lo + counters, ring_hi + counters
    tp_total_lo, tp_total_hi = ring_tp_lo + counters, ring_tp_hi + counters
    decided = verdict(total_lo, total_hi, RECORDER_BOUND)
    if tp_total_lo > RECORDER_BOUND:
        decided = "not met (throughput)"
    return (
        f"VERDICT recorder (counters + ring cost <= 2 % of no-op throughput): {decided} -- daemon CPU per task "
        f"{pct(total)} [95 % CI {pct(total_lo)} .. {pct(total_hi)}] = ring A/B {pct(ring)} [{pct(ring_lo)} .. {pct(ring_hi)}] "
        f"+ counters {pct(counters)} (timeit); throughput cost {pct(ring_tp + counters)} [{pct(tp_total_lo)} .. {pct(tp_total_hi)}]"
    )


# ---------------------------------------------------------------------------- the dashboards


def dashboards_goal(args: argparse.Namespace) -> str:
    daemon = Daemon("--dashboard", "127.0.0.1:0")
    pollers = None
    try:
        url = daemon.wait_for(rb"dashboard at (http://\S+)").decode()
        base, _, token = url.partition("/?token=")
        pollers = subprocess.Popen(
            [sys.executable, __file__, "--poll", base, str(PAGES)], stdin=subprocess.PIPE, text=True,
            env={**os.environ, "DASHBOARD_TOKEN": token},
        )  # fmt: skip
        assert pollers.stdin is not None
        stdin = pollers.stdin

        def switch(state: str) -> None:
            stdin.write(state + "\n")
            stdin.flush()
            time.sleep(0.5)  # the other side's requests in flight end before the clock starts

        with ScalerExecutor(address=daemon.address) as ex:
            list(ex.map(noop, range(BATCH)))
            switch("on")  # the dashboard process connects to the daemon on its first request
            time.sleep(6)
            dashboard = [p for p in daemon.process.children() if "monitor.dashboard" in " ".join(p.cmdline())]
            assert dashboard, "no dashboard process beside the daemon"
            assert int(ex.statistics()["monitors"]) >= 1, "the pages' pollers did not reach the daemon"
            dash_cpu: list[float] = []
            poll_cpu: list[float] = []

            def a() -> tuple[float, float]:
                switch("off")
                return window(ex, daemon, args.seconds)

            def b() -> tuple[float, float]:
                switch("on")
                before = sum(cpu_seconds(p.pid) for p in dashboard), cpu_seconds(pollers.pid)
                got = window(ex, daemon, args.seconds)
                dash_cpu.append(sum(cpu_seconds(p.pid) for p in dashboard) - before[0])
                poll_cpu.append(cpu_seconds(pollers.pid) - before[1])
                return got

            cpu_ratios, tp_ratios = rounds(args.rounds, a, b, "dashboards")
            switch("off")
        print(f"\ndashboards: B ({PAGES} pages polling) over A (none), per round:")
        _, cpu_lo, cpu_hi = summary("daemon CPU per task B/A", cpu_ratios)
        cpu_med = statistics.median(cpu_ratios)
        _, tp_lo, tp_hi = summary("throughput B/A", tp_ratios)
        tp_med = statistics.median(tp_ratios)
        if dash_cpu:
            print(
                f"  while {PAGES} pages poll (median over B's windows): the dashboard process "
                f"{statistics.median(dash_cpu) / args.seconds * 100:.2f} % of a core, the pollers (the pages' stand-in) "
                f"{statistics.median(poll_cpu) / args.seconds * 100:.2f} %"
            )
        decided = verdict(cpu_lo - 1, cpu_hi - 1, DASHBOARD_BOUND)
        if 1 - tp_hi > DASHBOARD_BOUND:
            decided = "not met (throughput)"
        return (
            f"VERDICT dashboards ({PAGES} pages vs none, daemon within 5 %): {decided} -- daemon CPU per task "
            f"{pct(cpu_med - 1)} [95 % CI {pct(cpu_lo - 1)} .. {pct(cpu_hi - 1)}]; "
            f"throughput {pct(tp_med - 1)} [{pct(tp_lo - 1)} .. {pct(tp_hi - 1)}]"
        )
    finally:
        if pollers is not None:
            assert pollers.stdin is not None
            pollers.stdin.close()
            pollers.wait(30)
        daemon.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goal", choices=("recorder", "dashboards", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of A and B per goal (at least 2)")
    parser.add_argument("--blocks", type=int, default=2, help="recorder: fresh daemon pairs, the rounds split among them")
    parser.add_argument("--seconds", type=float, help="seconds per side per round (recorder 2, dashboards 4)")
    parser.add_argument("--poll", nargs=2, metavar=("BASE", "PAGES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poll:
        poll(args.poll[0], os.environ["DASHBOARD_TOKEN"], int(args.poll[1]))
        return 0
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: an interval needs two rounds")
    policy = {os.SCHED_OTHER: "SCHED_OTHER (not under chrt)", os.SCHED_RR: "SCHED_RR", os.SCHED_FIFO: "SCHED_FIFO"}
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
    print(
        f"monitoring_cost: {cpu}, {os.cpu_count()} CPUs, policy {policy.get(os.sched_getscheduler(0), '?')}, "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start",
        flush=True,
    )
    verdicts = []
    if args.goal in ("recorder", "both"):
        seconds = args.seconds
        args.seconds = seconds or 2.0
        verdicts.append(recorder_goal(args))
        args.seconds = seconds
    if args.goal in ("dashboards", "both"):
        args.seconds = args.seconds or 4.0
        verdicts.append(dashboards_goal(args))
    print(f"\nload {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    for line in verdicts:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
