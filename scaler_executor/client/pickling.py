"""Turning calls and values into what travels: pickles, store objects, dependencies.

* ``Packer`` pickles a task's call (``pickle_args``, ``pickle_obj``) with cloudpickle;
  in the same pass futures of this executor become dependencies (``reduce_future``) and
  ``ObjectRef``s references, and large buffers go to the host's object store.
* ``ObjectRef`` is a value ``ex.put`` placed in the store once; ``MapCache`` the
  shared-buffer cache of one ``map`` call.
* ``GraphBatch`` collects a graph's tasks for one transmission.
"""

from __future__ import annotations

import concurrent.futures
import functools
import io
import pickle
import threading
import time
import types
import weakref
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any, NamedTuple

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

from scaler_executor.client import serialization as ser
from scaler_executor.client.events import GraphSubmitted
from scaler_executor.client.state import LANE, PARKED, TaskItem
from scaler_executor.config import ClusterConfig
from scaler_executor.protocol.messages import TaskFlags
from scaler_executor.protocol.refs import Key, dependency, identity, stored

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent
    from scaler_executor.client.future import TaskFuture
    from scaler_executor.client.state import TaskRecord


class DependencyFailed(Exception):
    """Raised while pickling: a future passed as an argument failed; args[0] is its exception."""


class AfterLane(Exception):
    """Raised while pickling a task whose argument is a running lane task's future
    (args[0]): the daemon never held that task, so this one waits in the client."""


# Types that need none of ``Packer.reduce``'s cases (no Future or ObjectRef, no Pipe end, no
# code object): most of what a call pickles (its function, a class, a graph's keys) is
# answered with one lookup instead of the chain of checks (a 999-node graph calls it ~2,500 times).
_PLAIN = frozenset({types.BuiltinFunctionType, types.FunctionType, types.MethodType, type, Key})
# Of those, what neither ``reduce`` nor cloudpickle changes: the pickler does not ask either
# (objstore/payload.py, ``pack``'s ``inert``), and ``Key`` (every graph node refers to it) is
# pickled by name without cloudpickle's check that its module is importable.
_INERT = frozenset({types.BuiltinFunctionType, Key})
_BY_REFERENCE = frozenset({Key})

NO_DEPS: list[int] = []
NO_OBJECTS: list[bytes] = []


class Pickled(NamedTuple):
    """A pickled call or value, ready to travel."""

    payload: bytes  # a plain pickle, or with flags PACKED an object-store header
    deps: list[int]  # tasks (futures) it refers to
    objects: list[bytes]  # store objects it refers to (its own buffers, ObjectRefs)
    flags: int  # TaskFlags.PACKED or 0
    created: list[bytes] = NO_OBJECTS  # objects written for it (freed if it is never sent)


class Packer:
    """Pickles calls and values for one client agent (see the module doc)."""

    def __init__(self, agent: ClientAgent, config: ClusterConfig) -> None:
        self.agent = agent
        self.core = agent.core
        self.config = config
        self.store: Any = None  # the daemon host's object store, when this host can map it
        self.store_ready = threading.Event()  # set once the handshake said whether there is one

    def pickle_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], shared: Any = None) -> Pickled:
        threshold = self.config.object_store_threshold
        fast = ser.dumps_plain_args(args, kwargs, threshold)
        if fast is not None and len(fast) < threshold:
            return Pickled(fast, NO_DEPS, NO_OBJECTS, 0)
        del fast  # not kept alive beside the copy pickle_obj makes
        return self.pickle_obj((args, kwargs), shared)  # large bytes or str go through the store

    def pickle_args_waiting(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Pickled:
        """``pickle_args`` for a caller that blocks for the result anyway (``ex.get``): the
        future of a running lane task among the arguments is waited for, then its value
        goes inline (the daemon never held that task)."""
        while True:
            try:
                return self.pickle_args(args, kwargs)
            except AfterLane as after:
                concurrent.futures.wait([after.args[0]])

    def pickle_obj(self, obj: Any, shared: Any = None) -> Pickled:
        """cloudpickle ``obj``; futures of this executor inside it become dependencies, and
        large buffers (or a large whole) go through the object store when there is one."""
        if self.store is None:
            from scaler_executor.objstore.payload import plain_dispatch_table

            buffer = io.BytesIO()
            plain_dispatch_table(_CallPickler)
            pickler = _CallPickler(buffer, self)
            pickler.dump(obj)
            payload = buffer.getvalue()
            if len(payload) < self.config.object_store_threshold or self.store_ready.is_set():
                return Pickled(payload, pickler.deps, pickler.objects, 0)
            # Large, and the handshake that says whether there is a store has not finished
            # (a submit right after start-up): wait for it rather than send it inline.
            self.store_ready.wait(self.config.daemon_loss_timeout)
            if self.store is None:
                return Pickled(payload, pickler.deps, pickler.objects, 0)
        from scaler_executor.objstore import payload as packing

        deps: list[int] = []
        objects: list[bytes] = []
        known = set(shared.object_ids()) if shared is not None else None
        packed = packing.pack(
            obj,
            self.store,
            threshold=self.config.object_store_threshold,
            shared=shared,
            reducer=functools.partial(self.reduce, deps=deps, objects=objects),
            inert=_INERT,
            by_reference=_BY_REFERENCE,
        )
        if shared is not None:
            assert known is not None
            fresh = [i for i in shared.object_ids() if i not in known]
            if fresh:
                self.agent.pin_objects(fresh)  # held while their source object lives (MapCache)
        objects.extend(packed.object_ids)
        stream = packing.inline_stream(packed.header)
        if stream is not None:
            return Pickled(stream, deps, objects, 0)  # refs only: the header is a plain pickle
        return Pickled(packed.header, deps, objects, TaskFlags.PACKED, packed.created)

    def discard_created(self, pickled: Pickled) -> None:
        """Objects a pickling wrote for a task that was never sent."""
        if pickled.created and self.store is not None:
            from scaler_executor.objstore import payload as packing

            packing.delete_objects(self.store, pickled.created)

    def reduce(self, obj: Any, deps: list[int], objects: list[bytes]) -> Any:
        if type(obj) in _PLAIN:
            return NotImplemented
        if isinstance(obj, Future):
            return self.reduce_future(obj, deps)
        if isinstance(obj, ObjectRef):
            objects.extend(obj.object_ids)
            return (stored, (obj.header, obj.object_ids))
        return ser.reduce_other(obj)  # by-value code keeps its file name; Pipe ends refused

    def reduce_future(self, future: Future[Any], deps: list[int]) -> tuple[Any, ...]:
        """A future as an argument: a dependency the cluster resolves while its task is
        outstanding, its value once it is done."""
        record: TaskRecord | None = getattr(future, "_record", None)
        ours = record is not None and record.owner is self.core
        if ours and not future.done():
            assert record is not None  # ours says so
            if record.where in (PARKED, LANE):
                raise AfterLane(future)  # the daemon never held it: the task waits here
            deps.append(record.n)  # outstanding (or just finishing): the cluster resolves it
            return (dependency, (record.n,))
        if future.done():
            if future.cancelled():
                raise DependencyFailed(CancelledError("a future passed as an argument was cancelled"))
            exc = future.exception()
            if exc is not None:
                exc.add_note("raised by a dependency (a future passed as an argument); the task did not run")
                raise DependencyFailed(exc)
            return (identity, (future.result(),))
        raise TypeError(
            "a pending future of another executor cannot be an argument: only futures of the same "
            "ScalerExecutor are resolved in the cluster; pass its result() instead"
        )

    def put(self, value: Any) -> ObjectRef:
        """Place ``value`` in the object store once (inline when there is no store or it is small)."""
        self.agent.check_usable()
        if self.store is None and not self.store_ready.is_set():
            self.store_ready.wait(self.config.daemon_loss_timeout)
        if self.store is None:
            return ObjectRef(ser.dumps(value), [], self.agent)
        from scaler_executor.objstore import payload as packing

        packed = packing.pack(value, self.store, threshold=self.config.object_store_threshold)
        if not packed.object_ids:
            stream = packing.inline_stream(packed.header)
            assert stream is not None
            return ObjectRef(stream, [], self.agent)  # small: a plain pickle, kept in the ref
        return ObjectRef(packed.header, packed.object_ids, self.agent)

    def load_value(self, header: bytes, object_ids: list[bytes]) -> Any:
        """A value the cluster stored (a large result, an ex.put): zero-copy when the store is here."""
        from scaler_executor.objstore import payload as packing

        if self.agent.pushed.streams:  # forwarded while the daemon stored it (client/pushed.py)
            from scaler_executor.client.pushed import NOT_PUSHED

            value = self.agent.pushed.load(header, object_ids)
            if value is not NOT_PUSHED:
                return value
        if self.store is not None:
            return packing.unpack(header, object_ids, self.store)
        return packing.unpack(header, object_ids, packing.Fetched(self.agent.fetch_objects(object_ids)))


class _CallPickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no stubs
    """cloudpickle, plus: futures of this executor become dependencies and ObjectRefs
    references, found in the same pass that pickles the call."""

    def __init__(self, file: io.BytesIO, packer: Packer) -> None:
        super().__init__(file, protocol=5)
        self.packer = packer
        self.deps: list[int] = []
        self.objects: list[bytes] = []

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in _INERT or (kind is type and obj in _BY_REFERENCE):
            return NotImplemented
        reduced = self.packer.reduce(obj, self.deps, self.objects)
        if reduced is not NotImplemented:
            return reduced
        return super().reducer_override(obj)


class GraphBatch:
    """A graph's tasks, numbered as they are added and sent in one transmission by ``submit``.

    One transmission matters: the daemon handles a transmission at once, so every
    dependency of the graph is linked before any intermediate can finish — one that
    finished with no dependent linked yet would be forgotten.
    """

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.items: list[TaskItem] = []

    def add(
        self, future: TaskFuture[Any] | None, fn_id: int, options_id: int, flags: int, pickled: Pickled, deps: list[int]
    ) -> int:
        """Number a task of the graph; ``deps``: every task it waits for (its graph
        dependencies and any future among its arguments, ``pickled.deps``)."""
        agent = self.agent
        with agent.lock:
            n = agent.core.graph_number(future, time.time())  # the core's GraphTaskAdded
        self.items.append(TaskItem(n, fn_id, options_id, flags | pickled.flags, pickled.payload, deps, pickled.objects))
        return n

    def submit(self) -> None:
        with self.agent.lock:
            self.agent.check_usable()
            commands = self.agent.core.handle(GraphSubmitted(self.items))
        self.agent.execute(commands)


class MapCache(dict):  # type: ignore[type-arg]  # entries are (weakref or owner, oid); get() and [] speak (owner, oid)
    """The shared-buffer cache of one ``map`` call: each source buffer is stored once.

    Unlike a plain cache it holds the source objects weakly: an entry (and the daemon's
    pin on its object) goes when its source array is garbage-collected, so a long map
    over distinct arrays frees each one after its task, while ``repeat(big)`` keeps one
    object for the whole call.  Sources that cannot be weakly referenced stay until the
    map ends (``release_all``).
    """

    def __init__(self, agent: ClientAgent) -> None:
        super().__init__()
        self._agent = weakref.ref(agent)

    def get(self, key: Any, default: Any = None) -> Any:
        entry = super().get(key)
        if entry is None:
            return default
        ref, oid = entry
        owner = ref() if isinstance(ref, weakref.ref) else ref
        return default if owner is None else (owner, oid)

    def __setitem__(self, key: Any, value: Any) -> None:
        owner, oid = value
        try:
            ref: Any = weakref.ref(owner, lambda _r, key=key, oid=oid: self._gone(key, oid))  # type: ignore[misc]  # defaults bind this entry's key and oid
        except TypeError:
            ref = owner  # no weak references (bytes-like): kept until the map ends
        super().__setitem__(key, (ref, oid))

    def _gone(self, key: Any, oid: bytes) -> None:
        entry = super().get(key)
        if entry is not None and entry[1] == oid:
            super().__delitem__(key)
        agent = self._agent()
        if agent is not None:
            agent.release_objects([oid])

    def object_ids(self) -> list[bytes]:
        return [oid for _ref, oid in self.values()]

    def release_all(self) -> None:
        ids = self.object_ids()
        self.clear()
        agent = self._agent()
        if agent is not None and ids:
            agent.release_objects(ids)


class ObjectRef:
    """A value placed in the cluster's object store once (``ScalerExecutor.put``).

    Pass it as an argument anywhere (nested in containers too): tasks receive the value,
    zero-copy on the daemon's host.  ``result()`` reads it here.  The objects stay in the
    store while the ref lives (and while tasks that got it run).
    """

    __slots__ = ("header", "object_ids", "_agent", "__weakref__")

    def __init__(self, header: bytes, object_ids: list[bytes], agent: ClientAgent) -> None:
        self.header = header
        self.object_ids = object_ids
        self._agent = agent
        if object_ids:
            agent.pin_objects(object_ids)
            weakref.finalize(self, agent.release_objects, object_ids).atexit = False

    def result(self) -> Any:
        if not self.object_ids:
            return pickle.loads(self.header)
        return self._agent.packer.load_value(self.header, self.object_ids)

    def __reduce__(self) -> Any:
        raise TypeError(
            "an ObjectRef is resolved when it is an argument of a task of its executor; "
            "it cannot be pickled on its own"
        )

    def __repr__(self) -> str:
        return f"<ObjectRef {len(self.object_ids)} object(s)>"
