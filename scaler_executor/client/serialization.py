"""Turning calls into bytes on the client, and bytes back into results.

* Callables are pickled once and referred to by id: a plain function per
  executor (weakly cached: when the function is garbage-collected, the
  cluster is told to drop it), and any callable once per ``map`` call.
  Other callables (bound methods, callable objects, partials) travel inside
  each task, as ``ProcessPoolExecutor`` sends them, so their state is current.
* Arguments use plain ``pickle`` when every one is a builtin scalar (five times
  cheaper than cloudpickle for small calls) and cloudpickle otherwise, so that
  lambdas, closures and interactive functions work.
* When pickling fails, the original exception gets a note naming where the
  culprit sits: ``while pickling kwargs['conn'] (socket.socket) for f``.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
import msgpack

from scaler_executor.exceptions import (
    RemoteError,
    RemoteTraceback,
    TaskCancelled,
    TaskError,
    TaskTimeout,
    WorkerLost,
)
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.tracebacks import fill_sources, reduce_code

_PLAIN = frozenset({int, float, str, bytes, bool, type(None), complex})
_SIZED = frozenset({str, bytes})  # plain, and as large as they like


def describe_callable(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def reduce_other(obj: Any) -> Any:
    """For the client's picklers' ``reducer_override``, after their own cases: by-value
    code keeps its file name (``protocol/tracebacks.py``); a ``multiprocessing`` Pipe end is refused;
    NotImplemented for anything else."""
    connection = sys.modules.get("multiprocessing.connection")  # not imported: no Pipe ends
    if connection is not None and type(obj) is connection.Connection:
        # cloudpickle would copy its bare descriptor number, which in a processor names
        # another file (its socket to the worker agent, say); multiprocessing's own
        # pickler sends the descriptor itself, which only works between its processes.
        raise TypeError(
            "a multiprocessing Pipe end (multiprocessing.connection.Connection) cannot be passed "
            "to a cluster's task: its file descriptor means nothing in a processor; use a "
            "multiprocessing.Manager().Queue() instead"
        )
    return reduce_code(obj)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no stubs
    """cloudpickle, keeping by-value functions' file names for remote tracebacks."""

    def reducer_override(self, obj: Any) -> Any:
        reduced = reduce_other(obj)
        return reduced if reduced is not NotImplemented else super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


def dumps_plain_args(args: tuple[Any, ...], kwargs: dict[str, Any], limit: int | None = None) -> bytes | None:
    """``pickle.dumps((args, kwargs))`` when every argument is a builtin scalar, else None.

    Also None when a ``bytes`` or ``str`` argument has ``limit`` or more items: such a
    call goes through the object store, and a pickle of it here would be a copy of the
    argument made only to be thrown away."""
    for a in args:
        if type(a) not in _PLAIN or (limit is not None and type(a) in _SIZED and len(a) >= limit):
            return None
    for v in kwargs.values():
        if type(v) not in _PLAIN or (limit is not None and type(v) in _SIZED and len(v) >= limit):
            return None
    return pickle.dumps((args, kwargs), protocol=5)


def dumps_plain_chunk(items: list[tuple[Any, ...]], limit: int) -> bytes | None:
    """``pickle.dumps(items)`` for a chunk of ``map`` (a list of argument tuples) when every
    argument is a builtin scalar and none is a ``bytes`` or ``str`` of ``limit`` or more
    items, else None: what ``dumps_plain_args`` is to one call."""
    for args in items:
        for a in args:
            if type(a) not in _PLAIN or (type(a) in _SIZED and len(a) >= limit):
                return None
    return pickle.dumps(items, protocol=5)


def dumps_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle ``(args, kwargs)`` without dependency detection (benchmarks, tools)."""
    plain = dumps_plain_args(args, kwargs)
    return plain if plain is not None else cloudpickle.dumps((args, kwargs), protocol=5)


def pickling_note(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Which part of a call fails to pickle, found by pickling each part alone (error path only)."""
    target = describe_callable(fn)
    try:
        cloudpickle.dumps(fn, protocol=5)
    except Exception as exc:  # noqa: BLE001 - error path: whatever pickling raises points at the culprit
        return f"while pickling the function {target} ({type(fn).__module__}.{type(fn).__qualname__})" + _inherit_only(exc)
    for i, a in enumerate(args):
        try:
            cloudpickle.dumps(a, protocol=5)
        except Exception as exc:  # noqa: BLE001 - error path: whatever pickling raises points at the culprit
            return f"while pickling args[{i}] ({type(a).__module__}.{type(a).__qualname__}) for {target}" + _inherit_only(exc)
    for k, v in kwargs.items():
        try:
            cloudpickle.dumps(v, protocol=5)
        except Exception as exc:  # noqa: BLE001 - error path: whatever pickling raises points at the culprit
            return f"while pickling kwargs[{k!r}] ({type(v).__module__}.{type(v).__qualname__}) for {target}" + _inherit_only(exc)
    return f"while pickling the call to {target}"


def _inherit_only(exc: Exception) -> str:
    """The fix, when the culprit is a multiprocessing object only inheritance can pass."""
    if "shared between processes through inheritance" not in str(exc):
        return ""
    return (
        ": multiprocessing's Queue, Lock, Event, Value, Array and the like pass only to processes "
        "multiprocessing starts itself, never to a cluster's processors (nor to ProcessPoolExecutor's "
        "tasks); use a multiprocessing.Manager()'s Queue(), Lock(), Event(), Value() instead, "
        "which work in tasks on the client's host"
    )


def is_cacheable(fn: Any) -> bool:
    """Plain functions are cached by identity; anything with mutable state travels per task."""
    return type(fn) is types.FunctionType


# --------------------------------------------------------------------------- results


def rebuild_exception(payload: bytes) -> BaseException:
    """The task's exception with its remote traceback as ``__cause__``: itself, or when it
    could not travel an exception of its type rebuilt from its arguments, or a RemoteError."""
    pickled, type_name, message, tb_text, tb_dict, *rest = msgpack.unpackb(payload, raw=False)
    rebuild = rest[0] if rest else b""
    exc: BaseException | None = None
    failure: BaseException | None = None
    for blob, build in ((pickled, _unpickled), (rebuild, _rebuilt)):
        if blob and exc is None:
            try:
                exc = build(blob)
            except Exception as error:  # noqa: BLE001 - whatever unpickling raises, the caller gets a RemoteError
                failure = error
    if exc is None:
        exc = RemoteError(type_name, message, tb_text)
        if failure is not None:
            exc.add_note(f"the exception could not be unpickled here: {failure!r}")
    # The text alone: the traceback display prints a cause's __traceback__ and then its
    # text, which holds the same frames (the remote traceback was printed twice).
    cause = RemoteTraceback(f'\n"""\n{fill_sources(tb_text)}"""')
    if tb_dict is not None:
        try:
            from tblib import Traceback  # type: ignore[import-untyped]  # no stubs or py.typed

            # Real frame objects for debuggers: pdb.post_mortem(exc.__cause__.frames).
            cause.frames = Traceback.from_dict(tb_dict).as_traceback()
        except Exception:  # noqa: BLE001 - real frames are a debugging extra: the text traceback stays
            pass
    exc.__cause__ = cause
    return exc


def _unpickled(blob: bytes) -> BaseException:
    exc = pickle.loads(blob)
    if not isinstance(exc, BaseException):
        raise TypeError(f"unpickled a {type(exc).__name__}, not an exception")
    return exc


def _rebuilt(blob: bytes) -> BaseException:
    """An exception built from the (type, args, attributes) the processor sent (see
    ``worker/processor.py``'s ``_rebuildable``) when the original could not be pickled."""
    cls, args, attributes = pickle.loads(blob)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise TypeError(f"rebuilt a {cls!r}, not an exception type")
    exc = cls(*args)
    for key, value in attributes.items():
        try:
            setattr(exc, key, value)
        except Exception:  # noqa: BLE001 - a read-only attribute: the constructor's value stays
            pass
    return exc


def outcome(status: int, payload: bytes, task_id: int) -> tuple[bool, Any]:
    """(True, value) or (False, exception) for a result that reached the client."""
    if status == Status.OK:
        try:
            return True, pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - whatever unpickling raises is the future's exception
            exc.add_note(f"while unpickling the result of task {task_id:#x} in the client")
            return False, exc
    if status == Status.ERROR:
        return False, rebuild_exception(payload)
    if status == Status.WORKER_LOST:
        text, attempts = msgpack.unpackb(payload, raw=False)
        lost = WorkerLost(text + ":\n  " + "\n  ".join(attempts), task_id, tuple(attempts))
        return False, lost
    if status == Status.TIMEOUT:
        return False, TaskTimeout(f"task {task_id:#x}: {payload.decode(errors='replace')}")
    if status == Status.FORCE_CANCELLED:
        return False, TaskCancelled(f"task {task_id:#x}: {payload.decode(errors='replace')}")
    if status == Status.CANCELLED:
        return False, TaskCancelled(f"task {task_id:#x} was cancelled by the cluster")
    if status == Status.DEP_FAILED:
        dep_id, dep_status, dep_payload = msgpack.unpackb(payload, raw=False)
        _, dep_exc = outcome(dep_status, dep_payload, dep_id)
        dep_exc.add_note(f"raised by dependency task {dep_id:#x} of task {task_id:#x}; that task did not run")
        return False, dep_exc
    if status == Status.REJECTED:
        return False, TaskError(f"the daemon rejected task {task_id:#x}: {payload.decode(errors='replace')}")
    return False, TaskError(f"task {task_id:#x} ended with unknown status {status}")


Loader = Callable[[bytes], Any]
