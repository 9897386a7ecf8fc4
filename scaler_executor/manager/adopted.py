"""Local workers a daemon restarted on its journal takes over from its dead predecessor.

The embedded cluster's workers outlive their daemon for its restart (worker/resume.py):
they are no children of the restarted daemon, so it cannot reap them or hold their
lifeline.  The journal names them (pid and host); the local manager keeps them as
``AdoptedWorker``s, counted among the workers it keeps alive, so that it starts no extra
ones, and stops them with the others.  A pid is taken only while it still runs a worker
of ours (its command line names the worker module), so a reused pid is never signalled.
"""

from __future__ import annotations

import os
import signal
import time

WORKER_MODULE = b"scaler_executor.cli.worker"


def _runs_a_worker(pid: int, address: str = "") -> bool:
    """Whether ``pid`` is a live (not zombie) worker agent of this user's, of the daemon at
    ``address`` if given (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return False
    parts = cmdline.split(b"\0")
    mine = not address or os.fsencode(address) in parts
    return WORKER_MODULE in parts and mine and state != b"Z" and owner == os.getuid()


class AdoptedWorker:
    """A running local worker started by an earlier daemon: WorkerProcess's interface."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdin = None  # its lifeline was the earlier daemon's: it waits for us by its silence limit
        self.returncode: int | None = None

    @classmethod
    def find(cls, pid: int, address: str) -> AdoptedWorker | None:
        """The worker agent ``pid`` of the daemon at ``address`` if it still runs, else None."""
        return cls(pid) if _runs_a_worker(pid, address) else None

    def poll(self) -> int | None:
        if self.returncode is None and not _runs_a_worker(self.pid):
            self.returncode = 0  # not our child: its exit status is its parent's to read
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"adopted worker pid {self.pid} still running after {timeout:g} s")
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                self.returncode = 0

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
