"""One processor as the worker agent sees it: its record, the pipe to it, its stderr, its end.

The agent (worker/agent.py) decides which task goes where and what a processor's death
means for its tasks; this module is the process itself: writing RUNs to it (alone, several
in one system call, or with memfds beside them), forwarding what it writes to stderr while
keeping the tail that explains a crash, killing or retiring it, and putting its death into
words (exit status, the kernel's OOM killer, the worker's memory limit, its last stderr
lines).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections import deque
from multiprocessing.connection import Connection

from scaler_executor._compat import describe_wait_status
from scaler_executor.worker.framing import FrameReader, send_with_fds
from scaler_executor.worker.memory import OomCounter

_FRAME_LEN = struct.Struct("!i")  # multiprocessing.connection's framing (worker/framing.py)
_FRAME_LONG = struct.Struct("!Q")
STDERR_TAIL_BYTES = 4096  # kept per processor to explain a crash
STDERR_TAIL_LINES = 6  # quoted in the error of the task it was running when it died


class Processor:
    __slots__ = (
        "attempts",
        "conn",
        "deadline",
        "eof_at",
        "err_fd",
        "err_tail",
        "fd",
        "functions",
        "head_since",
        "kill",
        "memory",
        "outstanding",
        "peak",
        "pid",
        "reader",
        "recall_fd",
        "recalling",
        "retired",
        "seceded",
        "sent",
        "wait_status",
    )

    def __init__(self, pid: int, conn: Connection, err_fd: int, recall_fd: int = -1) -> None:
        self.pid = pid
        self.conn = conn
        self.fd = conn.fileno()
        # recvmsg on a duplicate: large results come as memfds beside DONE (worker/handoff.py)
        self.reader = FrameReader(self.fd, socket.socket(fileno=os.dup(self.fd)))
        self.seceded = False  # its running task waits on sub-tasks: it does not count as a slot
        self.retired = False  # asked to exit (the worker has one processor too many)
        self.err_fd = err_fd  # read end of its stderr pipe, -1 once closed
        self.err_tail = bytearray()
        self.memory = 0  # last sampled private memory
        self.peak = 0  # highest sample during the running task
        self.outstanding: deque[int] = deque()  # task ids sent, in order; [0] is running
        self.attempts: dict[int, int] = {}  # task id -> the attempt this processor was given
        self.functions: set[int] = set()
        self.sent = 0
        self.eof_at: float | None = None  # when its socket closed
        self.wait_status: int | None = None  # from the zygote
        self.kill: tuple[int, str] | None = None  # (status, reason) when we killed it on purpose
        self.deadline: float | None = None  # task_timeout of the running task
        self.recall_fd = recall_fd  # write end of its recall pipe (-1 once closed)
        self.recalling = False  # a recall is out: no task goes to it until RECALLED
        self.head_since = 0.0  # when the running task (outstanding[0]) was sent or became first

    def close_fds(self) -> None:
        self.reader.close()
        self.conn.close()
        if self.recall_fd >= 0:
            os.close(self.recall_fd)
            self.recall_fd = -1

    # ------------------------------------------------------------------ writing to it
    # A processor that died cannot be written to: the write is dropped, and its socket's EOF
    # (the poller) says it is gone.

    def send(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except OSError:
            pass

    def send_with_fds(self, data: bytes, fds: list[int]) -> None:
        """``data`` with memfds (or a stream's socket) beside it (worker/handoff.py)."""
        sock = self.reader.sock
        try:
            if sock is None:
                raise OSError("the processor's socket is closed")
            send_with_fds(sock, data, fds)
        except OSError:
            pass

    def send_frames(self, frames: list[bytes]) -> None:
        """``frames`` in ``Connection.send_bytes``'s framing, in one system call if they fit."""
        if len(frames) == 1:
            self.send(frames[0])
            return
        parts: list[bytes] = []
        for data in frames:
            size = len(data)
            parts.append(_FRAME_LEN.pack(size) if size <= 0x7FFFFFFF else _FRAME_LEN.pack(-1) + _FRAME_LONG.pack(size))
            parts.append(data)
        view = memoryview(b"".join(parts))
        try:
            fd = self.conn.fileno()  # (raises once closed: its number may be another file's by then)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            pass

    # ------------------------------------------------------------------ its stderr

    def read_stderr(self, forward_to: int = 2) -> bool:
        """Forward what it wrote to stderr (to ``forward_to``) and keep the tail; True once
        its stderr has ended (the caller then takes ``err_fd`` off its poller and calls
        ``close_stderr``)."""
        while self.err_fd >= 0:
            try:
                data = os.read(self.err_fd, 65536)
            except BlockingIOError:
                return False
            except OSError:
                data = b""
            if not data:
                return True
            _write_all(forward_to, data)
            self.err_tail += data
            del self.err_tail[:-STDERR_TAIL_BYTES]
        return True

    def close_stderr(self) -> None:
        if self.err_fd >= 0:
            os.close(self.err_fd)
            self.err_fd = -1

    def last_lines(self, count: int = STDERR_TAIL_LINES) -> list[str]:
        lines = bytes(self.err_tail).decode(errors="replace").splitlines()
        return [line for line in lines if line.strip()][-count:]

    # ------------------------------------------------------------------ its end

    def kill_for(self, status: int, reason: str) -> None:
        """SIGKILL it, remembering why (the first reason stays): the task it ran ends with
        ``status`` and ``reason`` (the agent's ``_bury``)."""
        if self.kill is None:
            self.kill = (status, reason)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def retire(self) -> None:
        """Ask it to exit (SIGTERM); its end is then handled like any other.

        Its socket stays open until it is buried: closing it here freed the descriptor
        number for the next processor while this record was still filed under it, and the
        burial then removed the new processor's entry (its results were never read).
        """
        self.retired = True
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def how_it_ended(self, oom: OomCounter, memory_limit: int | None) -> str:
        """Its end in words, for the error of the task it ran: how it exited; for a SIGKILL
        that was not ours, whether the kernel's OOM killer counted one (``oom``, consumed)
        or, under a worker memory limit, its last private memory; its last stderr lines."""
        status = self.wait_status
        how = describe_wait_status(status) if status is not None else "exit status unknown"
        if (
            self.kill is None
            and status is not None
            and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGKILL
        ):
            if oom.killed_since_last():
                how += " by the kernel's out-of-memory killer (the cgroup's memory.events counted an oom_kill)"
            elif memory_limit is not None:
                how += f", last private memory {size_text(self.memory)} of the worker's limit {size_text(memory_limit)}"
        tail = self.last_lines()
        if tail:
            how += "; its last stderr lines:\n    " + "\n    ".join(tail)
        return how

    def take_back(self, returned: list[int]) -> dict[int, int | None]:
        """Tasks it hands back unstarted (RECALLED, SECEDE): out of its queue and its count
        towards ``max_tasks_per_child``; returns each one's attempt as it was given."""
        given = {task_id: self.attempts.pop(task_id, None) for task_id in returned}
        for task_id in returned:
            self.outstanding.remove(task_id)
        self.sent -= len(returned)
        return given


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
        except OSError:
            return  # our own stderr is gone: nothing better to do with the text


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
