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
