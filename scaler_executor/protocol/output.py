"""The wire form of a task's captured output (``TaskResult.output``), and the note a
failed task's exception gets from it; captured by worker/capture.py."""

from __future__ import annotations

from typing import Any

import msgpack

__all__ = ["decode", "encode", "tail_note"]


def encode(stdout: str, stderr: str, logs: list[list[Any]]) -> bytes:
    return msgpack.packb([stdout, stderr, logs], use_bin_type=True)


def decode(output: bytes) -> tuple[str, str, tuple[tuple[float, str, str, str], ...]]:
    """(stdout, stderr, log records) from a ``TaskResult.output``."""
    stdout, stderr, logs = msgpack.unpackb(output)
    return str(stdout), str(stderr), tuple((float(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in logs)


def tail_note(stdout: str, stderr: str, lines: int = 20, max_chars: int = 4000) -> str:
    """The last lines of a task's output, for a note on its exception ("" when none)."""
    parts = []
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if not text.strip():
            continue
        tail = text.rstrip("\n").splitlines()[-lines:]
        shown = "\n".join("    " + line for line in tail)[-max_chars:]
        parts.append(f"the task's {name} ended with:\n{shown}")
    return "\n".join(parts)
