"""Sending and receiving transmissions on ZeroMQ sockets, without pyzmq's sugar.

pyzmq's ``send_multipart``/``recv_multipart`` combine flags as ``enum.IntFlag``
values (``zmq.SNDMORE | flags``) for every frame, and a receive loop that stops
on ``zmq.Again`` builds an exception each turn; together that was about 20 us of
a no-op task's round trip, spent in four processes.  These helpers call the
backend socket methods with plain ``int`` flags and poll (without waiting) before
reading.  Semantics are unchanged: non-blocking, whole multipart messages (ZeroMQ
delivers all parts of a message or none); frames of ``ZERO_COPY_BYTES`` or more are
not copied (below).
"""

from __future__ import annotations

from typing import Any

import zmq

_Backend = zmq.backend.Socket
_send = _Backend.send
_recv = _Backend.recv
_poll = zmq.backend.zmq_poll
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
_POLLIN = int(zmq.POLLIN)


# Frames at least this long are handed to libzmq without a copy (it holds the buffer until
# the I/O thread has written it) and read back as views of libzmq's message: an object's
# bytes are then copied by the kernel only, instead of twice more in user space (a 100 MB
# object crossing two namespaces: see bench/multihost.py).  Smaller ones are copied: a
# zero-copy frame costs pyzmq an object and a release callback, more than copying 64 KiB.
ZERO_COPY_BYTES = 1 << 16


def send(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """Send ``frames`` as one message without blocking; raises ``zmq.Again`` (queue
    full) or another ``zmq.ZMQError`` (``EHOSTUNREACH`` with ROUTER_MANDATORY)
    before any part is queued.  A frame of ``ZERO_COPY_BYTES`` or more must not change
    until it is sent (bytes, a sealed store object, a buffer whose owner waits)."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        if len(frame) >= ZERO_COPY_BYTES:
            _send(sock, frame, _MORE_NOBLOCK if i < last else _NOBLOCK, False)
        else:
            _send(sock, frame, _MORE_NOBLOCK if i < last else _NOBLOCK)


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a whole message waits to be read (cheaper than a failed recv)."""
    # zmq_poll with no wait, not getsockopt(EVENTS): pyzmq turns every option into an
    # enum member first, which costs more than the poll.
    return bool(_poll([(sock, _POLLIN)], 0))


def recv(sock: zmq.Socket[Any]) -> list[Any]:
    """One whole message, its frames as bytes (a large one as a memoryview); raises
    ``zmq.Again`` if none waits."""
    frame = _recv(sock, _NOBLOCK, False)  # a Frame knows whether more parts follow
    frames: list[Any] = [frame.bytes]
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        # A large frame (an object's bytes) as a read-only view of libzmq's message, alive
        # as long as the view is: no copy.  Only out-of-band buffers are that large.
        frames.append(frame.bytes if len(frame) < ZERO_COPY_BYTES else frame.buffer)
    return frames


_USER_ID = "User-Id"


def recv_with_user(sock: zmq.Socket[Any]) -> tuple[list[bytes], str, Any]:
    """``recv`` on a ROUTER, plus the ZAP User-Id of the peer and the first body frame.

    The identity frame is the ROUTER's own and carries no metadata; the body frames carry the
    connection's (ZMTP properties and what the ZAP handler answered)."""
    frame = _recv(sock, _NOBLOCK, False)
    frames: list[Any] = [frame.bytes]
    body: Any = None
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        if body is None:
            body = frame
        # A put's chunk (ObjectChunk, 4 MiB) as a view of libzmq's message, as in recv: the
        # daemon writes it into the store from there, without a copy of its own first.
        frames.append(frame.bytes if len(frame) < ZERO_COPY_BYTES else frame.buffer)
    user = ""  # no User-Id (a connection no ZAP handler answered): the caller refuses it
    if body is not None:
        try:
            user = body.get(_USER_ID)
        except zmq.ZMQError:
            pass
    return frames, user, body
