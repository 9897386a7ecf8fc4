"""Objects that arrive from the daemon in parts (``ObjectPart``), put together on a peer.

A client or worker on a host that cannot map the daemon's store asks for objects
(``ObjectRequest``); each object larger than one chunk comes first as parts, in order and one
object at a time (scheduler/object_stream.py), then the ``ObjectData`` that ends the answer
carries an empty frame in its place. The receiver:

* allocates the object's buffer once (``allocate``), at its first part (offset 0, with the total size),
  and writes every part straight into it (``write``): no part is kept, nothing is joined at the end;
* checks each part against what came before: the same object, the next offset, the same
  total, nothing beyond it; a part that does not fit fails the object (its answer then
  reports it with the reason) and frees its buffer, and the parts after it are dropped;
* answers every part, kept or not, with credit (``ObjectPartsTaken``), so the daemon's
  window moves on and the answer still ends with its ObjectData;
* frees everything (``clear``) when the connection to the daemon is lost.

No socket, no lock: the thread that reads the daemon's connection owns it (a ``Parts`` being
read while its parts come is shared with the reading thread under its own condition).
"""

from __future__ import annotations

import io
import mmap
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from scaler_executor.protocol import messages as m
from scaler_executor.protocol import prefault


class StreamError(Exception):
    """An object came in parts that do not make it whole (the reason says how)."""


class _Assembly(NamedTuple):
    object_id: bytes
    total: int
    buffer: Any  # ``total`` bytes to write (Incoming.allocate, Incoming.write); None: parts kept
    parts: Parts | None  # the frames as they came (Incoming(keep_parts=True))


def allocate(total: int) -> memoryview:
    """A writable buffer of ``total`` bytes: an anonymous mapping, whose pages the kernel
    zeroes as the parts are first written (``bytearray(total)`` wrote every byte once more)."""
    return memoryview(mmap.mmap(-1, total))


def write(buffer: memoryview, offset: int, part: memoryview) -> None:
    """Copy ``part`` into ``buffer`` (an ``allocate``'s) at ``offset``."""
    buffer[offset : offset + part.nbytes] = part


class Parts:
    """An object kept as the frames it came in (views of libzmq's messages, no copy made):
    read once as a stream (``reader``: ``pickle.load`` copies each part straight into the
    objects it builds), or put together (``join``: one copy, as an assembly would have made).
    Read-only either way.

    Live: ``Incoming`` makes it at the object's first part and adds each part as it comes
    (``add``), so a reader may start before the last part is here (a client's read-back:
    ``Incoming.started``): it then waits for the next part, and raises StreamError if the
    object fails (``fail``: a part that does not fit, the connection lost). The condition
    guards ``views``, ``received`` and ``error`` between the thread that receives and the one
    that reads; nothing else is done under it."""

    __slots__ = ("views", "nbytes", "received", "error", "taken", "changed")

    def __init__(self, views: list[memoryview], nbytes: int) -> None:
        self.views = views
        self.nbytes = nbytes
        self.received = sum(v.nbytes for v in views)
        self.error: str | None = None
        self.taken = False  # a reader has the parts
        self.changed = threading.Condition(threading.Lock())

    def add(self, view: memoryview) -> None:
        with self.changed:
            self.views.append(view)
            self.received += view.nbytes
            self.changed.notify_all()

    def fail(self, reason: str) -> None:
        with self.changed:
            if self.received < self.nbytes and self.error is None:
                self.error = reason
                self.views.clear()
                self.changed.notify_all()

    def reader(self) -> PartsReader:
        """Read once: the reader takes the parts, and lets each go once read past."""
        with self.changed:
            if self.taken:
                raise StreamError("an object's parts were read already")
            self.taken = True
        return PartsReader(self)

    def join(self) -> memoryview:
        """The whole object in one buffer (called once every part is here)."""
        if self.taken:
            raise StreamError("an object's parts were read already")
        if self.error is not None or self.received < self.nbytes:
            raise StreamError(self.error or "an object's parts were joined before the last came")
        whole = allocate(self.nbytes)
        offset = 0
        for view in self.views:
            whole[offset : offset + view.nbytes] = view
            offset += view.nbytes
        return whole.toreadonly()


class PartsReader(io.RawIOBase):
    """A binary file over ``Parts``' frames (``readinto`` copies from them, nothing else),
    waiting for parts that have not come yet."""

    def __init__(self, parts: Parts) -> None:
        super().__init__()
        with parts.changed:
            self._views = deque(parts.views)
            parts.views = []
            self._left = parts.nbytes - sum(v.nbytes for v in self._views)  # not yet received
            self._parts = parts if self._left else None
            self._error = parts.error
        self._offset = 0  # into the first view

    def readable(self) -> bool:
        return True

    def _more(self) -> bool:
        """Wait for parts not yet taken; False at the end of the object."""
        parts = self._parts
        if parts is None:
            return False
        with parts.changed:
            while not parts.views and parts.error is None and self._left:
                parts.changed.wait()
            if parts.error is not None:
                raise StreamError(parts.error)
            for view in parts.views:
                self._views.append(view)
                self._left -= view.nbytes
            parts.views = []
            if not self._left:
                self._parts = None
        return bool(self._views)

    def readinto(self, buffer: Any) -> int:
        if self._error is not None:
            raise StreamError(self._error)
        target = memoryview(buffer).cast("B")
        want, done = target.nbytes, 0
        views = self._views
        ahead = prefault.Ahead(target)  # a large read: its pages faulted in a window ahead
        while done < want and (views or self._more()):
            view = views[0]
            count = min(ahead.limit(done) - done, view.nbytes - self._offset)
            target[done : done + count] = view[self._offset : self._offset + count]
            done += count
            self._offset += count
            if self._offset == view.nbytes:
                views.popleft()  # read: the frame can go
                self._offset = 0
        return done


class Incoming:
    """``allocate(total)`` gives each object's buffer and ``write(buffer, offset, part)`` copies
    a part into it (by default a writable anonymous mapping; a worker's are memfds written with
    ``pwrite``, which its processors map: worker/handoff.py). With
    ``keep_parts`` no buffer is made: the parts' frames are kept as they came, and ``take``
    gives a ``Parts`` (a client: ``pickle.load`` reads them, one copy in all); ``started``, if
    given, is called with an object's ``Parts`` (or its buffer, once the first part is
    written into it) at its first part, so that its reader can begin while the rest come (a
    client's read-back, a worker's task: unpickling overlaps the transfer); ``abort``, if
    given, with the buffer of an object that fails and the reason."""

    def __init__(
        self,
        allocate: Callable[[int], Any] = allocate,
        keep_parts: bool = False,
        finish: Callable[[Any], memoryview] = memoryview.toreadonly,
        write: Callable[[Any, int, memoryview], None] = write,
        started: Callable[[bytes, Any], None] | None = None,
        abort: Callable[[Any, str], None] | None = None,
    ) -> None:
        self.allocate = allocate
        self.started = started
        self.abort = abort  # told of a buffer whose object failed (a worker's streams end short)
        self.write = write
        self.finish = finish  # an allocated buffer, written whole -> the read-only object
        self.keep_parts = keep_parts
        self.current: _Assembly | None = None
        self.received = 0  # bytes of ``current`` so far
        self.ready: dict[bytes, deque[memoryview | Parts]] = {}  # whole, waiting for their ObjectData
        self.failed: dict[bytes, str] = {}

    def part(self, message: m.ObjectPart, data: Any) -> None:
        """Write one part (its frame ``data``); a part that does not fit fails its object."""
        view = memoryview(data)
        size = view.nbytes
        object_id, offset, total = message.object_id, message.offset, message.total
        current = self.current
        if offset == 0 and object_id not in self.failed:
            if current is not None:
                self._fail(current.object_id, f"cut short at {self.received} of {current.total} bytes")
            if total < 1:
                self._fail(object_id, f"a part of an object of {total} bytes")
                return
            try:
                buffer = None if self.keep_parts else self.allocate(total)
            except (MemoryError, OSError):
                self._fail(object_id, f"no memory on this host for an object of {total} bytes")
                return
            parts = Parts([], total) if self.keep_parts else None
            current = self.current = _Assembly(object_id, total, buffer, parts)
            self.received = 0
        elif current is None or current.object_id != object_id:
            if object_id not in self.failed:
                self._fail(object_id, f"a part at offset {offset} came before the part at offset 0")
            return
        if offset != self.received or total != current.total or offset + size > total:
            self._fail(
                object_id,
                f"a part of {size} bytes at offset {offset} of {total} does not follow "
                f"{self.received} bytes of {current.total}",
            )
            return
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if current.parts is not None:
            current.parts.add(view.toreadonly())
            if offset == 0 and self.started is not None:
                self.started(object_id, current.parts)
        else:
            try:
                self.write(current.buffer, offset, view)
            except OSError as exc:  # a memfd's pages are charged as written: no memory left
                self._fail(object_id, f"could not keep it on this host ({exc})")
                return
            if offset == 0 and self.started is not None:
                self.started(object_id, current.buffer)
        self.received += size
        if self.received == total:
            try:
                whole = current.parts if current.parts is not None else self.finish(current.buffer)
            except OSError as exc:
                self._fail(object_id, f"could not keep it on this host ({exc})")
                return
            self.current = None
            self.ready.setdefault(object_id, deque()).append(whole)

    def take(self, object_id: bytes, frame: Any) -> Any:
        """The bytes of ``object_id`` as its ObjectData frame ``frame`` stands for: the object
        put together from its parts if it came that way, else the frame itself. Raises
        StreamError if its parts failed or the answer came before all of them."""
        reason = self.failed.pop(object_id, None)
        if reason is not None:
            raise StreamError(f"object {object_id.hex()} came from the daemon in parts that do not fit: {reason}")
        queue = self.ready.get(object_id)
        if queue:
            whole = queue.popleft()
            if not queue:
                del self.ready[object_id]
            return whole
        if self.current is not None and self.current.object_id == object_id:
            reason = f"object {object_id.hex()} ended at {self.received} of its {self.current.total} bytes"
            self._end_current(reason)
            raise StreamError(reason)
        return frame

    def clear(self) -> None:
        """The connection is gone: free every buffer, whole or partial (a reader of the
        partial one raises StreamError)."""
        self._end_current("the connection to the daemon was lost before the object was whole")
        self.received = 0
        self.ready.clear()
        self.failed.clear()

    def holding(self) -> int:
        """Bytes allocated for objects in parts (whole ones not yet taken, and the partial one)."""
        whole = sum(v.nbytes for queue in self.ready.values() for v in queue)
        return whole + (self.current.total if self.current is not None else 0)

    def _fail(self, object_id: bytes, reason: str) -> None:
        self.failed[object_id] = reason
        if self.current is not None and self.current.object_id == object_id:
            # its reader, if one began, raises this; its buffer goes with it
            self._end_current(f"object {object_id.hex()} came from the daemon in parts that do not fit: {reason}")

    def _end_current(self, reason: str) -> None:
        """The object being received will not be whole: its reader or streams end with ``reason``."""
        current, self.current = self.current, None
        if current is None:
            return
        if current.parts is not None:
            current.parts.fail(reason)
        elif self.abort is not None and current.buffer is not None:
            self.abort(current.buffer, reason)
