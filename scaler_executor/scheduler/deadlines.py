"""Peers due for a check at a time: liveness and heartbeat checks without sweeps.

With a thousand workers, a sweep of every peer on each tick (four a heartbeat interval)
costs the daemon O(peers) per tick even when nothing is due.  Here each peer has at most
one entry, in the slot of a timing wheel (``resolution`` seconds a slot) when the earliest
thing it could be due for falls due; the caller pops the due ones, re-checks each against
its real state (which only moves deadlines later: a message seen, a transmission sent)
and puts it back for its next one.  So a peer is looked at about once per period, adding
and popping are O(1), and a tick with nothing due costs O(1).  An entry comes out at
the first look in its slot (up to ``resolution`` before its time, never after): the
caller's check decides, and one not yet due goes back into the current slot, looked at
again at the next call, so deadlines are kept exactly, at the caller's own ticks.
"""

from __future__ import annotations

import math


class DeadlineQueue:
    __slots__ = ("_cursor", "_queued", "_slots", "resolution")

    def __init__(self, resolution: float) -> None:
        if resolution <= 0:
            raise ValueError(f"a deadline wheel needs a resolution > 0 seconds, got {resolution!r}")
        self.resolution = resolution
        self._slots: dict[int, list[bytes]] = {}
        self._queued: set[bytes] = set()
        self._cursor: int | None = None  # no slot before it holds an entry

    def add(self, peer: bytes, due: float) -> None:
        """Check ``peer`` at ``due``; a peer already queued keeps its entry (its check
        re-reads the peer's state and queues it again as needed)."""
        if peer in self._queued:
            return
        self._queued.add(peer)
        slot = math.floor(due / self.resolution)
        if self._cursor is not None and slot < self._cursor:
            slot = self._cursor
        self._slots.setdefault(slot, []).append(peer)

    def add_all(self, peers: list[bytes], due: float) -> None:
        """``add`` each of ``peers`` at one ``due`` (a heartbeat round's peers: one slot)."""
        queued = self._queued
        fresh = [p for p in peers if p not in queued]
        if not fresh:
            return
        queued.update(fresh)
        slot = math.floor(due / self.resolution)
        if self._cursor is not None and slot < self._cursor:
            slot = self._cursor
        self._slots.setdefault(slot, []).extend(fresh)

    def due(self, now: float) -> list[bytes]:
        """The peers due at ``now``, removed (``add`` them again to keep checking them)."""
        slots = self._slots
        current = math.floor(now / self.resolution)
        out: list[bytes] = []
        if slots:
            start = self._cursor if self._cursor is not None else min(slots)
            if current - start > len(slots):  # a long gap: visit the occupied slots only
                keys = sorted(k for k in slots if k <= current)
            else:
                keys = [k for k in range(start, current + 1) if k in slots]
            for key in keys:
                out.extend(slots.pop(key))
        self._cursor = current  # the current slot is looked at again: entries put back early
        self._queued.difference_update(out)
        return out

    def __len__(self) -> int:
        return len(self._queued)
