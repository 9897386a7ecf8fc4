"""Dependencies inside a task: futures passed as arguments and graph keys.

The client pickles a future of the same executor that is not done yet (and a graph
key) as a reference to the task that computes it.  The daemon runs the dependent only
once every dependency has finished, and hands the worker their pickled results
(``TaskDispatch.deps``); :func:`install` makes them available to the unpickling of the
task's arguments, where :func:`dependency` (the reference's reconstructor) returns the
value — unpickled once per task even when referenced many times.
"""

from __future__ import annotations

import pickle
from typing import Any

TASK_MASK = (1 << 40) - 1  # a client's own task number, the low bits of a task id

_payloads: dict[int, bytes] = {}
_values: dict[int, Any] = {}


def install(deps: list[list[Any]] | None) -> None:
    """The dependency results for the next task: ``[[task_id, pickled result], ...]``."""
    _payloads.clear()
    _values.clear()
    if deps:
        for task_id, payload in deps:
            _payloads[task_id & TASK_MASK] = payload


def dependency(n: int) -> Any:
    """The result of this client's task ``n``: called while unpickling a dependent's arguments."""
    try:
        return _values[n]
    except KeyError:
        pass
    try:
        payload = _payloads[n]
    except KeyError:
        raise LookupError(f"the result of dependency task {n} was not delivered with this task") from None
    value = _values[n] = pickle.loads(payload)
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
