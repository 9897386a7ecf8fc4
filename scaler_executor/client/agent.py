"""The client agent: the background thread that owns the connection to the daemon.

::

    user thread(s)                      agent role (one pool thread)      other pool threads
    ──────────────                      ────────────────────────────      ──────────────────
    submit(): pickle (pickling.py),     drain core.outbox ─► SubmitTasks  Completer: results
      core.new_task + outbox item  ──►   (batched, submit window)         settled, callbacks
      (wakes the agent: eventfd)        recv: a handler per message  ───► run (completion.py)
    Future.cancel() ─ hook ─ cancel.py ►  TaskResults, TasksRunning,
      (asks the daemon, waits             TasksCancelled, ...
       ≤ cancel_wait: TasksCancelled)   heartbeats, daemon-loss timer
    result() on a lone task: reads the  routes.py: the daemon's connection, a
      reply inbox itself (pick-up)        worker's lane, the reply inbox

* What the client knows of its tasks is the pure core (``state.py``: one record per
  task, the outbox, the window, the registries); futures are settled only through
  ``completion.py``; the cancel contract is ``cancel.py``; the daemon's connection, the
  lane and the reply inbox are route objects (``routes.py``).  This module keeps the
  loop: polling, a handler per daemon message, draining the outbox, the lock order.
* Only the thread holding the agent role touches the socket, and it runs no user
  code while it holds it, so a slow done-callback delays no result and no heartbeat.
  (A user thread used to write a lone submit itself, beside the agent's poll; with the
  lanes on it was never taken, and measured with all other paths on its gain's interval
  included zero: removed, see docs/performance.rst.)
* Results read by the agent thread are completed on pool threads; a sequential caller
  picks its own up from the reply inbox.  Running notices for up to RUNNING_INLINE tasks
  are applied on the agent thread.
* The agent holds no reference to the executor; the executor's finalizer and the
  module's ``atexit`` hook are what shut it down.

Locks, outermost first: ``_io`` (the connection: held by the thread that has the agent
role while it has it; handing the role on releases it, and its release and acquire are
the memory barrier ZeroMQ asks for when a socket moves between threads) → ``lock`` (the core: records, outbox, registries, the shutdown and
broken flags; never held across I/O or user code) → ``ReplyInbox.pickup_lock`` →
``LaneRoute.lock`` → ``ReplyInbox.fd_lock`` (routes.py) → ``_wake_lock`` (the wake-up
descriptor, reentrant: the only one a finalizer takes).  Each is made with its rank
(``LOCK_RANK_*``, ``scaler_executor/_locks.py``), and the tests check the order.
The other locks of the client are leaves, taken after any of these and holding no other
lock while held (they guard a few fields and only notify): ``PendingLimit._cond``
(pending.py, taken under ``lock`` when the agent forgets its tasks), ``CancelWait.lock``
(completion.py), ``Completer.cond``, ``RemoteStore.lock`` (remote_store.py: no send under
it) and ``Forwarder.lock`` (forward.py).  They stay plain ``threading`` locks: a
``Condition`` needs its lock's own ownership test, which the ranked lock does not offer.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

from scaler_executor._compat import python_version
from scaler_executor._locks import ranked_lock
from scaler_executor._version import __version__
from scaler_executor.client import connect
from scaler_executor.client import serialization as ser
from scaler_executor.client.authkey import AuthkeyFile
from scaler_executor.client.cancel import Cancels
from scaler_executor.client.cluster import EmbeddedCluster
from scaler_executor.client.completion import (
    FAIL_ALL,
    RUNNING,
    Completer,
    Completion,
    settle,
)
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.no_worker import warn_no_worker
from scaler_executor.client.pending import PendingLimit
from scaler_executor.client.pickling import (
    AfterLane,
    DependencyFailed,
    GraphBatch,
    ObjectRef,
    Packer,
    Pickled,
)
from scaler_executor.client.remote_store import RemoteStore
from scaler_executor.client.resume import ClientResume
from scaler_executor.client.routes import DaemonRoute, LaneRoute, ReplyInbox
from scaler_executor.client.state import (
    FETCH_OBJECTS,
    FLUSHED,
    HISTORY,
    LANE,
    PARKED,
    PARTS_TAKEN,
    PIN_OBJECTS,
    RELEASE_FN,
    RELEASE_OBJECTS,
    SENT,
    STATS,
    TASK_MASK,
    UNSENT,
    ClientCore,
    TaskItem,
    TaskRecord,
)
from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import BrokenScalerExecutor, DaemonLost, InitializerFailed
from scaler_executor.protocol import channel
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming, StreamError
from scaler_executor.protocol.messages import TaskFlags, TaskOptions
from scaler_executor.protocol.rejoin import is_not_resumable, is_unknown_peer

if TYPE_CHECKING:
    from scaler_executor.scheduler.stats import Statistics

log = logging.getLogger("scaler_executor.client")

FLUSH_WAIT = 1.0  # seconds shutdown(cancel_futures=True) waits for the daemon's answer
RECV_BURST = 1024
TURN_SECONDS = 0.02  # most a turn spends receiving, so heartbeats and submissions still go out under floods
# Running notices for at most this many tasks are applied by the agent thread (marking a
# future running calls no callback); handing each to a pool thread woke it once per notice,
# about 80 us of CPU per task of 12 ms on the 2-core VM.  Larger ones go to the pool, so
# the agent thread is not held up by a long loop.
RUNNING_INLINE = 64

# The lock order of the module doc, as ranks (scaler_executor/_locks.py checks it in tests).
LOCK_RANK_IO, LOCK_RANK_CORE, LOCK_RANK_WAKE = 10, 20, 90
# Fast paths, each on by default; bench/fastpaths.py turns one off at a time to measure
# what it gains with all the others on (docs/performance.rst has the figures).
REPLY_INBOX = True  # the embedded client binds a reply socket (routes.ReplyInbox)
PICK_UP = True  # a caller waiting on a lone task reads the reply inbox itself

_live_agents: weakref.WeakSet[ClientAgent] = weakref.WeakSet()

Pack = Callable[[], tuple[int, int, Pickled]]


@atexit.register
def _shutdown_at_exit() -> None:
    """Interpreter exit acts as shutdown(wait=True): outstanding futures complete first."""
    for agent in list(_live_agents):
        agent.shutdown(wait=True)


class ClientAgent:
    def __init__(
        self, config: ClusterConfig, address: str, cluster: EmbeddedCluster | None, security: Any = None
    ) -> None:
        self.config = config
        self.security = security  # security.client.ClientSecurity on a secured tcp:// daemon
        self.address = address
        self.cluster = cluster
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.lock = ranked_lock("ClientAgent.lock", LOCK_RANK_CORE)  # the core, and the shutdown and broken flags
        self.core = ClientCore(config.submit_window)
        self.pending = self.core.pending = PendingLimit(
            config.max_pending_tasks,
            config.max_pending_bytes,
            block=config.pending_full == "block",
            own_thread=lambda: threading.current_thread() in self.completer.threads,
        )
        self.packer = Packer(self, config)
        self.completion = Completion(self)
        self.stats_waiters: deque[Future[Statistics]] = deque()
        self.history_waiters: deque[Future[m.History]] = deque()
        self.fetch_waiters: deque[Future[dict[bytes, bytes]]] = deque()
        self.remote_store: RemoteStore | None = None  # the daemon's store, when this host cannot map it
        self.incoming = Incoming()  # objects fetched from it that come in parts (protocol/chunks.py)
        self.shutdown_requested = False
        self.broken: BaseException | None = None
        self.welcome = threading.Event()  # set at the daemon's Welcome, or when the agent breaks first
        # A running daemon's: is anything still listening once it is silent (connect.py).
        self.listener = connect.ListenerProbe(address) if cluster is None else None
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_pending = False
        # Guards only the wake-up descriptor against its close.  Reentrant: wake() is
        # reached from finalizers (ObjectRef, MapCache, a cached function's release),
        # which a garbage collection may run on a thread that is inside wake() already.
        self._wake_lock = ranked_lock("ClientAgent._wake_lock", LOCK_RANK_WAKE, reentrant=True)
        self._io = ranked_lock("ClientAgent._io", LOCK_RANK_IO)  # the connection (see the module doc)
        self.lane = LaneRoute(self, config.worker_lanes, config.send_hwm)
        self.inbox: ReplyInbox | None = None  # processors' results of sequential tasks
        self.authkey: AuthkeyFile | None = None  # for processors on this host (client/authkey.py)
        self._closed = False
        self.finished = threading.Event()  # set once the agent role has torn the connection down
        self.cancels = Cancels(self)
        self.cancel_hook = self.cancels.request  # bound once, shared by every future
        self._pickup_hook = self._pick_up  # bound once, set on each sequential caller's future
        self._handlers: dict[type, Callable[[Any, list[Any]], None]] = {
            m.TaskResults: self._on_results,
            m.TasksRunning: self._on_running,
            m.SubmitAck: self._on_ack,
            m.TasksCancelled: self.cancels.answered,
            m.Welcome: self._on_welcome,
            m.ObjectData: self._on_object_data,
            m.ObjectPart: self._on_object_part,
            m.ObjectStored: self._on_object_stored,
            m.Stats: self._on_stats,
            m.History: self._on_history,
            m.ClusterBroken: self._on_cluster_broken,
            m.Refused: self._on_refused,
            m.Goodbye: self._on_goodbye,
            m.Heartbeat: self._on_heartbeat,
            m.TasksWithoutWorker: self._on_tasks_without_worker,
        }
        self.resume = ClientResume()  # a journaled daemon's restart (client/resume.py)
        self.completer = Completer(self)
        self.completer.start()  # its first thread takes the agent role
        _live_agents.add(self)

    @property
    def store(self) -> Any:
        return self.packer.store

    @property
    def store_ready(self) -> threading.Event:
        return self.packer.store_ready

    # ================================================================== user-thread side

    def wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            with self._wake_lock:
                if not self._closed:
                    os.eventfd_write(self._wake_fd, 1)

    def check_usable(self) -> None:
        if self.broken is not None:
            if isinstance(self.broken, BrokenScalerExecutor):
                raise type(self.broken)(*self.broken.args)
            raise BrokenScalerExecutor(str(self.broken))
        if self.shutdown_requested:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options_id: int, flags: int = 0
    ) -> Future[Any]:
        self.check_usable()
        future: TaskFuture[Any] = TaskFuture()
        packer = self.packer

        def pack() -> tuple[int, int, Pickled]:
            if ser.is_cacheable(fn):
                return self.function_id(fn), TaskFlags.CALL | flags, packer.pickle_args(args, kwargs)
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
                self._enqueue(future, fn_id, options_id, flags, pickled, pack if pickled.deps else None, size)
            except BaseException:
                self.pending.free(size)
                raise
        except BaseException:
            self.packer.discard_created(pickled)
            raise
        return future

    def _enqueue(
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
            self.check_usable()
            alone = not core.records
            record = core.new_task(future, UNSENT, time.time())
            record.charge = charge
            if repack is not None:
                record.repack = (repack, options_id)
            if alone:
                flags |= TaskFlags.REPLY_DIRECT  # a sequential caller's: its result may come straight back
                if self.inbox is not None and PICK_UP:
                    future._pickup = self._pickup_hook
            item = TaskItem(record.n, fn_id, options_id, flags | pickled.flags, pickled.payload, pickled.deps, pickled.objects)
            future._on_cancel = self.cancel_hook
            if alone and self.lane.open and options_id == 0 and not pickled.deps and not pickled.objects:
                record.where = LANE
                if self.lane.submit(record, item):
                    future.mark_running()  # (unless its result was read, and completed it, already)
                    return
            core.queue(record, item)
        self.wake()

    def _park(self, future: TaskFuture[Any], pack: Pack, options_id: int, note: Callable[[], str], lane_future: Future[Any]) -> None:
        """A task with an argument that is a running lane task's future (or one of a task
        parked like this): the daemon never held that task, so this one waits here,
        outstanding and PENDING, and is pickled again (the value inlined) and sent once
        that future is done."""
        with self.lock:
            self.check_usable()
            record = self.core.new_task(future, PARKED, time.time())
        future._on_cancel = self.cancel_hook
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
        self.wake()

    def graph_batch(self) -> GraphBatch:
        """Collects a graph's tasks, to send them in one transmission (see GraphBatch)."""
        self.check_usable()
        return GraphBatch(self)

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
        self.wake()

    def _submit_again(self, record: TaskRecord) -> None:
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

    # ------------------------------------------------------------------ registries and objects

    def function_id(self, fn: Callable[..., Any]) -> int:
        """The id of a cached plain function, registering it with the cluster on first use."""
        fn_id = self.core.fn_cache.get(fn)
        if fn_id is not None:
            return fn_id
        payload = ser.dumps(fn)
        with self.lock:
            fn_id, new = self.core.function_id(fn, payload)
        if new:
            weakref.finalize(fn, _release_function, weakref.ref(self), fn_id).atexit = False
        return fn_id

    def register_function(self, fn: Callable[..., Any], owner: object) -> int:
        """Register ``fn`` for as long as ``owner`` lives (one ``map`` call)."""
        payload = ser.dumps(fn)
        with self.lock:
            self.check_usable()
            fn_id = self.core.register_function(payload)
        weakref.finalize(owner, _release_function, weakref.ref(self), fn_id).atexit = False
        return fn_id

    def release_function(self, fn_id: int) -> None:
        """(Possibly from a finalizer: no lock but the wake-up's) the callable is gone."""
        self.core.fn_payloads.pop(fn_id, None)
        if self.shutdown_requested and not self.core.records:
            return
        self.core.outbox.append((RELEASE_FN, fn_id))
        self.wake()

    def options_id(self, options: TaskOptions) -> int:
        with self.lock:
            options_id, _ = self.core.options_id(options)
        return options_id

    def put(self, value: Any) -> ObjectRef:
        return self.packer.put(value)

    def pin_objects(self, object_ids: list[bytes]) -> None:
        self.core.outbox.append((PIN_OBJECTS, object_ids))
        self.wake()

    def release_objects(self, object_ids: list[bytes]) -> None:
        """(Possibly from a finalizer: no lock but the wake-up's.)"""
        if self.broken is None and not self._closed:
            self.core.outbox.append((RELEASE_OBJECTS, object_ids))
            self.wake()

    def fetch_objects(self, object_ids: list[bytes]) -> dict[bytes, bytes]:
        """The bytes of store objects, through the daemon (for a client on another host)."""
        future: Future[dict[bytes, bytes]] = Future()
        with self.lock:
            self.check_usable()
            self.fetch_waiters.append(future)
            self.core.outbox.append((FETCH_OBJECTS, object_ids))
        self.wake()
        return future.result()

    def request_stats(self) -> Future[Statistics]:
        future: Future[Statistics] = Future()
        with self.lock:
            self.check_usable()
            self.stats_waiters.append(future)
            self.core.outbox.append((STATS, None))
        self.wake()
        return future

    def request_history(self) -> Future[m.History]:
        """The daemon's history of the run (recent task runs, the coarse series): ex.report."""
        future: Future[m.History] = Future()
        with self.lock:
            self.check_usable()
            self.history_waiters.append(future)
            self.core.outbox.append((HISTORY, None))
        self.wake()
        return future

    # ------------------------------------------------------------------ shutdown

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # No lock: the executor's finalizer calls this, maybe on a thread inside the lock.
        # The agent decides to stop under the lock (_turns) and _enqueue checks the flag
        # under it, so a submit racing this either lands before the agent stops or raises.
        self.shutdown_requested = True
        self.pending.close()  # a submit waiting for room raises (after shutdown) instead
        own = threading.current_thread() in self.completer.threads
        if cancel_futures:
            # All pending tasks asked of the daemon in one message; returns once it
            # answered, so a task cancelled here is never dispatched because a result
            # freed a processor first, and every cancelled future is notified.
            self.cancels.many([r.future for r in list(self.core.records.values())], FLUSH_WAIT)
            flushed = threading.Event()
            self.core.outbox.append((FLUSHED, flushed))
            self.wake()
            daemon = getattr(self, "daemon", None)
            if daemon is not None and daemon.welcomed and not own:
                deadline = time.monotonic() + FLUSH_WAIT
                while not flushed.wait(0.02) and not self.finished.is_set() and time.monotonic() < deadline:
                    pass
        self.wake()
        if wait and not own:
            self.finished.wait()
            self.completer.join()

    @property
    def outstanding(self) -> int:
        return len(self.core.records)

    # ================================================================== agent thread

    def start(self) -> None:
        """Connect and say Hello (on the pool thread that first takes the agent role)."""
        daemon = DaemonRoute(self.address, self.config.send_hwm, self.config.heartbeat_interval, self.security)
        self._poller = poller = channel.Poller()
        poller.register(daemon.pollable)
        poller.register(self._wake_fd)
        # Not under a journal: a task must reach the daemon, which journals it, not a lane.
        if self.cluster is not None and REPLY_INBOX and not self.config.journal:
            self.inbox = ReplyInbox.bind(self.cluster.directory, poller, self._open_lane)
        self.authkey = AuthkeyFile.reserve(self.cluster.directory if self.cluster is not None else None)
        self.daemon = daemon
        daemon.send([self._hello()])
        self.authkey.write()  # before any task is sent: this thread sends them
        if self.cluster is not None:
            # The store's module now, while our daemon starts (~100 ms): its Welcome names
            # the store, which _on_welcome maps before the first task goes out, and the
            # import there (~4 ms alone, ~11 ms in a cold start) delayed the first result.
            import scaler_executor.objstore  # noqa: F401

    def _open_lane(self, path: str) -> None:
        if not self.lane.open and self.inbox is not None:
            self.lane.connect(path, self.inbox.path, self._poller, self._closed)

    def agent_turns(self) -> None:
        """The agent's loop, on the pool thread that holds the agent role, until the
        connection is torn down."""
        with self._io:
            try:
                self._turns()
            except Exception as exc:  # a bug here must fail futures, not leave them hanging
                log.exception("client agent failed")
                self.break_with(BrokenScalerExecutor(f"the client agent failed: {exc!r}"))
            self._teardown()

    def _turns(self) -> None:
        """Turns, holding ``_io``, until it is time to stop."""
        daemon, poller, completer = self.daemon, self._poller, self.completer
        tick = min(self.config.heartbeat_interval / 4, 0.05)
        while True:
            timeout = tick * 1000 if daemon.pending is None else 5
            if completer.unkicked:
                completer.kick()
            timeout = daemon.poll_timeout(timeout)
            ready = poller.poll(timeout)
            self._serve(ready)
            now = time.monotonic()
            completer.check(now)
            if self.broken is None:
                self._check_daemon(now)
            if self.broken is not None:
                return
            if daemon.welcomed:
                self._drain_outbox()
                if self.resume.journal and self.resume.ack_due(now, daemon.heartbeat_interval):
                    daemon.send([self.resume.ack(now)])
                if self.remote_store is not None and daemon.pending is None:
                    self.remote_store.send_pending(daemon)  # a put's chunks, after what it depends on
            if daemon.pending is not None:
                daemon.retry()
            elif daemon.heartbeat_due(now):
                daemon.send([m.Heartbeat(0, 0)])
            if self.shutdown_requested and daemon.pending is None:
                with self.lock:
                    if not self.core.records and not self.core.has_tasks_to_send():
                        return

    def _serve(self, ready: list[Any]) -> None:
        """Read whatever the poll found ready (and what was read earlier, still buffered)."""
        daemon, lane, inbox = self.daemon, self.lane.dealer, self.inbox
        if daemon.buffered and daemon.pollable not in ready:
            self._receive()  # transmissions read earlier and not yet handled
        if lane is not None and lane.buffered and lane.pollable not in ready:
            self._receive_lane()
        for target in ready:
            if target == daemon.pollable:
                self._receive()
            elif inbox is not None and target == inbox.fd:
                results = inbox.read()
                if results:
                    self._take_results(results)
            elif self.lane.dealer is not None and target == self.lane.dealer.pollable:  # (opened meanwhile, maybe)
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

    def _receive_lane(self) -> None:
        results, again = self.lane.receive(self._poller)
        for record in again:
            self._submit_again(record)
        pins = [oid for r in results for oid in r.objects]
        if pins:
            # Made by the processor for us, unknown to the daemon: held for us from now on,
            # released (ReleaseObjects, after this in the outbox) once read.
            self.core.outbox.append((PIN_OBJECTS, pins))
        if results:
            self._take_results(results)

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
            self.inbox.path if self.inbox is not None else "",
            self.authkey.path if self.authkey is not None else "",
        )

    def _drain_outbox(self) -> None:
        while self.daemon.pending is None and self.core.outbox:
            with self.lock:
                batch, flushed = self.core.drain()
                more = self.core.more_to_drain  # a full transmission: the rest in the next one
            for message in batch:
                if type(message) is m.ReleaseFunctions:
                    self.lane.release(message.fn_ids[0] & TASK_MASK)
            if batch:
                self.daemon.send(batch)
            for event in flushed:
                event.set()  # written, or held in order behind a full queue (DaemonRoute.pending)
            if not more:
                return

    def _receive(self) -> None:
        handlers = self._handlers
        for messages, buffers in self.daemon.receive(TURN_SECONDS):
            for message in messages:
                handler = handlers.get(type(message))
                if handler is None:
                    log.warning("client: dropped a %s from the daemon", type(message).__name__)
                    continue
                handler(message, buffers)

    # ------------------------------------------------------------------ the daemon's messages

    def _on_results(self, message: m.TaskResults, _buffers: list[Any]) -> None:
        if self.core.sent_unacked is None or not self.resume.refused(self.core, message.results):
            self.resume.received += 1  # (refusals for a full journal are not counted: never kept)
        if self.core.sent_unacked is not None:
            for result in message.results:
                if result.objects and not result.delivered:  # held for us until we read it
                    self.core.count_holds(result.objects, 1)
        self._take_results(message.results)

    def _on_running(self, message: m.TasksRunning, _buffers: list[Any]) -> None:
        if len(message.task_ids) <= RUNNING_INLINE:
            self.completion.mark_running(message.task_ids)  # runs no user code: no thread woken for it
        else:
            self.completer.put(RUNNING, message.task_ids)

    def _on_ack(self, message: m.SubmitAck, _buffers: list[Any]) -> None:
        self.core.acknowledged(message.count)

    def _on_welcome(self, message: m.Welcome, _buffers: list[Any]) -> None:
        resumed = self.resume.welcomed(message)
        if message.journal and self.core.sent_unacked is None:
            self.core.sent_unacked = deque()
        if resumed:
            log.warning("client: resumed with the daemon at %s after its restart", self.address)
            with self.lock:
                report = self.resume.report(self.core)
            self.daemon.send([report])  # before anything the outbox holds
            if message.object_store != getattr(self.packer.store, "name", message.object_store):
                self._attach_store(message.object_store)  # (objects in the old region are gone)
        self.daemon.welcomed = True
        self.welcome.set()
        if self.listener is not None:
            self.listener.welcomed(message.heartbeat_interval)
        self.core.base = message.peer_id << m.TASK_ID_BITS
        # The daemon judges our liveness by its settings, not ours.
        self.daemon.heartbeat_interval = min(self.config.heartbeat_interval, message.heartbeat_interval)
        self._attach_store(message.object_store)

    def _on_object_part(self, message: m.ObjectPart, buffers: list[Any]) -> None:
        self.incoming.part(message, buffers[0] if buffers else b"")
        self.core.outbox.append((PARTS_TAKEN, 1))  # the daemon's window moves on

    def _on_object_data(self, message: m.ObjectData, buffers: list[Any]) -> None:
        data = iter(buffers)
        got: dict[bytes, Any] = {}
        failed: BaseException | None = None
        for oid, ok in zip(message.object_ids, message.found, strict=False):
            if ok:
                try:
                    # bytes, views of large frames (wire.recv) or of what came in parts: not copied here
                    got[oid] = self.incoming.take(oid, next(data, b""))
                except StreamError as exc:
                    failed = exc
        if self.fetch_waiters:
            waiter = self.fetch_waiters.popleft()
            missing = [oid.hex() for oid, ok in zip(message.object_ids, message.found, strict=False) if not ok]
            if failed is not None:
                waiter.set_exception(failed)
            elif missing:
                waiter.set_exception(LookupError(f"objects no longer in the store: {missing}"))
            else:
                waiter.set_result(got)

    def _on_object_stored(self, message: m.ObjectStored, _buffers: list[Any]) -> None:
        if self.remote_store is not None:
            self.remote_store.stored(message)

    def _on_stats(self, message: m.Stats, _buffers: list[Any]) -> None:
        if self.stats_waiters:
            # Imported when first asked for: no start-up cost for a client that never asks.
            from scaler_executor.scheduler.stats import Statistics

            self.stats_waiters.popleft().set_result(Statistics.from_message(message))

    def _on_history(self, message: m.History, _buffers: list[Any]) -> None:
        if self.history_waiters:
            self.history_waiters.popleft().set_result(message)

    def _on_cluster_broken(self, message: m.ClusterBroken, _buffers: list[Any]) -> None:
        self.break_with(_initializer_failed(message))

    def _on_refused(self, message: m.Refused, _buffers: list[Any]) -> None:
        if is_unknown_peer(message.reason) and not is_not_resumable(message.reason) and self.resume.journal:
            # Policy (d): the daemon restarted on its journal; the refusals of what we sent
            # before our Resume follow it, and are ignored.
            if not self.resume.resuming:
                log.warning("client: the daemon at %s restarted; resuming on its journal", self.address)
                self.daemon.welcomed = False  # the outbox waits for its Welcome
                self.daemon.send([self.resume.start(time.monotonic())])
            return
        if is_not_resumable(message.reason):
            self.break_with(DaemonLost(
                f"the daemon at {self.address} restarted and cannot resume this client ({message.reason}); "
                "its pending tasks are lost"
            ))
            return
        if is_unknown_peer(message.reason):  # policy (c) of protocol/rejoin.py: its tasks are gone
            self.break_with(DaemonLost(
                f"the daemon at {self.address} no longer knows this client: it restarted without a "
                f"journal, or dropped the client after client_timeout; its pending tasks are lost"
            ))
            return
        self.break_with(DaemonLost(f"the daemon at {self.address} refused this client: {message.reason}"))

    def _on_goodbye(self, message: m.Goodbye, _buffers: list[Any]) -> None:
        self.break_with(DaemonLost(f"the daemon at {self.address} stopped ({message.reason})"))

    def _on_heartbeat(self, message: m.Heartbeat, _buffers: list[Any]) -> None:
        pass  # any message counts: DaemonRoute.last_recv is set for each transmission

    def _on_tasks_without_worker(self, message: m.TasksWithoutWorker, _buffers: list[Any]) -> None:
        warn_no_worker(message, self.address, self.cluster is not None)

    # ------------------------------------------------------------------ results

    def _pick_up(self, future: TaskFuture[Any], timeout: float | None) -> float | None:
        """``future.result()`` of a sequential caller's task: read the reply inbox on this
        thread (routes.py) and complete what came there; returns what is left of ``timeout``.
        Done-callbacks, if any, still run on a pool thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        inbox, record = self.inbox, getattr(future, "_record", None)
        if inbox is not None and record is not None and not self._closed:
            for result in inbox.pick_up(future, timeout, record.n):
                self.lane.delivered(result.task_id & TASK_MASK)
                self.completion.complete(result, quietly=True)  # outside the inbox's locks
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _take_results(self, results: list[m.TaskResult]) -> None:
        lane = self.lane
        if lane.tasks:
            for result in results:
                lane.delivered(result.task_id & TASK_MASK)
        self.completer.put_results(results)

    def _attach_store(self, name: str) -> None:
        if name:
            try:
                from scaler_executor.objstore import ObjectStore

                self.packer.store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
            except Exception as exc:  # noqa: BLE001 - another host: objects travel through the daemon
                log.info("client cannot map the object store %s (%s): objects travel over the network", name, exc)
                self.remote_store = self.packer.store = RemoteStore(self, name)
        self.packer.store_ready.set()

    # ------------------------------------------------------------------ the end

    def _check_daemon(self, now: float) -> None:
        if self.cluster is not None:
            how = self.cluster.exit_status()
            if how is not None and self.config.journal and not self.shutdown_requested:
                refused = self.cluster.restart(now)  # its workers wait for it (client/cluster.py)
                if refused is None:
                    log.warning("client: the embedded scaler-daemon exited (%s); restarted it on its journal", how)
                    return
                self.break_with(DaemonLost(f"the embedded scaler-daemon exited ({how}): {refused}"))
                return
            if how is not None:
                self.break_with(DaemonLost(f"the embedded scaler-daemon exited unexpectedly ({how})"))
                return
        daemon = self.daemon
        resume = self.resume
        if resume.resuming:
            if resume.again_due(now):  # no Welcome yet: that daemon died too, say
                daemon.send([resume.start(now)])
        elif not daemon.welcomed and self.cluster is None:
            if now - daemon.started > self.config.connect_timeout:  # no answer to the first Hello
                self.break_with(DaemonLost(connect.no_welcome(self.address, now - daemon.started)))
            return
        silence = now - daemon.last_recv
        listener = self.listener
        # A journaled daemon may be down for its restart: refused connections are expected
        # then, for its grace period (connect.py's ListenerProbe is asked after it).
        waited = resume.silence_limit(daemon.heartbeat_interval)
        if listener is not None and silence > max(listener.silent_after, waited):
            gone = listener.check(now)  # refused: the daemon is gone, not slow (connect.py)
            if gone is not None:
                self.break_with(DaemonLost(f"the daemon at {self.address} is gone (it died or was stopped): no message for {silence:.1f} s, and {gone}"))
                return
        elif listener is not None:
            listener.quiet()
        if silence > max(self.config.daemon_loss_timeout, waited):
            if daemon.welcomed or resume.resuming:
                text = f"no message from the daemon at {self.address} for {silence:.1f} s (daemon_loss_timeout)"
            else:
                text = f"could not reach the daemon at {self.address} within {now - daemon.started:.1f} s (daemon_loss_timeout)"
            self.break_with(DaemonLost(text))

    def break_with(self, exc: BaseException) -> None:
        with self.lock:
            if self.broken is not None:
                return
            self.broken = exc
            self.core.outbox.clear()
        log.debug("client broken: %s", exc)
        if self.remote_store is not None:
            self.remote_store.fail_all(exc)
        self.welcome.set()  # a constructor waiting for the Welcome raises this
        self.completer.put(FAIL_ALL, exc)

    def _teardown(self) -> None:
        self.incoming.clear()  # objects half-received from the daemon: their buffers go now
        self.daemon.close(goodbye=self.broken is None or not isinstance(self.broken, DaemonLost))
        self.lane.close(self._poller)
        if self.listener is not None:
            self.listener.close()
        if self.inbox is not None:
            self.inbox.close()
        if self.cluster is not None:
            self.cluster.stop()
        if self.authkey is not None:
            self.authkey.close()
        store = self.packer.store
        if store is not None:
            name = store.name
            try:
                store.close()  # the mapping stays while result views handed out live
                if self.cluster is not None:
                    # Our own cluster: if its daemon died before removing the region, we do.
                    from scaler_executor.objstore import ObjectStore

                    ObjectStore.unlink_name(name, tempfile.gettempdir())
            except Exception as exc:  # noqa: BLE001 - closing is best effort; the process may exit next
                log.debug("closing the object store %s: %s", name, exc)
        self.completer.put(FAIL_ALL, DaemonLost("the executor shut down before these tasks finished"))
        self.completer.stop()
        with self._wake_lock:
            self._closed = True
            os.close(self._wake_fd)
        _live_agents.discard(self)
        self.finished.set()


def _release_function(agent_ref: weakref.ref[ClientAgent], fn_id: int) -> None:
    agent = agent_ref()
    if agent is not None and agent.broken is None:
        agent.release_function(fn_id)


def _initializer_failed(message: m.ClusterBroken) -> InitializerFailed:
    error = InitializerFailed(f"{message.reason}; the executor is broken (as ProcessPoolExecutor's would be)")
    if message.payload:
        error.__cause__ = ser.rebuild_exception(message.payload)
    return error
