"""Results sent straight from a processor to its client: one unix datagram each.

A sequential caller's round trip crosses seven processes and threads on the normal
path (daemon, worker agent, processor, worker agent, daemon, client agent, caller).
For a task submitted while no other is outstanding (``TaskFlags.REPLY_DIRECT``), the
processor also sends the result to the client's *reply socket*: a unix datagram
socket the client binds in its private (mode 0700) cluster directory.  The client
completes the future from it, and the worker agent's copy of the result, marked
``delivered``, only does the daemon's bookkeeping.  Two hops leave the caller's path.

Why it cannot lose a result:

* A unix datagram is delivered whole or ``sendto`` fails (no partial writes, no loss
  in the kernel).  On any failure (the client gone, its queue full, a path this
  process may not write to) the processor reports the result the normal way.
* The directory's mode lets only the client's user in, so a datagram that was sent
  is one the client reads; the daemon refuses peers of another package version, so
  it decodes.
* Only results that ran under ``DIRECT_SECONDS`` with a payload of at most
  ``MAX_PAYLOAD`` bytes and no object-store objects go this way.
"""

from __future__ import annotations

import struct

from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m

MAX_PAYLOAD = 64 * 1024  # larger results take the daemon's path (one copy fewer to skip)
DATAGRAM_LIMIT = MAX_PAYLOAD + 4096  # what the client reads at once: any datagram we send fits
DIRECT_SECONDS = 0.01  # longer tasks gain nothing measurable (and their memory peak is sampled)
SOCKET_NAME = "reply.sock"

# One result per datagram, in a fixed layout rather than the codec's msgpack: both ends
# are on the round trip of a sequential caller, where the generic encode and decode
# (with its field checks) cost ~3.5 and ~4 us hot against ~0.5 and ~1.5 here, and more
# from a cold cache.  Little-endian: the protocol tag (codec.VERSION_FRAME, so that a
# datagram of another protocol version is refused like any other transmission), task
# id, attempt, status, started, finished, peak memory, the lengths of the worker's name
# and of its lane's path; then the name and the path (UTF-8; the path is "" when the
# worker has no lane for this client: worker/lanes.py) and the pickled payload, to the end.
_TAG = codec.VERSION_FRAME.ljust(8, b"\0")
_HEADER = struct.Struct("<8sQIBddQHH")
_MAX_NAMES = DATAGRAM_LIMIT - MAX_PAYLOAD - _HEADER.size
assert len(codec.VERSION_FRAME) <= 8


def encode(result: m.TaskResult, lane: str = "") -> bytes:
    """One datagram carrying ``result`` (which has no store objects) and the path of the
    sending worker's lane, if it has one."""
    if result.objects:
        raise ValueError("a result with store objects cannot travel in a reply datagram")
    facts = result.facts
    name = facts.worker.encode()
    path = lane.encode()
    if len(name) + len(path) > _MAX_NAMES:
        raise ValueError(
            f"worker name and lane path of {len(name) + len(path)} bytes are too long for a reply datagram (at most {_MAX_NAMES})"
        )
    try:
        header = _HEADER.pack(
            _TAG, result.task_id, result.attempt, result.status, facts.started, facts.finished, facts.peak_memory,
            len(name), len(path),
        )
    except struct.error as exc:  # a field out of the layout's range: the daemon's path carries it
        raise ValueError(f"a result that does not fit a reply datagram's header: {exc}") from None
    return b"".join((header, name, path, result.payload))


def decode(datagram: bytes) -> tuple[m.TaskResult, str]:
    """The result in a datagram and the sender's lane ("" if none); raises
    codec.DecodeError for anything else."""
    if len(datagram) < _HEADER.size:
        raise codec.DecodeError(f"a reply datagram of {len(datagram)} bytes is shorter than its {_HEADER.size}-byte header")
    tag, task_id, attempt, status, started, finished, peak, name_length, path_length = _HEADER.unpack_from(datagram)
    if tag != _TAG:
        raise codec.DecodeError(
            f"a reply datagram of protocol {tag.rstrip(bytes(1))!r}, this side speaks {codec.VERSION_FRAME!r}: "
            "install the same scaler-executor version everywhere"
        )
    path_at = _HEADER.size + name_length
    start = path_at + path_length
    if start > len(datagram):
        raise codec.DecodeError(
            f"a reply datagram's worker name and lane path ({name_length} and {path_length} bytes) run past its end"
        )
    try:
        worker = datagram[_HEADER.size : path_at].decode()
        lane = datagram[path_at:start].decode()
    except UnicodeDecodeError as exc:
        raise codec.DecodeError(f"a reply datagram's worker name or lane path is not UTF-8: {exc}") from None
    facts = m.make(m.TaskFacts, (worker, started, finished, peak))  # (m.make: once per round trip)
    return m.make(m.TaskResult, (task_id, attempt, status, datagram[start:], facts, m.NO_OBJECTS, False, b"")), lane
