"""The submit path: a call pickled, charged to the pending limit and queued in the core.

::

    submit / submit_with ─► pack (pickling.py) ─► PendingLimit.charge ─► enqueue:
        core.new_task + outbox item (the agent drains it), or down the open lane
        for a task submitted alone (routes.LaneRoute)
    an argument that is a running lane task's future ─► park: PARKED until it is done
    DEP_GONE ─► resend (pickled again, the value inlined)

Every decision is the core's (``state.py``): this module pickles, reports the events
(``Submitted``, ``Parked``, ``Repickled``, ``TaskFailed``, ``LaneRefused``) and executes
the commands that come back.  Runs on user threads (submit, cancel) and completion
threads (resend, unpark).  It takes ``ClientAgent.lock`` (the core) only, never across
pickling or user code; see the lock order in ``agent.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from types import FunctionType
from typing import TYPE_CHECKING, Any

from scaler_executor.client import serialization as ser
from scaler_executor.client.completion import settle
from scaler_executor.client.events import (
    DISCARD,
    LaneRefused,
    Parked,
    Repickled,
    SendDownLane,
    TaskFailed,
)
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.pickling import (
    NO_DEPS,
    NO_OBJECTS,
    AfterLane,
    DependencyFailed,
    Pickled,
)
from scaler_executor.client.state import TaskItem, TaskRecord
from scaler_executor.protocol.messages import TaskFlags

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent

Pack = Callable[[], tuple[int, int, Pickled]]

# A caller waiting on a lone task reads the reply inbox itself (routes.ReplyInbox.pick_up);
# bench/fastpaths.py turns it off to measure its gain (docs/performance.rst).
PICK_UP = True


class Submitter:
    """The submit path of one client agent (see the module doc)."""

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.core = agent.core
        self.lock = agent.lock
        self.packer = agent.packer
        self.pending = agent.pending
        self.lane = agent.lane

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options_id: int, flags: int = 0
    ) -> Future[Any]:
        self.agent.check_usable()
        future: TaskFuture[Any] = TaskFuture()
        packer = self.packer
        # A registered plain function with small builtin arguments (a loop of submits, most
        # often): nothing here can fail to pickle, so no pack closure, note or repack.
        fn_id = self.core.fn_cache.get(fn) if type(fn) is FunctionType else None
        if fn_id is not None:
            threshold = packer.config.object_store_threshold
            plain = ser.dumps_plain_args(args, kwargs, threshold)
            if plain is not None and len(plain) < threshold:
                # submit_plain's body, written out: the call itself was 5 % of submit's cost
                # (bench/ab.py, noop_submit's submit call, 12 pairs: 1.061, 1.018-1.137).
                size = len(plain)
                self.pending.charge(size)  # waits for room (or raises) at max_pending_tasks/bytes
                try:
                    self.enqueue(future, fn_id, options_id, TaskFlags.CALL | flags, plain, NO_DEPS, NO_OBJECTS, None, size)
                except BaseException:
                    self.pending.free(size)
                    raise
                return future

        def pack() -> tuple[int, int, Pickled]:
            if ser.is_cacheable(fn):
                return self.agent.function_id(fn), TaskFlags.CALL | flags, packer.pickle_args(args, kwargs)
            return 0, TaskFlags.INLINE_FN | flags, packer.pickle_obj((fn, args, kwargs))

        return self.submit_with(future, pack, options_id, lambda: ser.pickling_note(fn, args, kwargs))

    def submit_plain(self, future: TaskFuture[Any], fn_id: int, options_id: int, flags: int, plain: bytes) -> Future[Any]:
        """Queue a call of the registered function ``fn_id`` whose arguments
        ``ser.dumps_plain_args`` pickled (small builtin values): nothing can fail to pickle or
        be a dependency, so no pack closure, note or repack (``submit``, ``map``'s items)."""
        size = len(plain)
        self.pending.charge(size)  # waits for room (or raises) at max_pending_tasks/bytes
        try:
            self.enqueue(future, fn_id, options_id, flags, plain, NO_DEPS, NO_OBJECTS, None, size)
        except BaseException:
            self.pending.free(size)
            raise
        return future

    def submit_with(self, future: TaskFuture[Any], pack: Pack, options_id: int, note: Callable[[], str]) -> Future[Any]:
        """Pickle a call with ``pack`` and queue it; a pickling failure fails ``future`` with a note."""
        try:
            fn_id, flags, pickled = pack()
        except AfterLane as after:
            self._park(future, pack, options_id, note, after.args[0])
            return future
        except DependencyFailed as failed:
            settle(future, False, failed.args[0])
            return future
        except Exception as exc:  # noqa: BLE001 - whatever pickling the call raises fails its future, with a note
            exc.add_note(note())
            settle(future, False, exc)
            return future
        size = len(pickled.payload)
        try:
            self.pending.charge(size)  # waits for room (or raises) at max_pending_tasks/bytes
            try:
                self.enqueue(
                    future, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects,
                    (pack, options_id) if pickled.deps else None, size,
                )  # fmt: skip
            except BaseException:
                self.pending.free(size)
                raise
        except BaseException:
            self.packer.discard_created(pickled)
            raise
        return future

    def enqueue(
        self,
        future: TaskFuture[Any],
        fn_id: int,
        options_id: int,
        flags: int,
        payload: bytes,
        deps: list[int],
        objects: list[bytes],
        repack: tuple[Pack, int] | None,
        charge: int,
    ) -> None:
        """The core's ``Submitted`` (called directly: one command back, no list); a
        ``SendDownLane`` is executed under the lock, as the core's decision was taken.
        Takes the pickled call's fields (the submit loop's path never makes a ``Pickled``)."""
        with self.lock:
            self.agent.check_usable()
            command = self.core.handle_submit(future, fn_id, options_id, flags, payload, deps, objects, repack, charge, time.time())
            if command is not None and self.down_lane(command):
                return
        self.agent.wake()

    def down_lane(self, command: SendDownLane) -> bool:
        """(Under the lock) execute ``SendDownLane``: True if the task went down the lane
        (its future is then running), False if it waits in the outbox (``LaneRefused``)."""
        record = command.record
        if self.lane.submit(record, command.item):
            record.future.mark_running()  # (unless its result was read, and completed it, already)
            return True
        self.core.handle(LaneRefused(record))
        return False

    def _park(self, future: TaskFuture[Any], pack: Pack, options_id: int, note: Callable[[], str], lane_future: Future[Any]) -> None:
        """A task with an argument that is a running lane task's future (or one of a task
        parked like this): the daemon never held that task, so this one waits here,
        outstanding and PENDING (``Parked``), and is pickled again (the value inlined) and
        sent once that future is done (``Repickled``)."""
        with self.lock:
            self.agent.check_usable()
            self.core.handle(Parked(future, time.time()))
        record: TaskRecord = future._record
        lane_future.add_done_callback(lambda _done: self._unpark(record, pack, options_id, note))

    def _unpark(self, record: TaskRecord, pack: Pack, options_id: int, note: Callable[[], str]) -> None:
        if not self.core.owns(record):
            return  # cancelled (or failed with the executor) meanwhile: no need to pickle it
        future = record.future
        try:
            fn_id, flags, pickled = pack()
        except AfterLane as after:  # another argument is such a task too
            after.args[0].add_done_callback(lambda _done: self._unpark(record, pack, options_id, note))
            return
        except BaseException as exc:  # noqa: BLE001 - it fails its future, whatever it is
            if isinstance(exc, DependencyFailed):
                exc = exc.args[0]
                if isinstance(exc, CancelledError):
                    future.cancel()  # as the daemon cancels the dependents of a cancelled task
                    return
            else:
                exc.add_note(note())
            self.agent.execute(self.core.handle(TaskFailed(record, exc)))
            return
        self._repickled(record, fn_id, options_id, flags, pickled, pack)

    def _repickled(self, record: TaskRecord, fn_id: int, options_id: int, flags: int, pickled: Pickled, pack: Pack) -> None:
        item = TaskItem(record.n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects)
        with self.lock:
            commands = self.core.handle(Repickled(record, item, (pack, options_id) if pickled.deps else None))
        for command in commands:
            if command is DISCARD:
                self.packer.discard_created(pickled)
            else:
                self.agent.execute([command])

    def resend(self, n: int) -> None:
        """DEP_GONE (the core's ``Resend``): a dependency finished before the daemon saw
        this task: pickle it again, the value inlined."""
        core = self.core
        record = core.records.get(n)
        if record is None:
            return
        if record.repack is None:
            error = RuntimeError(f"task {n} lost a dependency it could not send again")
            self.agent.execute(core.handle(TaskFailed(record, error)))
            return
        repack, options_id = record.repack
        try:
            fn_id, flags, pickled = repack()
        except DependencyFailed as failed:
            self.agent.execute(core.handle(TaskFailed(record, failed.args[0])))
            return
        self._repickled(record, fn_id, options_id, flags, pickled, repack)
