"""Locks with a rank, so that the order they are taken in is checked while tests run.

A module with more than one lock writes their order down (``client/agent.py``'s doc);
``ranked_lock(name, rank)`` makes each lock with its place in that order.  Normally it
returns a plain ``threading.Lock`` (or ``RLock``): no cost.  With ``SCALER_DEBUG_LOCKS=1``
in the environment (the test suite sets it, ``tests/conftest.py``) it returns a
``RankedLock``, which raises ``LockOrderError`` when a thread takes a lock while it holds
one of the same or a higher rank (other than itself, re-entered) — the inversion that
can deadlock two threads taking the pair in the other order, found on the first run
that takes them in the wrong order, whether or not the deadlock happens.
"""

from __future__ import annotations

import os
import threading
from typing import Any

DEBUG = os.environ.get("SCALER_DEBUG_LOCKS", "") == "1"

_held = threading.local()


class LockOrderError(RuntimeError):
    """A lock was taken out of its documented order."""


class RankedLock:
    """A lock that checks, on each acquire, the ranks of the locks this thread holds."""

    __slots__ = ("lock", "name", "rank", "reentrant")

    def __init__(self, name: str, rank: int, reentrant: bool = False) -> None:
        self.lock: Any = threading.RLock() if reentrant else threading.Lock()
        self.name = name
        self.rank = rank
        self.reentrant = reentrant

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        stack: list[RankedLock] | None = getattr(_held, "stack", None)
        if stack is None:
            stack = _held.stack = []
        for other in stack:
            if other is self and self.reentrant:
                continue
            if other.rank >= self.rank:
                raise LockOrderError(
                    f"{self.name} (rank {self.rank}) taken while holding {other.name} (rank {other.rank}); "
                    f"held: {[held.name for held in stack]}"
                )
        got = bool(self.lock.acquire(blocking, timeout))
        if got:
            stack.append(self)
        return got

    def release(self) -> None:
        stack: list[RankedLock] = getattr(_held, "stack", [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break
        self.lock.release()

    def locked(self) -> bool:
        return bool(self.lock.locked()) if hasattr(self.lock, "locked") else False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<RankedLock {self.name} rank {self.rank}>"


def ranked_lock(name: str, rank: int, reentrant: bool = False) -> Any:
    """A lock at ``rank`` in its module's documented order (lower ranks are taken first)."""
    if DEBUG:
        return RankedLock(name, rank, reentrant)
    return threading.RLock() if reentrant else threading.Lock()
