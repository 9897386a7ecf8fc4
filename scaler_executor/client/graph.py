"""``ScalerExecutor.get``: Dask-style task graphs, run inside the cluster.

Dask's graph specification, both forms:

* *legacy*: a dict ``{key: value}`` where a value is a task — a tuple whose first
  element is callable, e.g. ``(add, "x", 1)`` — or data; keys may appear anywhere in a
  task's arguments, nested in lists, tuples and dicts; a value that is itself a key is
  an alias; tasks may nest (``(add, (inc, 1), "x")``);
* *task spec* (Dask ≥ 2024.12): values are ``Task``, ``Alias``, ``DataNode``, ``List``…
  nodes, recognised by duck typing (a callable with a ``dependencies`` set), so this
  module never imports Dask.

The graph is culled to what ``keys`` need, checked for cycles, and sent to the daemon
in one batch in dependency order.  Each task becomes one cluster task whose
dependencies are the tasks it refers to; the daemon releases it when they finish and
frees each intermediate result as soon as no dependent needs it.  Only the requested
keys' results travel back to the client; intermediates stay in the cluster
(``TaskFlags.NO_RESULT``).  A failure anywhere fails the requested keys that depend on
it, with the original exception.  Everything here is iterative: a 10,000-node chain
needs no deep recursion.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from concurrent.futures import Future
from typing import Any

from scaler_executor.client.agent import ClientAgent
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.pickling import GraphBatch
from scaler_executor.protocol.messages import TaskFlags
from scaler_executor.protocol.refs import Key, call_node, evaluate

_UNSET = object()


def _is_task(value: Any) -> bool:
    return type(value) is tuple and bool(value) and callable(value[0])


def _is_node(value: Any) -> bool:
    """A Dask task-spec node (Task, Alias, DataNode, List, Dict…), by duck typing."""
    return hasattr(value, "dependencies") and callable(value) and not isinstance(value, type)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _flatten_keys(keys: Any) -> list[Hashable]:
    out: list[Hashable] = []
    stack = [keys]
    while stack:
        item = stack.pop()
        if type(item) is list:
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _legacy_deps(value: Any, dsk: Mapping[Hashable, Any]) -> set[Hashable]:
    """Keys referenced anywhere inside a legacy value (not descending into dependency values)."""
    found: set[Hashable] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is tuple:
            if _hashable(item) and item in dsk:
                found.add(item)
                continue
            stack.extend(item[1:] if item and callable(item[0]) else item)
        elif kind is list:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.values())
        elif _hashable(item) and not callable(item) and item in dsk:
            found.add(item)
    return found


class _Graph:
    def __init__(self, dsk: Mapping[Hashable, Any]) -> None:
        self.dsk = dsk
        self.deps: dict[Hashable, set[Hashable]] = {}

    def alias_target(self, key: Hashable) -> Hashable | None:
        """The key a value merely names (legacy alias or task-spec Alias), else None."""
        value = self.dsk[key]
        if _is_node(value):
            if type(value).__name__ == "Alias":
                target = getattr(value, "target", None)
                target = getattr(target, "key", target)
                if target is not None and target in self.dsk and target != key:
                    return target  # type: ignore[no-any-return]  # a key of dsk, read off an untyped node
            return None
        if _hashable(value) and not callable(value) and value in self.dsk and value != key:
            return value  # type: ignore[no-any-return]  # a key of dsk (a legacy alias)
        return None

    def dependencies(self, key: Hashable) -> set[Hashable]:
        found = self.deps.get(key)
        if found is None:
            value = self.dsk[key]
            if _is_node(value):
                found = {k for k in value.dependencies if k in self.dsk}
            else:
                found = _legacy_deps(value, self.dsk)  # a task naming its own key is a cycle
            self.deps[key] = found
        return found

    def order(self, wanted: list[Hashable]) -> list[Hashable]:
        """The keys ``wanted`` needs, dependencies first; ValueError naming a key on a cycle."""
        for key in wanted:
            if key not in self.dsk:
                raise KeyError(key)
        WHITE, GREY, BLACK = 0, 1, 2
        color: dict[Hashable, int] = {}
        order: list[Hashable] = []
        for root in wanted:
            if color.get(root, WHITE) != WHITE:
                continue
            color[root] = GREY
            stack: list[tuple[Hashable, Any]] = [(root, iter(self.dependencies(root)))]
            while stack:
                key, children = stack[-1]
                for child in children:
                    state = color.get(child, WHITE)
                    if state == GREY:
                        raise ValueError(f"the graph has a cycle through key {child!r}")
                    if state == WHITE:
                        color[child] = GREY
                        stack.append((child, iter(self.dependencies(child))))
                        break
                else:
                    stack.pop()
                    color[key] = BLACK
                    order.append(key)
        return order


def run_graph(agent: ClientAgent, dsk: Mapping[Hashable, Any], keys: Any, options_id: int) -> Any:
    """Compute ``keys`` of ``dsk`` on the cluster; results in the nested shape of ``keys``."""
    if not isinstance(dsk, Mapping) and hasattr(dsk, "__dask_graph__"):
        dsk = dsk.__dask_graph__()  # what Dask's own schedulers do with its expression objects
    if not isinstance(dsk, Mapping):
        raise TypeError(f"a graph must be a mapping from keys to tasks, got {type(dsk).__name__}")
    graph = _Graph(dsk if isinstance(dsk, dict) else dict(dsk))
    wanted = _flatten_keys(keys)
    run = _GraphRun(agent, graph, options_id, set(wanted))
    batch = agent.graph_batch()
    for key in graph.order(wanted):
        run.add(batch, key)
    batch.submit()
    results: dict[Hashable, Any] = {}
    for key in wanted:
        target = run.resolve(key)
        if target in run.literal:
            results[key] = run.literal[target]
        else:
            results[key] = run.futures[target].result()
    return _pack(keys, results)


class _GraphRun:
    """One ``run_graph`` call: each key becomes a task of the batch or a literal value."""

    def __init__(self, agent: ClientAgent, graph: _Graph, options_id: int, wanted: set[Hashable]) -> None:
        self.agent = agent
        self.graph = graph
        self.options_id = options_id
        self.evaluate_id = agent.function_id(evaluate)
        self.number: dict[Hashable, int] = {}  # key -> task number in the cluster
        self.literal: dict[Hashable, Any] = {}  # key -> value known on the client
        self.futures: dict[Hashable, Future[Any]] = {}
        self.wanted_targets = {self.resolve(w) for w in wanted}

    def resolve(self, key: Hashable) -> Hashable:
        seen = {key}
        while (target := self.graph.alias_target(key)) is not None:
            if target in seen:
                raise ValueError(f"the graph has a cycle of aliases through key {key!r}")
            seen.add(target)
            key = target
        return key

    def reference(self, key: Hashable) -> Any:
        key = self.resolve(key)
        if key in self.literal:
            return self.literal[key]
        return Key(self.number[key])

    def substitute(self, value: Any) -> Any:
        kind = type(value)
        if kind is tuple:
            if _hashable(value) and value in self.graph.dsk:
                return self.reference(value)
            if value and callable(value[0]):
                return (value[0], *[self.substitute(a) for a in value[1:]])
            return tuple(self.substitute(a) for a in value)
        if kind is list:
            return [self.substitute(a) for a in value]
        if kind is dict:
            return {k: self.substitute(v) for k, v in value.items()}
        if _hashable(value) and not callable(value) and value in self.graph.dsk:
            return self.reference(value)
        return value

    def add(self, batch: GraphBatch, key: Hashable) -> None:
        graph = self.graph
        if graph.alias_target(key) is not None:
            return
        value = graph.dsk[key]
        deps = graph.dependencies(key)
        if _is_node(value):
            if type(value).__name__ == "DataNode" and not deps and hasattr(value, "value"):
                self.literal[key] = value.value
                return
            expr: Any = (call_node, value, {d: self.reference(d) for d in deps})
        elif not deps and not _contains_task(value):
            self.literal[key] = value
            return
        else:
            expr = self.substitute(value)
        pickled = self.agent.packer.pickle_args_waiting((expr,), {})
        number = self.number
        numbers = {number[r] for r in map(self.resolve, deps) if r in number}
        if pickled.deps:
            numbers.update(pickled.deps)
        dep_numbers = sorted(numbers)
        if key in self.wanted_targets:
            future: TaskFuture[Any] = TaskFuture()
            number[key] = batch.add(future, self.evaluate_id, self.options_id, TaskFlags.CALL, pickled, dep_numbers)
            self.futures[key] = future
        else:
            number[key] = batch.add(
                None, self.evaluate_id, self.options_id, TaskFlags.CALL | TaskFlags.NO_RESULT, pickled, dep_numbers
            )


def _contains_task(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is tuple:
            if item and callable(item[0]):
                return True
            stack.extend(item)
        elif kind is list:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.values())
    return False


def _pack(keys: Any, results: dict[Hashable, Any]) -> Any:
    """Results in the shape of ``keys``: a list of keys gives a tuple, as Dask's schedulers do."""
    if type(keys) is not list:
        return results[keys]
    # Iterative, for very long or deep key lists.
    root: list[Any] = []
    stack: list[tuple[Any, list[Any]]] = [(keys, root)]
    frames: list[tuple[list[Any], list[Any], int]] = []
    while stack:
        source, target = stack.pop()
        for item in source:
            if type(item) is list:
                child: list[Any] = []
                target.append(child)
                stack.append((item, child))
                frames.append((target, child, len(target) - 1))
            else:
                target.append(results[item])
    for parent, child, index in reversed(frames):
        parent[index] = tuple(child)
    return tuple(root)
