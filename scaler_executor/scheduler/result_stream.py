"""Large results forwarded to their clients while they reach the store (pure state).

A worker on a host that cannot map the daemon's store streams a large result into it in
chunks (``ObjectChunk`` naming the task and attempt), then sends the TaskResult that names
the object. Stored first and fetched after, the two network legs ran one after the other
(issue 22: 100 MB, the chunks to the daemon 79-144 ms, then the client's fetch 112-153 ms).
Now each chunk also goes on to the task's client as it comes, while the daemon still stores
the object (a kept result may be read again: futures as arguments, ``ref`` reads)::

    ObjectChunk(oid, offset, total, task, attempt) from the task's worker
      → core: ResultStreams.chunk() → StoreChunk(..., forward=client) → loop: write the
        chunk into the store, send ResultPart(task, oid, offset, total) with the same frame
      → window full (the client is slow): the stream stops (ResultStreamEnded): the rest
        is only stored, and the client reads the result from the store as before
    ResultPartsTaken(n) from the client → ResultStreams.taken(): the window opens by n
    TaskResults from the worker → ResultStreams.ended(task): the stream is over (if the
        result does not name the object, the client is told to drop it)
    worker lost mid-upload → every stream of it ends: its client drops the parts (no
        partial object is ever a result: the retry streams a new object), the partial
        object is aborted in the store (AbortPartial)
    client lost → its streams go on only into the store; its window is forgotten

This module decides and never touches a socket, a store or a buffer; ``core.py`` asks it,
``validate()`` checks its indexes against the core's workers and clients.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import NamedTuple

from scaler_executor.protocol import messages as m

# ResultParts forwarded to one client and not yet answered by ResultPartsTaken: 16 x 4 MiB
# = 64 MiB queued toward one client at most (frames received from the worker, held by
# libzmq until written). Twice a fetch's window (object_stream.WINDOW_PARTS): a forwarded
# stream cannot pause and resume, it stops for good when the window is full, so the window
# must cover the worker's burst (it sends a result's chunks back to back) plus a turn of
# the client's credit on a loaded machine.
WINDOW_PARTS = 16


class Ended(NamedTuple):
    """Tell ``client`` that no more parts of ``object_id`` come (ResultStreamEnded)."""

    client: bytes
    object_id: bytes
    reason: str


class Verdict(NamedTuple):
    """What to do with one chunk: ``forward`` to that client (b"": only store it), and
    the clients to tell that a stream stopped."""

    forward: bytes
    ended: list[Ended]


@dataclass(slots=True)
class _Stream:
    object_id: bytes
    task_id: int
    attempt: int
    worker: bytes
    client: bytes  # b"": only stored (no client to forward to, or stopped)
    offset: int  # the last chunk's offset: the next must be beyond it
    total: int
    forwarded: int = 0  # parts forwarded


@dataclass(slots=True)
class ResultStreams:
    """Every large result being streamed in by a worker, and each client's window."""

    window: int = WINDOW_PARTS
    streams: dict[bytes, _Stream] = field(default_factory=dict)  # object id ->
    by_task: dict[int, bytes] = field(default_factory=dict)  # task id -> object id
    by_worker: dict[bytes, set[bytes]] = field(default_factory=dict)  # worker -> object ids
    in_flight: dict[bytes, int] = field(default_factory=dict)  # client -> parts forwarded, not taken
    forwarded: int = 0  # streams forwarded whole (for the counters)
    stopped: int = 0  # streams that stopped before their end (window full, worker lost, ...)

    def chunk(self, worker: bytes, message: m.ObjectChunk, client: bytes) -> Verdict:
        """A chunk of task ``message.task_id``'s result from ``worker``; ``client``: where
        the core would send the task's result now (b"" if nowhere: the task is not this
        worker's attempt, its client left, or it keeps no result for its client)."""
        object_id, offset = message.object_id, message.offset
        stream = self.streams.get(object_id)
        if offset == 0:
            ended: list[Ended] = []
            if stream is not None:
                ended += self._end(stream, "a new stream began with the same object id")
            old = self.by_task.get(message.task_id)
            if old is not None:  # an earlier attempt's stream, never finished
                ended += self._end(self.streams[old], "the task's result is streamed again")
            stream = _Stream(object_id, message.task_id, message.attempt, worker, client, 0, message.total)
            self.streams[object_id] = stream
            self.by_task[message.task_id] = object_id
            self.by_worker.setdefault(worker, set()).add(object_id)
            if client:
                self.in_flight.setdefault(client, 0)
            return Verdict(self._take_slot(stream), ended)
        if stream is None or stream.worker != worker or stream.task_id != message.task_id:
            return Verdict(b"", [])  # a chunk of no stream we know: the store refuses it
        if offset <= stream.offset or offset >= stream.total or message.total != stream.total:
            # Out of order or beyond its end: no more is forwarded; the store judges the chunk.
            return Verdict(b"", self._stop(stream, f"a chunk at offset {offset} does not follow the stream"))
        stream.offset = offset
        if not stream.client:
            return Verdict(b"", [])
        if client != stream.client:  # the task left its client (cancelled, the client gone)
            return Verdict(b"", self._stop(stream, "the task no longer sends its result to this client"))
        forward = self._take_slot(stream)
        if forward:
            return Verdict(forward, [])
        return Verdict(b"", self._stop(stream, "the client fell behind the daemon's window: read it from the store"))

    def _take_slot(self, stream: _Stream) -> bytes:
        client = stream.client
        if not client or self.in_flight[client] >= self.window:
            return b""
        self.in_flight[client] += 1
        stream.forwarded += 1
        return client

    def _stop(self, stream: _Stream, reason: str) -> list[Ended]:
        """Forward no more of ``stream`` (it stays, to be stored); the client to tell, if any."""
        client = stream.client
        if not client:
            return []
        stream.client = b""
        self.stopped += 1
        return [Ended(client, stream.object_id, reason)]

    def taken(self, client: bytes, count: int) -> None:
        """``client`` received ``count`` parts. Credit beyond what was forwarded is ignored."""
        if client in self.in_flight:
            self.in_flight[client] = max(0, self.in_flight[client] - max(0, count))

    def ended(self, worker: bytes, task_id: int, named: Container[bytes]) -> list[Ended]:
        """The worker's result of ``task_id`` came, naming the objects ``named``: its stream
        is over. The client to tell to drop its parts, if the result does not name them."""
        object_id = self.by_task.get(task_id)
        if object_id is None:
            return []
        stream = self.streams[object_id]
        if stream.worker != worker:
            return []  # another worker's late result: this one's stream goes on
        ended: list[Ended] = []
        if object_id in named:
            if stream.client:
                self.forwarded += 1
        else:
            ended = self._stop(stream, "the task's result does not name the object streamed for it")
        self._forget(stream)
        return ended

    def _end(self, stream: _Stream, reason: str) -> list[Ended]:
        ended = self._stop(stream, reason)
        self._forget(stream)
        return ended

    def worker_lost(self, worker: bytes) -> tuple[list[bytes], list[Ended]]:
        """``worker`` is gone mid-upload: the objects it was streaming (to abort in the
        store, if still partial), and the clients to tell to drop their parts."""
        object_ids = sorted(self.by_worker.get(worker, ()))
        tell: list[Ended] = []
        for object_id in object_ids:
            tell += self._end(self.streams[object_id], "the worker was lost while it sent the result")
        return object_ids, tell

    def client_lost(self, client: bytes) -> None:
        """``client`` is gone: its streams go on into the store only; its window is forgotten."""
        if self.in_flight.pop(client, None) is None:
            return
        for stream in self.streams.values():
            if stream.client == client:
                stream.client = b""

    def _forget(self, stream: _Stream) -> None:
        del self.streams[stream.object_id]
        if self.by_task.get(stream.task_id) == stream.object_id:
            del self.by_task[stream.task_id]
        ids = self.by_worker[stream.worker]
        ids.discard(stream.object_id)
        if not ids:
            del self.by_worker[stream.worker]

    def validate(self, workers: Container[bytes], clients: Container[bytes]) -> None:
        """The indexes agree, every stream's worker and client exist, windows are bounded."""
        for object_id, stream in self.streams.items():
            assert stream.object_id == object_id
            assert self.by_task.get(stream.task_id) == object_id, f"stream of task {stream.task_id:#x} not indexed"
            assert object_id in self.by_worker.get(stream.worker, ()), f"stream {object_id.hex()} not under its worker"
            assert stream.worker in workers, f"stream {object_id.hex()} of a worker that is gone"
            if stream.client:
                assert stream.client in clients, f"stream {object_id.hex()} forwarded to a client that is gone"
                assert stream.client in self.in_flight, f"stream {object_id.hex()}'s client has no window"
            assert 0 <= stream.offset < max(stream.total, 1), f"stream {object_id.hex()} at {stream.offset} of {stream.total}"
        assert len(self.by_task) == len(self.streams), "a task indexes a stream that is gone"
        assert sum(len(ids) for ids in self.by_worker.values()) == len(self.streams), "a worker indexes a stream that is gone"
        for client, count in self.in_flight.items():
            assert client in clients, f"a window for client {client!r}, which is gone"
            assert 0 <= count <= self.window, f"client {client!r} has {count} parts in flight (window {self.window})"


# A command of the core (core.py) for the loop, about these streams.


@dataclass(frozen=True, slots=True)
class AbortPartial:
    """``peer`` (a worker) is gone: abort those of ``object_ids`` it had not finished
    streaming into the store (a finished one is left: its result's holds decide)."""

    peer: bytes
    object_ids: tuple[bytes, ...]
