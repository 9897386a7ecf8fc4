"""The daemon host's object store, for a client on another host (it cannot map the region).

``objstore.payload.pack`` and ``unpack`` take it where they take a mapped store, so a
value's wire form (header + object ids) is the same on every host:

* ``put(object_id, data)`` streams the bytes to the daemon as ``ObjectChunk``
  transmissions of ``CHUNK_BYTES`` each (one frame each, cut from the caller's buffer
  without a copy), which the daemon writes into the object in place; it returns once the
  daemon answers ``ObjectStored`` (and raises with the daemon's reason when it could not
  store it). Neither side ever holds the whole value twice: the client holds the value,
  the daemon one chunk beside the object.
* ``get(object_id)`` fetches the bytes through the daemon (``ObjectRequest``; a large
  object comes as ``ObjectPart`` messages, kept as they came by ``protocol/chunks.py``
  and put together here); ``stream(object_id)`` reads a pickle stream's object from its
  parts without putting them together (``pickle.load`` copies each once).
* ``delete`` has the daemon drop an object nobody was told about (a task never sent, a
  pack undone): a pin then a release, so the daemon's reference counts free it.

The user thread that puts waits; the agent thread sends the chunks (``send_pending``,
once per turn), since the connection belongs to whichever thread holds the agent role.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent
    from scaler_executor.client.routes import DaemonRoute

CHUNK_BYTES = m.OBJECT_CHUNK_BYTES


class RemoteStoreError(RuntimeError):
    """The daemon could not store an object put from this host (its reason follows)."""


class RemoteStore:
    def __init__(self, agent: ClientAgent, name: str) -> None:
        self.agent = agent
        self.name = name
        self.lock = threading.Lock()  # uploads and waiters: user threads add, the agent thread takes
        self.uploads: deque[tuple[bytes, list[Any]]] = deque()  # (object id, one chunk's frames)
        self.waiters: dict[bytes, Future[str]] = {}
        self.written: set[bytes] = set()

    # ------------------------------------------------------------------ the store interface

    def put(self, object_id: bytes, data: Any) -> None:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        self.put_parts(object_id, [view])

    def put_parts(self, object_id: bytes, parts: list[memoryview]) -> None:
        """One object of ``parts`` (1-D byte views) end to end, streamed in chunks cut from
        them: a chunk within one part is a view of it, one across parts (small pieces of a
        pickle stream between large ones) is joined (at most CHUNK_BYTES). So a large pickle
        stream (objstore.payload) goes out without being joined whole first."""
        total = sum(part.nbytes for part in parts)
        waiter: Future[str] = Future()
        chunks = [
            (object_id, codec.encode([m.ObjectChunk(object_id, offset, total)], [chunk]))
            for offset, chunk in _chunks(parts, total)
        ]
        self.agent.check_usable()
        with self.lock:
            self.waiters[object_id] = waiter
            self.uploads.extend(chunks)
        self.agent.wake()
        error = waiter.result()  # failed by fail_all if the connection breaks
        if error:
            raise RemoteStoreError(f"the daemon could not store an object of {total} bytes put from this host: {error}")
        self.written.add(object_id)

    def get(self, object_id: bytes) -> memoryview:
        # Imported at first use: the agent thread imports the store's module at its start.
        from scaler_executor.objstore.payload import Fetched

        return Fetched(self.agent.fetch_objects([object_id])).get(object_id)

    def stream(self, object_id: bytes) -> Any:
        """A pickle stream's object, read from the parts as they come (objstore.payload.unpack:
        ``pickle.load`` starts at the first part, ClientAgent.fetch_stream)."""
        from scaler_executor.objstore.payload import Fetched

        return Fetched({object_id: self.agent.fetch_stream(object_id)}).stream(object_id)

    def contains(self, object_id: bytes) -> bool:
        return object_id in self.written  # written by this client and not deleted by it

    def delete(self, object_id: bytes) -> bool:
        self.written.discard(object_id)
        self.agent.pin_objects([object_id])
        self.agent.release_objects([object_id])
        return True

    def seal_at(self, address: int, size: int) -> bytes | None:
        return None  # no memory of this process is a block of the daemon's store

    # ------------------------------------------------------------------ the agent thread

    def send_pending(self, daemon: DaemonRoute) -> None:
        """Send queued chunks while the daemon's queue takes them (in order; a full queue
        leaves the rest for the next turn)."""
        while True:
            with self.lock:
                if not self.uploads:
                    return
                frames = self.uploads[0][1]
            try:
                daemon.sock.send(frames)
            except channel.Again:
                return
            with self.lock:
                self.uploads.popleft()

    def stored(self, message: m.ObjectStored) -> None:
        with self.lock:
            waiter = self.waiters.pop(message.object_id, None)
            if message.error:  # a failed object's remaining chunks are not sent
                self.uploads = deque(u for u in self.uploads if u[0] != message.object_id)
        if waiter is not None:
            try:
                waiter.set_result(message.error)
            except InvalidStateError:
                pass

    def fail_all(self, exc: BaseException) -> None:
        with self.lock:
            waiters, self.waiters = list(self.waiters.values()), {}
            self.uploads.clear()
        for waiter in waiters:
            try:
                waiter.set_exception(type(exc)(*exc.args))
            except InvalidStateError:
                pass


def _chunks(parts: list[memoryview], total: int) -> list[tuple[int, Any]]:
    """(offset, frame) of each chunk of ``parts`` end to end: CHUNK_BYTES each (the last
    shorter), a view where a chunk lies within one part, else the pieces joined."""
    if total == 0:
        return [(0, b"")]
    out: list[tuple[int, Any]] = []
    pieces: list[memoryview] = []
    size = offset = 0
    for part in parts:
        at = 0
        while at < part.nbytes:
            take = min(CHUNK_BYTES - size, part.nbytes - at)
            pieces.append(part[at : at + take])
            size += take
            at += take
            if size == CHUNK_BYTES:
                out.append((offset, pieces[0] if len(pieces) == 1 else b"".join(pieces)))
                offset += size
                pieces, size = [], 0
    if pieces:
        out.append((offset, pieces[0] if len(pieces) == 1 else b"".join(pieces)))
    return out
