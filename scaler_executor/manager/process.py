"""A local worker process, started with ``posix_spawn`` and its lifeline as standard input.

Why not ``subprocess.Popen``: ``scaler-daemon`` starts the embedded cluster's
first workers before it imports anything but this module (``cli/daemon.py``),
so the workers' interpreter start overlaps the daemon's, and nothing of the
daemon's imports ``subprocess`` (~3 ms of a cold start on a 2-core VM).  And
``Popen.wait(timeout)`` sleeps in steps of up to 50 ms, which a stopping
cluster would pay: :meth:`WorkerProcess.wait` waits on a pidfd instead
(``_compat.exited_within``).

The object offers what :class:`~scaler_executor.manager.local.LocalWorkerManager`
uses of a ``Popen``: ``pid``, ``stdin`` (the write end of the lifeline, held by
this process only), ``poll()``/``returncode`` (negative: killed by that signal),
``wait(timeout)`` (raising ``TimeoutError``), ``send_signal``, ``kill``.  The process is this process's
child, so its exact wait status (a worker killed by SIGKILL, one that exited
with code 3) is known.
"""

from __future__ import annotations

import os
import signal

from scaler_executor._compat import exited_within

TYPE_CHECKING = False  # not typing's: cli/daemon.py imports this before starting its workers
if TYPE_CHECKING:
    from typing import IO


class WorkerProcess:
    def __init__(self, command: list[str]) -> None:
        """Start ``command`` with a fresh lifeline pipe as its standard input.

        Standard output and error are inherited; every other descriptor of this process is
        close-on-exec (Python's default), so the child holds none of them, no lifeline of
        another worker among them."""
        read_end, write_end = os.pipe()  # both close-on-exec; dup2 onto 0 clears it for the child
        try:
            self.pid = os.posix_spawn(
                command[0],
                command,
                os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0)],
                # What Popen's restore_signals does: Python ignores SIGPIPE (and SIGXFSZ); a
                # child that is not Python should not inherit that.
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self.stdin: IO[bytes] | None = os.fdopen(write_end, "wb", buffering=0)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (negative: the signal that killed it), or None while it runs."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait until it exits; raises ``TimeoutError`` after ``timeout`` seconds."""
        if self.returncode is not None:
            return self.returncode
        if timeout is not None and not self._exited_within(timeout):
            raise TimeoutError(f"worker pid {self.pid} still running after {timeout:g} s")
        self._reap(0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exited_within(self, timeout: float) -> bool:
        return exited_within(self.pid, timeout, lambda: self.poll() is not None)

    def _reap(self, flags: int) -> None:
        while True:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except InterruptedError:
                continue
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 255
                return
            break
        if pid == 0:
            return
        self.returncode = os.waitstatus_to_exitcode(status)
