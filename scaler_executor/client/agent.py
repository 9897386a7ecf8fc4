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
  task, the outbox, the window, the registries).  Everything that happens goes in as an
  event (``events.py``: submits, cancels and the daemon's answers, results, notices,
  acknowledgements, lanes opened and lost, ticks, the daemon's loss) and comes out as
  commands, which the shell executes (``execute`` here; futures are settled only
  through ``completion.py``).  The cancel side is ``cancel.py``; the submit path is
  ``submit.py``; the daemon's messages are handled in ``inbound.py``; the watchdog over
  the daemon is ``watchdog.py``.  The daemon's connection, the lane and the reply inbox
  are route objects with one interface (``routes.Route``).  This module keeps the loop,
  shaped like ``scheduler/loop.py``: poll, serve each ready route (``_serve``), tick the
  core and send what it says (``_tick``); and the lock order.
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
The modules split out of this one keep it: ``submit.py`` and ``completion.py`` take
``lock`` (never across pickling or user code), ``inbound.py``'s handlers and
``watchdog.py`` run on the agent thread holding ``_io`` and take ``lock`` after it.
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
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed

from scaler_executor._compat import python_version
from scaler_executor._locks import ranked_lock
from scaler_executor._version import __version__
from scaler_executor.client import connect
from scaler_executor.client import serialization as ser
from scaler_executor.client import submit as submit_module
from scaler_executor.client.authkey import AuthkeyFile
from scaler_executor.client.cancel import Cancels
from scaler_executor.client.cluster import EmbeddedCluster
from scaler_executor.client.completion import (
    CANCELLED,
    FAIL_ALL,
    Completer,
    Completion,
)
from scaler_executor.client.events import (
    AnswerCancel,
    AwaitAnswer,
    Command,
    DaemonLost,
    Discard,
    Fail,
    FailAll,
    FailTasks,
    FunctionReleased,
    KillOnLane,
    LaneLost,
    LaneOpened,
    MarkRunning,
    NotifyCancelled,
    Posted,
    ReleaseOnLane,
    Resend,
    SendDownLane,
    SendToDaemon,
    SetFlushed,
    Settle,
    Tick,
    Wake,
)
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.inbound import DaemonMessages, ObjectsFetch
from scaler_executor.client.pending import PendingLimit
from scaler_executor.client.pickling import (
    GraphBatch,
    ObjectRef,
    Packer,
    Pickled,
)
from scaler_executor.client.pushed import PushedResults
from scaler_executor.client.remote_store import RemoteStore
from scaler_executor.client.routes import DaemonRoute, LaneRoute, ReplyInbox, Route
from scaler_executor.client.state import (
    FETCH_OBJECTS,
    FLUSHED,
    HISTORY,
    PIN_OBJECTS,
    RELEASE_OBJECTS,
    STATS,
    ClientCore,
    TaskRecord,
)
from scaler_executor.client.submit import Submitter
from scaler_executor.client.watchdog import check_daemon
from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import BrokenScalerExecutor
from scaler_executor.exceptions import DaemonLost as DaemonLostError
from scaler_executor.protocol import channel
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming, Parts
from scaler_executor.protocol.messages import TaskOptions

if TYPE_CHECKING:
    from scaler_executor.scheduler.stats import Statistics

log = logging.getLogger("scaler_executor.client")

FLUSH_WAIT = 1.0  # seconds shutdown(cancel_futures=True) waits for the daemon's answer

# The lock order of the module doc, as ranks (scaler_executor/_locks.py checks it in tests).
LOCK_RANK_IO, LOCK_RANK_CORE, LOCK_RANK_WAKE = 10, 20, 90
# Fast paths, each on by default; bench/fastpaths.py turns one off at a time to measure
# what it gains with all the others on (docs/performance.rst has the figures).
REPLY_INBOX = True  # the embedded client binds a reply socket (routes.ReplyInbox)

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
        self.fetch_waiters: deque[ObjectsFetch] = deque()  # in the order asked, as the daemon answers
        self.remote_store: RemoteStore | None = None  # the daemon's store, when this host cannot map it
        # objects fetched from it that come in parts (protocol/chunks.py), read as they come
        self.incoming = Incoming(keep_parts=True, started=self._object_started)
        self.pushed = PushedResults()  # large results the daemon forwards as they come (client/pushed.py)
        self.shutdown_requested = False
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
        # Bound once, shared by every future (the core sets them on new tasks' futures).
        self.cancel_hook = self.core.cancel_hook = self.cancels.request
        self._pickup_hook = self._pick_up  # on each sequential caller's future, once the inbox is bound
        self.resume = self.core.resume  # a journaled daemon's restart (client/resume.py)
        self.messages = DaemonMessages(self)  # a handler per message of the daemon (inbound.py)
        # The submit path (submit.py), called through these names by the executor and
        # completion.py (bound once: no extra call on the hot path).
        self.submitter = submitter = Submitter(self)
        self.submit = submitter.submit
        self.submit_with = submitter.submit_with
        self.submit_plain = submitter.submit_plain
        self.resend = submitter.resend
        self.completer = Completer(self)
        self.completer.start()  # its first thread takes the agent role
        _live_agents.add(self)

    @property
    def broken(self) -> BaseException | None:
        """Why the executor broke (the core's ``DaemonLost``), or None."""
        return self.core.broken

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
        broken = self.core.broken  # (not the property: this runs twice per submit)
        if broken is not None:
            if isinstance(broken, BrokenScalerExecutor):
                raise type(broken)(*broken.args)
            raise BrokenScalerExecutor(str(broken))
        if self.shutdown_requested:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def graph_batch(self) -> GraphBatch:
        """Collects a graph's tasks, to send them in one transmission (see GraphBatch)."""
        self.check_usable()
        return GraphBatch(self)

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
        self.execute(self.core.handle(FunctionReleased(fn_id, self.shutdown_requested)))

    def options_id(self, options: TaskOptions) -> int:
        with self.lock:
            options_id, _ = self.core.options_id(options)
        return options_id

    def put(self, value: Any) -> ObjectRef:
        return self.packer.put(value)

    def pin_objects(self, object_ids: list[bytes]) -> None:
        self.execute(self.core.handle(Posted(PIN_OBJECTS, object_ids)))

    def release_objects(self, object_ids: list[bytes]) -> None:
        """(Possibly from a finalizer: no lock but the wake-up's.)"""
        if self.pushed.streams:
            self.pushed.forget(object_ids)
        if self.broken is None and not self._closed:
            self.execute(self.core.handle(Posted(RELEASE_OBJECTS, object_ids)))

    def fetch_objects(self, object_ids: list[bytes]) -> dict[bytes, Any]:
        """The bytes of store objects, through the daemon (for a client on another host)."""
        return self._fetch(ObjectsFetch(None), object_ids).result()

    def fetch_stream(self, object_id: bytes) -> Any:
        """One store object through the daemon, to be read once as a stream: its ``Parts`` as
        soon as its first part is here (their reader waits for the rest, so unpickling
        overlaps the transfer), or its bytes if it came whole. Raises what the fetch raises."""
        fetch = self._fetch(ObjectsFetch(object_id), [object_id])
        either: list[Future[Any]] = [fetch, fetch.early]
        wait(either, return_when=FIRST_COMPLETED)
        if fetch.done() or not fetch.early.done():
            return fetch.result()[object_id]
        return fetch.early.result()

    def _fetch(self, fetch: ObjectsFetch, object_ids: list[bytes]) -> ObjectsFetch:
        with self.lock:
            self.check_usable()
            self.fetch_waiters.append(fetch)
            commands = self.core.handle(Posted(FETCH_OBJECTS, object_ids))
        self.execute(commands)
        return fetch

    def _object_started(self, object_id: bytes, parts: Parts) -> None:
        """(The agent's thread, Incoming.started.) The first part of an object came: it answers
        the oldest fetch not answered yet (the daemon answers in the order asked), whose
        reader may begin."""
        try:
            fetch = self.fetch_waiters[0]
        except IndexError:
            return
        if fetch.stream_id == object_id and not fetch.early.done():
            fetch.early.set_result(parts)

    def request_stats(self) -> Future[Statistics]:
        future: Future[Statistics] = Future()
        lanes = self.lane.counts()  # the daemon answers once it counted these (stats_barrier.py)
        with self.lock:
            self.check_usable()
            self.stats_waiters.append(future)
            commands = self.core.handle(Posted(STATS, lanes))
        self.execute(commands)
        return future

    def request_history(self) -> Future[m.History]:
        """The daemon's history of the run (recent task runs, the coarse series): ex.report."""
        future: Future[m.History] = Future()
        with self.lock:
            self.check_usable()
            self.history_waiters.append(future)
            commands = self.core.handle(Posted(HISTORY, None))
        self.execute(commands)
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
            self.execute(self.core.handle(Posted(FLUSHED, flushed)))
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
        # Under a journal too: a lane task is the client's to submit again (LaneLost), never
        # the daemon's to journal; a direct reply's task is journaled as it is dispatched.
        if self.cluster is not None and REPLY_INBOX:
            self.inbox = ReplyInbox.bind(self.cluster.directory, poller, self._open_lane)
            if self.inbox is not None and submit_module.PICK_UP:
                self.core.pickup_hook = self._pickup_hook  # set on each sequential caller's future
        self.authkey = AuthkeyFile.reserve(self.cluster.directory if self.cluster is not None else None)
        self.daemon = daemon
        # What the loop serves (routes.Route), the daemon first; the lane's is None until it opens.
        self.routes: list[Route] = [daemon, self.lane]
        if self.inbox is not None:
            self.routes.append(self.inbox)
        daemon.send([self._hello()])
        self.authkey.write()  # before any task is sent: this thread sends them
        if self.cluster is not None:
            # The store's modules now, while our daemon starts (~100 ms): its Welcome names
            # the store, which inbound.py's _on_welcome maps before the first task goes out, and the
            # import there (~4 ms alone, ~11 ms in a cold start) delayed the first result; and
            # the packing of values into it (payload: ~1 ms at the first map or large argument).
            import scaler_executor.objstore.payload  # noqa: F401

    def _open_lane(self, path: str) -> None:
        """A result named a worker's lane (on the agent thread, or a caller picking up its
        result, holding the inbox's pick-up lock: ``LaneOpened`` takes no lock)."""
        if not self.lane.open and self.inbox is not None:
            self.lane.connect(path, self.inbox.path, self._poller, self._closed)
            if self.lane.open:
                self.core.handle(LaneOpened())

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
                check_daemon(self, now)
            if self.broken is not None:
                return
            if daemon.welcomed:
                self._tick(now)
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
        """Serve each route the poll found ready (or that holds what it read earlier)."""
        for route in self.routes:
            pollable = route.pollable
            if pollable is not None and (pollable in ready or route.buffered):
                route.serve(self)
        if self._wake_fd in ready:
            # Read, then clear: clearing first lets a wake() in between write, have
            # its write consumed here, and leave the flag set on an empty eventfd,
            # after which no wake() would ever write again (found by the benchmarks).
            try:
                os.eventfd_read(self._wake_fd)
            except BlockingIOError:
                pass
            self._wake_pending = False

    # -------------------------------------------------- what the routes hand over (RouteSink)

    def on_message(self, message: Any, buffers: list[Any]) -> None:
        handler = self.messages.table.get(type(message))
        if handler is None:
            log.warning("client: dropped a %s from the daemon", type(message).__name__)
            return
        handler(message, buffers)

    def on_results(self, results: list[m.TaskResult]) -> None:
        self.take_results(results)

    def send_again(self, records: list[TaskRecord], closed: bool) -> None:
        # Under the lane's lock: a caller picking up its result may have connected a new
        # lane since the old one closed (its LaneOpened follows its connect, hence this).
        with self.lock, self.lane.lock:
            closed = closed and not self.lane.open
            self.core.handle(LaneLost(records, closed))  # (WAKE: this turn's tick sends them)

    def pin(self, object_ids: list[bytes]) -> None:
        # Held for us from now on, released (ReleaseObjects, after this in the outbox) once read.
        self.core.handle(Posted(PIN_OBJECTS, object_ids))  # (WAKE: this turn's tick sends it)

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

    def _tick(self, now: float) -> None:
        """The core's ``Tick``: what the outbox holds goes out, a transmission at a time,
        while the daemon's queue takes it."""
        while self.daemon.pending is None:
            with self.lock:
                commands = self.core.handle(Tick(now))
                more = self.core.more_to_drain  # a full transmission: the rest in the next one
            self.execute(commands)
            if not more:
                return

    def execute(self, commands: list[Command]) -> None:
        """Carry out the core's commands, in order (``events.py``); an unknown one is a bug."""
        for command in commands:
            match command:
                case Wake():
                    self.wake()
                case SendToDaemon(messages):
                    self.daemon.send(messages)
                case ReleaseOnLane(fn_id):
                    self.lane.release(fn_id)
                case SetFlushed(events):
                    for event in events:
                        event.set()  # written, or held in order behind a full queue (DaemonRoute.pending)
                case Settle() | Resend() | MarkRunning() | Fail() | FailTasks():
                    self.completion.execute(command)
                case FailAll(error):
                    self.completer.put(FAIL_ALL, error)
                case NotifyCancelled(records):
                    for record in records:
                        record.future.cancel_now()
                case SendDownLane():  # (the submit path executes it under the lock)
                    with self.lock:
                        if not self.submitter.down_lane(command):
                            self.wake()
                case AnswerCancel(record, wait, dropped):
                    # A dropped task whose canceller stopped waiting: cancelled on a pool thread.
                    if wait.answer(record, dropped) and dropped:
                        self.completer.put(CANCELLED, record.future)
                case KillOnLane() | AwaitAnswer() | Discard():
                    raise RuntimeError(f"{command!r} is executed by its caller (cancel.py, submit.py)")
                case _:
                    raise TypeError(f"not a client core command: {command!r}")

    # ------------------------------------------------------------------ results

    def _pick_up(self, future: TaskFuture[Any], timeout: float | None) -> float | None:
        """``future.result()`` of a sequential caller's task: read the reply inbox on this
        thread (routes.py) and complete what came there; returns what is left of ``timeout``.
        Done-callbacks, if any, still run on a pool thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        inbox, record = self.inbox, getattr(future, "_record", None)
        if inbox is not None and record is not None and not self._closed:
            for result in inbox.pick_up(future, timeout, record.n):
                self.lane.delivered(result)
                self.completion.complete(result, quietly=True)  # outside the inbox's locks
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def take_results(self, results: list[m.TaskResult]) -> None:
        lane = self.lane
        if lane.tasks:
            for result in results:
                lane.delivered(result)
        self.completer.put_results(results)

    # ------------------------------------------------------------------ the end

    def break_with(self, exc: BaseException) -> None:
        with self.lock:
            commands = self.core.handle(DaemonLost(exc))
        if not commands:
            return  # broken already
        log.debug("client broken: %s", exc)
        if self.remote_store is not None:
            self.remote_store.fail_all(exc)
        self.welcome.set()  # a constructor waiting for the Welcome raises this
        self.execute(commands)  # FailAll: on a completion thread, after the results read before

    def _teardown(self) -> None:
        self.incoming.clear()  # objects half-received from the daemon: their buffers go now
        self.pushed.clear()
        self.daemon.close(goodbye=self.broken is None or not isinstance(self.broken, DaemonLostError))
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
        self.completer.put(FAIL_ALL, DaemonLostError("the executor shut down before these tasks finished"))
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
