"""Private-memory measurement and the kernel's OOM-kill counter, from /proc and cgroups.

Private memory is ``RssAnon`` from ``/proc/PID/status``: resident anonymous pages.
Pages of shared-memory segments (the object store) are ``RssShmem`` and file pages are
``RssFile``, so neither counts — a task reading a 1 GB array from the store uses ~0 of
its limit.  Reading it costs ~20 µs, cheap enough to sample every processor at 10 Hz.
"""

from __future__ import annotations

import os
import re

from scaler_executor.sizes import parse_size, total_memory

_RSS_ANON = re.compile(rb"RssAnon:\s+(\d+) kB")


def private_memory(pid: int | str = "self") -> int:
    """Resident anonymous memory of a process in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            match = _RSS_ANON.search(f.read())
    except OSError:
        return 0
    return int(match.group(1)) * 1024 if match else 0


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | str = "self") -> float | None:
    """User plus system CPU time a process has used, in seconds (None if it is gone), from
    ``/proc/PID/stat`` (fields 14 and 15, after the command name, which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return None


def memory_limit(setting: str, workers_on_host: int, reserved: int = 0) -> int | None:
    """The per-worker limit in bytes for the ``memory_limit`` setting.

    ``auto``: 95% of the machine's RAM, less what is ``reserved`` (the object store), shared
    evenly by the workers on this host; ``none``: no limit; otherwise a size such as ``4G``.
    """
    setting = setting.strip().lower()
    if setting == "none":
        return None
    if setting == "auto":
        return max(1 << 26, int(total_memory() * 0.95 - reserved) // max(1, workers_on_host))
    return parse_size(setting)


def _cgroup_events_file() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":  # cgroup v2
            candidate = f"/sys/fs/cgroup{path}/memory.events"
            if os.path.exists(candidate):
                return candidate
        if "memory" in controllers.split(","):  # cgroup v1
            candidate = f"/sys/fs/cgroup/memory{path}/memory.oom_control"
            if os.path.exists(candidate):
                return candidate
    for candidate in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        if os.path.exists(candidate):
            return candidate
    return None


class OomCounter:
    """The cgroup's count of kernel OOM kills, to tell an OOM kill from another SIGKILL."""

    def __init__(self) -> None:
        self.path = _cgroup_events_file()
        self.last = self.read()

    def read(self) -> int | None:
        if self.path is None:
            return None
        try:
            with open(self.path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            return None
        return None

    def killed_since_last(self) -> bool:
        """Did the kernel OOM-kill something in our cgroup since the last call?"""
        now = self.read()
        if now is None:
            return False
        grew = self.last is not None and now > self.last
        self.last = now
        return grew
