"""Large results forwarded to their clients while they reach the store (pure state).

A worker on a host that cannot map the daemon's store streams a large result into it in
chunks (``ObjectChunk`` naming the task and attempt), then sends the TaskResult that names
the object. Stored first and fetched after, the two network legs ran one after the other
(issue 22: 100 MB, the chunks to the daemon 79-144 ms, then the client's fetch 112-153 ms).
Now each chunk also goes on to the task's client as it comes, while the daemon still stores
the object (a kept result may be read again: futures as arguments, ``ref`` reads)::

    ObjectChunk(oid, offset, total, task, attempt) from the task's worker
      → core: ResultStreams.chunk() → StoreChunk(..., forward=client) → loop: the same
        frame to the client as ResultPart(task, oid, offset, total), and into the store
      → the client's window is full (it is slower than the worker): the stream falls
        behind; the chunks are only stored, and the parts it missed are served from the
        store (ForwardStored: from the unsealed object, or the sealed one once its result
        came) as the client's credit comes back (ResultPartsTaken → pump), in order
    TaskResults from the worker → ResultStreams.ended(): the worker's part is over; a
        stream still behind goes on from the sealed object until the client has it all
        (the client waits for the parts after the result); a result that does not name the
        object ends the stream (ResultStreamEnded: the client drops its parts)
    worker lost mid-upload → its unfinished streams end: the client drops the parts (no
        partial object is ever a result: the retry streams a new object), the partial
        object is aborted in the store (AbortPartial); one it had streamed whole but whose
        result never came is deleted (``unclaimed``: nobody will name it)
    client lost → its streams go on into the store only; its window is forgotten

Every part sent to a client counts in its window until credited: at most WINDOW_PARTS
parts (frames the daemon holds until libzmq has written them) per client, however slow.
A stream's chunks must be CHUNK_BYTES each but the last (the worker agent cuts them so), so
the core knows every part's length without seeing a buffer; a chunk that does not follow
stops the forwarding (ResultStreamEnded) and is left to the store to judge.

This module decides and never touches a socket, a store or a buffer; ``core.py`` asks it,
``validate()`` checks its indexes against the core's workers and clients.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import NamedTuple

from scaler_executor.protocol import messages as m

# ResultParts sent to one client and not yet answered by ResultPartsTaken: 16 x 4 MiB =
# 64 MiB queued toward one client at most (frames held by libzmq until written). A stream
# that fills it is not lost, it falls behind and is served from the store as credit comes;
# the window must cover a turn of the client's credit (and, with CURVE, the daemon's I/O
# thread encrypting toward the client more slowly than it decrypts from the worker).
WINDOW_PARTS = 16
CHUNK_BYTES = m.OBJECT_CHUNK_BYTES  # the worker agent's chunks (worker/agent_daemon.py _offload)


class Ended(NamedTuple):
    """Tell ``client`` that no more parts of ``object_id`` come (ResultStreamEnded)."""

    client: bytes
    object_id: bytes
    reason: str


class Verdict(NamedTuple):
    """What to do with one chunk: ``forward`` its frame to that client (b"": only store
    it), and the clients to tell that a stream stopped."""

    forward: bytes
    ended: list[Ended]


@dataclass(frozen=True, slots=True)
class ForwardStored:
    """Send bytes [offset, offset + length) of object ``object_id`` from the store to
    ``client`` as ResultPart(task_id, object_id, offset, total): a part the client missed
    while its window was full (a command of the core for the loop)."""

    client: bytes
    task_id: int
    object_id: bytes
    offset: int
    length: int
    total: int


@dataclass(slots=True)
class _Stream:
    object_id: bytes
    task_id: int
    attempt: int
    worker: bytes  # b"": its result came (the object is sealed); only the client's catch-up is left
    client: bytes  # b"": not forwarded (no client wants it, or it was stopped)
    total: int
    received: int  # bytes of it the daemon has (the chunks so far)
    sent: int = 0  # bytes of it sent to the client


@dataclass(slots=True)
class ResultStreams:
    """Every large result being streamed in by a worker or caught up by its client, and
    each client's window."""

    window: int = WINDOW_PARTS
    chunk_bytes: int = CHUNK_BYTES
    streams: dict[bytes, _Stream] = field(default_factory=dict)  # object id -> (in order of their start)
    by_task: dict[int, bytes] = field(default_factory=dict)  # task id -> object id, while its worker streams
    by_worker: dict[bytes, set[bytes]] = field(default_factory=dict)  # worker -> object ids it streams
    in_flight: dict[bytes, int] = field(default_factory=dict)  # client -> parts sent, not taken
    forwarded: int = 0  # streams the client had whole (for the counters)

    def chunk(self, worker: bytes, message: m.ObjectChunk, client: bytes) -> Verdict:
        """A chunk of task ``message.task_id``'s result from ``worker``; ``client``: where
        the core would send the task's result now (b"" if nowhere: the task is not this
        worker's attempt, its client left, or it keeps no result for its client)."""
        object_id, offset, total = message.object_id, message.offset, message.total
        stream = self.streams.get(object_id)
        if offset == 0:
            ended: list[Ended] = []
            if stream is not None:
                ended += self._end(stream, "a new stream began with the same object id")
            old = self.by_task.get(message.task_id)
            if old is not None:  # an earlier attempt's stream, never finished
                ended += self._end(self.streams[old], "the task's result is streamed again")
            if total < 1:
                return Verdict(b"", ended)
            stream = _Stream(object_id, message.task_id, message.attempt, worker, client, total, 0)
            self.streams[object_id] = stream
            self.by_task[message.task_id] = object_id
            self.by_worker.setdefault(worker, set()).add(object_id)
            if client:
                self.in_flight.setdefault(client, 0)
        elif stream is None or stream.worker != worker or stream.task_id != message.task_id:
            return Verdict(b"", [])  # a chunk of no stream we know: the store judges it
        else:
            ended = []
            if offset != stream.received or total != stream.total or offset >= total:
                # Not the next chunk: forward no more of it (what was sent stays unfinished).
                return Verdict(b"", self._stop(stream, f"a chunk at offset {offset} does not follow {stream.received} bytes"))
            if stream.client and client != stream.client:  # the task left its client (it left, say)
                ended += self._stop(stream, "the task no longer sends its result to this client")
        stream.received = min(total, offset + self.chunk_bytes)
        if stream.client and stream.sent == offset and self.in_flight[stream.client] < self.window:
            self.in_flight[stream.client] += 1
            stream.sent = stream.received
            return Verdict(stream.client, ended)
        return Verdict(b"", ended)  # stored only, or behind: caught up from the store (pump)

    def _stop(self, stream: _Stream, reason: str) -> list[Ended]:
        """Forward no more of ``stream`` (it stays, to be stored); the client to tell, if any."""
        client = stream.client
        if not client:
            return []
        stream.client = b""
        return [Ended(client, stream.object_id, reason)]

    def taken(self, client: bytes, count: int) -> None:
        """``client`` received ``count`` parts. Credit beyond what was sent is ignored."""
        if client in self.in_flight:
            self.in_flight[client] = max(0, self.in_flight[client] - max(0, count))

    def pump(self, client: bytes) -> list[ForwardStored]:
        """The parts ``client``'s streams that fell behind may have now, from the store,
        oldest stream first, while its window has room."""
        room = self.window - self.in_flight.get(client, self.window)
        out: list[ForwardStored] = []
        if room <= 0:
            return out
        for stream in list(self.streams.values()):
            if stream.client != client:
                continue
            while room > 0 and stream.sent < stream.received:
                length = min(self.chunk_bytes, stream.received - stream.sent)
                out.append(ForwardStored(client, stream.task_id, stream.object_id, stream.sent, length, stream.total))
                stream.sent += length
                room -= 1
            if not stream.worker and stream.sent == stream.total:
                self.forwarded += 1
                self._forget(stream)  # caught up after its result: done
            if room <= 0:
                break
        self.in_flight[client] = self.window - room
        return out

    def behind(self, client: bytes) -> bool:
        """Whether a stream of ``client``'s waits for room in its window."""
        return any(s.client == client and s.sent < s.received for s in self.streams.values())

    def ended(self, worker: bytes, task_id: int, named: Container[bytes]) -> list[Ended]:
        """The worker's result of ``task_id`` came, naming the objects ``named``: the
        worker's part of its stream is over. The stream goes on while its client is behind
        (the object is sealed now); the client is told to drop its parts if the result does
        not name them."""
        object_id = self.by_task.get(task_id)
        if object_id is None:
            return []
        stream = self.streams[object_id]
        if stream.worker != worker:
            return []  # another worker's late result: this one's stream goes on
        ended: list[Ended] = []
        if object_id not in named or stream.received < stream.total:
            ended += self._stop(stream, "the task's result does not name a whole object streamed for it")
        self._leave_worker(stream)
        if not stream.client or stream.sent == stream.total:
            if stream.client:
                self.forwarded += 1
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

    def unclaimed(self, worker: bytes) -> list[bytes]:
        """Objects ``worker`` streamed whole (sealed in the store) whose result has not come."""
        return sorted(o for o in self.by_worker.get(worker, ()) if self.streams[o].received == self.streams[o].total)

    def client_lost(self, client: bytes) -> None:
        """``client`` is gone: its streams go on into the store only; its window is forgotten."""
        if self.in_flight.pop(client, None) is None:
            return
        for stream in list(self.streams.values()):
            if stream.client == client:
                stream.client = b""
                if not stream.worker:
                    self._forget(stream)

    def _leave_worker(self, stream: _Stream) -> None:
        if self.by_task.get(stream.task_id) == stream.object_id:
            del self.by_task[stream.task_id]
        if stream.worker:
            ids = self.by_worker[stream.worker]
            ids.discard(stream.object_id)
            if not ids:
                del self.by_worker[stream.worker]
            stream.worker = b""

    def _forget(self, stream: _Stream) -> None:
        self._leave_worker(stream)
        del self.streams[stream.object_id]

    def validate(self, workers: Container[bytes], clients: Container[bytes]) -> None:
        """The indexes agree, every stream's worker and client exist, windows are bounded."""
        streaming = 0
        for object_id, stream in self.streams.items():
            assert stream.object_id == object_id
            assert 0 <= stream.sent <= stream.received <= stream.total, f"stream {object_id.hex()}: {stream}"
            if stream.worker:
                streaming += 1
                assert self.by_task.get(stream.task_id) == object_id, f"stream of task {stream.task_id:#x} not indexed"
                assert object_id in self.by_worker.get(stream.worker, ()), f"stream {object_id.hex()} not under its worker"
                assert stream.worker in workers, f"stream {object_id.hex()} of a worker that is gone"
            else:
                assert stream.client and stream.received == stream.total > stream.sent, f"finished stream {object_id.hex()} kept for nothing"
            if stream.client:
                assert stream.client in clients, f"stream {object_id.hex()} forwarded to a client that is gone"
                assert stream.client in self.in_flight, f"stream {object_id.hex()}'s client has no window"
        assert len(self.by_task) == streaming, "a task indexes a stream that is gone or done"
        assert sum(len(ids) for ids in self.by_worker.values()) == streaming, "a worker indexes a stream that is gone"
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
