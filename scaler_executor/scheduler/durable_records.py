"""What the journaled daemon (durable.py) writes: its records' keys and shapes, how they
are packed and checked when read back, and the commands it adds to the core's.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import DecodeError, _record
from scaler_executor.scheduler.journal_format import JournalRecordInvalid

LOGICAL = b"\xffP"  # a journaled peer's id in the core; no transport identity starts so
NEXT_PEER = b"n"
ON_LANE = m.TaskFlags.ON_LANE
STORE = b"s"  # the host's store region: kept by a restarted daemon (scheduler/objects.py)

Entries = list[tuple[bytes, bytes | None]]
MAX_PEER_ID = 1 << (64 - m.TASK_ID_BITS)  # a client's id prefixes its 64-bit task ids
MAX_HOLDS = 1 << 24  # holds of one object by one client: more is a garbled record


@dataclass(frozen=True, slots=True)
class SendNow:
    """Send at once, even while the loop holds the turns its journal could not write yet
    (the refusals of submissions while the journal is full: they change no journaled state)."""

    peer: bytes
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class SweepStore:
    """Every peer the journal knew has reported or is gone: delete the objects the adopted
    store region held at the restart that nobody holds (HostStore.sweep)."""


@dataclass(frozen=True, slots=True)
class JournalWrite:
    """Write these entries to the journal before executing the turn's other commands."""

    entries: Entries


def logical(peer_id: int) -> bytes:
    return LOGICAL + peer_id.to_bytes(8, "big")


def _key(kind: bytes, number: int) -> bytes:
    return _KEY(kind, number)


_KEY = struct.Struct(">cQ").pack
_DISPATCH = struct.Struct(">QI").pack  # a dispatch: the worker's peer id (8 bytes) and the attempt (4)


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


KEPT = "kept"  # first field of a ``t`` record that holds the task's result, not the task


# The shapes of the records' values, checked at restore (the codec's validators): a record
# the files hold intact but whose value makes no sense is refused, naming its key
# (JournalRecordInvalid), never a crash inside restore or a core in a state it never had.
class _Client(NamedTuple):
    name: str
    host: str
    reply_to: str
    authkey_file: str
    token: bytes


class _Worker(NamedTuple):
    name: str
    capacity: int
    resources: dict[str, float]
    tags: list[str]
    pid: int
    host: str
    token: bytes


class _Task(NamedTuple):
    fn_id: int
    flags: int
    payload: bytes
    deps: list[int]
    objects: list[bytes]
    parent: int
    options: m.TaskOptions | None
    attempt: int
    failures: list[str] | None  # one line per failed attempt
    dispatch: bytes  # b"", or the worker's id (8 bytes) and the attempt (4)


class _Kept(NamedTuple):
    kept: str
    result: m.TaskResult


class _Finished(NamedTuple):
    result: bytes  # (a finished task holds its result for its dependents)
    objects: list[bytes]


_SHAPES: dict[type, Callable[[Any], Any]] = {}


def _fields(key: bytes, value: bytes) -> Any:
    try:
        return _unpack(value)
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:  # (a list as a map key: TypeError)
        raise JournalRecordInvalid(key, f"its value is not msgpack ({type(exc).__name__}: {exc})") from None


def _load(key: bytes, value: bytes, shape: type, fields: Any = None) -> Any:
    """The record's value as ``shape``, or JournalRecordInvalid naming ``key``."""
    check = _SHAPES.get(shape) or _SHAPES.setdefault(shape, _record(shape))
    try:
        return check(_fields(key, value) if fields is None else fields)
    except DecodeError as exc:
        raise JournalRecordInvalid(key, f"its value is not a {shape.__name__.strip('_').lower()} record: {exc}") from None


def _number(key: bytes, value: bytes) -> int:
    if len(value) != 8:
        raise JournalRecordInvalid(key, f"its value is {len(value)} bytes, not an 8-byte number")
    return int.from_bytes(value, "big")


class Ledger:
    """A client's results sent and not yet acknowledged: kept (and journaled, ``k``) until its
    ResultsAck counts the TaskResults message that carried them."""

    __slots__ = ("batches", "client_id", "kept", "seq")

    def __init__(self, client_id: int) -> None:
        self.client_id = client_id
        self.kept: dict[int, m.TaskResult] = {}
        self.batches: deque[tuple[int, list[int]]] = deque()  # (seq, task ids) of messages sent
        self.seq = 0  # TaskResults messages sent since the client's last Welcome
