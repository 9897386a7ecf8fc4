"""The only place that packs and unpacks frames.

A transmission is a list of ZeroMQ frames::

    [VERSION_FRAME, body, buffer_0, buffer_1, ...]

* ``VERSION_FRAME`` names the protocol and its version (``b"SCX/1"``).  A peer
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
"""

from __future__ import annotations

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
    env: dict[str, Any] = {"DecodeError": DecodeError, "_fail": _fail, "_new": tuple.__new__, "cls": cls}
    names = [f"a{i}" for i in range(arity)]
    lines = [
        "def check(value):",
        f"    if type(value) is not list or len(value) != {arity}:",
        f"        raise DecodeError('{cls.__name__}: expected {arity} fields, got %.80r' % (value,))",
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
                f"peer speaks protocol {bytes(frame)!r}, this side speaks {VERSION_FRAME!r}: "
                "install the same scaler-executor version on every host"
            )
        raise VersionMismatch(f"not a scaler-executor transmission (first frame {bytes(frame[:16])!r})")


def decode(frames: Sequence[Any]) -> tuple[list[Message], list[Any]]:
    """Messages and out-of-band buffers from frames; raises DecodeError on anything invalid.

    Frames may be ``bytes`` or ``zmq.Frame`` (anything with the buffer protocol).
    """
    if len(frames) < 2:
        raise DecodeError(f"expected at least 2 frames, got {len(frames)}")
    check_version(bytes(frames[0]))
    try:
        raw = msgpack.unpackb(frames[1], raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for garbage; all are DecodeError
        raise DecodeError(f"body is not msgpack: {exc}") from None
    if type(raw) is not list:
        raise DecodeError("body is not a batch (array) of messages")
    out = []
    decoders = _DECODERS
    for item in raw:
        if type(item) is not list or len(item) != 2:
            raise DecodeError(f"message is not [tag, fields]: {item!r:.80}")
        entry = decoders.get(item[0]) if type(item[0]) is int else None
        if entry is None:
            entry = _decoder(item[0])
            if entry is None:
                raise DecodeError(f"unknown message tag {item[0]!r:.20}")
        out.append(entry[1](item[1]))
    return out, list(frames[2:])


__all__ = [
    "VERSION_FRAME",
    "DecodeError",
    "VersionMismatch",
    "_m",
    "check_version",
    "decode",
    "encode",
    "encode_one",
]
