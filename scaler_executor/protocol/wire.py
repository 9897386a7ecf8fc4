"""Sending and receiving transmissions on ZeroMQ sockets, without pyzmq's sugar.

pyzmq's ``send_multipart``/``recv_multipart`` combine flags as ``enum.IntFlag``
values (``zmq.SNDMORE | flags``) for every frame, and a receive loop that stops
on ``zmq.Again`` builds an exception each turn; together that was about 20 us of
a no-op task's round trip, spent in four processes.  These helpers call the
backend socket methods with plain ``int`` flags and poll (without waiting) before
reading.  Semantics are unchanged: non-blocking, copying, whole multipart
messages (ZeroMQ delivers all parts of a message or none).
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


def send(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """Send ``frames`` as one message without blocking; raises ``zmq.Again`` (queue
    full) or another ``zmq.ZMQError`` (``EHOSTUNREACH`` with ROUTER_MANDATORY)
    before any part is queued."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        _send(sock, frame, _MORE_NOBLOCK if i < last else _NOBLOCK)


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a whole message waits to be read (cheaper than a failed recv)."""
    # zmq_poll with no wait, not getsockopt(EVENTS): pyzmq turns every option into an
    # enum member first, which costs more than the poll.
    return bool(_poll([(sock, _POLLIN)], 0))


def recv(sock: zmq.Socket[Any]) -> list[bytes]:
    """One whole message as bytes frames; raises ``zmq.Again`` if none waits."""
    frame = _recv(sock, _NOBLOCK, False)  # a Frame knows whether more parts follow
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


_USER_ID = "User-Id"


def recv_with_user(sock: zmq.Socket[Any]) -> tuple[list[bytes], str, Any]:
    """``recv`` on a ROUTER, plus the ZAP User-Id of the peer and the first body frame.

    The identity frame is the ROUTER's own and carries no metadata; the body frames carry the
    connection's (ZMTP properties and what the ZAP handler answered)."""
    frame = _recv(sock, _NOBLOCK, False)
    frames = [frame.bytes]
    body: Any = None
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        if body is None:
            body = frame
        frames.append(frame.bytes)
    user = ""  # no User-Id (a connection no ZAP handler answered): the caller refuses it
    if body is not None:
        try:
            user = body.get(_USER_ID)
        except zmq.ZMQError:
            pass
    return frames, user, body
