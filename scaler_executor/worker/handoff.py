"""Large objects between a worker agent and its processors, in shared memory (memfd).

A worker on a host that cannot map the daemon's store fetches its tasks' objects over the
network (``protocol/chunks.py``) and streams large results back (``agent._offload``).
Handing such an object to a processor inside the RUN message (msgpack) cost four copies
of it: ``packb`` into the message, the socket, the processor's read buffer, ``unpackb``
out of it; with 100 MB that was ~0.3 s of the 0.5 s a remote task took to read it
(bench/multihost.py), and the agent and the processor each held it whole twice. A large
result came back the same way. Now:

* the agent writes an object's parts (``chunks.Incoming``, ``allocate``, ``write``) straight
  into a memfd with ``pwrite``: the one copy a fetch needs; then seals the memfd against
  writes and keeps a read-only mapping of it (``seal``, a ``SharedBlob``): processors of
  other clients' tasks may be given the same object;
* a RUN names such an object by its size, and its descriptor travels beside the message
  (``SCM_RIGHTS``, ``framing.send_with_fds``); the processor maps it read-only (``attach``)
  and closes the descriptor: the processor reads the agent's pages, no copy;
* a large result is pickled into a memfd by the processor (``dump_large``) and comes back
  the same way; the agent maps it and streams it to the daemon from the mapping;
* a task whose only missing object is a pickle stream still arriving need not wait for its
  last part: the agent runs it at once and sends the object's bytes as they land
  (``stream``: ``sendfile`` from the memfd into a socket pair of the task's own, by a thread
  of the agent), then, once the object is whole and sealed, its memfd on the same socket.
  The processor's ``pickle.load`` reads the bytes as they come (``Streamed``), so unpickling
  overlaps the transfer, and any later read of the object in the task maps the sealed
  memfd. The processor is never given a descriptor of the memfd before it is sealed (it
  could write it, or map it writable, and corrupt what other tasks read).

A memfd has no name in any file system: only processes given its descriptor can reach it,
and it goes when the last descriptor and mapping go (a process that dies leaks nothing;
nothing to sweep in /dev/shm).
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
import pickle
import socket
import threading
from typing import Any, NamedTuple

from scaler_executor.protocol import messages as m
from scaler_executor.protocol import prefault
from scaler_executor.protocol.chunks import StreamError

# Objects at least this large cross the agent <-> processor socket as memfds; smaller ones
# go inside the message as before (a memfd costs three system calls and a mapping).
LARGE = m.OBJECT_CHUNK_BYTES
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux 5.1; Python's fcntl names it from 3.12 on
# Descriptors beside one message at most (the kernel's SCM_MAX_FD is 253): a task's further
# large objects go inside its RUN as before.
MAX_FDS = 64


class SharedBlob(mmap.mmap):
    """A shared mapping of a memfd; ``fd`` stays open while the mapping lives
    (closed when it is collected), so it can be handed to processors."""

    fd: int

    def __del__(self) -> None:
        fd = getattr(self, "fd", -1)
        if fd >= 0:
            self.fd = -1
            os.close(fd)


class Unsealed:
    """A fresh memfd of ``size`` bytes being written (``allocate``, ``write``) before ``seal``;
    its descriptor is closed when it is collected unsealed (an object cut short).

    Threads streaming it to processors (``stream``) wait on ``changed`` for ``landed`` (bytes
    written from the start) to grow, and for ``whole`` (the sealed object, ``seal``) or
    ``failed`` (``abort``)."""

    __slots__ = ("fd", "size", "landed", "whole", "failed", "changed")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.landed = 0
        self.whole: memoryview | None = None
        self.failed = ""
        self.changed: threading.Condition | None = None  # made by the first stream

    def advance(self, landed: int) -> None:
        changed = self.changed
        if changed is None:
            self.landed = landed
            return
        with changed:
            self.landed = landed
            changed.notify_all()

    def abort(self, reason: str) -> None:
        """The object will not be whole: its streams end short (their readers raise)."""
        changed = self.changed
        if changed is None:
            self.failed = self.failed or reason
            return
        with changed:
            self.failed = self.failed or reason
            changed.notify_all()

    def __del__(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def allocate(total: int) -> Unsealed:
    """A fresh memfd of ``total`` bytes to write the parts of an object into
    (``chunks.Incoming``'s allocator)."""
    fd = os.memfd_create("scaler-object", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, total)
    except BaseException:
        os.close(fd)
        raise
    return Unsealed(fd, total)


def write(memfd: Unsealed, offset: int, part: memoryview) -> None:
    """Copy ``part`` into the memfd at ``offset`` (``chunks.Incoming``'s writer). ``pwrite``,
    not a writable mapping: the kernel fills the memfd's pages as it copies, where a mapping
    took a page fault per 4 KiB page (measured in docs/security.rst, "the fetch's limits").
    Raises OSError when the host has no memory left for it (a mapping would get SIGBUS)."""
    done, size = 0, part.nbytes
    while done < size:
        done += os.pwrite(memfd.fd, part[done:], offset + done)
    memfd.advance(offset + size)


def seal(memfd: Unsealed) -> memoryview:
    """The object ``allocate`` gave, once written whole (``chunks.Incoming``'s ``finish``):
    the memfd is sealed against writes, shrinking and growing, so a processor given it
    (tasks of other clients may read the same object on this worker) can neither write it
    (``pwrite``, a writable reopening through ``/proc``) nor map it writable, even by
    ``mprotect``. Returns a read-only view of a read-only mapping that holds the descriptor.

    ``F_SEAL_FUTURE_WRITE``, not ``F_SEAL_WRITE``: the latter also waits for every other
    reference to the memfd's pages to go, and fails with EBUSY while a stream's socket still
    holds pages ``sendfile`` gave it (``stream``); the former forbids every write from now
    on and spares only writable mappings made before it, and there are none: the agent
    writes with ``pwrite``, and nobody else has had the descriptor."""
    fd, size = memfd.fd, memfd.size
    memfd.fd = -1  # the descriptor is the sealed mapping's
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        sealed = SharedBlob(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        os.close(fd)
        raise
    sealed.fd = fd
    whole = memoryview(sealed)
    changed = memfd.changed
    if changed is None:
        memfd.whole = whole
    else:
        with changed:
            memfd.whole = whole
            changed.notify_all()
    return whole


def fd_of(value: Any) -> int:
    """The memfd behind ``value`` (a view of a SharedBlob), or -1."""
    owner = value.obj if type(value) is memoryview else value
    return owner.fd if type(owner) is SharedBlob and owner.fd >= 0 else -1


def attach(fd: int, size: int) -> memoryview:
    """A read-only view of ``size`` bytes of memfd ``fd``, which is closed (the mapping holds
    the memory)."""
    try:
        if os.fstat(fd).st_size < size:
            raise ValueError(f"a shared object of {size} bytes came in a memfd of {os.fstat(fd).st_size}")
        return memoryview(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ))
    finally:
        os.close(fd)


class InMemfd(NamedTuple):
    """A processor's result pickled into memfd ``fd`` (``size`` bytes): DONE carries the size
    and the descriptor goes beside it."""

    fd: int
    size: int

    def __len__(self) -> int:
        return self.size


def pickle_large(value: Any, fallback: Any) -> InMemfd:
    """``value`` pickled into a fresh memfd. The pickler writes a large bytes-like value's
    body straight to the file (protocol 5 frames stop before it), so this costs one copy,
    where ``pickle.dumps`` then a write would cost two. ``fallback`` (the cloudpickle
    module) pickles what plain pickle cannot."""
    fd = os.memfd_create("scaler-result", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as file:
            try:
                pickle.dump(value, file, protocol=5)
            except Exception:  # noqa: BLE001 - pickle fails in many ways: cloudpickle next, from the start
                file.flush()
                file.seek(0)
                file.truncate()
                fallback.dump(value, file, protocol=5)
            size = file.tell()
    except BaseException:
        os.close(fd)
        raise
    return InMemfd(fd, size)


def is_large(value: Any) -> bool:
    """Whether ``value`` is a bytes-like or str result worth pickling into a memfd at once."""
    kind = type(value)
    if kind is bytes or kind is bytearray or kind is str:
        return len(value) >= LARGE
    if kind is memoryview:
        return bool(value.nbytes >= LARGE)
    return False


def to_memfd(data: bytes) -> InMemfd:
    """``data`` (a pickle already made) written into a fresh memfd."""
    fd = os.memfd_create("scaler-result", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        written = 0
        while written < view.nbytes:
            written += os.write(fd, view[written:])
    except BaseException:
        os.close(fd)
        raise
    return InMemfd(fd, view.nbytes)


def blobs_for_run(blobs: dict[bytes, Any]) -> tuple[dict[bytes, Any], list[int], list[int]]:
    """A RUN's fetched objects: each one in a memfd named by its size, its descriptor in the
    list returned (in the dict's order, up to MAX_FDS); one still arriving (an ``Unsealed``)
    named by minus its size, the processor's end of its stream's socket in the list, and
    also in the third list returned (the caller closes those once sent); the others as they
    are."""
    out: dict[bytes, Any] = {}
    fds: list[int] = []
    streams: list[int] = []
    for object_id, blob in blobs.items():
        if type(blob) is Unsealed:
            if blob.whole is None:  # (at most one a task: it may pass MAX_FDS by one)
                out[object_id] = -blob.size
                streams.append(stream(blob))
                fds.append(streams[-1])
                continue
            blob = blob.whole  # sealed since; if it failed, the task fails on it as it would have
        fd = fd_of(blob)
        if fd >= 0 and len(fds) < MAX_FDS:
            out[object_id] = memoryview(blob).nbytes
            fds.append(fd)
        else:
            out[object_id] = blob
    return out, fds, streams


# ------------------------------------------------------------------ streaming an object to a processor

# Bytes per sendfile call: the socket takes what fits in its buffer and the call returns.
_SEND = 4 << 20
_TRAILER = b"\x01"  # the byte the sealed memfd travels beside, after the object's bytes


def stream(memfd: Unsealed) -> int:
    """Start sending ``memfd``'s bytes, as they land, into a new socket pair; returns the
    processor's end (a descriptor the caller passes on and closes). A thread of the agent
    sends them (``sendfile``: no copy through Python), then the sealed memfd beside one
    more byte; it stops without it if the object fails or the processor hangs up."""
    if memfd.changed is None:
        memfd.changed = threading.Condition(threading.Lock())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        source = os.dup(memfd.fd)
    except BaseException:
        ours.close()
        theirs.close()
        raise
    threading.Thread(target=_send, args=(memfd, source, ours), name="scaler-object-stream", daemon=True).start()
    return theirs.detach()


def _send(memfd: Unsealed, source: int, sock: socket.socket) -> None:
    changed, size, sent = memfd.changed, memfd.size, 0
    assert changed is not None
    try:
        while True:
            with changed:
                while memfd.landed <= sent and not memfd.failed and (sent < size or memfd.whole is None):
                    changed.wait()
                if memfd.failed:
                    return  # the socket closes short: the reader raises StreamError
                landed, whole = memfd.landed, memfd.whole
            while sent < landed:
                sent += os.sendfile(sock.fileno(), source, sent, min(landed - sent, _SEND))
            if sent == size and whole is not None:
                fd = fd_of(whole)
                if fd >= 0:
                    sock.sendmsg([_TRAILER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))])
                return
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise
        # the processor hung up (its task ended, or was recalled or killed): nothing to send
    finally:
        os.close(source)
        sock.close()


class Streamed:
    """A processor's view of an object the agent streams to it (``stream``): read once as a
    file while it arrives (``reader``), or whole (``join``: the sealed memfd that follows
    its bytes, mapped; any read after the first is that mapping)."""

    __slots__ = ("sock", "object_id", "size", "left", "mapped", "taken")

    def __init__(self, fd: int, object_id: bytes, size: int) -> None:
        self.sock: socket.socket | None = socket.socket(fileno=fd)
        self.object_id = object_id
        self.size = size
        self.left = size  # bytes not yet read from the socket
        self.mapped: memoryview | None = None
        self.taken = False

    def reader(self) -> Any:
        if self.taken or self.mapped is not None:
            return self.join()
        self.taken = True
        return io.BufferedReader(_StreamReader(self), 1 << 16)

    def join(self) -> memoryview:
        if self.mapped is None:
            sock = self._sock()
            scratch = memoryview(bytearray(min(self.left, 1 << 20)))
            while self.left:  # what a reader left unread
                self.recv_into(scratch[: min(self.left, scratch.nbytes)])
            data, ancillary, _flags, _address = sock.recvmsg(1, socket.CMSG_SPACE(4))
            fds = [int.from_bytes(d[:4], "little") for level, kind, d in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS]
            if data != _TRAILER or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise StreamError(f"object {self.object_id.hex()} of its arguments came to this worker without its memfd")
            self.mapped = attach(fds[0], self.size)
            self.close()
        return memoryview(self.mapped)  # its own view: a reader releases it when done

    def recv_into(self, target: memoryview) -> int:
        count = self._sock().recv_into(target, min(target.nbytes, self.left))
        if count == 0:
            raise StreamError(
                f"object {self.object_id.hex()} of its arguments did not arrive whole: its transfer to this worker "
                f"ended at {self.size - self.left} of its {self.size} bytes"
            )
        self.left -= count
        return count

    def _sock(self) -> socket.socket:
        if self.sock is None:
            raise StreamError(f"object {self.object_id.hex()} of its arguments was read after its stream was closed")
        return self.sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def __del__(self) -> None:
        self.close()


class _StreamReader(io.RawIOBase):
    """The bytes of a ``Streamed`` object as a binary file, waiting for those not here yet."""

    def __init__(self, streamed: Streamed) -> None:
        super().__init__()
        self.streamed = streamed

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        streamed = self.streamed
        target = memoryview(buffer).cast("B")
        want, done = min(target.nbytes, streamed.left), 0
        ahead = prefault.Ahead(target[:want])  # a large read: its pages faulted in a window ahead
        while done < want:
            done += streamed.recv_into(target[done : ahead.limit(done)])
        return done
