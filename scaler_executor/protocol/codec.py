"""The only place that packs and unpacks frames.

A transmission is a list of ZeroMQ frames::

    [VERSION_FRAME, body, buffer_0, buffer_1, ...]

* ``VERSION_FRAME`` names the protocol and its version (``b"SCX/5"``).  A peer
  speaking another version is refused with a reason, never guessed at.
* ``body`` is a msgpack array of messages, each ``[tag, [field, ...]]``: every
  transmission is a *batch*, so one syscall and one decode carry as many
  messages as queued while the previous send was in flight.
* Large buffers (object-store transfers) travel as frames of their own and are
  referred to by index from the messages, never copied into the body.

msgpack executes no code while decoding, so control messages from an
unauthenticated peer can be read safely; pickled user payloads are opaque
``bytes`` fields, unpickled only where user code runs or receives results.
Every decoded message is validated against the field types declared in
:mod:`.messages` (arity and types, recursively); anything else raises
:class:`DecodeError`, which the caller logs and drops.

A receiver that does not trust its peers (the daemon) passes :class:`Limits`: caps on what
one transmission may decode to, checked before anything is built (the batch's length
from its header, the rest by msgpack's C unpacker as it goes), so a batch of millions
of small messages is refused at the cost of reading a few bytes.  Senders split their
batches at :data:`SEND_BATCH_MESSAGES`, well under the cap.
"""

from __future__ import annotations

import reprlib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Union

import msgpack

from scaler_executor.exceptions import ProtocolError
from scaler_executor.protocol import messages as _m
from scaler_executor.protocol.messages import MESSAGE_TAGS, PROTOCOL_VERSION

VERSION_FRAME = b"SCX/%d" % PROTOCOL_VERSION
_VERSION_PREFIX = b"SCX/"

Message = Any  # one of the NamedTuples in .messages
Frames = list[bytes]


class DecodeError(ProtocolError):
    """Frames that are not a valid transmission of this protocol version."""


class VersionMismatch(DecodeError):
    """The peer speaks another protocol (or another version of this one)."""


class Limits(typing.NamedTuple):
    """Caps on what one transmission may decode to (``decode(frames, limits)``)."""

    messages: int  # messages in the batch (the body's top-level array)
    array: int  # elements of any other array (a SubmitTasks' tasks, a task's deps, ...)
    map: int  # entries of any map (resources, options)
    string: int  # bytes of any string
    binary: int  # bytes of any bin (payloads, pickled callables)


# Messages a sender puts in one transmission at most (client/state.py, worker/agent.py):
# more wait for the next one.  A tenth of the receiver's cap below.
SEND_BATCH_MESSAGES = 10_000
# The daemon's caps (scheduler/loop.py: daemon_limits, which raises ``array`` to the
# config's max_pending_tasks and ``string``/``binary`` to its max_message_size).
MAX_BATCH_MESSAGES = 100_000  # 100k heartbeats decode to ~30 MB; 2 M had grown the daemon by 500 MB
MAX_ARRAY_LEN = 1 << 20  # a graph of 10^6 nodes, a cancel of 10^6 tasks, 10^6 results
MAX_MAP_LEN = 1 << 16  # resources and options hold a handful of keys
# msgpack (C) nests at most 1024 containers deep; deeper raises StackError (a DecodeError
# here): the deepest message (DispatchTasks) nests 7 levels.
MAX_NESTING = 1024

# Short descriptions of untrusted values in error text: a plain repr of a 1000-level list
# raises RecursionError, and of a million-element one costs its whole length before the
# message truncates it.
_brief_repr = reprlib.Repr()
_brief_repr.maxlevel = 3
_brief_repr.maxlist = _brief_repr.maxdict = _brief_repr.maxtuple = 4
_brief_repr.maxstring = _brief_repr.maxother = 40


def _brief(value: Any) -> str:
    return _brief_repr.repr(value)


# --------------------------------------------------------------------------- validation

_Validator = Callable[[Any], Any]


def _fail(expected: str, value: Any) -> typing.NoReturn:
    raise DecodeError(f"expected {expected}, got {type(value).__name__}")


def _primitive(tp: type) -> _Validator:
    if tp is float:
        accepted: tuple[type, ...] = (float, int)
    else:
        accepted = (tp,)
    name = tp.__name__

    def check(value: Any) -> Any:
        if type(value) in accepted:  # exact types: a bool is not an int on this wire
            return value
        _fail(name, value)

    check.accepted = accepted  # type: ignore[attr-defined]  # lets list checks inline it
    return check


def _optional(inner: _Validator) -> _Validator:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def _list_of(inner: _Validator, inner_accepted: tuple[type, ...] | None) -> _Validator:
    if inner_accepted is not None:

        def check_primitives(value: Any) -> Any:
            if not isinstance(value, list):
                _fail("list", value)
            for item in value:
                if type(item) not in inner_accepted:
                    _fail("list of " + inner_accepted[0].__name__, item)
            return value

        return check_primitives

    def check(value: Any) -> Any:
        if not isinstance(value, list):
            _fail("list", value)
        return [inner(item) for item in value]

    return check


def _dict_of(key: _Validator, val: _Validator) -> _Validator:
    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            _fail("dict", value)
        for k, v in value.items():
            key(k)
            val(v)
        return value

    return check


def _union(options: list[_Validator]) -> _Validator:
    def check(value: Any) -> Any:
        for option in options:
            try:
                return option(value)
            except DecodeError:
                continue
        _fail("one of the union's types", value)

    return check


def _record(cls: type) -> _Validator:
    """A validator for a NamedTuple record, generated as straight-line code.

    Generated (as ``dataclasses`` generates ``__init__``) because this runs for
    every task on every hop: inline ``isinstance`` checks cost a fifth of a
    call per field through generic validators.
    """
    hints = typing.get_type_hints(cls)
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    arity = len(fields)
    env: dict[str, Any] = {"DecodeError": DecodeError, "_fail": _fail, "_new": tuple.__new__, "cls": cls, "_brief": _brief}
    names = [f"a{i}" for i in range(arity)]
    lines = [
        "def check(value):",
        f"    if type(value) is not list or len(value) != {arity}:",
        f"        raise DecodeError('{cls.__name__}: expected {arity} fields, got %s' % _brief(value))",
    ]
    if arity:
        lines.append(f"    {', '.join(names)}{',' if arity == 1 else ''} = value")
    for i, name in enumerate(fields):
        tp = hints[name]
        optional = typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)
        inner = _validator_for(tp)
        accepted = getattr(_validator_for(_strip_none(tp)), "accepted", None)
        if accepted is not None:
            env[f"T{i}"] = accepted
            cond = f"type(a{i}) not in T{i}"
            if optional:
                cond = f"a{i} is not None and " + cond
            lines.append(f"    if {cond}:")
            lines.append(f"        _fail('{cls.__name__}.{name}: {accepted[0].__name__}', a{i})")
        else:
            env[f"V{i}"] = inner
            lines.append(f"    a{i} = V{i}(a{i})")
    lines.append(f"    return _new(cls, ({', '.join(names)}{',' if arity == 1 else ''}))")
    exec("\n".join(lines), env)  # source built above from type hints only
    return env["check"]  # type: ignore[no-any-return]


def _strip_none(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _validator_for(tp: Any) -> _Validator:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = _validator_for(args[0]) if len(args) == 1 else _union([_validator_for(a) for a in args])
        return _optional(inner) if type(None) in typing.get_args(tp) else inner
    if origin is list:
        (item,) = typing.get_args(tp)
        inner = _validator_for(item)
        return _list_of(inner, getattr(inner, "accepted", None))
    if origin is dict:
        k, v = typing.get_args(tp)
        return _dict_of(_validator_for(k), _validator_for(v))
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):
        return _record(tp)
    if tp in (int, float, str, bytes, bool):
        return _primitive(tp)
    raise TypeError(f"codec cannot validate field type {tp!r}")  # a bug in messages.py


# tag -> (class, validator). Each validator is generated the first time its tag arrives:
# generating all of them at import took ~15 ms of every process's start-up (a worker uses
# a handful of the message types).
_CLASSES: dict[int, type] = {tag: cls for cls, tag in MESSAGE_TAGS.items()}
_DECODERS: dict[int, tuple[type, _Validator]] = {}


def _decoder(tag: Any) -> tuple[type, _Validator] | None:
    """The decoder for ``tag``, made on first use; None for an unknown tag."""
    cls = _CLASSES.get(tag) if type(tag) is int else None
    if cls is None:
        return None
    entry = _DECODERS[tag] = (cls, _record(cls))  # two threads at once: the same entry twice
    return entry
_TAGS = MESSAGE_TAGS

# --------------------------------------------------------------------------- encode / decode

_packer = msgpack.Packer(use_bin_type=True, autoreset=True)


def encode(batch: Sequence[Message], buffers: Sequence[bytes | memoryview] = ()) -> list[Any]:
    """Frames for a batch of messages (and out-of-band buffers)."""
    tags = _TAGS
    body = msgpack.packb([[tags[type(m)], m] for m in batch], use_bin_type=True)
    if buffers:
        return [VERSION_FRAME, body, *buffers]
    return [VERSION_FRAME, body]


def encode_one(message: Message) -> list[Any]:
    return encode((message,))


def check_version(frame: bytes) -> None:
    if frame != VERSION_FRAME:
        if bytes(frame[:4]) == _VERSION_PREFIX:
            raise VersionMismatch(
                f"peer speaks protocol {bytes(frame[:16])!r}, this side speaks {VERSION_FRAME!r}: "
                "install the same scaler-executor version on every host"
            )
        raise VersionMismatch(f"not a scaler-executor transmission (first frame {bytes(frame[:16])!r})")


def _batch_length(body: Any) -> int:
    """The number of messages the body's header announces (0 if it is not an array)."""
    head = memoryview(body)[:5]
    if not head:
        return 0
    first = head[0]
    if 0x90 <= first <= 0x9F:  # fixarray
        return first & 0x0F
    if first == 0xDC:  # array 16
        return int.from_bytes(head[1:3], "big")
    if first == 0xDD:  # array 32
        return int.from_bytes(head[1:5], "big")
    return 0


def decode(frames: Sequence[Any], limits: Limits | None = None) -> tuple[list[Message], list[Any]]:
    """Messages and out-of-band buffers from frames; raises DecodeError on anything invalid.

    Frames may be ``bytes`` or ``zmq.Frame`` (anything with the buffer protocol).  With
    ``limits``, a transmission over any of them is refused (DecodeError) before more than
    its header is decoded, or while msgpack decodes it, never after.
    """
    if len(frames) < 2:
        raise DecodeError(f"expected at least 2 frames, got {len(frames)}")
    check_version(bytes(memoryview(frames[0])[:16]) if len(frames[0]) > 16 else bytes(frames[0]))
    body = frames[1]
    try:
        if limits is None:
            raw = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
        else:
            # (The common case, a bytes body of fewer than 16 messages, reads one byte.)
            if type(body) is not bytes or not body or body[0] >= 0xDC or limits.messages < 16:
                count = _batch_length(body)
                if count > limits.messages:
                    raise DecodeError(f"a batch of {count} messages (at most {limits.messages} are accepted)")
            raw = msgpack.unpackb(
                body,
                raw=False,
                use_list=True,
                strict_map_key=True,
                max_array_len=limits.array,
                max_map_len=limits.map,
                max_str_len=limits.string,
                max_bin_len=limits.binary,
                max_ext_len=0,  # no extension types on this wire
            )
    except DecodeError:
        raise
    except msgpack.StackError:
        raise DecodeError(f"body nests deeper than {MAX_NESTING} levels") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for garbage; all are DecodeError
        raise DecodeError(f"body is not msgpack: {exc}") from None
    if type(raw) is not list:
        raise DecodeError("body is not a batch (array) of messages")
    out = []
    decoders = _DECODERS
    for item in raw:
        if type(item) is not list or len(item) != 2:
            raise DecodeError(f"message is not [tag, fields]: {_brief(item)}")
        entry = decoders.get(item[0]) if type(item[0]) is int else None
        if entry is None:
            entry = _decoder(item[0])
            if entry is None:
                raise DecodeError(f"unknown message tag {_brief(item[0])}")
        out.append(entry[1](item[1]))
    return out, list(frames[2:])


__all__ = [
    "MAX_ARRAY_LEN",
    "MAX_BATCH_MESSAGES",
    "MAX_MAP_LEN",
    "SEND_BATCH_MESSAGES",
    "VERSION_FRAME",
    "DecodeError",
    "Limits",
    "VersionMismatch",
    "_m",
    "check_version",
    "decode",
    "encode",
    "encode_one",
]
