"""The submit path: a call pickled, charged to the pending limit and queued in the core.

::

    submit / submit_with ─► pack (pickling.py) ─► PendingLimit.charge ─► enqueue:
        core.new_task + outbox item (the agent drains it), or down the open lane
        for a task submitted alone (routes.LaneRoute)
    an argument that is a running lane task's future ─► park: PARKED until it is done
    DEP_GONE ─► resend (pickled again, the value inlined)
    a lane task whose lane closed ─► submit_again (to the daemon, a new number)

Runs on user threads (submit, cancel), completion threads (resend, unpark) and the
agent thread (submit_again).  It takes ``ClientAgent.lock`` (the core) only, never
across pickling or user code; see the lock order in ``agent.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any

from scaler_executor.client import serialization as ser
from scaler_executor.client.completion import settle
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.pickling import AfterLane, DependencyFailed, Pickled
from scaler_executor.client.state import (
    LANE,
    PARKED,
    RELEASE_FN,
    SENT,
    UNSENT,
    TaskItem,
    TaskRecord,
)
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

        def pack() -> tuple[int, int, Pickled]:
            if ser.is_cacheable(fn):
                return self.agent.function_id(fn), TaskFlags.CALL | flags, packer.pickle_args(args, kwargs)
            return 0, TaskFlags.INLINE_FN | flags, packer.pickle_obj((fn, args, kwargs))

        return self.submit_with(future, pack, options_id, lambda: ser.pickling_note(fn, args, kwargs))

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
                self.enqueue(future, fn_id, options_id, flags, pickled, pack if pickled.deps else None, size)
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
        pickled: Pickled,
        repack: Pack | None,
        charge: int = -1,
    ) -> None:
        core = self.core
        with self.lock:
            self.agent.check_usable()
            alone = not core.records
            record = core.new_task(future, UNSENT, time.time())
            record.charge = charge
            if repack is not None:
                record.repack = (repack, options_id)
            if alone:
                flags |= TaskFlags.REPLY_DIRECT  # a sequential caller's: its result may come straight back
                if self.agent.inbox is not None and PICK_UP:
                    future._pickup = self.agent._pickup_hook
            item = TaskItem(record.n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects)
            future._on_cancel = self.agent.cancel_hook
            if alone and self.lane.open and options_id == 0 and not pickled.deps and not pickled.objects:
                record.where = LANE
                if self.lane.submit(record, item):
                    future.mark_running()  # (unless its result was read, and completed it, already)
                    return
            core.queue(record, item)
        self.agent.wake()

    def _park(self, future: TaskFuture[Any], pack: Pack, options_id: int, note: Callable[[], str], lane_future: Future[Any]) -> None:
        """A task with an argument that is a running lane task's future (or one of a task
        parked like this): the daemon never held that task, so this one waits here,
        outstanding and PENDING, and is pickled again (the value inlined) and sent once
        that future is done."""
        with self.lock:
            self.agent.check_usable()
            record = self.core.new_task(future, PARKED, time.time())
        future._on_cancel = self.agent.cancel_hook
        lane_future.add_done_callback(lambda _done: self._unpark(record, pack, options_id, note))

    def _unpark(self, record: TaskRecord, pack: Pack, options_id: int, note: Callable[[], str]) -> None:
        core = self.core
        if core.records.get(record.n) is not record:
            return  # cancelled (or failed with the executor) meanwhile
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
            if core.claim(record.n) is record:
                settle(future, False, exc)
            return
        with self.lock:
            if core.records.get(record.n) is not record or record.where is not PARKED:
                self.packer.discard_created(pickled)
                return
            if pickled.deps:
                record.repack = (pack, options_id)
            core.move(record, "unpark")
            core.outbox.append(TaskItem(record.n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects))
        self.agent.wake()

    def resend(self, n: int) -> None:
        """DEP_GONE: a dependency finished before the daemon saw this task: pickle it again,
        the value inlined."""
        core = self.core
        record = core.records.get(n)
        if record is None:
            return
        if record.repack is None:
            if core.claim(n) is record:
                settle(record.future, False, RuntimeError(f"task {n} lost a dependency it could not send again"))
            return
        repack, options_id = record.repack
        try:
            fn_id, flags, pickled = repack()
        except DependencyFailed as failed:
            if core.claim(n) is record:
                settle(record.future, False, failed.args[0])
            return
        with self.lock:
            if core.records.get(n) is not record or record.where is not SENT:
                self.packer.discard_created(pickled)
                return  # cancelled meanwhile
            record.repack = (repack, options_id) if pickled.deps else None
            core.move(record, "resend")
            core.outbox.append(TaskItem(n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects))
        self.agent.wake()

    def submit_again(self, record: TaskRecord) -> None:
        """(Agent thread) A lane task that did not run to the end (its processor died, or
        the lane closed): to the daemon, under a new number (the worker may still hold
        the old one), which retries it by the usual rules."""
        core = self.core
        item = record.item
        assert item is not None
        with self.lock:
            if core.records.get(record.n) is not record:
                return  # completed meanwhile (its result came straight)
            n = core.renumber(record)
            core.move(record, "lane-lost")
            flags = item.flags | TaskFlags.LANE_RETRY  # the daemon counts the attempt made on the lane
            fn_id = item.fn_id
            if fn_id and fn_id not in core.fn_payloads and record.blob is not None:
                # Its callable was released meanwhile: registered again, for this task only.
                fn_id = core.register_function(record.blob)
                core.fn_payloads.pop(fn_id, None)
                core.outbox.append(item._replace(n=n, fn_id=fn_id, flags=flags))
                core.outbox.append((RELEASE_FN, fn_id))
            else:
                core.outbox.append(item._replace(n=n, flags=flags))
