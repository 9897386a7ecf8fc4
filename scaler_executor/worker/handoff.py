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
  the same way; the agent maps it and streams it to the daemon from the mapping.

A memfd has no name in any file system: only processes given its descriptor can reach it,
and it goes when the last descriptor and mapping go (a process that dies leaks nothing;
nothing to sweep in /dev/shm).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pickle
from typing import Any, NamedTuple

from scaler_executor.protocol import messages as m

# Objects at least this large cross the agent <-> processor socket as memfds; smaller ones
# go inside the message as before (a memfd costs three system calls and a mapping).
LARGE = m.OBJECT_CHUNK_BYTES
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
    its descriptor is closed when it is collected unsealed (an object cut short)."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

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


def seal(memfd: Unsealed) -> memoryview:
    """The object ``allocate`` gave, once written whole (``chunks.Incoming``'s ``finish``):
    the memfd is sealed against writes, shrinking and growing (``F_SEAL_WRITE``...), so a
    processor given it (tasks of other clients may read the same object on this worker) can
    neither write it nor map it writable, even by ``mprotect``. Returns a read-only view of
    a read-only mapping that holds the descriptor."""
    fd, size = memfd.fd, memfd.size
    memfd.fd = -1  # the descriptor is the sealed mapping's
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        sealed = SharedBlob(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        os.close(fd)
        raise
    sealed.fd = fd
    return memoryview(sealed)


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


def blobs_for_run(blobs: dict[bytes, Any]) -> tuple[dict[bytes, Any], list[int]]:
    """A RUN's fetched objects: each one in a memfd named by its size, its descriptor in the
    list returned (in the dict's order, up to MAX_FDS); the others as they are."""
    out: dict[bytes, Any] = {}
    fds: list[int] = []
    for object_id, blob in blobs.items():
        fd = fd_of(blob)
        if fd >= 0 and len(fds) < MAX_FDS:
            out[object_id] = memoryview(blob).nbytes
            fds.append(fd)
        else:
            out[object_id] = blob
    return out, fds
