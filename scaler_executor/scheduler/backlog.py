"""What the daemon holds for peers that do not read: bounded in count per peer and in bytes
for all peers together.

A send that meets a full socket (the high-water mark, or a peer's full kernel buffer on
ipc) is kept here, in order, and retried each turn (``loop.py``).  Two bounds keep a peer
that stops reading from growing the daemon without end:

* ``max_transmissions`` per peer: past it the peer is dropped (``PeerUnreachable``: a
  worker's tasks go elsewhere, a client is forgotten as one that vanished);
* ``max_bytes`` for all peers together: past it, peers are dropped largest backlog first
  until the rest fits, so one slow reader cannot take the memory others need, and many
  slow readers together cannot either.

A backlog of a single transmission is never dropped for its size: the transmission was
legitimate (a large object a client fetched), and dropping its reader would fail it, not
save memory the daemon had not already spent.  Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["Backlogs", "nbytes"]


def nbytes(frames: list[Any]) -> int:
    """Bytes of a transmission's frames (bytes, bytearrays or buffers)."""
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)


class Backlogs:
    def __init__(self, max_transmissions: int, max_bytes: int) -> None:
        self.max_transmissions = max_transmissions
        self.max_bytes = max_bytes
        self._queues: dict[bytes, deque[tuple[list[Any], int]]] = {}
        self._bytes: dict[bytes, int] = {}
        self.total = 0  # bytes held for every peer

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __contains__(self, peer: bytes) -> bool:
        return peer in self._queues

    def __len__(self) -> int:
        return len(self._queues)

    def peers(self) -> list[bytes]:
        return list(self._queues)

    def held(self, peer: bytes) -> tuple[int, int]:
        """(transmissions, bytes) held for ``peer``."""
        queue = self._queues.get(peer)
        return (0, 0) if queue is None else (len(queue), self._bytes[peer])

    def hold(self, peer: bytes, frames: list[Any]) -> list[tuple[bytes, str]]:
        """Keep ``frames`` for ``peer``, after what it already has; the peers to drop, each
        with why (their backlogs are gone: the caller declares them unreachable)."""
        size = nbytes(frames)
        queue = self._queues.get(peer)
        if queue is None:
            queue = self._queues[peer] = deque()
            self._bytes[peer] = 0
        queue.append((frames, size))
        self._bytes[peer] += size
        self.total += size
        dropped: list[tuple[bytes, str]] = []
        if len(queue) > self.max_transmissions:
            dropped.append((peer, f"it has not read {len(queue)} transmissions"))
            self.clear(peer)
        while self.total > self.max_bytes:
            largest = max(
                (p for p, q in self._queues.items() if len(q) > 1), key=self._bytes.__getitem__, default=None
            )
            if largest is None:
                break  # only single transmissions are left: each was owed to its reader
            why = (
                f"it has not read {self._bytes[largest]} bytes, the most of any peer, "
                f"and the daemon holds {self.total} (max_backlog_bytes {self.max_bytes})"
            )
            dropped.append((largest, why))
            self.clear(largest)
        return dropped

    def front(self, peer: bytes) -> list[Any] | None:
        """The oldest transmission held for ``peer``, or None."""
        queue = self._queues.get(peer)
        return queue[0][0] if queue else None

    def sent(self, peer: bytes) -> None:
        """The oldest transmission of ``peer`` went out; its backlog goes when empty."""
        queue = self._queues[peer]
        _, size = queue.popleft()
        self._bytes[peer] -= size
        self.total -= size
        if not queue:
            del self._queues[peer], self._bytes[peer]

    def clear(self, peer: bytes) -> None:
        """Forget what is held for ``peer`` (unreachable, or dropped)."""
        if self._queues.pop(peer, None) is not None:
            self.total -= self._bytes.pop(peer)
