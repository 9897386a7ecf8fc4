"""The client agent: the background thread that owns the connection to the daemon.

::

    user thread(s)                 agent role (one pool thread)       other pool threads
    ──────────────                 ────────────────────────────       ──────────────────
    submit(): pickle, Future  ──►  outbox ─► SubmitTasks (batched,    futures: RUNNING,
      (wakes the agent via           up to submit_window unacked)      results unpickled,
       an eventfd)                 recv: TasksRunning, TaskResults ──► set_result / set_exception,
    Future.cancel() ─ hook ─────►  CancelTasks                         done-callbacks run here
                                   heartbeats, daemon-loss timer

* Only the thread holding the agent role touches the socket, and it runs no user
  code while it holds it, so a slow done-callback delays no result and no heartbeat.
  One exception: a user thread submitting a task while no other is outstanding writes
  it itself when the agent waits in poll and the channel allows a send beside a poll
  (``_send_directly``; ``_io`` is the connection's lock, held by the agent thread for
  its turns). A sequential caller's round trip then has no agent wake-up on the way out.
  The role moves to an idle pool thread when results arrive (``_Completer``): the
  thread that read them completes them, with no wake-up of another thread between a
  result and the user waiting for it.
* Futures are completed only through their public methods, on pool threads not
  holding the agent role, except a lone result (or up to QUIET_RESULTS that came
  together) whose completion runs no user code (``_complete_quietly``: no global in its
  pickle, no done-callback), which the agent thread completes itself, and running
  notices for up to RUNNING_INLINE tasks; a result arriving before its RUNNING notice
  marks the future running itself.
* The agent holds no reference to the executor; the executor's finalizer and
  the module's ``atexit`` hook are what shut it down.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import io
import tempfile
import itertools
import math
import select
import logging
import os
import pickle
import signal
import socket
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from concurrent.futures import CancelledError, Future, InvalidStateError
from typing import Any, Callable, NamedTuple

import cloudpickle

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.client import serialization as ser
from scaler_executor.client.cluster import EmbeddedCluster
from scaler_executor.client.future import TaskFuture
from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import BrokenScalerExecutor, DaemonLost, InitializerFailed, ResultUnreadable
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import reply
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags, TaskOptions
from scaler_executor.protocol.refs import dependency, identity, stored

log = logging.getLogger("scaler_executor.client")

TASK_MASK = (1 << m.TASK_ID_BITS) - 1
SUBMIT, CANCEL, REGISTER_FN, RELEASE_FN, REGISTER_OPTIONS, STATS, FORCE_CANCEL = range(7)
PIN_OBJECTS, RELEASE_OBJECTS, FETCH_OBJECTS, SUBMIT_BATCH, FLUSHED = range(7, 12)
FLUSH_WAIT = 1.0  # seconds shutdown(cancel_futures=True) waits for its cancels to be written
RECV_BURST = 1024
TURN_SECONDS = 0.02  # most a turn spends receiving, so heartbeats and submissions still go out under floods
MAX_TASKS_PER_TRANSMISSION = 2000  # bounds the daemon's work per message, hence its turn time
QUIET_PAYLOAD = 4096  # most bytes of a result the agent thread completes itself
QUIET_RESULTS = 4  # most results that came together the agent thread completes itself
# Running notices for at most this many tasks are applied by the agent thread (marking a
# future running calls no callback); handing each to a pool thread woke it once per notice,
# about 80 us of CPU per task of 12 ms on the 2-core VM.  Larger ones go to the pool, so
# the agent thread is not held up by a long loop.
RUNNING_INLINE = 64
# A sequential caller polls its reply socket without sleeping for up to this long before it
# blocks (_await_reply): a blocked caller leaves its vCPU idle, and waking an idle vCPU of
# a VM costs ~0.2-1 ms, most of the slowest 1 % of round trips.  Spinning only while the
# last pick-up came within the window bounds the waste to one window per change to
# longer tasks; it yields the CPU on every empty poll, so the processes it waits on run.
PICKUP_SPIN_SECONDS = 0.002
_SPIN_WORTHWHILE = len(os.sched_getaffinity(0)) > 1  # on one CPU the work waited on needs it

_live_agents: weakref.WeakSet[ClientAgent] = weakref.WeakSet()


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What is known about a finished task (``scaler_executor.task_info(future)``).

    Times are wall-clock seconds (``time.time()``); ``started``/``finished`` come from the
    worker's clock.  ``peak_memory`` is the highest private memory (RssAnon) of the process
    that ran it, sampled every 100 ms and at the end of tasks of 10 ms or more; 0 if unknown.
    """

    task_id: int
    worker: str
    submitted: float
    started: float
    finished: float
    attempts: int
    peak_memory: int

    @property
    def queued_seconds(self) -> float:
        return max(0.0, self.started - self.submitted) if self.started else 0.0

    @property
    def duration(self) -> float:
        return max(0.0, self.finished - self.started)




def task_info_of(future: Future[Any]) -> TaskInfo | None:
    facts = getattr(future, "_scaler_facts", None)
    return None if facts is None else TaskInfo(*facts)


@atexit.register
def _shutdown_at_exit() -> None:
    """Interpreter exit acts as shutdown(wait=True): outstanding futures complete first."""
    for agent in list(_live_agents):
        agent.shutdown(wait=True)


class ClientAgent:
    def __init__(self, config: ClusterConfig, address: str, cluster: EmbeddedCluster | None) -> None:
        self.config = config
        self.address = address
        self.cluster = cluster
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.lock = threading.Lock()  # guards: shutdown flag, broken, outbox order of registrations
        self.outbox: deque[tuple[Any, ...]] = deque()
        self.futures: dict[int, Future[Any]] = {}
        self._ids: dict[int, int] = {}  # id(future) -> n, while the future is outstanding
        self._submitted: dict[int, float] = {}  # n -> time.time() of submit
        self._repack: dict[int, tuple[Callable[[], Any], int]] = {}  # n -> how to pickle it again (DEP_GONE)
        self._counter = itertools.count(1)
        self._fn_counter = itertools.count(1)
        self._fn_cache: weakref.WeakKeyDictionary[Callable[..., Any], int] = weakref.WeakKeyDictionary()
        self._options: dict[tuple[Any, ...], int] = {}
        self._stats_waiters: deque[Future[dict[str, Any]]] = deque()
        self._fetch_waiters: deque[Future[dict[bytes, bytes]]] = deque()
        self.store: Any = None  # the daemon host's object store, when this host can map it
        self.store_ready = threading.Event()  # set once the handshake said whether there is one
        self.shutdown_requested = False
        self.broken: BaseException | None = None
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_pending = False
        # Guards only the wake-up descriptor against its close.  Reentrant: wake() is
        # reached from finalizers (ObjectRef, MapCache, a cached function's release),
        # which a garbage collection may run on a thread that is inside wake() already.
        self._wake_lock = threading.RLock()
        # Tasks the client holds and the daemon does not know yet (in the outbox, or
        # parked behind a lane task): cancel() takes them back on the spot.
        self._unsent: set[int] = set()
        # Cancels asked of the daemon and not answered yet: n -> its _CancelWait.
        self._cancel_waits: dict[int, _CancelWait] = {}
        # The connection's lock: held by the agent role's thread for its whole turn (not
        # while it waits in poll), and by a user thread that sends its own submit (_enqueue).
        self._io = threading.Lock()
        self._direct = False  # the channel takes a send while another thread polls it (ipc)
        self._reply: socket.socket | None = None  # processors' results of sequential tasks (protocol/reply.py)
        self._reply_to = ""
        # A worker's lane (worker/lanes.py): a task submitted alone goes straight to it.
        # _lane_lock serializes its sends (user threads) and reads (the agent thread).
        self._lane: Any = None  # a channel.StreamDealer, once a result named a lane
        self._lane_lock = threading.Lock()
        self._lanes_refused: set[str] = set()  # lanes that could not be connected
        self._lane_fns: set[int] = set()  # callables sent down the current lane
        self._lane_tasks: dict[int, tuple[tuple[Any, ...], bytes | None]] = {}  # n -> (SUBMIT item, callable)
        self._fn_payloads: dict[int, bytes] = {}  # registered callables, for a lane's first task of each
        # A caller waiting in result() on a REPLY_DIRECT future reads the reply socket itself
        # (_pick_up): one at a time (_pickup_lock), woken by _pickup_fd when its future is
        # completed another way; _pickup_fd_lock keeps a write off a closed descriptor.
        self._pickup_lock = threading.Lock()
        self._pickup_fd_lock = threading.Lock()
        self._pickup_fd = -1
        self._picking: Future[Any] | None = None
        self._pickup_spin = _SPIN_WORTHWHILE  # the last pick-up came within PICKUP_SPIN_SECONDS
        self._tearing = False
        self._pickup_hook = self._pick_up  # bound once, set on each sequential caller's future
        self._closed = False
        self._finished = threading.Event()  # set once the agent role has torn the connection down
        self._handoff: list[m.TaskResult] | None = None  # results this turn completes itself
        # PENDING -> RUNNING happens on completion threads, from a RUNNING notice or from the
        # result itself, possibly on two threads at once for one future: TaskFuture's
        # mark_running() is the check-and-set under the future's own lock.
        self._cancel_hook = self._on_cancel_requested  # bound once, shared by every future
        self._completer = _Completer(self)
        self._completer.start()  # its first thread takes the agent role
        _live_agents.add(self)

    # ================================================================== user-thread side

    def wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            with self._wake_lock:
                if not self._closed:
                    os.eventfd_write(self._wake_fd, 1)

    def check_usable(self) -> None:
        if self.broken is not None:
            raise type(self.broken)(*self.broken.args) if isinstance(self.broken, BrokenScalerExecutor) else BrokenScalerExecutor(str(self.broken))
        if self.shutdown_requested:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options_id: int, flags: int = 0
    ) -> Future[Any]:
        self.check_usable()
        future: TaskFuture[Any] = TaskFuture()

        def pack() -> tuple[int, int, Pickled]:
            if ser.is_cacheable(fn):
                return self.function_id(fn), TaskFlags.CALL | flags, self.pickle_args(args, kwargs)
            return 0, TaskFlags.INLINE_FN | flags, self.pickle_obj((fn, args, kwargs))

        return self.submit_with(future, pack, options_id, lambda: ser.pickling_note(fn, args, kwargs))

    def submit_with(
        self,
        future: TaskFuture[Any],
        pack: Callable[[], tuple[int, int, Pickled]],
        options_id: int,
        note: Callable[[], str],
    ) -> Future[Any]:
        """Pickle a call with ``pack`` and queue it; a pickling failure fails ``future`` with a note."""
        try:
            fn_id, flags, pickled = pack()
        except _AfterLane as after:
            self._park(future, pack, options_id, note, after.args[0])
            return future
        except DependencyFailed as failed:
            exc = failed.args[0]
            future.set_exception(exc)
            return future
        except Exception as exc:
            exc.add_note(note())
            future.set_exception(exc)
            return future
        try:
            self._enqueue(future, fn_id, options_id, flags, pickled, pack if pickled.deps else None)
        except BaseException:
            self.discard_created(pickled)
            raise
        return future

    def _enqueue(
        self,
        future: TaskFuture[Any],
        fn_id: int,
        options_id: int,
        flags: int,
        pickled: Pickled,
        repack: Callable[[], tuple[int, int, Pickled]] | None,
    ) -> None:
        with self.lock:
            self.check_usable()
            n = next(self._counter)
            self.futures[n] = future
            self._ids[id(future)] = n
            self._submitted[n] = time.time()
            if repack is not None:
                self._repack[n] = (repack, options_id)
            alone = len(self.futures) == 1
            if alone:
                flags |= TaskFlags.REPLY_DIRECT  # a sequential caller's: its result may come straight back
                if self._reply is not None:
                    future._pickup = self._pickup_hook
            item = (SUBMIT, n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects)
            if alone and self._lane is not None and options_id == 0 and not pickled.deps and not pickled.objects:
                if self._lane_submit(item, future):
                    future._on_cancel = self._cancel_hook
                    return
            self._unsent.add(n)
            self.outbox.append(item)
        future._on_cancel = self._cancel_hook
        if alone and self._direct and self._send_directly():
            return
        self.wake()

    def _park(
        self,
        future: TaskFuture[Any],
        pack: Callable[[], tuple[int, int, Pickled]],
        options_id: int,
        note: Callable[[], str],
        lane_future: Future[Any],
    ) -> None:
        """A task with an argument that is a running lane task's future (or one of a task
        parked like this): the daemon never held that task, so this one waits here,
        outstanding and PENDING, and is pickled again (the value inlined) and sent once
        that future is done."""
        with self.lock:
            self.check_usable()
            n = next(self._counter)
            self.futures[n] = future
            self._ids[id(future)] = n
            self._submitted[n] = time.time()
            self._unsent.add(n)  # held here: a cancel takes it back on the spot
        future._off_daemon = True
        future._on_cancel = self._cancel_hook
        lane_future.add_done_callback(lambda _done: self._unpark(n, future, pack, options_id, note))

    def _unpark(
        self,
        n: int,
        future: TaskFuture[Any],
        pack: Callable[[], tuple[int, int, Pickled]],
        options_id: int,
        note: Callable[[], str],
    ) -> None:
        if self.futures.get(n) is not future:
            return  # cancelled (or failed with the executor) meanwhile
        try:
            fn_id, flags, pickled = pack()
        except _AfterLane as after:  # another argument is such a task too
            after.args[0].add_done_callback(lambda _done: self._unpark(n, future, pack, options_id, note))
            return
        except BaseException as exc:
            if isinstance(exc, DependencyFailed):
                exc = exc.args[0]
                if isinstance(exc, CancelledError):
                    future.cancel()  # as the daemon cancels the dependents of a cancelled task
                    return
            else:
                exc.add_note(note())
            if self.futures.pop(n, None) is future:
                self._unsent.discard(n)
                self._ids.pop(id(future), None)
                self._submitted.pop(n, None)
                settle(future, False, exc)
            return
        with self.lock:
            if self.futures.get(n) is not future:
                self.discard_created(pickled)
                return
            if pickled.deps:
                self._repack[n] = (pack, options_id)
            self.outbox.append((SUBMIT, n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects))
            future._off_daemon = False  # from now on the daemon holds it (once sent)
        self.wake()

    def _lane_submit(self, item: tuple[Any, ...], future: TaskFuture[Any]) -> bool:
        """Send a task submitted alone down the lane (worker/lanes.py); False: it goes to the
        daemon instead.  The future turns RUNNING at once: the worker has it, and a cancel
        could no longer keep it from running."""
        with self._lane_lock:
            lane = self._lane
            if lane is None or lane.conn is None:
                return False
            _, n, fn_id, _options_id, flags, payload, _deps, _objects = item
            base = self._base
            messages: list[Any] = []
            blob = None
            if fn_id:
                blob = self._fn_payloads.get(fn_id)
                if blob is None:
                    return False  # released meanwhile (its callable is gone): the daemon's path
                if fn_id not in self._lane_fns:
                    messages.append(m.RegisterFunction(base | fn_id, blob))
            messages.append(m.SubmitTasks([m.TaskSpec(base | n, base | fn_id if fn_id else 0, 0, flags, payload, [], [], 0)]))
            self._lane_tasks[n] = (item, blob)  # first: its result may be read before send returns
            future._off_daemon = True
            try:
                lane.send(codec.encode(messages))
            except channel.SendError:
                del self._lane_tasks[n]
                future._off_daemon = False
                return False
            if lane.conn is None:
                del self._lane_tasks[n]
                future._off_daemon = False
                return False  # the write failed: the worker is gone, nothing of it arrived whole
            if fn_id:
                self._lane_fns.add(fn_id)
        future.mark_running()  # (unless its result was read, and completed it, already)
        return True

    def _open_lane(self, path: str) -> None:
        """Connect to the lane a result named, unless one is open (or this one failed)."""
        with self._lane_lock:
            if self._lane is not None or path in self._lanes_refused or self._tearing or self._closed:
                return
            if not self.config.worker_lanes or not path.startswith(os.path.dirname(self._reply_to) + os.sep):
                self._lanes_refused.add(path)  # off, or not beside our reply socket: not a lane of ours
                return
            try:
                lane = channel.StreamDealer(path, hwm=self.config.send_hwm, linger=0)
            except OSError as exc:
                lane = None
                log.info("client: cannot connect to the lane %s (%s)", path, exc)
            if lane is None or lane.conn is None:
                if lane is not None:
                    lane.close(linger=0)
                self._lanes_refused.add(path)
                return
            self._lane_fns.clear()
            self._poller.register(lane.pollable)
            self._lane = lane

    def _receive_lane(self) -> None:
        """(Agent thread) What came back on the lane: results it could not deliver
        straight, tasks whose processor died (sent again, to the daemon), and the end of
        the connection (every task still on it is sent again, to the daemon)."""
        results: list[m.TaskResult] = []
        with self._lane_lock:
            lane = self._lane
            if lane is None:
                return
            while lane.conn is not None and lane.readable():
                try:
                    frames = lane.recv()
                except channel.Again:
                    break
                try:
                    messages, _ = codec.decode(frames)
                except codec.DecodeError as exc:
                    log.error("client: dropped a bad transmission from the lane %s: %s", lane.path, exc)
                    continue
                for message in messages:
                    if type(message) is m.TaskResults:
                        results.extend(message.results)
            lost = lane.conn is None
            if lost:
                self._close_lane()
        again = []
        for result in results:
            entry = self._lane_tasks.pop(result.task_id & TASK_MASK, None)
            if result.status == Status.PROCESSOR_DIED and entry is not None:
                again.append((result.task_id & TASK_MASK, entry))
        if lost:
            left, self._lane_tasks = self._lane_tasks, {}
            again.extend(left.items())
        for n, entry in again:
            self._submit_again(n, *entry)
        results = [r for r in results if r.status != Status.PROCESSOR_DIED]
        pins = [oid for r in results for oid in r.objects]
        if pins:
            # Made by the processor for us, unknown to the daemon: held for us from now on,
            # released (ReleaseObjects, after this in the outbox) once read.
            self.outbox.append((PIN_OBJECTS, pins))
        if results:
            self._take_results(results)

    def _lane_release(self, fn_id: int) -> None:
        """(Agent thread) The worker may drop a callable it had down the lane: after the
        tasks sent before, which it keeps it for."""
        with self._lane_lock:
            lane = self._lane
            if lane is None or fn_id not in self._lane_fns:
                return
            self._lane_fns.discard(fn_id)
            try:
                lane.send(codec.encode([m.ReleaseFunctions([self._base | fn_id])]))
            except channel.SendError:
                pass  # the lane is closing: its worker forgets everything of it

    def _close_lane(self) -> None:
        """Holding _lane_lock."""
        lane, self._lane = self._lane, None
        if lane is not None:
            self._lane_fns.clear()
            try:
                self._poller.unregister(lane.pollable)
            except (KeyError, ValueError, OSError):
                pass
            lane.close(linger=0)

    def _submit_again(self, n: int, item: tuple[Any, ...], blob: bytes | None) -> None:
        """A lane task that did not run to the end (its processor died, or the lane closed):
        to the daemon, under a new id (the worker may still hold the old one), which
        retries it by the usual rules."""
        future = self.futures.pop(n, None)
        if future is None:
            return  # completed meanwhile (its result came straight), or cancelled
        _, _, fn_id, options_id, flags, payload, deps, objects = item
        flags |= TaskFlags.LANE_RETRY  # the daemon counts the attempt made on the lane
        future._off_daemon = False  # type: ignore[attr-defined]
        with self.lock:
            new = next(self._counter)
            self.futures[new] = future
            self._ids[id(future)] = new
            self._submitted[new] = self._submitted.pop(n, time.time())
            if fn_id and fn_id not in self._fn_payloads and blob is not None:
                # Its callable was released meanwhile: registered again, for this task only.
                fn_id = next(self._fn_counter)
                self._unsent.add(new)
                self.outbox.append((REGISTER_FN, fn_id, blob))
                self.outbox.append((SUBMIT, new, fn_id, options_id, flags, payload, deps, objects))
                self.outbox.append((RELEASE_FN, fn_id))
            else:
                self._unsent.add(new)
                self.outbox.append((SUBMIT, new, fn_id, options_id, flags, payload, deps, objects))

    def _send_directly(self) -> bool:
        """Send the outbox from this (user) thread while the agent waits; False: wake it.

        Only for a task submitted when no other is outstanding (a sequential caller): the
        agent thread's wake-up is then a step of the round trip (~50-90 us on a 2-core VM).
        With tasks outstanding, the agent's batches are what keeps throughput up.
        """
        if not self._io.acquire(blocking=False):
            return False  # the agent is in its turn: it drains the outbox once woken
        try:
            if not self._welcomed or self._pending_frames is not None or self.broken is not None or self._closed:
                return False
            try:
                self._drain_outbox()
            except Exception as exc:  # as in the agent's turn: what it took must fail, not vanish
                log.exception("client agent failed (sending from a user thread)")
                self._break(BrokenScalerExecutor(f"the client agent failed: {exc!r}"))
                return False  # the woken agent sees it broken and tears down
            return not self.outbox and self._pending_frames is None
        finally:
            self._io.release()

    def graph_batch(self) -> GraphBatch:
        """Collects a graph's tasks, to send them in one transmission (see GraphBatch)."""
        self.check_usable()
        return GraphBatch(self)

    def _resubmit(self, n: int) -> None:
        """A dependency finished before the daemon saw this task: pickle it again, value inlined."""
        entry = self._repack.pop(n, None)
        future = self.futures.get(n)
        if entry is None or future is None:
            if future is not None and self.futures.pop(n, None) is not None:
                self._ids.pop(id(future), None)
                settle(future, False, RuntimeError(f"task {n} lost a dependency it could not send again"))
            return
        repack, options_id = entry
        try:
            fn_id, flags, pickled = repack()
        except DependencyFailed as failed:
            if self.futures.pop(n, None) is not None:
                self._ids.pop(id(future), None)
                settle(future, False, failed.args[0])
            return
        with self.lock:
            if self.futures.get(n) is not future:
                self.discard_created(pickled)
                return  # cancelled meanwhile
            if pickled.deps:
                self._repack[n] = (repack, options_id)
            self._unsent.add(n)
            self.outbox.append((SUBMIT, n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects))
        self.wake()

    # ------------------------------------------------------------------ pickling

    def pickle_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], shared: Any = None) -> Pickled:
        fast = ser.dumps_plain_args(args, kwargs)
        if fast is not None and len(fast) < self.config.object_store_threshold:
            return Pickled(fast, NO_DEPS, NO_OBJECTS, 0)
        return self.pickle_obj((args, kwargs), shared)  # large bytes or str go through the store

    def pickle_args_waiting(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Pickled:
        """``pickle_args`` for a caller that blocks for the result anyway (``ex.get``): the
        future of a running lane task among the arguments is waited for, then its value
        goes inline (the daemon never held that task: see _park)."""
        while True:
            try:
                return self.pickle_args(args, kwargs)
            except _AfterLane as after:
                concurrent.futures.wait([after.args[0]])

    def pickle_obj(self, obj: Any, shared: Any = None) -> Pickled:
        """cloudpickle ``obj``; futures of this executor inside it become dependencies, and
        large buffers (or a large whole) go through the object store when there is one."""
        if self.store is None:
            buffer = io.BytesIO()
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
            reducer=lambda o: self._reduce(o, deps, objects),
        )
        if shared is not None:
            fresh = [i for i in shared.object_ids() if i not in known]  # type: ignore[operator]
            if fresh:
                self.pin_objects(fresh)  # held while their source object lives (MapCache)
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

    def _reduce(self, obj: Any, deps: list[int], objects: list[bytes]) -> Any:
        if isinstance(obj, Future):
            return self.reduce_future(obj, deps)
        if isinstance(obj, ObjectRef):
            objects.extend(obj.object_ids)
            return (stored, (obj.header, obj.object_ids))
        return NotImplemented

    def reduce_future(self, future: Future[Any], deps: list[int]) -> tuple[Any, ...]:
        n = self._ids.get(id(future))
        if getattr(future, "_off_daemon", False):
            if not future.done():
                raise _AfterLane(future)  # the daemon never held it: the task waits here (_park)
            n = None  # done (maybe still finishing): its value goes inline
        if n is not None:
            deps.append(n)  # still outstanding (or just finishing): the cluster resolves it
            return (dependency, (n,))
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

    def function_id(self, fn: Callable[..., Any]) -> int:
        """The id of a cached plain function, registering it with the cluster on first use."""
        fn_id = self._fn_cache.get(fn)
        if fn_id is not None:
            return fn_id
        payload = ser.dumps(fn)
        with self.lock:
            fn_id = self._fn_cache.get(fn)
            if fn_id is None:
                fn_id = next(self._fn_counter)
                self.outbox.append((REGISTER_FN, fn_id, payload))
                self._fn_payloads[fn_id] = payload
                self._fn_cache[fn] = fn_id
                weakref.finalize(fn, _release_function, weakref.ref(self), fn_id).atexit = False
        return fn_id

    def register_function(self, fn: Callable[..., Any], owner: object) -> int:
        """Register ``fn`` for as long as ``owner`` lives (one ``map`` call)."""
        payload = ser.dumps(fn)
        with self.lock:
            self.check_usable()
            fn_id = next(self._fn_counter)
            self.outbox.append((REGISTER_FN, fn_id, payload))
            self._fn_payloads[fn_id] = payload
        weakref.finalize(owner, _release_function, weakref.ref(self), fn_id).atexit = False
        return fn_id

    def release_function(self, fn_id: int) -> None:
        self._fn_payloads.pop(fn_id, None)
        if self.shutdown_requested and not self.futures:
            return
        self.outbox.append((RELEASE_FN, fn_id))
        self.wake()

    def options_id(self, options: TaskOptions) -> int:
        key = (tuple(sorted(options.resources.items())), tuple(sorted(options.tags)), *options[2:])
        options_id = self._options.get(key)
        if options_id is None:
            with self.lock:
                options_id = self._options.get(key)
                if options_id is None:
                    options_id = len(self._options) + 1
                    self.outbox.append((REGISTER_OPTIONS, options_id, options))
                    self._options[key] = options_id
        return options_id

    def put(self, value: Any) -> ObjectRef:
        """Place ``value`` in the object store once (inline when there is no store or it is small)."""
        self.check_usable()
        if self.store is None and not self.store_ready.is_set():
            self.store_ready.wait(self.config.daemon_loss_timeout)
        if self.store is None:
            return ObjectRef(ser.dumps(value), [], self)
        from scaler_executor.objstore import payload as packing

        packed = packing.pack(value, self.store, threshold=self.config.object_store_threshold)
        if not packed.object_ids:
            stream = packing.inline_stream(packed.header)
            assert stream is not None
            return ObjectRef(stream, [], self)  # small: a plain pickle, kept in the ref
        return ObjectRef(packed.header, packed.object_ids, self)

    def pin_objects(self, object_ids: list[bytes]) -> None:
        self.outbox.append((PIN_OBJECTS, object_ids))
        self.wake()

    def release_objects(self, object_ids: list[bytes]) -> None:
        if self.broken is None and not self._closed:
            self.outbox.append((RELEASE_OBJECTS, object_ids))
            self.wake()

    def fetch_objects(self, object_ids: list[bytes]) -> dict[bytes, bytes]:
        """The bytes of store objects, through the daemon (for a client on another host)."""
        future: Future[dict[bytes, bytes]] = Future()
        with self.lock:
            self.check_usable()
            self._fetch_waiters.append(future)
            self.outbox.append((FETCH_OBJECTS, object_ids))
        self.wake()
        return future.result()

    def load_value(self, header: bytes, object_ids: list[bytes]) -> Any:
        """A value the cluster stored (a large result, an ex.put): zero-copy when the store is here."""
        from scaler_executor.objstore import payload as packing

        if self.store is not None:
            return packing.unpack(header, object_ids, self.store)
        from scaler_executor.objstore.payload import Fetched as _Fetched

        return packing.unpack(header, object_ids, _Fetched(self.fetch_objects(object_ids)))

    def request_stats(self) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        with self.lock:
            self.check_usable()
            self._stats_waiters.append(future)
            self.outbox.append((STATS,))
        self.wake()
        return future

    def _on_cancel_requested(self, future: TaskFuture[Any]) -> bool:
        """``cancel()`` of a PENDING future of ours (the hook every future shares: one
        bound method, where a ``partial`` per future cost ~200 bytes of each pending task).

        True only if the task will never run.  A task the client still holds (in the
        outbox, or parked) is taken back on the spot.  One the daemon may hold is asked
        of the daemon (``CancelTasks``, answered by ``TasksCancelled``), and a user thread
        waits up to ``cancel_wait`` for the answer; on a thread of the client's own (a
        done-callback, a ``map`` iterator closed there) it never waits and answers False.
        """
        n = self._ids.get(id(future))  # outstanding futures are alive, so id() is theirs
        if n is None:
            return future.cancel_now()  # not (or no longer) the agent's: the standard rule
        with self.lock:
            if self.futures.get(n) is not future:
                return False  # its result is being completed
            try:
                self._unsent.remove(n)  # atomic: the drain's own remove() or this one wins
            except KeyError:
                taken = False
                wait = self._cancel_waits.get(n)
            else:
                self._take_back(n, future)
                taken = True
        if taken:
            return future.cancel_now()
        if self.broken is not None or self._closed:
            return False  # failing with the executor
        if threading.current_thread() in self._completer.threads:
            return False  # never wait on a thread the answer needs
        if wait is None:
            wait = _CancelWait(1)
            with self.lock:
                if self._cancel_waits.setdefault(n, wait) is wait:
                    self.outbox.append((CANCEL, n))
                else:
                    wait = self._cancel_waits[n]
            self.wake()
        return wait.result(self.config.cancel_wait, n, future)

    def _take_back(self, n: int, future: TaskFuture[Any]) -> None:
        """(Holding ``lock``, ``n`` just removed from ``_unsent``) forget a task the daemon
        never got; the drain skips its item."""
        del self.futures[n]
        self._ids.pop(id(future), None)
        self._submitted.pop(n, None)
        self._repack.pop(n, None)

    def cancel_many(self, futures: list[Future[Any]], wait: float | None) -> None:
        """Cancel futures in one go (``shutdown(cancel_futures=True)``, a closed ``map``):
        every cancel to ask of the daemon travels in one message; waits up to ``wait``
        seconds (None: ``cancel_wait``) for the answer, on a user thread only."""
        taken: list[TaskFuture[Any]] = []
        asked: list[tuple[int, TaskFuture[Any]]] = []
        group = _CancelWait(0)
        with self.lock:
            for future in futures:
                n = self._ids.get(id(future))
                if n is None or self.futures.get(n) is not future or future.running() or future.done():
                    continue
                try:
                    self._unsent.remove(n)
                except KeyError:
                    pass
                else:
                    self._take_back(n, future)  # type: ignore[arg-type]
                    taken.append(future)  # type: ignore[arg-type]
                    continue
                if n not in self._cancel_waits and self.broken is None:
                    self._cancel_waits[n] = group
                    group.expected += 1
                    asked.append((n, future))  # type: ignore[arg-type]
                    self.outbox.append((CANCEL, n))
        if asked:
            self.wake()
        for future in taken:
            future.cancel_now()
        if asked:
            own = threading.current_thread() in self._completer.threads
            group.results(0 if own else self.config.cancel_wait if wait is None else wait, asked)

    def _on_cancel_answer(self, message: m.TasksCancelled) -> None:
        """(Agent thread) The daemon's answer: the futures of dropped tasks are cancelled by
        the threads that wait for the answer, or on a pool thread if none waits any more."""
        late: list[TaskFuture[Any]] = []
        with self.lock:
            for verdict, task_ids in ((True, message.cancelled), (False, message.refused)):
                for task_id in task_ids:
                    n = task_id & TASK_MASK
                    wait = self._cancel_waits.pop(n, None)
                    if wait is None:
                        continue
                    future = self.futures.get(n) if verdict else None
                    if future is not None:
                        del self.futures[n]
                        self._ids.pop(id(future), None)
                        self._submitted.pop(n, None)
                        self._repack.pop(n, None)
                    if wait.answer(n, verdict) and future is not None:
                        late.append(future)  # type: ignore[arg-type]
        for future in late:
            self._completer.put(CANCELLED, future)

    def cancel(self, future: Future[Any], force: bool) -> bool:
        """``Future.cancel()``, plus killing the process running it when ``force``."""
        if future.cancel():
            return True
        if not force or future.done():
            return False
        n = self._ids.get(id(future))
        if n is None or self.futures.get(n) is not future:
            return False  # not one of ours, or it finished meanwhile
        if n in self._lane_tasks and self._lane_cancel(n):
            return True
        self.outbox.append((FORCE_CANCEL, n))
        self.wake()
        return True

    def _lane_cancel(self, n: int) -> bool:
        """Kill a running lane task (its worker, not the daemon, holds it)."""
        with self._lane_lock:
            lane = self._lane
            if lane is None or lane.conn is None or n not in self._lane_tasks:
                return False  # the lane closed: the task goes to the daemon, which can be told
            try:
                lane.send(codec.encode([m.CancelTasks([self._base | n], True)]))
            except channel.SendError:
                return False
            return lane.conn is not None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self.lock:
            self.shutdown_requested = True
        flushed = None
        if cancel_futures:
            self.cancel_many(list(self.futures.values()), FLUSH_WAIT)
            # Return once the cancels are written to the daemon's socket: the daemon then
            # reads them before any result produced after we return, so a task cancelled
            # here is never dispatched because a result freed a processor first.
            flushed = threading.Event()
            self.outbox.append((FLUSHED, flushed))
        self.wake()
        # Not welcomed yet: nothing was sent, and the submits and their cancels will travel
        # in one batch, which the daemon applies before it dispatches.
        if flushed is not None and getattr(self, "_welcomed", False) and threading.current_thread() not in self._completer.threads:
            deadline = time.monotonic() + FLUSH_WAIT
            while not flushed.wait(0.02) and not self._finished.is_set() and time.monotonic() < deadline:
                pass
        if wait and threading.current_thread() not in self._completer.threads:
            self._finished.wait()
            self._completer.join()

    @property
    def outstanding(self) -> int:
        return len(self.futures)

    # ================================================================== agent thread

    def _start(self) -> None:
        """Connect and say Hello (on the pool thread that first takes the agent role)."""
        # The embedded daemon binds moments after we connect: the channel retries.
        sock = channel.connect(self.address, hwm=self.config.send_hwm, linger=0.1)
        self._poller = poller = channel.Poller()
        poller.register(sock.pollable)
        poller.register(self._wake_fd)
        if self.cluster is not None:
            self._bind_reply_socket(poller)
        self._sock = sock
        self._welcomed = False
        self._base = 0
        self._unacked = 0
        self._pending_frames: list[Any] | None = None
        self._heartbeat_interval = self.config.heartbeat_interval
        self._started = self._last_recv = self._last_send = time.monotonic()
        self._send([self._hello()])
        self._direct = sock.send_beside_poll  # last: _send_directly reads what is set above

    def _bind_reply_socket(self, poller: channel.Poller) -> None:
        """Bind the socket where local processors send sequential tasks' results (reply.py).

        In the embedded cluster's own directory (mode 0700): only this user's processes can
        write to it, and it goes with the directory.  Without it, results take the daemon.
        """
        assert self.cluster is not None
        path = os.path.join(self.cluster.directory, reply.SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            log.warning("client: no reply socket at %s (%s); results take the daemon's path", path, exc)
            return
        self._pickup_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._reply_to = path
        poller.register(sock.fileno())
        self._reply = sock  # last: _enqueue reads it to offer the pick-up

    def _agent_turns(self) -> list[m.TaskResult] | None:
        """The agent's loop, on whichever pool thread holds the agent role.

        Returns results to complete when this thread handed the role to an idle pool
        thread (see ``_Completer``), or None once the connection is torn down.
        """
        with self._io:
            try:
                handoff = self._turns()
                if handoff is not None:
                    return handoff
            except Exception as exc:  # a bug here must fail futures, not leave them hanging
                log.exception("client agent failed")
                self._break(BrokenScalerExecutor(f"the client agent failed: {exc!r}"))
            if self._handoff is not None:
                self._completer.put_results(self._handoff)
                self._handoff = None
            self._teardown(self._sock)
            return None

    def _turns(self) -> list[m.TaskResult] | None:
        """Turns, holding ``_io`` except while waiting; the results handed over, or None to stop."""
        sock, poller, completer, io = self._sock, self._poller, self._completer, self._io
        tick = min(self.config.heartbeat_interval / 4, 0.05)
        while True:
            timeout = tick * 1000 if self._pending_frames is None else 5
            if completer.unkicked:
                completer.kick()
            timeout = sock.poll_timeout(timeout)
            io.release()  # a user thread may send meanwhile (_send_directly)
            try:
                ready = poller.poll(timeout)
            finally:
                io.acquire()
            if sock.buffered and sock.pollable not in ready:
                self._receive()  # transmissions read earlier and not yet handled
            lane = self._lane
            if lane is not None and lane.buffered and lane.pollable not in ready:
                self._receive_lane()
            for target in ready:
                if target == sock.pollable:
                    self._receive()
                elif self._reply is not None and target == self._reply.fileno():
                    self._receive_replies()
                elif self._lane is not None and target == self._lane.pollable:  # (opened meanwhile, maybe)
                    self._receive_lane()
                else:
                    # Read, then clear: clearing first lets a wake() in between write, have
                    # its write consumed here, and leave the flag set on an empty eventfd,
                    # after which no wake() would ever write again (found by the benchmarks).
                    try:
                        os.eventfd_read(self._wake_fd)
                    except BlockingIOError:
                        pass
                    self._wake_pending = False
            now = time.monotonic()
            completer.check(now)
            if self.broken is None:
                self._check_daemon(now, self._started)
            if self.broken is not None:
                return None
            if self._welcomed:
                self._drain_outbox()
            if self._pending_frames is not None:
                self._retry_pending()
            elif now - self._last_send >= self._heartbeat_interval:
                self._send([m.Heartbeat(0, 0)])
            if self.shutdown_requested and not self.futures and self._pending_frames is None:
                if not any(item[0] == SUBMIT for item in self.outbox):
                    return None
            handoff = self._handoff
            if handoff is not None:
                self._handoff = None
                if self._complete_quietly(handoff):
                    continue  # a sequential caller's result (or a few): no thread but the callers woken
                if completer.hand_over():
                    return handoff
                completer.put_results(handoff)  # nobody idle after all: queue them

    def _hello(self) -> m.Hello:
        return m.Hello(
            m.Role.CLIENT,
            m.PROTOCOL_VERSION,
            python_version(),
            cloudpickle.__version__,
            __version__,
            self.name,
            os.getpid(),
            socket.gethostname(),
            0,
            {},
            [],
            self._reply_to,
        )

    def _send(self, batch: list[Any]) -> None:
        frames = codec.encode(batch)
        try:
            self._sock.send(frames)
            self._last_send = time.monotonic()
        except channel.Again:
            self._pending_frames = frames  # the daemon's queue is full: hold it, keep order

    def _retry_pending(self) -> None:
        assert self._pending_frames is not None
        try:
            self._sock.send(self._pending_frames)
        except channel.Again:
            return
        self._pending_frames = None
        self._last_send = time.monotonic()

    def _drain_outbox(self) -> None:
        if self._pending_frames is not None or not self.outbox:
            return
        outbox, base, unsent = self.outbox, self._base, self._unsent
        window = self.config.submit_window
        batch: list[Any] = []
        specs: list[m.TaskSpec] = []
        cancels: list[int] = []
        forced: list[int] = []
        flushed: list[threading.Event] = []
        while outbox:
            item = outbox[0]
            kind = item[0]
            if kind == SUBMIT:
                if self._unacked >= window or len(specs) >= MAX_TASKS_PER_TRANSMISSION:
                    break
                outbox.popleft()
                _, n, fn_id, options_id, flags, payload, deps, objects = item
                try:
                    unsent.remove(n)  # atomic: a cancel()'s own remove() or this one wins
                except KeyError:
                    continue  # cancelled on the spot: the daemon never hears of it
                specs.append(
                    m.TaskSpec(
                        base | n,
                        base | fn_id if fn_id else 0,
                        options_id,
                        flags,
                        payload,
                        [base | d for d in deps] if deps else [],
                        objects,
                        0,
                    )
                )
                if not flags & TaskFlags.REPLY_DIRECT:  # a sequential caller's task is never acked
                    self._unacked += 1
                continue
            outbox.popleft()
            if specs:
                batch.append(m.SubmitTasks(specs))
                specs = []
            if kind == CANCEL:
                cancels.append(base | item[1])
            elif kind == FORCE_CANCEL:
                forced.append(base | item[1])
            elif kind == REGISTER_FN:
                batch.append(m.RegisterFunction(base | item[1], item[2]))
            elif kind == RELEASE_FN:
                batch.append(m.ReleaseFunctions([base | item[1]]))
                if item[1] in self._lane_fns:
                    self._lane_release(item[1])
            elif kind == REGISTER_OPTIONS:
                batch.append(m.RegisterOptions(item[1], item[2]))
            elif kind == STATS:
                batch.append(m.StatsRequest())
            elif kind == SUBMIT_BATCH:
                # A graph: all its tasks in one SubmitTasks, so that the daemon links every
                # dependency before any result can release an intermediate.
                graph = [
                    m.TaskSpec(base | n, base | fn_id if fn_id else 0, options_id, flags, payload,
                               [base | d for d in deps] if deps else [], objects, 0)
                    for _, n, fn_id, options_id, flags, payload, deps, objects in item[1]
                ]
                self._unacked += len(graph)
                batch.append(m.SubmitTasks(graph))
            elif kind == PIN_OBJECTS:
                batch.append(m.PinObjects(item[1]))
            elif kind == RELEASE_OBJECTS:
                batch.append(m.ReleaseObjects(item[1]))
            elif kind == FETCH_OBJECTS:
                batch.append(m.ObjectRequest(item[1]))
            elif kind == FLUSHED:
                flushed.append(item[1])
        if specs:
            batch.append(m.SubmitTasks(specs))
        if cancels:
            batch.append(m.CancelTasks(cancels, False))
        if forced:
            batch.append(m.CancelTasks(forced, True))
        if batch:
            self._send(batch)
        for event in flushed:
            event.set()  # written, or held in order behind a full queue (_pending_frames)

    def _receive(self) -> None:
        sock = self._sock
        deadline = time.monotonic() + TURN_SECONDS
        for _ in range(RECV_BURST):
            if time.monotonic() > deadline:
                return  # the rest waits for the next turn
            if not sock.readable():
                return
            try:
                frames = sock.recv()
            except channel.Again:
                return
            self._last_recv = time.monotonic()
            try:
                messages, buffers = codec.decode(frames)
            except codec.DecodeError as exc:
                log.warning("client: dropped a bad transmission from the daemon: %s", exc)
                continue
            for message in messages:
                kind = type(message)
                if kind is m.TaskResults:
                    self._take_results(message.results)
                elif kind is m.TasksRunning:
                    if len(message.task_ids) <= RUNNING_INLINE:
                        self._mark_running(message.task_ids)  # runs no user code: no thread woken for it
                    else:
                        self._completer.put(RUNNING, message.task_ids)
                elif kind is m.SubmitAck:
                    self._unacked -= message.count
                elif kind is m.TasksCancelled:
                    self._on_cancel_answer(message)
                elif kind is m.Welcome:
                    self._welcomed = True
                    self._base = message.peer_id << m.TASK_ID_BITS
                    # The daemon judges our liveness by its settings, not ours.
                    self._heartbeat_interval = min(self.config.heartbeat_interval, message.heartbeat_interval)
                    self._attach_store(message.object_store)
                elif kind is m.ObjectData:
                    if self._fetch_waiters:
                        data = iter(buffers)
                        got = {oid: bytes(next(data)) for oid, ok in zip(message.object_ids, message.found) if ok}
                        waiter = self._fetch_waiters.popleft()
                        missing = [oid.hex() for oid, ok in zip(message.object_ids, message.found) if not ok]
                        if missing:
                            waiter.set_exception(LookupError(f"objects no longer in the store: {missing}"))
                        else:
                            waiter.set_result(got)
                elif kind is m.Stats:
                    if self._stats_waiters:
                        self._stats_waiters.popleft().set_result(dict(message.snapshot))
                elif kind is m.ClusterBroken:
                    self._break(_initializer_failed(message))
                elif kind is m.Refused:
                    self._break(DaemonLost(f"the daemon at {self.address} refused this client: {message.reason}"))
                elif kind is m.Goodbye:
                    self._break(DaemonLost(f"the daemon at {self.address} stopped ({message.reason})"))

    def _pick_up(self, future: TaskFuture[Any], timeout: float | None) -> float | None:
        """``future.result()`` of a sequential caller's task: read the reply socket on this
        thread; returns what is left of ``timeout``.

        The processor sends such a result to the reply socket (protocol/reply.py); read by
        the agent thread, it then had to wake this one, a thread wake-up in series on the
        round trip.  The waiting thread takes the socket from the agent's poller instead,
        and completes its future itself (done-callbacks, if any, still run on a pool thread).
        Only one thread at a time; a future completed any other way (the daemon's path,
        a cancel, a broken executor) wakes it through ``_pickup_fd``, and one that timed
        out gives the socket back.  It polls without sleeping for the first
        ``PICKUP_SPIN_SECONDS`` while results have been coming that fast.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        results: list[m.TaskResult] = []
        if self._pickup_lock.acquire(blocking=False):
            try:
                if not self._tearing and not self._closed and self._reply is not None:
                    results = self._await_reply(future, self._reply, deadline)
            finally:
                self._pickup_lock.release()
        for result in results:  # outside the lock: unpickling may run the user's code
            self._complete_result(result, quietly=True)  # done-callbacks still go to a pool thread
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _await_reply(self, future: TaskFuture[Any], sock: socket.socket, deadline: float | None) -> list[m.TaskResult]:
        """Results read from the reply socket once one arrives; [] if ``future`` was
        completed otherwise, the deadline passed or the agent is tearing down."""
        waiter = _PickupWaiter(self)
        with future._condition:  # type: ignore[attr-defined]
            if future.done():
                return []
            future._waiters.append(waiter)  # type: ignore[attr-defined]
        fd = sock.fileno()
        wanted = self._ids.get(id(future))
        started = time.monotonic()
        self._poller.unregister(fd)  # the agent thread stops watching it (epoll is thread-safe)
        self._picking = future  # only now: the socket is this thread's (tests wait for this)
        try:
            try:
                os.eventfd_read(self._pickup_fd)  # a wake-up meant for an earlier pick-up
            except BlockingIOError:
                pass
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            poll.register(self._pickup_fd, select.POLLIN)
            spin_until = started + PICKUP_SPIN_SECONDS if self._pickup_spin else started
            if deadline is not None:
                spin_until = min(spin_until, deadline)
            while not future.done() and not self._tearing:
                now = time.monotonic()
                if now < spin_until:
                    ready = poll.poll(0)
                    if not ready:
                        os.sched_yield()  # the daemon, worker or processor may be waiting for this CPU
                        continue
                elif deadline is None:
                    ready = poll.poll()
                else:
                    left = deadline - now
                    if left <= 0:
                        return []
                    ready = poll.poll(math.ceil(left * 1000))
                if any(ready_fd == fd for ready_fd, _ in ready):
                    results = self._read_replies(sock, wanted)
                    if results:
                        return results
            return []
        finally:
            # However the wait ended (a result either way, a timeout, a cancel): spin next
            # time only if this one was short enough for spinning to have paid.
            self._pickup_spin = _SPIN_WORTHWHILE and time.monotonic() - started <= PICKUP_SPIN_SECONDS
            self._picking = None
            with future._condition:  # type: ignore[attr-defined]
                if waiter in future._waiters:  # type: ignore[attr-defined]
                    future._waiters.remove(waiter)  # type: ignore[attr-defined]
            if not self._tearing:
                self._poller.register(fd)  # level-triggered: anything that came meanwhile wakes the agent

    def _wake_picker(self) -> None:
        with self._pickup_fd_lock:
            if self._pickup_fd >= 0:
                os.eventfd_write(self._pickup_fd, 1)

    def _read_replies(self, sock: socket.socket, wanted: int | None = None) -> list[m.TaskResult]:
        """Datagrams until none is left, or until one has the result of task ``wanted``
        (a caller picking up its own: one more ``recv`` would only fail, ~20 us of its
        round trip for the system call and the exception; the agent reads any rest)."""
        results: list[m.TaskResult] = []
        for _ in range(RECV_BURST):
            try:
                datagram = sock.recv(reply.DATAGRAM_LIMIT)
            except BlockingIOError:
                break
            try:
                result, lane = reply.decode(datagram)
            except codec.DecodeError as exc:  # only a bug sends one: the daemon has no copy to send
                log.error("client: dropped a bad result datagram (%d bytes): %s", len(datagram), exc)
                continue
            results.append(result)
            if lane and self._lane is None:
                self._open_lane(lane)
            if wanted is not None and result.task_id & TASK_MASK == wanted:
                break
        return results

    def _take_results(self, results: list[m.TaskResult]) -> None:
        if self._handoff is not None:
            self._handoff.extend(results)
        elif self._completer.idle:
            self._handoff = list(results)  # completed by this thread, after the turn
        else:
            self._completer.put_results(results)

    def _receive_replies(self) -> None:
        """Results that processors sent straight here (REPLY_DIRECT tasks) while no caller
        was picking them up itself."""
        assert self._reply is not None
        results = self._read_replies(self._reply)
        if results:
            self._take_results(results)

    def _attach_store(self, name: str) -> None:
        if name:
            try:
                from scaler_executor.objstore import ObjectStore

                self.store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
            except Exception as exc:  # another host: objects travel through the daemon
                log.debug("client cannot map the object store %s: %s", name, exc)
        self.store_ready.set()

    def _check_daemon(self, now: float, started: float) -> None:
        if self.cluster is not None:
            how = self.cluster.exit_status()
            if how is not None:
                self._break(DaemonLost(f"the embedded scaler-daemon exited unexpectedly ({how})"))
                return
        silence = now - self._last_recv
        if silence > self.config.daemon_loss_timeout:
            if self._welcomed:
                text = f"no message from the daemon at {self.address} for {silence:.1f} s (daemon_loss_timeout)"
            else:
                text = f"could not reach the daemon at {self.address} within {now - started:.1f} s (daemon_loss_timeout)"
            self._break(DaemonLost(text))

    def _break(self, exc: BaseException) -> None:
        with self.lock:
            if self.broken is not None:
                return
            self.broken = exc
            self.outbox.clear()
        log.debug("client broken: %s", exc)
        self._completer.put(FAIL_ALL, exc)

    def _teardown(self, sock: Any) -> None:
        if self.broken is None or not isinstance(self.broken, DaemonLost):
            try:
                sock.send(codec.encode([m.Goodbye("client shutting down")]))
            except channel.SendError:
                pass
        sock.close()
        with self._lane_lock:
            self._close_lane()
        if self._reply is not None:
            self._tearing = True
            self._wake_picker()
            with self._pickup_lock:  # a caller picking up leaves once woken
                self._reply.close()  # its file goes with the cluster's directory
            with self._pickup_fd_lock:
                os.close(self._pickup_fd)
                self._pickup_fd = -1
        if self.cluster is not None:
            self.cluster.stop()
        if self.store is not None:
            name = self.store.name
            try:
                self.store.close()  # the mapping stays while result views handed out live
                if self.cluster is not None:
                    # Our own cluster: if its daemon died before removing the region, we do.
                    from scaler_executor.objstore import ObjectStore

                    ObjectStore.unlink_name(name, tempfile.gettempdir())
            except Exception as exc:
                log.debug("closing the object store %s: %s", name, exc)
        self._completer.put(FAIL_ALL, DaemonLost("the executor shut down before these tasks finished"))
        self._completer.stop()
        with self._wake_lock:
            self._closed = True
            os.close(self._wake_fd)
        _live_agents.discard(self)
        self._finished.set()

    # ================================================================== completion threads

    def _complete_quietly(self, results: list[m.TaskResult]) -> bool:
        """Complete results on the agent thread when that can run no user code; False
        (nothing done) otherwise.

        A sequential caller's result (or the few that came together): handing the agent
        role over first cost a wake-up of another pool thread, which then competed with the
        caller for the interpreter lock (a few per cent of a no-op round trip, side by side
        in one process; about 80 us of CPU per result of a 12 ms task).  Only up to
        QUIET_RESULTS small results whose pickles look up no global (so unpickling calls
        nothing of the user's), with no store objects; done-callbacks are checked under
        the future's lock at the last step (``_set_quietly``).  Anything else is handed over.
        """
        if len(results) > QUIET_RESULTS:
            return False
        for result in results:
            if (
                result.status != Status.OK
                or result.objects
                or len(result.payload) > QUIET_PAYLOAD
                or ser.looks_up_globals(result.payload)
            ):
                return False
        for result in results:
            self._complete_result(result, quietly=True)
        return True

    def _set_quietly(self, future: Future[Any], ok: bool, value: Any) -> None:
        """Complete ``future`` unless that would run a done-callback here (the agent thread).

        Holding the future's lock (reentrant) across the check and ``set_result`` (or
        ``set_exception``, if unpickling failed) keeps ``add_done_callback`` from slipping
        one in between; a future that has callbacks is completed on a pool thread instead.
        """
        if future.settle_if_no_callbacks(ok, value):  # type: ignore[attr-defined]
            self._ids.pop(id(future), None)
            return
        self._completer.put(SET_RESULT, (future, ok, value))

    def _complete_result(self, result: m.TaskResult, quietly: bool = False) -> None:
        """Complete one future from its result (on a completion thread, where it runs its
        callbacks; or on the agent thread ``quietly``, see ``_complete_quietly``)."""
        n = result.task_id & TASK_MASK
        if result.status == Status.DEP_GONE:
            self._resubmit(n)
            return
        if self._lane_tasks:
            self._lane_tasks.pop(n, None)
        future = self.futures.pop(n, None)
        if future is None:
            return  # cancelled, or a late duplicate
        self._repack.pop(n, None)
        submitted = self._submitted.pop(n, 0.0)
        try:
            ok, value = self._outcome(result, submitted, future)
        except BaseException as exc:  # noqa: BLE001 - nothing may leave a future pending forever
            ok, value = False, ResultUnreadable(
                f"the client could not read the result of task {result.task_id:#x} "
                f"(status {result.status}): {exc!r}"
            )
            value.__cause__ = exc
        if ok is None:
            self._ids.pop(id(future), None)
            return  # cancelled, unrun (a dependency was cancelled)
        if quietly:
            self._set_quietly(future, ok, value)
            return
        settle(future, ok, value)
        # Only now: until the future is done, passing it as an argument must make a
        # dependency (reduce_future), never a "foreign future" error.
        self._ids.pop(id(future), None)

    def _outcome(self, result: m.TaskResult, submitted: float, future: Future[Any]) -> tuple[Any, Any]:
        """(ok, value) of a result for ``future``; (None, None) once it was cancelled here."""
        if result.status == Status.CANCELLED and future.cancel_now():  # type: ignore[attr-defined]
            return None, None  # a dependency was cancelled: so is this, unrun
        facts = result.facts
        if facts.worker:
            # A plain attribute on the future (built into a TaskInfo only when asked for):
            # a weak dictionary entry per task cost ~5% of the client's time at full rate.
            future._scaler_facts = (  # type: ignore[attr-defined]
                result.task_id, facts.worker, submitted, facts.started, facts.finished,
                result.attempt + 1, facts.peak_memory,
            )
        if result.objects:
            try:
                return True, self.load_value(result.payload, result.objects)
            except Exception as exc:
                exc.add_note(f"while reading the result of task {result.task_id:#x} from the object store")
                return False, exc
            finally:
                self.release_objects(result.objects)  # our views keep them alive as long as needed
        return ser.outcome(result.status, result.payload, result.task_id)

    def _mark_running(self, task_ids: list[int]) -> None:
        futures = self.futures
        for task_id in task_ids:
            future = futures.get(task_id & TASK_MASK)
            if future is not None:
                future.mark_running()  # type: ignore[attr-defined]

    def _fail_all(self, exc: BaseException) -> None:
        self._lane_tasks.clear()
        self._ids.clear()
        self._submitted.clear()
        self._repack.clear()
        self._unsent.clear()
        with self.lock:
            waits, self._cancel_waits = self._cancel_waits, {}
        for wait in waits.values():
            wait.event.set()  # no answer will come: cancel() returns False at once
        while self.futures:
            _, future = self.futures.popitem()
            settle(future, False, type(exc)(*exc.args) if exc.__cause__ is None else exc)
        for waiters in (self._stats_waiters, self._fetch_waiters):
            while waiters:
                try:
                    waiters.popleft().set_exception(type(exc)(*exc.args))  # type: ignore[attr-defined]
                except InvalidStateError:
                    pass


RESULTS, RUNNING, FAIL_ALL, AGENT, SET_RESULT = "results", "running", "fail-all", "agent", "set-result"
CANCELLED = "cancelled"
STUCK_SECONDS = 0.1  # a completion thread busy this long in one item is presumed in a slow callback
MAX_COMPLETION_THREADS = 32


class _Completer:
    """The client's thread pool: one thread holds the agent role, the others complete futures.

    The agent role (socket, heartbeats, outbox) is never held by a thread running user
    code: done-callbacks run only on threads that have handed the role on.

    * Work items are taken one at a time from a shared queue, so when a done-callback is
      slow, only its own future's item waits: the agent notices a thread stuck in one item
      (``check``) and starts another, which carries on with the rest.
    * Leader/follower hand-off: when results arrive while a pool thread is idle, the agent
      thread gives the role to that thread (``hand_over``) and completes the results
      itself, so a result reaches its waiting user thread without a wake-up of another
      thread in between (about 70 us of a no-op round trip on a 2-core machine).  Under
      load no thread is idle and results are queued as before.  The socket moves between
      threads only through this condition's lock, the memory barrier ZeroMQ asks for.
      A lone result that runs no user code to complete is not handed over at all
      (``ClientAgent._complete_quietly``).
    * Order within a future is kept: a result arriving before its RUNNING notice marks
      the future running itself.
    """

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.work: deque[tuple[str, Any]] = deque()
        self.cond = threading.Condition()
        self.busy: dict[int, float] = {}  # thread ident -> when it took its current item
        self.threads: list[threading.Thread] = []
        self.idle = 0  # threads waiting for work
        self.stopping = False
        self.unkicked = False  # results queued since the last notify

    def start(self) -> None:
        self._start_thread(agent_role=True)
        self._start_thread()

    def _start_thread(self, agent_role: bool = False) -> None:
        thread = threading.Thread(
            target=self._main, args=(agent_role,), name=f"scaler-client-{len(self.threads)}", daemon=True
        )
        self.threads.append(thread)
        thread.start()

    def put(self, kind: str, data: Any) -> None:
        self.work.append((kind, data))
        with self.cond:
            self.cond.notify()

    def put_results(self, results: list[m.TaskResult]) -> None:
        """Queue results; the agent calls ``kick`` once it is about to block.

        Woken earlier, a completion thread would only wait for the interpreter lock
        while the agent finishes its turn: kicked last, it runs as the agent blocks.
        """
        self.work.extend((RESULTS, r) for r in results)
        self.unkicked = True

    def kick(self) -> None:
        self.unkicked = False
        with self.cond:
            self.cond.notify()

    def hand_over(self) -> bool:
        """Give the agent role to an idle thread; False (keep it) if none is idle."""
        with self.cond:
            if not self.idle or self.stopping:
                return False
            self.work.appendleft((AGENT, None))
            self.cond.notify()
            return True

    def check(self, now: float) -> None:
        """Start another thread if work waits while every other thread is stuck in one item."""
        if not self.work or len(self.threads) >= MAX_COMPLETION_THREADS:
            return
        busy = list(self.busy.values())
        if len(busy) >= len(self.threads) - 1 and all(now - since > STUCK_SECONDS for since in busy):
            self._start_thread()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def join(self) -> None:
        for thread in list(self.threads):
            if thread is not threading.current_thread():
                thread.join()

    def _main(self, agent_role: bool) -> None:
        _block_signals()
        if agent_role:
            agent = self.agent
            try:
                agent._start()
            except Exception as exc:
                log.exception("client agent could not start")
                agent._break(BrokenScalerExecutor(f"the client agent could not start: {exc!r}"))
                self.stop()
                agent._finished.set()
            else:
                self._serve_as_agent()
        self._loop()

    def _serve_as_agent(self) -> None:
        me = threading.get_ident()
        handoff = self.agent._agent_turns()
        if handoff:  # the role went to another thread: complete what it took, as any item
            self.busy[me] = time.monotonic()
            try:
                for result in handoff:
                    self._complete(RESULTS, result)
            finally:
                del self.busy[me]

    def _complete(self, kind: str, data: Any) -> None:
        try:
            if kind == RESULTS:
                self.agent._complete_result(data)
            elif kind == RUNNING:
                self.agent._mark_running(data)
            elif kind == FAIL_ALL:
                self.agent._fail_all(data)
            elif kind == SET_RESULT:  # the agent thread found done-callbacks to run: here
                future, ok, value = data
                settle(future, ok, value)
                self.agent._ids.pop(id(future), None)
            elif kind == CANCELLED:  # the daemon dropped it after its canceller stopped waiting
                data.cancel_now()
        except BaseException:  # noqa: BLE001 - a bug (or SystemExit) must not end a thread that completes futures
            log.exception("client: failed to complete a future")

    def _loop(self) -> None:
        me = threading.get_ident()
        work = self.work
        while True:
            try:
                kind, data = work.popleft()
            except IndexError:
                with self.cond:
                    while not work and not self.stopping:
                        self.idle += 1
                        try:
                            self.cond.wait()
                        finally:
                            self.idle -= 1
                    if self.stopping and not work:
                        return
                continue
            if kind == AGENT:
                self._serve_as_agent()
                continue
            self.busy[me] = time.monotonic()
            try:
                self._complete(kind, data)
            finally:
                del self.busy[me]
                kind = data = None  # hold no result while waiting for the next item


class DependencyFailed(Exception):
    """Raised while pickling: a future passed as an argument failed; args[0] is its exception."""


NO_DEPS: list[int] = []
NO_OBJECTS: list[bytes] = []


class Pickled(NamedTuple):
    """A pickled call or value, ready to travel."""

    payload: bytes  # a plain pickle, or with flags PACKED an object-store header
    deps: list[int]  # tasks (futures) it refers to
    objects: list[bytes]  # store objects it refers to (its own buffers, ObjectRefs)
    flags: int  # TaskFlags.PACKED or 0
    created: list[bytes] = NO_OBJECTS  # objects written for it (freed if it is never sent)


class GraphBatch:
    """A graph's tasks, numbered as they are added and sent in one transmission by ``submit``.

    One transmission matters: the daemon handles a transmission at once, so every
    dependency of the graph is linked before any intermediate can finish — one that
    finished with no dependent linked yet would be forgotten.
    """

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent
        self.items: list[tuple[Any, ...]] = []

    def add(self, future: TaskFuture[Any] | None, fn_id: int, options_id: int, flags: int, pickled: Pickled) -> int:
        agent = self.agent
        n = next(agent._counter)
        if future is not None:
            agent.futures[n] = future
            agent._ids[id(future)] = n
            agent._submitted[n] = time.time()
            future._on_cancel = agent._cancel_hook
        self.items.append((SUBMIT, n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects))
        return n

    def submit(self) -> None:
        with self.agent.lock:
            self.agent.check_usable()
            self.agent.outbox.append((SUBMIT_BATCH, self.items))
        self.agent.wake()


class MapCache(dict):  # type: ignore[type-arg]
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
            ref: Any = weakref.ref(owner, lambda _r, key=key, oid=oid: self._gone(key, oid))
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
        return self._agent.load_value(self.header, self.object_ids)

    def __reduce__(self) -> Any:
        raise TypeError(
            "an ObjectRef is resolved when it is an argument of a task of its executor; "
            "it cannot be pickled on its own"
        )

    def __repr__(self) -> str:
        return f"<ObjectRef {len(self.object_ids)} object(s)>"


class _CallPickler(cloudpickle.Pickler):
    """cloudpickle, plus: futures of this executor become dependencies and ObjectRefs
    references, found in the same pass that pickles the call."""

    def __init__(self, file: io.BytesIO, agent: ClientAgent) -> None:
        super().__init__(file, protocol=5)
        self.agent = agent
        self.deps: list[int] = []
        self.objects: list[bytes] = []

    def reducer_override(self, obj: Any) -> Any:
        reduced = self.agent._reduce(obj, self.deps, self.objects)
        if reduced is not NotImplemented:
            return reduced
        return super().reducer_override(obj)


class _PickupWaiter:
    """A ``concurrent.futures`` waiter that wakes a thread in ``ClientAgent._pick_up``."""

    __slots__ = ("agent",)

    def __init__(self, agent: ClientAgent) -> None:
        self.agent = agent

    def add_result(self, future: Future[Any]) -> None:
        self.agent._wake_picker()

    add_exception = add_cancelled = add_result


class _AfterLane(Exception):
    """Raised while pickling a task whose argument is a running lane task's future."""


def settle(future: Future[Any], ok: bool, value: Any) -> None:
    """Complete ``future`` (PENDING or RUNNING) with a value or an exception; a future
    cancelled meanwhile stays cancelled."""
    if isinstance(future, TaskFuture):
        future.mark_running()
    elif not future.running() and not future.set_running_or_notify_cancel():
        return
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except InvalidStateError:
        pass  # cancelled before it was marked running


class _CancelWait:
    """The daemon's answer to cancels (``TasksCancelled``), awaited by the thread(s) that
    asked: one task's (``Future.cancel()``) or many's (``cancel_many``)."""

    __slots__ = ("lock", "event", "expected", "verdicts", "abandoned")

    def __init__(self, expected: int) -> None:
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.expected = expected
        self.verdicts: dict[int, bool] = {}
        self.abandoned = False

    def answer(self, n: int, verdict: bool) -> bool:
        """Record the daemon's verdict on task ``n``; True if no thread waits for it any
        more (the caller then cancels a dropped task's future itself)."""
        with self.lock:
            self.verdicts[n] = verdict
            if len(self.verdicts) >= self.expected:
                self.event.set()
            return self.abandoned

    def result(self, timeout: float, n: int, future: TaskFuture[Any]) -> bool:
        self.event.wait(timeout)
        with self.lock:
            verdict = self.verdicts.get(n)
            if verdict is None:
                self.abandoned = True  # a later answer cancels it on a pool thread
                return False
        return future.cancel_now() if verdict else False

    def results(self, timeout: float, asked: list[tuple[int, TaskFuture[Any]]]) -> None:
        if timeout > 0:
            self.event.wait(timeout)
        with self.lock:
            dropped = [future for n, future in asked if self.verdicts.get(n)]
            self.abandoned = True
        for future in dropped:
            future.cancel_now()


def _block_signals() -> None:
    """Keep process-directed signals (Ctrl-C's SIGINT above all) off this background thread.

    The kernel delivers such a signal to any thread that does not block it; one delivered
    here would not wake the main thread blocked in ``future.result()``, and Ctrl-C would
    seem to do nothing.
    """
    signal.pthread_sigmask(
        signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
    )


def _release_function(agent_ref: weakref.ref[ClientAgent], fn_id: int) -> None:
    agent = agent_ref()
    if agent is not None and agent.broken is None:
        agent.release_function(fn_id)


def _initializer_failed(message: m.ClusterBroken) -> InitializerFailed:
    error = InitializerFailed(f"{message.reason}; the executor is broken (as ProcessPoolExecutor's would be)")
    if message.payload:
        error.__cause__ = ser.rebuild_exception(message.payload)
    return error
