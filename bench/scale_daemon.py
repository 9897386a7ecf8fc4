"""The daemon under bench/scale.py: started pinned, its CPU read from /proc (split from scale.py)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil


def daemon_cpu(pid: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9


def cpu_busy(cpu: int) -> float:
    """Seconds CPU ``cpu`` was busy (any process), from /proc/stat; 0.0 where unreadable."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith(f"cpu{cpu} "):
                    v = [int(x) for x in line.split()[1:]]
                    idle = v[3] + (v[4] if len(v) > 4 else 0)
                    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return 0.0


def raise_nofile() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def pin() -> tuple[list[str], bool]:
    """(prefix of the daemon's command, whether this process is pinned apart from it)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2 and shutil.which("taskset"):
        os.sched_setaffinity(0, set(cpus[1:]))
        return ["taskset", "-c", str(cpus[0])], True
    return [], False


class DaemonProcess:
    def __init__(self, address: str, extra: list[str], prefix: list[str], log_path: str, tree: str = "",
                 tap: str = "") -> None:
        self.log = open(log_path, "wb")  # noqa: SIM115  # closed by stop(), after the process
        main = ["bench.scale_tap", tap, "--"] if tap else ["scaler_executor.cli.daemon"]  # tap: counts per message type
        cmd = [*prefix, sys.executable, "-m", *main, "--address", address, "--workers", "0", *extra]
        env = dict(os.environ, PYTHONPATH=tree) if tree else None  # another checkout's daemon (A/B)
        # In the tree's directory too: ``python -m`` puts the working directory first on
        # sys.path, ahead of PYTHONPATH, so from this checkout's directory every "tree" ran
        # this checkout's daemon.
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tree or None,
        )
        self.ps = psutil.Process(self.proc.pid)
        self.core = int(prefix[-1]) if prefix else None  # the CPU it is pinned to

    def cpu(self) -> float:
        return daemon_cpu(self.proc.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _phase(sim: Any, daemon: DaemonProcess, body: Callable[[], None]) -> dict[str, float]:
    """Run ``body``; the wall time, the daemon's and this process's CPU, and how busy the
    daemon's core was with other processes (``others``: the machine is shared)."""
    core = daemon.core
    cpu0, own0, t0 = daemon.cpu(), time.process_time(), time.monotonic()
    busy0 = cpu_busy(core) if core is not None else 0.0
    body()
    wall = time.monotonic() - t0
    used = daemon.cpu() - cpu0
    others = (cpu_busy(core) - busy0 - used) / wall if core is not None else float("nan")
    return {"wall": wall, "daemon_cpu": used, "harness_cpu": time.process_time() - own0, "others": max(0.0, others)}


def _pctl(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]
