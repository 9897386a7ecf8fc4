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

import os
import select
import struct
from collections import deque

_LEN = struct.Struct("!i")
_LONG = struct.Struct("!Q")
READ_SIZE = 1 << 18
LARGE = 1 << 20  # a frame this big is read straight into its own buffer


class FrameReader:
    """Length-prefixed frames from a stream socket or pipe ``fd``."""

    __slots__ = ("fd", "buf", "parsed")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.parsed: deque[bytes | bytearray] = deque()

    def fill(self) -> None:
        """One read of what is available (blocks only if nothing is); EOFError at the end."""
        data = os.read(self.fd, READ_SIZE)
        if not data:
            raise EOFError
        self.buf += data
        self._parse()

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
