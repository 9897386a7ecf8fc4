"""Is the daemon's cost per task flat in the number of tasks?  (10^3 … 10^6 no-op tasks)

A script, not a test: it prints a table and, with ``--output``, writes it as a page::

    PYTHONPATH=. python bench/daemon_flatness.py --output docs/daemon_flatness.rst
    PYTHONPATH=. python bench/daemon_flatness.py --sizes 1000,10000   # a quick look

One standalone ``scaler-daemon`` (``--workers 1 --processors-per-worker 2``) serves every
size in turn, so its own process can be measured apart from the client and the workers:

* **CPU per task**: the daemon process's time on a CPU (every thread), read from
  ``/proc/<pid>/task/*/schedstat`` in nanoseconds, over the run, divided by the tasks
  (psutil's user + system time counts whole 10 ms clock ticks: ±25 % at 10^3 tasks);
* **bytes per pending task**: both processors are first held by a task that waits for a
  file, then the N tasks are submitted at once; when the daemon reports all N recorded,
  the growth of its resident memory since before the submission, divided by N, is what
  one pending task costs it.  Then the blockers are released and every task runs.  Under
  about 10^4 tasks the growth fits in memory the daemon already holds after the warm-up
  (pymalloc reuses its arenas), so that row reads near zero: the figure means something
  from 10^4 up;
* **RSS after**: the daemon's resident memory once the run is over (what a long-lived
  daemon keeps after 10^6 tasks).

"Flat" means per-task figures within ±20 % of their mean across sizes.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000)
BLOCK_TIMEOUT = 600.0


def cpu_seconds(proc: Any) -> float:
    """Time on a CPU of every thread of ``proc``: nanoseconds from schedstat where Linux
    has it, else psutil's user + system (whole clock ticks)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                pass  # a thread that ended meanwhile
    except OSError:
        return float(sum(proc.cpu_times()[:2]))
    return total / 1e9


def noop(x: int) -> int:
    return x


def block(path: str) -> None:
    """Hold a processor until ``path`` exists (or BLOCK_TIMEOUT: never hang)."""
    deadline = time.monotonic() + BLOCK_TIMEOUT
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def wait_recorded(ex: Any, timeout: float = 600.0) -> None:
    """Until the daemon has acknowledged every submission (it records a task, then acks it).

    Reads the client core's own counters (``client/state.py``: the outbox and the tasks sent
    but not yet acknowledged) rather than polling ``ex.statistics()``.
    """
    core = ex._agent.core
    deadline = time.monotonic() + timeout
    while core.outbox or core.unacked:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemon did not acknowledge every task in {timeout} s")
        time.sleep(0.01)


def run(sizes: list[int]) -> list[dict[str, Any]]:
    from scaler_executor import ScalerExecutor

    workdir = tempfile.mkdtemp(prefix="scaler-flatness-")
    address = f"ipc://{workdir}/daemon.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
    daemon = subprocess.Popen(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address,
         "--workers", "1", "--processors-per-worker", "2"],
        env=env,
    )
    rows = []
    try:
        proc = psutil.Process(daemon.pid)
        with ScalerExecutor(address=address) as ex:
            # Warm-up: workers connected, functions registered, code paths hot.
            assert list(ex.map(noop, range(2000))) == list(range(2000))
            for n in sizes:
                gate = os.path.join(workdir, f"go-{n}")
                blockers = [ex.submit(block, gate) for _ in range(2)]
                while ex.statistics().get("tasks_dispatched", 0) < 2:
                    time.sleep(0.01)
                rss0 = proc.memory_info().rss
                cpu0 = cpu_seconds(proc)
                t0 = time.perf_counter()
                futures = [ex.submit(noop, i) for i in range(n)]
                wait_recorded(ex)
                rss_pending = proc.memory_info().rss
                open(gate, "w").close()
                total = sum(f.result() for f in futures)
                for b in blockers:
                    b.result()
                wall = time.perf_counter() - t0
                cpu1 = cpu_seconds(proc)
                del futures
                if total != n * (n - 1) // 2:
                    raise AssertionError(f"wrong sum for {n} tasks")
                rows.append({
                    "tasks": n,
                    "wall_s": wall,
                    "rate": n / wall,
                    "cpu_us_per_task": (cpu1 - cpu0) / n * 1e6,
                    "bytes_per_task": (rss_pending - rss0) / n,
                    "rss_after": proc.memory_info().rss,
                })
                r = rows[-1]
                print(f"{n:>9,} tasks  {r['rate']:8,.0f} tasks/s  daemon {r['cpu_us_per_task']:6.1f} us/task  "
                      f"{r['bytes_per_task']:6.0f} B/pending task  RSS after {r['rss_after'] / 2**20:6.1f} MiB",
                      flush=True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    header = ["tasks", "tasks/s", "daemon CPU (µs/task)", "daemon memory (B/pending task)", "daemon RSS after (MiB)"]
    body = [
        [f"{r['tasks']:,}", f"{r['rate']:,.0f}", f"{r['cpu_us_per_task']:.1f}", f"{r['bytes_per_task']:.0f}",
         f"{r['rss_after'] / 2**20:.1f}"]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"

    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [rule, line(header), rule.replace("-", "=")]
    for b in body:
        out += [line(b), rule]
    return "\n".join(out)


def spread(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows]
    mean = sum(values) / len(values)
    return max(abs(v - mean) for v in values) / mean * 100 if mean else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--output", help="write the table as a reStructuredText page")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = run(sizes)
    text = table(rows)
    cpu_spread = spread(rows, "cpu_us_per_task")
    sized = [r for r in rows if r["tasks"] >= 10_000] or rows  # see the docstring: 10^3 reads ~0
    bytes_spread = spread(sized, "bytes_per_task")
    verdict = (
        f"Largest deviation from the mean across sizes: CPU per task ±{cpu_spread:.0f} %, "
        f"memory per pending task ±{bytes_spread:.0f} % (from 10⁴ tasks up; goal: within ±20 %)."
    )
    print(text)
    print(verdict)
    if args.output:
        machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"{psutil.virtual_memory().total / 2**30:.1f} GiB, Python {platform.python_version()}, "
                   f"{time.strftime('%Y-%m-%d')}")
        title = "Daemon cost per task from 10³ to 10⁶ tasks"
        page = "\n".join([
            title, "=" * len(title), "",
            "Generated by ``bench/daemon_flatness.py`` (see its docstring for what is measured)::", "",
            f"    python bench/daemon_flatness.py --output {args.output}", "",
            "One standalone daemon with one worker of 2 processors serves every size in turn: N",
            "no-op tasks submitted at once behind two blocking tasks, then released.", "",
            text, "", verdict, "", f"Machine: {machine}.", "",
        ])
        with open(args.output, "w") as f:
            f.write(page)


if __name__ == "__main__":
    main()
