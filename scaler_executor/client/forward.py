"""``forward_output``: a captured task's output printed on the client's own streams.

With the config's ``forward_output = true`` every ``submit``/``map`` task is captured
(worker/capture.py) and, when its result reaches the client, its stdout and stderr are
written to the client's ``sys.stdout`` / ``sys.stderr``, each line prefixed with where it
ran::

    [worker host:1234 task 0x100000003] the line the task printed

It travels with the result (processor → agent → daemon → client), so it arrives when the
task ends, not while it runs; its size is bounded per task by ``capture_output_limit``,
and its rate by a token bucket of ``forward_output_rate`` bytes per second (a burst of as
many): lines beyond it are dropped, and one line says how many once output flows again.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

__all__ = ["Forwarder"]


class Forwarder:
    """Writes tasks' output lines with their prefix, within a byte rate (thread-safe)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self.tokens = rate
        self.last = clock()
        self.dropped = 0  # lines dropped since the last line written
        self.lock = threading.Lock()  # guards tokens, last and dropped; no I/O under it

    def _admit(self, lines: list[str]) -> list[str]:
        """The lines the rate allows now, each after a note of the lines dropped before it."""
        out = []
        with self.lock:
            now = self.clock()
            self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
            self.last = now
            for line in lines:
                if len(line) > self.tokens:
                    self.dropped += 1
                    continue
                self.tokens -= len(line)
                if self.dropped:
                    out.append(f"[scaler-executor: {self.dropped} lines of forwarded task output dropped (forward_output_rate)]\n")
                    self.dropped = 0
                out.append(line)
        return out

    def forward(self, worker: str, task_id: int, stdout: str, stderr: str) -> None:
        prefix = f"[worker {worker} task {task_id:#x}] "
        for text, stream in ((stdout, sys.stdout), (stderr, sys.stderr)):
            if not text:
                continue
            lines = [prefix + line + "\n" for line in text.splitlines()]
            kept = self._admit(lines)
            if kept:
                try:
                    stream.write("".join(kept))
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed or broken stream must not fail the future
                    pass
