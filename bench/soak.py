"""The durable daemon's soak: many tasks from concurrent clients while workers are killed now
and then and the daemon is SIGKILLed and restarted on its journal (issue 25).

A script, not a test::

    PYTHONPATH=. python bench/soak.py                          # 10^6 tasks, 4 clients, 2 restarts
    PYTHONPATH=. python bench/soak.py --tasks 100000 --svg docs/_static/soak_memory.svg

What runs: one ``scaler-daemon --journal`` on ``ipc://`` with no local workers, ``--workers``
standalone ``scaler-worker`` processes (one processor each), and ``--clients`` client
processes, each submitting its share of ``--tasks`` through ``ScalerExecutor(address=...)``
with at most ``--window`` futures outstanding.  Every task appends its id and its process id
to a file of its processor's (``O_APPEND``), so the runs can be counted afterwards.

Meanwhile: every ``--kill-every`` seconds one worker (its whole process group) is SIGKILLed
and a new one started; when a third and two thirds of the tasks have run, the daemon is
SIGKILLed and started again on the same journal and address.  The daemon's resident memory
is sampled every ``--sample`` seconds (across its restarts).

What it checks and prints: every future completed exactly once with the right value (a
client counts a wrong value or an exception as a failure); every task ran at least once;
the tasks that ran more than once, and whether each such second run follows the death of the
worker process that ran it first (the only excuse the issue allows); the daemon's memory over
time (a table of samples, and an SVG plot with ``--svg``).  Exit status 0 only when nothing
was lost, nothing completed wrongly and nothing ran twice without a killed worker.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

RECORD = struct.Struct("<QI")  # task id (client << 40 | index), the pid that ran it


def run_task(task_id: int) -> int:
    """Record this run in the processor's own file, then return a value the client checks."""
    path = os.path.join(os.environ["SOAK_RUNS"], str(os.getpid()))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, struct.pack("<QI", task_id, os.getpid()))  # RECORD's layout (a Struct does not pickle)
    finally:
        os.close(fd)
    return task_id * 3 + 1


# ----------------------------------------------------------------------------- one client


def client_main(address: str, index: int, count: int, window: int, out: str) -> None:
    from scaler_executor import ScalerExecutor

    done = threading.Semaphore(window)
    lock = threading.Lock()
    tally = {"ok": 0, "wrong": 0, "errors": 0, "callbacks": 0}
    first_errors: list[str] = []
    settled = threading.Event()
    base = index << 40

    def finished(future: Any, task_id: int) -> None:
        try:
            value = future.result()
            key = "ok" if value == task_id * 3 + 1 else "wrong"
        except BaseException as exc:  # noqa: BLE001 - every failure is counted and shown
            key = "errors"
            if len(first_errors) < 5:
                first_errors.append(f"{type(exc).__name__}: {exc}")
        with lock:
            tally[key] += 1
            tally["callbacks"] += 1
            if tally["callbacks"] == count:
                settled.set()
        done.release()

    started = time.monotonic()
    with ScalerExecutor(address=address) as ex:
        for i in range(count):
            done.acquire()
            task_id = base | i
            ex.submit(run_task, task_id).add_done_callback(lambda f, t=task_id: finished(f, t))
        settled.wait()
    with open(out, "w") as f:
        json.dump({**tally, "submitted": count, "seconds": time.monotonic() - started, "first_errors": first_errors}, f)


# ----------------------------------------------------------------------------- the cluster


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="soak-")
        self.runs = os.path.join(self.dir, "runs")
        os.mkdir(self.runs)
        self.address = f"ipc://{self.dir}/daemon.sock"
        self.journal = os.path.join(self.dir, "journal")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
        self.env["SOAK_RUNS"] = self.runs
        self.env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), self.env.get("PYTHONPATH", "")])
        self.daemon: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.killed_pids: set[int] = set()  # processor pids of killed workers
        self.events: list[tuple[float, str]] = []
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.monotonic()
        self.stop = threading.Event()

    def note(self, what: str) -> None:
        self.events.append((time.monotonic() - self.t0, what))
        print(f"[{time.monotonic() - self.t0:7.1f} s] {what}", flush=True)

    def start_daemon(self) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address, "--workers", "0",
             "--journal", self.journal, "--log-level", "WARNING"],
            env=self.env, start_new_session=True,
        )

    def start_worker(self) -> None:
        self.workers.append(subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.worker", self.address, "--workers", "1", "--processors", "1",
             "--log-level", "WARNING"],
            env=self.env, start_new_session=True,
        ))

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                self.killed_pids.add(child.pid)
        except psutil.NoSuchProcess:
            pass
        self.killed_pids.add(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def runs_so_far(self) -> int:
        total = 0
        for name in os.listdir(self.runs):
            try:
                total += os.path.getsize(os.path.join(self.runs, name)) // RECORD.size
            except FileNotFoundError:
                pass
        return total

    def sampler(self) -> None:
        while not self.stop.wait(self.args.sample):
            daemon = self.daemon
            try:
                rss = psutil.Process(daemon.pid).memory_info().rss if daemon is not None else 0
            except psutil.NoSuchProcess:
                rss = 0
            self.samples.append((time.monotonic() - self.t0, rss))

    def run(self) -> int:
        args = self.args
        self.note(f"daemon at {self.address}, journal {self.journal}")
        self.start_daemon()
        for _ in range(args.workers):
            self.start_worker()
        threading.Thread(target=self.sampler, daemon=True).start()
        share = args.tasks // args.clients
        clients = [
            subprocess.Popen(
                [sys.executable, __file__, "--client", str(i + 1), "--address", self.address, "--tasks", str(share),
                 "--window", str(args.window), "--out", os.path.join(self.dir, f"client{i + 1}.json")],
                env=self.env,
            )
            for i in range(args.clients)
        ]
        total = share * args.clients
        restarts = [total * (k + 1) // (args.restarts + 1) for k in range(args.restarts)]
        next_kill = time.monotonic() + args.kill_every
        try:
            while any(c.poll() is None for c in clients):
                time.sleep(0.2)
                if restarts and self.runs_so_far() >= restarts[0]:
                    restarts.pop(0)
                    assert self.daemon is not None
                    self.note(f"SIGKILL daemon (pid {self.daemon.pid}) at {self.runs_so_far()} runs")
                    os.killpg(self.daemon.pid, signal.SIGKILL)
                    self.daemon.wait()
                    self.start_daemon()
                    self.note(f"daemon restarted on its journal (pid {self.daemon.pid})")
                if args.kill_every > 0 and time.monotonic() >= next_kill:
                    next_kill = time.monotonic() + args.kill_every
                    victim = self.workers.pop(0)
                    self.note(f"SIGKILL worker (pid {victim.pid})")
                    self.kill_worker(victim)
                    self.start_worker()
                if time.monotonic() - self.t0 > args.limit:
                    self.note(f"giving up after {args.limit:.0f} s")
                    for c in clients:
                        c.kill()
                    break
        finally:
            self.stop.set()
            for c in clients:
                c.wait()
            for w in self.workers:
                self.kill_worker(w)
            if self.daemon is not None:
                try:
                    os.killpg(self.daemon.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    self.daemon.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.daemon.pid, signal.SIGKILL)
                    self.daemon.wait()
        return self.verdict(total)

    def verdict(self, total: int) -> int:
        args = self.args
        tallies = []
        for i in range(args.clients):
            try:
                with open(os.path.join(self.dir, f"client{i + 1}.json")) as f:
                    tallies.append(json.load(f))
            except FileNotFoundError:
                tallies.append({"ok": 0, "wrong": 0, "errors": 0, "callbacks": 0, "first_errors": ["no summary: the client died"]})
        runs: dict[int, list[int]] = collections.defaultdict(list)
        for name in os.listdir(self.runs):
            with open(os.path.join(self.runs, name), "rb") as f:
                data = f.read()
            for task_id, pid in RECORD.iter_unpack(data[: len(data) - len(data) % RECORD.size]):
                runs[task_id].append(pid)
        expected = {(c + 1) << 40 | i for c in range(args.clients) for i in range(total // args.clients)}
        never = len(expected - runs.keys())
        twice = {t: pids for t, pids in runs.items() if len(pids) > 1}
        excused = sum(1 for pids in twice.values() if all(p in self.killed_pids for p in pids[:-1]))
        ok = sum(t["ok"] for t in tallies)
        wrong = sum(t["wrong"] for t in tallies)
        errors = sum(t["errors"] for t in tallies)
        print()
        print(f"machine: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()}")
        print(f"tasks: {total} from {args.clients} clients, {args.workers} workers, window {args.window}")
        for i, t in enumerate(tallies):
            print(f"  client {i + 1}: ok {t['ok']}, wrong {t['wrong']}, errors {t['errors']}, "
                  f"in {t.get('seconds', float('nan')):.1f} s {t['first_errors'] or ''}")
        print(f"futures completed right: {ok} of {total}; wrong values {wrong}; errors {errors}")
        print(f"tasks never run: {never}; run more than once: {len(twice)} "
              f"({excused} after their first worker was killed, {len(twice) - excused} without)")
        peak = max((rss for _, rss in self.samples), default=0)
        print(f"daemon memory: peak {peak / 2**20:.1f} MiB over {len(self.samples)} samples")
        step = max(1, len(self.samples) // 20)
        for t, rss in self.samples[::step]:
            print(f"  {t:7.1f} s  {rss / 2**20:8.1f} MiB")
        for t, what in self.events:
            print(f"  event {t:7.1f} s  {what}")
        if args.svg:
            write_svg(args.svg, self.samples, self.events, f"{total:,} tasks, {args.clients} clients, "
                      f"{args.workers} workers (one killed every {args.kill_every:g} s), {args.restarts} daemon restarts")
            print(f"plot: {args.svg}")
        shutil.rmtree(self.dir, ignore_errors=True)
        good = ok == total and wrong == 0 and errors == 0 and never == 0 and excused == len(twice)
        print("PASS" if good else "FAIL")
        return 0 if good else 1


def write_svg(path: str, samples: list[tuple[float, int]], events: list[tuple[float, str]], title: str) -> None:
    """A line plot of the daemon's RSS over time, restarts and worker kills marked."""
    width, height, left, bottom, top, right = 720, 320, 60, 40, 30, 20
    t_max = max((t for t, _ in samples), default=1.0) or 1.0
    m_max = max((rss for _, rss in samples), default=1) / 2**20 * 1.1 or 1.0

    def x(t: float) -> float:
        return left + (width - left - right) * t / t_max

    def y(mib: float) -> float:
        return height - bottom - (height - bottom - top) * mib / m_max

    points = " ".join(f"{x(t):.1f},{y(rss / 2**20):.1f}" for t, rss in samples)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="12">daemon resident memory: {title}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
    ]
    for k in range(5):
        mib = m_max * k / 4
        parts.append(f'<text x="{left - 6}" y="{y(mib) + 4:.1f}" text-anchor="end">{mib:.0f} MiB</text>')
        t = t_max * k / 4
        parts.append(f'<text x="{x(t):.1f}" y="{height - bottom + 16}" text-anchor="middle">{t:.0f} s</text>')
    for t, what in events:
        colour = "#c00" if "daemon" in what else "#999"
        if "SIGKILL" in what:
            parts.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{height - bottom}" stroke="{colour}" stroke-dasharray="3,3"/>')
    parts.append(f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    parts.append(f'<text x="{width - right}" y="{height - 6}" text-anchor="end" fill="#666">red: daemon SIGKILLed and '
                 "restarted on its journal; grey: a worker SIGKILLed</text>")
    parts.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--window", type=int, default=20_000, help="futures a client keeps outstanding")
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between worker kills (0: none)")
    parser.add_argument("--restarts", type=int, default=2, help="daemon SIGKILLs and restarts")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between memory samples")
    parser.add_argument("--limit", type=float, default=3600.0, help="give up after this many seconds")
    parser.add_argument("--svg", default="", help="write the memory plot here")
    parser.add_argument("--client", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--address", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.address, args.client, args.tasks, args.window, args.out)
        return 0
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
