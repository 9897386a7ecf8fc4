"""Dependencies inside a task: futures passed as arguments and graph keys.

The client pickles a future of the same executor that is not done yet (and a graph
key) as a reference to the task that computes it.  The daemon runs the dependent only
once every dependency has finished, and hands the worker their pickled results
(``TaskDispatch.deps``); :func:`install` makes them available to the unpickling of the
task's arguments, where :func:`dependency` (the reference's reconstructor) returns the
value — unpickled once per task even when referenced many times.

These references are part of the wire format: the client's pickles name
``scaler_executor.protocol.refs.dependency`` (``identity``, ``stored``) and the worker's
unpickling calls them, so they live here, below both.
"""

from __future__ import annotations

import pickle
from typing import Any

TASK_MASK = (1 << 40) - 1  # a client's own task number, the low bits of a task id

_payloads: dict[int, tuple[bytes, list[bytes]]] = {}
_values: dict[int, Any] = {}
# How to read values that live in the object store: set by the processor for each task
# (a callable (header, object_ids) -> value), None where every value is inline.
_loader: Any = None


def install(deps: list[list[Any]] | None, loader: Any = None) -> None:
    """The dependency results for the next task: ``[[task_id, payload, object_ids], ...]``."""
    global _loader
    _payloads.clear()
    _values.clear()
    _loader = loader
    if deps:
        for task_id, payload, objects in deps:
            _payloads[task_id & TASK_MASK] = (payload, objects)


def load(payload: bytes, objects: list[bytes]) -> Any:
    """A value sent inline (a plain pickle) or through the object store (a store header)."""
    if not objects:
        return pickle.loads(payload)
    if _loader is None:
        raise LookupError("this value lives in an object store this process cannot reach")
    return _loader(payload, objects)


def stored(header: bytes, object_ids: list[bytes]) -> Any:
    """Reconstructor of an ObjectRef (``ex.put``) passed as an argument: the stored value."""
    return load(header, object_ids)


def dependency(n: int) -> Any:
    """The result of this client's task ``n``: called while unpickling a dependent's arguments."""
    try:
        return _values[n]
    except KeyError:
        pass
    try:
        payload, objects = _payloads[n]
    except KeyError:
        raise LookupError(f"the result of dependency task {n} was not delivered with this task") from None
    value = _values[n] = load(payload, objects)
    return value


def identity(value: Any) -> Any:
    """Reconstructor of a finished future passed as an argument: its value."""
    return value


class Key:
    """A graph key's value inside a graph task's expression (kept as a marker until evaluated)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> tuple[Any, ...]:
        return (Key, (self.n,))

    def __repr__(self) -> str:
        return f"Key({self.n})"


def evaluate(expr: Any) -> Any:
    """Compute a Dask-style expression: tasks are tuples with a callable first; keys are Key markers.

    Values of dependencies are data and never evaluated again.
    """
    kind = type(expr)
    if kind is Key:
        return dependency(expr.n)
    if kind is tuple:
        if expr and callable(expr[0]):
            return expr[0](*[evaluate(a) for a in expr[1:]])
        return tuple(evaluate(a) for a in expr)
    if kind is list:
        return [evaluate(a) for a in expr]
    if kind is dict:
        return {k: evaluate(v) for k, v in expr.items()}
    return expr


def call_node(node: Any, values: dict[Any, Any]) -> Any:
    """Run a Dask task-spec node (``Task``, ``List``…: callables taking the dependency values)."""
    return node(values)
