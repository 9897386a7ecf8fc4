"""Tasks for tests/integration/test_durable.py: each notes its run in a file (O_APPEND, one
line per run), so that a test can tell a task that ran twice from one that ran once."""

from __future__ import annotations

import os
import time


def record(i: int, path: str, seconds: float = 0.0) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"%d\n" % i)
    finally:
        os.close(fd)
    if seconds:
        time.sleep(seconds)
    return i * 2


def add(a: int, b: int) -> int:
    return a + b


def runs(path: str) -> list[int]:
    try:
        with open(path, "rb") as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


def total(values: object, i: int, path: str, seconds: float = 0.0) -> int:
    record(i, path, seconds)
    return int(values.sum()) + i  # type: ignore[attr-defined]  # a NumPy array


def gated(i: int, path: str, fifo: str) -> int:
    """Runs until the test lets it end: it opens the read end of ``fifo`` (the test's
    opening the write end tells the test it runs), notes its run, and ends once the test
    writes and closes its end (a test's exact seam, no timing)."""
    with open(fifo, "rb") as f:
        record(i, path)
        f.read()
    return i * 2


class _Gate:
    """Unpickled, it waits as ``gated`` does (``_wait``): in a callable's closure, it holds
    the task before its run is timed, so that the task itself is short (a direct reply's)."""

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _wait, (self.fifo,)


def _wait(fifo: str) -> None:
    with open(fifo, "rb") as f:
        f.read()


def gated_callable(fifo: str, path: str) -> object:
    """A new callable (sent by value, unpickled in the processor before the task's clock
    starts) that waits for ``fifo`` as it is unpickled, then records ``i`` and returns 2i."""
    gate = _Gate(fifo)

    def quick(i: int) -> int:
        assert gate is None  # (unpickled: what _wait returned)
        record(i, path)
        return i * 2

    return quick
