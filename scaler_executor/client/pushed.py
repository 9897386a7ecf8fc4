"""Large results the daemon forwards while it stores them (``ResultPart``), read as they come.

A client on a host that cannot map the daemon's store used to learn of a large result only
once the daemon had stored it whole, then fetched it: two network legs one after the other.
The daemon now forwards each chunk of such a result as it comes (scheduler/result_stream.py)::

    ResultPart(task, oid, 0, total)  ─► a stream: the parts kept as they came (chunks.Parts),
                                        and, while fewer than EARLY_DECODES run, a thread that
                                        unpickles from them at once (pickle.load waits for
                                        each next part), so the copy overlaps the transfer
    ResultPart(task, oid, offset, …) ─► added, after checking offset, order and total (a part
                                        that does not fit drops the stream)
    every ResultPart                 ─► credit (ResultPartsTaken), kept or not
    ResultStreamEnded(oid, reason)   ─► dropped: its reader raises StreamError, and the
                                        result, if it comes, is read from the store as before
    TaskResults naming oid           ─► the completion takes the stream (``load``): the value
                                        the early reader made, or one read from the parts now
    connection lost, daemon resumed  ─► every stream dropped (``clear``)

The daemon sends a stream's parts in order on the same connection as the TaskResult that
names it, before it unless the client fell behind its window (the rest then comes from the
daemon's store after it): ``load`` waits for the parts still to come. A stream the daemon
ends (ResultStreamEnded) or whose parts do not fit is dropped: ``load`` then says
NOT_PUSHED and the result is fetched from the store, as any other. A partial stream is
never a value.

The agent thread adds and drops streams; completion threads take them (``dict.pop``, atomic);
``forget`` may run in a finalizer (``release_objects``), so no lock guards the dict.
"""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import Future
from typing import Any

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Parts, StreamError

# Streams unpickled at once by a thread of their own while their parts come. More at a time
# would each take a core to copy into fresh pages; the others are read when their results come.
EARLY_DECODES = 2

NOT_PUSHED = object()  # load(): no usable stream: read the result from the store


class _Stream:
    __slots__ = ("task_id", "parts", "received", "early")

    def __init__(self, task_id: int, total: int) -> None:
        self.task_id = task_id
        self.parts = Parts([], total)
        self.received = 0
        self.early: Future[Any] | None = None  # the value, unpickled as the parts came


class PushedResults:
    """Result streams of one client, by object id."""

    def __init__(self, early_decodes: int = EARLY_DECODES) -> None:
        self.streams: dict[bytes, _Stream] = {}
        self._early = threading.BoundedSemaphore(early_decodes) if early_decodes > 0 else None

    def part(self, message: m.ResultPart, data: Any) -> None:
        """(The agent thread.) One forwarded part, with its frame."""
        view = memoryview(data)
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        object_id, offset, total = message.object_id, message.offset, message.total
        stream = self.streams.get(object_id)
        if offset == 0:
            if stream is not None:
                self.drop(object_id, "a new stream of the same object began")
            if total < 1:
                return
            stream = self.streams[object_id] = _Stream(message.task_id, total)
        elif stream is None or stream.task_id != message.task_id:
            return  # of a stream dropped already
        size = view.nbytes
        if offset != stream.received or total != stream.parts.nbytes or offset + size > total or not size:
            self.drop(object_id, f"a part of {size} bytes at offset {offset} of {total} does not follow {stream.received} bytes")
            return
        stream.parts.add(view.toreadonly())
        stream.received += size
        if offset == 0 and self._early is not None and self._early.acquire(blocking=False):
            stream.early = Future()
            threading.Thread(target=self._decode, args=(stream,), name="scaler-result-reader", daemon=True).start()

    def _decode(self, stream: _Stream) -> None:
        """(A thread of its own.) Unpickle the stream as its parts come."""
        assert stream.early is not None
        try:
            value = pickle.load(stream.parts.reader(), buffers=[])
        except BaseException as exc:  # noqa: BLE001 - the result's reader raises it (or falls back, for StreamError)
            stream.early.set_exception(exc)
        else:
            stream.early.set_result(value)
        finally:
            del stream  # the value is the future's; its parts went as read
            assert self._early is not None
            self._early.release()

    def drop(self, object_id: bytes, reason: str) -> None:
        """(The agent thread: ResultStreamEnded, a part that does not fit.)"""
        stream = self.streams.pop(object_id, None)
        if stream is not None:
            stream.parts.fail(f"the result's stream was dropped: {reason}")

    def forget(self, object_ids: list[bytes]) -> None:
        """The client let these objects go (read, or never to be read): their streams go."""
        for object_id in object_ids:
            stream = self.streams.pop(object_id, None)
            if stream is not None:
                stream.parts.fail("the result was let go before it was read")

    def clear(self) -> None:
        """The connection to the daemon is gone (or a restarted daemon resumed us)."""
        for object_id in list(self.streams):
            self.drop(object_id, "the connection to the daemon was lost")

    def load(self, header: bytes, object_ids: list[bytes]) -> Any:
        """(A completion thread.) The value of a result whose one object came as a stream,
        or NOT_PUSHED: there is no usable stream of it (read it from the store). Parts not
        here yet are waited for: a client that fell behind the daemon's window gets them
        from its store after the result, and a stream the daemon ends is dropped (its
        reader raises StreamError, and this says NOT_PUSHED)."""
        from scaler_executor.objstore import payload as packing

        if len(object_ids) != 1:
            return NOT_PUSHED
        object_id = object_ids[0]
        stream = self.streams.get(object_id)
        if stream is None:
            return NOT_PUSHED
        try:
            if stream.early is not None:
                if header != packing.stream_in_store_header():
                    return NOT_PUSHED  # not a bare pickle stream: its parts were read as one
                return stream.early.result()
            blobs: dict[bytes, Any] = {object_id: stream.parts}  # Fetched reads Parts as a stream
            return packing.unpack(header, object_ids, packing.Fetched(blobs))
        except StreamError:
            return NOT_PUSHED
        finally:
            if self.streams.get(object_id) is stream:
                self.streams.pop(object_id, None)  # (the agent thread may have dropped it meanwhile)
            # Not read whole (a header it was not, a failed read): its early reader stops
            # instead of waiting for parts that no longer go anywhere.
            stream.parts.fail("the result was read from the store instead")
