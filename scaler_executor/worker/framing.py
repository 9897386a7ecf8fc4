"""Reading the agent ↔ processor stream in bulk.

Both ends write with ``multiprocessing.connection.Connection.send_bytes`` (a
``!i`` length, or ``-1`` then a ``!Q`` length past 2 GiB, then the bytes); its
``recv_bytes`` reads the length and the body in two system calls per message.
A no-op task crosses this stream twice, and on a virtual machine a system call
that wakes nobody still costs several microseconds: ``FrameReader`` reads
whatever is available in one call and returns every complete frame in it, so
two results that arrived together cost one read, and the agent needs no
``Connection.poll`` (a selector per call) to know whether more are waiting.
"""

from __future__ import annotations

import array
import os
import select
import socket
import struct
from collections import deque

_LEN = struct.Struct("!i")
_ANCILLARY = socket.CMSG_SPACE(253 * 4)  # the kernel's SCM_MAX_FD descriptors
_LONG = struct.Struct("!Q")
# As plain ints: ``socket``'s constants are enum members, and ``int & IntFlag`` builds an
# enum member through ``enum``'s Python code (0.5 us, on every read of every task's message).
_SOL_SOCKET, _SCM_RIGHTS, _MSG_CTRUNC = int(socket.SOL_SOCKET), int(socket.SCM_RIGHTS), int(socket.MSG_CTRUNC)
READ_SIZE = 1 << 18
LARGE = 1 << 20  # a frame this big is read straight into its own buffer


class FrameReader:
    """Length-prefixed frames from a stream socket or pipe ``fd``.

    Given ``sock`` (a socket over the same connection), it reads with ``recvmsg`` and keeps
    the descriptors that came beside the frames (``send_with_fds``), in order, for
    ``take_fd``: the memfds of large objects (worker/handoff.py). A sender's descriptors
    arrive with the first bytes of its message, so they are here once its frame is."""

    __slots__ = ("fd", "buf", "parsed", "sock", "fds")

    def __init__(self, fd: int, sock: socket.socket | None = None) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.parsed: deque[bytes | bytearray] = deque()
        self.sock = sock
        self.fds: deque[int] = deque()

    def fill(self) -> None:
        """One read of what is available (blocks only if nothing is); EOFError at the end."""
        if self.sock is None:
            data = os.read(self.fd, READ_SIZE)
        else:
            data, ancillary, flags, _ = self.sock.recvmsg(READ_SIZE, _ANCILLARY)
            for level, kind, payload in ancillary:
                if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                    self.fds.extend(fds)
            if flags & _MSG_CTRUNC:
                raise OSError("descriptors beside a message were cut off (more than SCM_MAX_FD)")
        if not data:
            raise EOFError
        self.buf += data
        self._parse()

    def take_fd(self) -> int:
        """The next descriptor that came beside the frames; OSError if none did."""
        if not self.fds:
            raise OSError("a message named a shared object whose descriptor did not come with it")
        return self.fds.popleft()

    def close(self) -> None:
        """Close the descriptors received and not taken, and the socket (not ``fd``)."""
        while self.fds:
            os.close(self.fds.popleft())
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def frames(self) -> list[bytes | bytearray]:
        """Every complete frame read so far, in order (taken out of the reader)."""
        out = list(self.parsed)
        self.parsed.clear()
        return out

    def next(self) -> bytes | bytearray:
        """The next frame, blocking until it is complete."""
        while not self.parsed:
            self.fill()
        return self.parsed.popleft()

    def available(self) -> list[bytes | bytearray]:
        """Every complete frame that can be had without waiting."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if poller.poll(0):
            try:
                self.fill()
            except EOFError:
                pass  # the caller finds out on its next read
        return self.frames()

    def _parse(self) -> None:
        buf = self.buf
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            head = 4
            if size == -1:
                if end - pos < 12:
                    break
                (size,) = _LONG.unpack_from(buf, pos + 4)
                head = 12
            start = pos + head
            if end - start >= size:
                self.parsed.append(bytes(buf[start : start + size]))
                pos = start + size
                continue
            if size >= LARGE:  # read the rest straight into the frame's own buffer
                self.parsed.append(self._read_rest(buf[start:], size))
                pos = end
            break
        del buf[:pos]

    def _read_rest(self, head: bytearray, size: int) -> bytearray:
        frame = bytearray(size)
        have = len(head)
        frame[:have] = head
        view = memoryview(frame)
        while have < size:
            n = os.readv(self.fd, [view[have:]])
            if n == 0:
                raise EOFError
            have += n
        return frame


def send_with_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """``data`` as one frame (``Connection.send_bytes``'s framing) with ``fds`` beside its
    first bytes (SCM_RIGHTS; the receiver's FrameReader keeps them). Blocks until written."""
    size = len(data)
    head = _LEN.pack(size) if size <= 0x7FFFFFFF else _LEN.pack(-1) + _LONG.pack(size)
    view = memoryview(head + data)
    sent = sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    while sent < view.nbytes:
        sent += sock.send(view[sent:])
