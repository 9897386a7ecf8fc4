"""Per-task output capture (``ex.options(capture_output=True)``), in the processor.

What is captured, and how::

    task code ──print / sys.stdout.write──► sys.stdout (buffered) ──flush at task end──┐
    C code, subprocesses ──write(1|2)───────────────────────────────────────────────────┤
                                                              fd 1 ──► <dir>/<pid>.1 ◄──┘
                                                              fd 2 ──► <dir>/<pid>.2
    logging records ──► a handler on the root logger ──► a bounded list in memory

* **At the file-descriptor level.**  While a capturing task runs, the processor's fds 1
  and 2 point at two files of its own (``O_APPEND``, truncated at the start of each
  capturing task, reused for the next), so output written by C extensions and by
  subprocesses that inherit fds 1/2 is captured with the Python-level writes.  Nothing
  is sent per ``write``: the processor reads the files once, when the task ends.
* **Bounded.**  At most ``limit`` bytes per stream reach the client: the first and the
  last ``limit // 2`` bytes, with a line between them saying how many bytes were left
  out.  The processor reads only those two slices (``pread``), so its memory stays
  bounded however much a task prints; the file itself holds everything the task wrote
  until the next capturing task (disk in the worker's temp directory, not memory).
* **Log records** that reach the root logger (the logger levels the task's code set
  decide which) are kept as ``(created, levelname, logger name, message)``, up to
  ``limit`` bytes of messages (head and tail, the number left out noted).
* **A processor killed mid-task** (segfault, SIGKILL, memory limit, timeout,
  ``cancel(force=True)``): the worker agent reads the files by their path
  (:func:`read_files`), so what the task had written to fds 1/2 up to its death
  reaches the client; bytes still in ``sys.stdout``'s buffer (Python's stdout is
  block-buffered when it is not a terminal) and its log records die with it.
* **Not captured:** output written by a subprocess after the task returned (it lands
  in the next capturing task's files, or in the worker's stderr), and output of tasks
  run without ``capture_output`` (it goes to the worker's stderr, as before).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from scaler_executor.protocol.output import encode

__all__ = ["Capture", "read_files"]

STREAMS = (1, 2)


def _read_bounded(fd: int, limit: int) -> str:
    """The text of file ``fd`` up to ``limit`` bytes: all of it, or its head and tail
    around a note of what was left out; read with two ``pread`` s, never all of it."""
    size = os.fstat(fd).st_size
    if not size:
        return ""
    if size <= limit:
        return os.pread(fd, size, 0).decode("utf-8", "replace")
    half = limit // 2
    head = os.pread(fd, half, 0).decode("utf-8", "replace")
    tail = os.pread(fd, half, size - half).decode("utf-8", "replace")
    note = f"\n[scaler-executor: {size - 2 * half} bytes of output left out here; capture_output_limit is {limit} bytes]\n"
    return head + note + tail


def path_of(directory: str, pid: int, stream: int) -> str:
    return os.path.join(directory, f"{pid}.{stream}")


def read_files(directory: str, pid: int, limit: int) -> bytes:
    """The output a (dead) processor's capturing task wrote to fds 1/2, encoded as for
    ``TaskResult.output``; b"" when it had no files.  The files are removed."""
    texts = []
    for stream in STREAMS:
        path = path_of(directory, pid, stream)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return b""
        try:
            texts.append(_read_bounded(fd, limit))
        finally:
            os.close(fd)
            os.unlink(path)
    note = "[scaler-executor: the process running this task died; bytes it had not flushed and its log records are lost]\n"
    return encode(texts[0], texts[1] + note, [])


class _Records(logging.Handler):
    """Keeps log records' text within a byte budget: the first half, and a ring of the last."""

    def __init__(self, limit: int) -> None:
        super().__init__(logging.NOTSET)
        self.budget = limit // 2
        self.reset()

    def reset(self) -> None:
        self.head: list[list[Any]] = []
        self.head_bytes = 0
        self.tail: list[list[Any]] = []
        self.tail_bytes = 0
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
        except Exception:  # noqa: BLE001 - a record whose arguments do not format is kept as its template
            message = str(record.msg)
        entry = [record.created, record.levelname, record.name, message]
        size = len(message) + len(record.name) + 16
        if self.head_bytes + size <= self.budget:
            self.head.append(entry)
            self.head_bytes += size
            return
        self.tail.append(entry)
        self.tail_bytes += size
        while self.tail_bytes > self.budget and self.tail:
            dropped = self.tail.pop(0)
            self.tail_bytes -= len(dropped[3]) + len(dropped[2]) + 16
            self.dropped += 1

    def records(self) -> list[list[Any]]:
        if not self.dropped:
            return self.head + self.tail
        gap = [self.tail[0][0] if self.tail else 0.0, "WARNING", "scaler_executor.capture",
               f"{self.dropped} log records left out here (capture_output_limit)"]
        return [*self.head, gap, *self.tail]


class Capture:
    """A processor's capture: ``start()`` before a capturing task, ``stop()`` after it."""

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self.files: list[int] = []  # our fds of <dir>/<pid>.1 and .2
        self.saved: list[int] = []  # copies of the processor's own fds 1 and 2 (made once)
        self.dirty = False  # the files hold a task's output (truncate them before the next)
        self.handler = _Records(limit)

    def start(self) -> None:
        _flush()  # what was written before the task is not its output
        if not self.files:
            pid = os.getpid()
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            self.files = [os.open(path_of(self.directory, pid, s), flags, 0o600) for s in STREAMS]
            self.saved = [os.dup(s) for s in STREAMS]  # non-inheritable: subprocesses get the files
        if self.dirty:
            for fd in self.files:
                os.ftruncate(fd, 0)  # O_APPEND: writes start again at 0
        for stream, fd in zip(STREAMS, self.files, strict=True):
            os.dup2(fd, stream)
        self.handler.reset()
        logging.getLogger().addHandler(self.handler)

    def stop(self) -> bytes:
        """Restore fds 1/2; the task's output encoded for ``TaskResult.output``."""
        logging.getLogger().removeHandler(self.handler)
        _flush()
        for stream, fd in zip(STREAMS, self.saved, strict=True):
            os.dup2(fd, stream)
        stdout, stderr = (_read_bounded(fd, self.limit) for fd in self.files)
        self.dirty = bool(stdout or stderr)
        return encode(stdout, stderr, self.handler.records())


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream must not stop the processor
            pass
