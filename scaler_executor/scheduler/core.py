"""The daemon's brain: a pure state machine, events in, commands out.

::

    loop (loop.py)                       Scheduler.handle(*events)
    ─────────────────                    ─────────────────────────────────────────
    recv frames → decode ──Received──►   handshake │ client controller │ worker
    timer ─────────────────Tick──────►   controller: liveness, results, retries
    send failed ──────PeerUnreachable─►  → task state machine (state.py)
                                         → dispatch (allocation policy, policies.py)
    ◄──────────── [Send(peer, msgs)] ──  one batch per peer per call

No sockets, threads, clocks or processes in here: time arrives in events, and
everything to do comes back as commands, so tests drive it with plain calls
(tests/unit/test_core.py) and check ``validate()`` after every step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
import msgpack

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.config import ClusterConfig, parse_resources, parse_tags
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import DEFAULT_OPTIONS as DEFAULT
from scaler_executor.protocol.messages import Role, Status, TaskFlags
from scaler_executor.protocol.rejoin import NOT_RESUMABLE, UNKNOWN_PEER, idle_heartbeat
from scaler_executor.protocol.runlog import DURATION_BOUNDS, MAX_REPORT_RUNS, RUN_BYTES
from scaler_executor.scheduler.deadlines import DeadlineQueue
from scaler_executor.scheduler.history import History, history_message
from scaler_executor.scheduler.managers import AdmitKeys, ManagerController, WithdrawKeys
from scaler_executor.scheduler.no_worker import NoWorkerWatch
from scaler_executor.scheduler.object_stream import CreditObjects, EndObjectSends
from scaler_executor.scheduler.placement import Placement
from scaler_executor.scheduler.policies import (
    LeastLoaded,
    ScalingView,
    WorkerSlot,
    desired_workers,
    prefetch_window,
)
from scaler_executor.scheduler.result_stream import AbortPartial, ForwardStored, ResultStreams
from scaler_executor.scheduler.state import (
    AT_WORKER_STATES,
    QUEUED_STATES,
    ClientRecord,
    ConstraintKey,
    ReadyQueue,
    TaskRecord,
    TaskState,
    WorkerRecord,
    constraint_key,
    describe_key,
)
from scaler_executor.scheduler.stats import Recorder, Statistics, stats_message
from scaler_executor.scheduler.stats_barrier import StatsBarrier
from scaler_executor.scheduler.turns import TurnHistogram

log = logging.getLogger("scaler_executor.daemon")

EWMA_WEIGHT = 0.2  # weight of the newest task duration in a worker's mean
NOTICE_DELAY = 0.002  # longest a submit ack or running notice waits to travel with results
# Most a peer's reported figure (a count, bytes, seconds) may be: thousands of them still sum
# within msgpack's 64-bit integers, which the snapshot is encoded in.
MAX_FIGURE = 2**52
MAX_NAME = 256  # characters of a peer's name or host in its Hello: they reach logs and Refused
ID_MASK = (1 << m.TASK_ID_BITS) - 1  # the per-client part of a task or function id
# Monitors share one snapshot built at most this often, however many watch or however often
# they ask: the daemon's monitoring cost is bounded by this, not by its watchers.
MONITOR_SNAPSHOT_SECONDS = 0.5
# Monitors (dashboards) share one history, rebuilt at most this often: building one is
# O(runs kept), up to 20,000, so a monitor asking in a loop cannot make the daemon do it
# in a loop.  A client's request (ex.report) is always answered fresh.
MONITOR_HISTORY_SECONDS = 2.0
REFUSAL_LOG_SECONDS = 60.0  # a refusal is logged once per peer and kind in this long
MAX_REFUSAL_KEYS = 4096
# What a worker may say of a task; the others are the daemon's to say (REJECTED, WORKER_LOST, ...).
WORKER_STATUSES = frozenset(
    {Status.OK, Status.ERROR, Status.PROCESSOR_DIED, Status.CANCELLED, Status.TIMEOUT, Status.FORCE_CANCELLED}
)
# What a task without store objects or dependencies records: one shared empty tuple, not
# the two empty lists the codec decoded (112 bytes of each pending task).
NONE: tuple[()] = ()
# The TaskSpec flags a client may set (ON_LANE is the daemon's own; no other bit is defined).
CLIENT_FLAGS = (
    TaskFlags.CHUNK | TaskFlags.INLINE_FN | TaskFlags.NO_RESULT | TaskFlags.PACKED | TaskFlags.WRITABLE
    | TaskFlags.REPLY_DIRECT | TaskFlags.LANE_RETRY | TaskFlags.CAPTURE
)
# How a cancel held for an UNCLAIMED task is applied (Scheduler.hold_cancel): its client
# awaits the answer (TasksCancelled), and/or it was asked with force.
CANCEL_ANSWER = 1
CANCEL_FORCE = 2
NO_CLIENT = b""  # the owner of a task whose client is gone (no ZeroMQ identity is empty)

# --------------------------------------------------------------------------- events / commands


@dataclass(frozen=True, slots=True)
class Received:
    peer: bytes
    messages: list[Any]
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class Wake:
    """Nothing happened, but ``wakeup_at()`` has passed: deferred notices are due."""

    now: float


@dataclass(frozen=True, slots=True)
class PeerUnreachable:
    """The transport could not deliver to ``peer`` (it disconnected)."""

    peer: bytes
    now: float


@dataclass(frozen=True, slots=True)
class WorkerExited:
    """A worker process that this daemon's host started has exited (seen by the local manager)."""

    pid: int
    host: str
    how: str  # "killed by signal SIGKILL", "exit code 1", ...
    now: float


@dataclass(frozen=True, slots=True)
class LocalWorkers:
    """The worker processes the daemon's local manager runs now (started or starting)."""

    pids: frozenset[int]
    host: str
    now: float


@dataclass(frozen=True, slots=True)
class Send:
    peer: bytes
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class StartWorkers:
    """Ask the local manager for ``count`` more workers (autoscaling)."""

    count: int


@dataclass(frozen=True, slots=True)
class StopWorkers:
    """Stop these local worker processes; they were drained (hold no task) first."""

    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeleteObjects:
    """Nothing holds these objects any more: delete them from the host's store."""

    object_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class SendObjects:
    """Read these objects from the store and send their bytes to ``peer``: ObjectData, after
    ObjectParts for large ones (scheduler/object_stream.py)."""

    peer: bytes
    object_ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class StoreChunk:
    """Write the chunk that came with ``peer``'s ObjectChunk into the store (the loop holds
    its bytes: the core never sees buffers); answer ObjectStored when it ends the object.
    ``forward``: also send the chunk to that client as ResultPart of task ``task_id``
    (a large result forwarded as it comes: scheduler/result_stream.py)."""

    peer: bytes
    object_id: bytes
    offset: int
    total: int
    forward: bytes = b""
    task_id: int = 0


@dataclass(frozen=True, slots=True)
class AbortPuts:
    """``peer`` (a client or worker that streamed puts: ObjectChunk without a task) is gone:
    abort every object it had not finished putting, so a put cut short leaks no store space."""

    peer: bytes


Event = Received | Tick | Wake | PeerUnreachable | WorkerExited | LocalWorkers
Command = (
    Send | StartWorkers | StopWorkers | DeleteObjects | SendObjects | StoreChunk | CreditObjects | EndObjectSends
    | AbortPartial | AbortPuts | ForwardStored | AdmitKeys | WithdrawKeys
)


def refusal_for(hello: m.Hello) -> str | None:
    """Why a peer's handshake is refused, or None.  Pickles need equal Python and cloudpickle."""
    if hello.role not in Role.ALL:
        return f"unknown role {hello.role[:32]!r}; expected one of {sorted(Role.ALL)}"
    if len(hello.name) > MAX_NAME or len(hello.host) > MAX_NAME:
        return f"a peer's name and host may have at most {MAX_NAME} characters"
    if hello.protocol != m.PROTOCOL_VERSION:
        return f"protocol {hello.protocol} != daemon's {m.PROTOCOL_VERSION}"
    mismatches = []
    if hello.python != python_version():
        mismatches.append(f"Python {hello.python} (daemon: {python_version()})")
    if hello.cloudpickle != cloudpickle.__version__:
        mismatches.append(f"cloudpickle {hello.cloudpickle} (daemon: {cloudpickle.__version__})")
    if hello.package != __version__:
        mismatches.append(f"scaler-executor {hello.package} (daemon: {__version__})")
    if mismatches:
        return (
            f"version mismatch: {hello.role} {hello.name!r} runs {', '.join(mismatches)}; "
            "install the same versions of Python, cloudpickle and scaler-executor everywhere"
        )
    if hello.role == Role.WORKER and hello.capacity < 1:
        return f"worker {hello.name!r} declared capacity {hello.capacity}; it must run at least one task"
    return None


class Scheduler:
    """The whole daemon state.  ``handle`` is the only entry point that changes it."""

    # Whether REPLY_DIRECT submissions are acknowledged (SubmitAck) like any: only under a
    # journal, whose client keeps every submission until then (durable.py, client/resume.py).
    ACK_DIRECT = False

    def __init__(self, config: ClusterConfig, object_store: str = "") -> None:
        self.config = config
        self.object_store = object_store  # the region's name, told to peers in Welcome
        # Object controller: who holds each object of the store (tasks whose arguments or
        # kept results live there, clients' pins and unread results).  At zero, deleted.
        self.object_holds: dict[bytes, int] = {}
        self._deletions: list[bytes] = []
        self.policy = LeastLoaded(config.max_prefetch)
        self.tasks: dict[int, TaskRecord] = {}
        self.state_counts: dict[TaskState, int] = {}  # tasks per state (TaskRecord.counts)
        self.ready = ReadyQueue()  # tasks any worker can run
        self.constrained: dict[ConstraintKey, ReadyQueue] = {}  # tasks that need resources or tags
        self.placement = Placement()  # workers by profile, keys no worker can serve now (placement.py)
        # When each client last had a task dispatched (a running count): the ready queues
        # compete for the same workers' slots, and the one whose next client has waited
        # longest is served first (_dispatch), so rotation holds across queues too.
        self._served: dict[bytes, int] = {}
        self._dispatches = 0
        self._warned: set[ConstraintKey] = set()
        self.no_worker = NoWorkerWatch(config.no_worker_warning)  # tasks no worker can run (no_worker.py)
        # The workers this daemon starts itself (local manager) and what they declare.
        self.template: WorkerRecord | None = None
        if config.workers:
            self.template = WorkerRecord(
                b"", 0, "template", config.processors_per_worker, parse_resources(config.worker_resources),
                frozenset(parse_tags(config.worker_tags)), 0.0,
            )
        self.clients: dict[bytes, ClientRecord] = {}
        self.workers: dict[bytes, WorkerRecord] = {}
        self.functions: dict[int, bytes] = {}  # fn_id -> pickled callable
        self.function_refs: dict[int, int] = {}  # fn_id -> tasks that refer to it
        self.released_functions: set[int] = set()  # released by their client, kept while tasks refer
        self.last_sent: dict[bytes, float] = {}
        # Clients and workers by when they may next miss their liveness deadline, and every
        # peer by when it may next need a heartbeat from us: no per-tick sweep (deadlines.py).
        wheel = config.heartbeat_interval / 8  # finer than the loop's ticks (interval / 4)
        self._liveness = DeadlineQueue(wheel)
        self._quiet = DeadlineQueue(wheel)
        # How long the daemon may stay silent toward a worker (protocol/rejoin.py): every
        # worker judges our silence by at least this daemon's interval * liveness, learnt from
        # its Welcome. Clients and monitors judge it by settings of their own
        # (daemon_loss_timeout, the listener probe after two intervals): an interval each.
        self.worker_quiet = idle_heartbeat(config.heartbeat_interval, config.heartbeat_liveness)
        self.counters: dict[str, int] = {
            "submitted": 0,
            "finished": 0,
            "failed": 0,
            "cancelled": 0,
            "retried": 0,
            "tasks_interrupted": 0,  # run again at no charge: their worker left in order or its infrastructure ended it
            "workers_lost": 0,
            "clients_lost": 0,  # went silent or unreachable
            "clients_left": 0,  # said Goodbye
            "dropped_messages": 0,
            "refused": 0,  # messages acted on by nobody: another party's ids, or a status not the sender's to give
            "delivered_direct": 0,  # results a processor sent straight to its client (REPLY_DIRECT)
            "lane": 0,  # tasks a client submitted straight to a worker's lane (worker/lanes.py)
            # TaskResults messages handled: with ``finished`` + ``failed``, how well workers batch
            # results (the per-batch costs, the recorder's among them, divide by it).
            "result_batches": 0,
            # The network object path (kept by the loop, which moves the bytes): objects
            # and bytes sent to peers that cannot map the store, and received from them.
            "objects_sent": 0,
            "object_bytes_sent": 0,
            "objects_received": 0,
            "object_bytes_received": 0,
            "object_sends_dropped": 0,  # answers still streaming when their peer was lost (object_stream.py)
            # Large results forwarded to their clients while stored (result_stream.py): parts
            # and bytes sent on (by the loop; of them, parts a client that fell behind had
            # from the store), streams forwarded whole, streams stopped early.
            "result_parts_forwarded": 0,
            "result_bytes_forwarded": 0,
            "result_parts_from_store": 0,
            "result_streams_forwarded": 0,
            "result_streams_stopped": 0,
            # Client statistics requests answered at the barrier's bound without the lane
            # counts they waited for (scheduler/stats_barrier.py): a worker that hung.
            "stats_barrier_expired": 0,
        }
        self._monitors: dict[bytes, float] = {}
        self._fetchers: set[bytes] = set()  # peers that asked for objects (ObjectRequest), until lost
        self._putters: set[bytes] = set()  # peers that streamed puts (ObjectChunk), until lost
        # Large results streamed in by workers, forwarded to their clients as they come.
        self.result_streams = ResultStreams()
        # Clients' statistics requests waiting for their lane tasks to be counted.
        self.stats_barrier = StatsBarrier()
        self.recorder = Recorder()  # O(1) monitoring state: ended tasks per second, recent events
        self.history = History(runs=config.history_runs)  # O(1) too: recent task runs, the run's coarse series (ex.report)
        # Task runs are recorded by the workers (protocol/runlog.py) and reach the history in
        # bulk (TaskRuns): the Welcome tells each worker how many to keep, 0: none.
        self._worker_runs = min(config.history_runs, MAX_REPORT_RUNS)
        self._memory_total = 0  # the workers' memory, summed from their heartbeats
        self._monitor_snapshot: tuple[float, m.Stats] | None = None  # (built at, snapshot)
        self._monitor_history: tuple[float, m.History] | None = None  # (built at, history)
        # The host store's figures for a snapshot (set by the loop, read only on request).
        self.store_stats: Callable[[], dict[str, int]] | None = None
        self._refusals_logged: dict[tuple[bytes, str], float] = {}  # (peer, what) -> when last logged
        self._heartbeats_due = False
        self._stats_wanted: list[bytes] = []
        self._next_peer_id = 1
        self._now = 0.0
        self._out: dict[bytes, list[Any]] = {}
        self._results: dict[bytes, list[m.TaskResult]] = {}
        self._running: dict[bytes, list[int]] = {}
        # REPLY_DIRECT tasks' running notices, each due NOTICE_DELAY after its dispatch: their
        # results usually reach the client straight, and this daemon sends it nothing else
        # (a shared deadline, renewed by each sequential task, would fire every few tasks).
        self._direct_running: dict[int, tuple[bytes, float]] = {}  # task id -> (client, dispatched)
        self._acks: dict[bytes, int] = {}
        # A restarted daemon's reloaded tasks that may be at a worker not reported yet
        # (UNCLAIMED, state.py; put there by durable.py's restore), in reload order, and the
        # cancels asked of them, held until they are claimed or released (hold_cancel).
        self.unclaimed: dict[int, None] = {}
        self.cancels_held: dict[int, int] = {}
        self._notices_since: float | None = None  # when the oldest deferred ack/running notice was made
        self._handlers: dict[type, Callable[[bytes, Any], None]] = {
            m.Heartbeat: self._on_heartbeat,
            m.Goodbye: self._on_goodbye,
            m.RegisterFunction: self._on_register_function,
            m.ReleaseFunctions: self._on_release_functions,
            m.RegisterOptions: self._on_register_options,
            m.SubmitTasks: self._on_submit,
            m.CancelTasks: self._on_cancel,
            m.ReleaseObjects: self._on_release_objects,
            m.StatsRequest: self._on_stats_request,
            m.HistoryRequest: self._on_history_request,
            m.TaskResults: self._on_task_results,
            m.ClusterBroken: self._on_cluster_broken,
            m.Seceded: self._on_seceded,
            m.WorkerDraining: self._on_worker_draining,
            m.PinObjects: self._on_pin_objects,
            m.ObjectRequest: self._on_object_request,
            m.ObjectChunk: self._on_object_chunk,
            m.ObjectPartsTaken: lambda peer, message: self._commands.append(CreditObjects(peer, message.parts)),
            m.ResultPartsTaken: self._on_result_parts_taken,
            m.LaneDone: self._on_lane_done,
            m.TaskRuns: self._on_task_runs,
            m.LaneStarted: self._on_lane_started,
            m.ManagerOffer: lambda peer, message: self.managers.on_offer(peer, message),
            m.WorkerStates: lambda peer, message: self.managers.on_changes(peer, message),
            m.WorkerKeys: lambda peer, message: self.managers.on_keys(peer, message),
            # A journaled daemon's (scheduler/durable.py); this one has no journal.
            m.ClientReport: self._no_journal,
            m.WorkerReport: self._no_journal,
            m.ResultsAck: self._no_journal,
        }
        self._event_handlers: dict[type, Callable[[Any], None]] = {
            Received: self._on_received,
            Tick: self._on_tick,
            Wake: lambda event: None,
            PeerUnreachable: self._on_unreachable,
            WorkerExited: self._on_worker_exited,
            LocalWorkers: self._on_local_workers,
        }
        self.autoscale = config.workers > 0 and config.min_workers is not None
        self.local_pids: frozenset[int] = frozenset()
        self.local_host = ""
        self.stopping_pids: set[int] = set()
        self._commands: list[Command] = []
        self.turns = TurnHistogram()  # recorded by the loop (scheduler/loop.py), reported here
        self.managers = ManagerController(self)  # worker managers (scheduler/managers.py)

    # ------------------------------------------------------------------ entry point

    def handle(self, *events: Event) -> list[Command]:
        for event in events:
            self._now = event.now
            self._event_handlers[type(event)](event)
        self._dispatch()
        return self._flush()

    # ------------------------------------------------------------------ events

    def _on_received(self, event: Received) -> None:
        peer = event.peer
        role_record: Any = self.clients.get(peer) or self.workers.get(peer) or self.managers.managers.get(peer)
        messages = event.messages
        if messages and type(messages[0]) is m.Hello and (role_record is not None or self._is_monitor(peer)):
            # A known peer joining again on the same connection (a worker that heard nothing
            # for its liveness period forgets what it held): start it afresh.
            self._on_goodbye(peer, m.Goodbye("joined again"))
            role_record = None
        if role_record is None and not self._is_monitor(peer):
            first = messages[0] if messages else None
            if type(first) is not m.Hello:
                if type(first) is m.Resume:  # (a journaled daemon's peers: scheduler/durable.py)
                    self._send(peer, m.Refused(f"{UNKNOWN_PEER}: {NOT_RESUMABLE}: this daemon has no journal"))
                elif type(first) is not m.Goodbye:
                    self._send(peer, m.Refused(f"{UNKNOWN_PEER}: send Hello first (was the daemon restarted?)"))
                self.counters["dropped_messages"] += len(messages)
                return
            self._on_hello(peer, first)
            messages = messages[1:]
            role_record = self.clients.get(peer) or self.workers.get(peer) or self.managers.managers.get(peer)
            if role_record is None and not self._is_monitor(peer):
                return  # refused
        if role_record is not None:
            role_record.last_seen = self._now
        elif peer in self._monitors:
            self._monitors[peer] = self._now
        accepted = m.ACCEPTED_FROM[self._role_of(peer)]
        handlers = self._handlers
        for message in messages:
            kind = type(message)
            if kind not in accepted:
                self._refuse(peer, kind.__name__, f"a {self._role_of(peer)} may not send {kind.__name__}")
                continue
            try:
                handlers[kind](peer, message)
            except Exception:  # a bug must cost one message, never the daemon
                self.counters["dropped_messages"] += 1
                log.exception("daemon: failed to handle %s from %r; message dropped", kind.__name__, peer)
            if not self.knows(peer):
                return  # the peer said goodbye

    def _on_tick(self, event: Tick) -> None:
        now = event.now
        if self.recorder.started is None:
            self.recorder.started = now
            self.history.gauge(now, 0, 0)  # the series starts with the daemon
        deadline = self.config.heartbeat_interval * self.config.heartbeat_liveness
        client_deadline = max(deadline, self.config.client_timeout)
        for peer in self._liveness.due(now):
            if (worker := self.workers.get(peer)) is not None:
                if now - worker.last_seen > deadline:
                    self._lose_worker(worker, f"missed heartbeats: no message for {now - worker.last_seen:.1f} s (host lost or process hung)")
                else:
                    self._liveness.add(peer, worker.last_seen + deadline)
            elif (client := self.clients.get(peer)) is not None:
                if now - client.last_seen > client_deadline:
                    self._lose_client(client, f"no message for {now - client.last_seen:.1f} s")
                else:
                    self._liveness.add(peer, client.last_seen + client_deadline)
        for peer in [p for p, seen in self._monitors.items() if now - seen > deadline]:
            del self._monitors[peer]
        for manager in [r for r in self.managers.managers.values() if now - r.last_seen > deadline]:
            self.managers.lose(manager.peer, f"no message for {now - manager.last_seen:.1f} s", now)
        self.managers.tick(now)
        if self.constrained:
            self._expire_unsatisfiable(now)
        for peer, notice in self.no_worker.check(now, self.ready, self.constrained, self.workers.values()):
            if peer in self.clients:
                self._send(peer, notice)
        self._heartbeats_due = True  # decided in _flush, once every message of this turn is known

    def _on_unreachable(self, event: PeerUnreachable) -> None:
        if (worker := self.workers.get(event.peer)) is not None:
            self._lose_worker(worker, "disconnected (unreachable)")
        elif (client := self.clients.get(event.peer)) is not None:
            self._lose_client(client, "disconnected (unreachable)")
        self.managers.lose(event.peer, "disconnected (unreachable)", event.now)
        self._monitors.pop(event.peer, None)

    def _on_local_workers(self, event: LocalWorkers) -> None:
        self.local_pids = event.pids
        self.local_host = event.host
        self.stopping_pids &= event.pids
        if self.autoscale:
            self._scale(event.now)

    def _scale(self, now: float) -> None:
        """Autoscaling: start what the queue needs at once; stop workers idle for long enough."""
        config = self.config
        assert config.min_workers is not None
        demand = self.ready.live + sum(q.live for q in self.constrained.values())
        demand += sum(len(w.inflight) for w in self.workers.values())
        running = len(self.local_pids - self.stopping_pids)
        desired = desired_workers(
            ScalingView(demand, running, config.processors_per_worker, config.min_workers, config.workers)
        )
        if desired > running:
            self._commands.append(StartWorkers(desired - running))
            return
        surplus = running - desired
        idle = [
            w
            for w in self.workers.values()
            if surplus > 0
            and w.pid in self.local_pids
            and w.host == self.local_host
            and w.pid not in self.stopping_pids
            and not w.inflight
            and now - w.idle_since >= config.scale_down_idle
        ]
        stop = sorted(idle, key=lambda w: w.idle_since)[:surplus]
        if stop:
            for w in stop:
                w.draining = True  # no task may land on it between this decision and its exit
                self.stopping_pids.add(w.pid)
            log.info("scaling down: stopping %d idle worker(s)", len(stop))
            self._commands.append(StopWorkers(tuple(w.pid for w in stop)))

    def _on_worker_exited(self, event: WorkerExited) -> None:
        for worker in list(self.workers.values()):
            if worker.pid == event.pid and worker.host == event.host:
                self._lose_worker(worker, f"process {event.pid} exited: {event.how}")

    # ------------------------------------------------------------------ handshake

    def peer_count(self) -> int:
        """Peers that joined: clients, workers, managers and monitors."""
        return len(self.clients) + len(self.workers) + len(self._monitors) + len(self.managers.managers)

    def connection(self, peer: bytes) -> bytes | None:
        """The routing id to reach ``peer`` (a key of ``clients`` or ``workers``) on the
        socket now: the peer's own here; a journaled daemon maps its logical ids."""
        return peer

    def knows(self, peer: bytes) -> bool:
        """Whether ``peer`` has joined (said a Hello that was welcomed)."""
        return peer in self.clients or peer in self.workers or peer in self._monitors or peer in self.managers.managers

    def _is_monitor(self, peer: bytes) -> bool:
        return peer in self._monitors

    def is_monitor(self, peer: bytes) -> bool:
        """Whether ``peer`` joined as a monitor (the loop drops, never waits for, a slow one)."""
        return peer in self._monitors

    def _role_of(self, peer: bytes) -> str:
        if peer in self.clients:
            return Role.CLIENT
        if peer in self.workers:
            return Role.WORKER
        if peer in self.managers.managers:
            return Role.MANAGER
        return Role.MONITOR

    def _on_hello(self, peer: bytes, hello: m.Hello) -> None:
        reason = refusal_for(hello)
        if reason is not None:
            self._refuse(peer, "hello", f"{reason} (pid {hello.pid} on {hello.host[:MAX_NAME]!r})")
            self._send(peer, m.Refused(reason))
            return
        if not self.knows(peer) and self.peer_count() >= self.config.max_peers:
            reason = (
                f"the daemon already has {self.config.max_peers} peers, its max_peers: raise max_peers "
                "(scaler-daemon --max-peers) or wait for peers to leave"
            )
            self._refuse(peer, "hello", f"{reason} ({hello.role[:32]!r} {hello.name[:MAX_NAME]!r})")
            self._send(peer, m.Refused(reason))
            return
        peer_id = self._next_peer_id
        self._next_peer_id += 1
        if hello.role == Role.CLIENT:
            self.clients[peer] = ClientRecord(
                peer, peer_id, hello.name, self._now, host=hello.host, reply_to=hello.reply_to, authkey_file=hello.authkey_file
            )
            log.info("client %r joined (pid %d on %s)", hello.name, hello.pid, hello.host)
        elif hello.role == Role.WORKER:
            self.workers[peer] = WorkerRecord(
                peer,
                peer_id,
                hello.name,
                hello.capacity,
                dict(hello.resources),
                frozenset(hello.tags),
                self._now,
                pid=hello.pid,
                host=hello.host,
                idle_since=self._now,
            )
            self.placement.add(self.workers[peer])
            log.info("worker %r joined with %d processors (pid %d on %s)", hello.name, hello.capacity, hello.pid, hello.host)
            self.history.gauge(self._now, len(self.workers), self._memory_total)
            self.managers.worker_joined(self.workers[peer])
        elif hello.role == Role.MANAGER:
            self.managers.join(peer, peer_id, hello.name, self._now)
        else:
            self._monitors[peer] = self._now
        if hello.role != Role.MONITOR:
            limit = self.config.heartbeat_interval * self.config.heartbeat_liveness
            if hello.role == Role.CLIENT:
                limit = max(limit, self.config.client_timeout)
            self._liveness.add(peer, self._now + limit)
        self._quiet.add(peer, self._now + self.config.heartbeat_interval)
        self._send(peer, self._welcome(peer, peer_id))

    def _welcome(self, peer: bytes, peer_id: int) -> m.Welcome:
        """The answer to an accepted Hello (a journaled daemon adds its fields: durable.py)."""
        runs = self._worker_runs if peer in self.workers else 0
        return m.Welcome(peer_id, self.config.heartbeat_interval, self.config.heartbeat_liveness, self.object_store, runs=runs)

    def _on_heartbeat(self, peer: bytes, message: m.Heartbeat) -> None:
        worker = self.workers.get(peer)
        if worker is not None:
            # A worker's own figures, clamped: they reach sums and the snapshot's encoding.
            worker.queued, worker.running = _figure(message.queued), _figure(message.running)
            memory = _figure(message.memory)
            self._memory_total += memory - worker.memory
            worker.memory, worker.memory_limit = memory, _figure(message.memory_limit)
            worker.cpu = message.cpu if 0.0 <= message.cpu <= MAX_FIGURE else 0.0  # NaN fails both
            worker.store = (
                message.store[:MAX_NAME], _figure(message.store_bytes), _figure(message.store_capacity),
                _figure(message.store_objects),
            )
            self.history.gauge(self._now, len(self.workers), self._memory_total)

    def _on_goodbye(self, peer: bytes, message: m.Goodbye) -> None:
        if (worker := self.workers.get(peer)) is not None:
            self._lose_worker(worker, f"left: {message.reason[:200]}", clean=True, unstarted=message.unstarted)
        elif (client := self.clients.get(peer)) is not None:
            self._lose_client(client, ascii(message.reason[:200]), clean=True)
        self.managers.lose(peer, f"left: {message.reason[:200]!a}", self._now)
        self._monitors.pop(peer, None)
        self.last_sent.pop(peer, None)
        self._out.pop(peer, None)

    # ------------------------------------------------------------------ client controller

    def _on_register_function(self, peer: bytes, message: m.RegisterFunction) -> None:
        """Ids belong to their owner: a client registers only ids under its own prefix
        (``client_id << TASK_ID_BITS``), and never over one already registered, so no
        client can make another's tasks run a callable of its choosing."""
        client = self.clients[peer]
        fn_id = message.fn_id
        if fn_id >> m.TASK_ID_BITS != client.client_id or not fn_id & ID_MASK:
            self._refuse(peer, "register-function", f"function id {fn_id:#x} is not this client's")
            return
        if fn_id in self.functions or fn_id in client.functions:
            self._refuse(peer, "register-function", f"function id {fn_id:#x} is registered already")
            return
        self.functions[fn_id] = message.payload
        client.functions.add(fn_id)

    def _no_journal(self, peer: bytes, message: Any) -> None:
        self._refuse(peer, type(message).__name__, "this daemon has no journal (scaler-daemon --journal)")

    def _refuse(self, peer: bytes, what: str, why: str) -> None:
        """A message not acted upon because it is not the sender's to send: counted always,
        logged once per peer and kind of refusal per ``REFUSAL_LOG_SECONDS``."""
        self.counters["refused"] += 1
        self.recorder.event(self._now, "refused", why, where=peer.hex()[:16])
        key = (peer, what)
        last = self._refusals_logged.get(key)
        if last is not None and self._now - last < REFUSAL_LOG_SECONDS:
            return
        if len(self._refusals_logged) >= MAX_REFUSAL_KEYS:
            self._refusals_logged.clear()  # bounded, whoever sends: at worst a line more
        self._refusals_logged[key] = self._now
        record: Any = self.clients.get(peer) or self.workers.get(peer) or self.managers.managers.get(peer)
        who = f"{self._role_of(peer)} {record.name!a}" if record is not None else "a peer that has not joined"
        log.warning("refused %s from %s (peer %s): %s", what, who, peer.hex()[:64], ascii(why[:500]))

    def _on_release_functions(self, peer: bytes, message: m.ReleaseFunctions) -> None:
        client = self.clients[peer]
        for fn_id in message.fn_ids:
            if fn_id in client.functions:
                client.functions.discard(fn_id)
                self._release_function(fn_id)
            elif fn_id in self.functions and fn_id >> m.TASK_ID_BITS != client.client_id:
                # (One of its own it released already, tasks still referring to it: a
                # release sent twice, e.g. again after a restart, changes nothing.)
                self._refuse(peer, "release-functions", f"function id {fn_id:#x} is not this client's")

    def _release_function(self, fn_id: int) -> None:
        """The client is done with a callable; it goes once no task refers to it any more."""
        if self.function_refs.get(fn_id):
            self.released_functions.add(fn_id)
            return
        self.released_functions.discard(fn_id)
        self.function_refs.pop(fn_id, None)
        if self.functions.pop(fn_id, None) is None:
            return
        forget = m.ReleaseFunctions([fn_id])
        for worker in self.workers.values():
            if fn_id in worker.functions:
                worker.functions.discard(fn_id)
                self._send(worker.peer, forget)

    def _on_register_options(self, peer: bytes, message: m.RegisterOptions) -> None:
        self.clients[peer].options[message.options_id] = message.options

    def _on_submit(self, peer: bytes, message: m.SubmitTasks) -> None:
        client = self.clients[peer]
        options_table = client.options
        tasks = self.tasks
        ready = self.ready
        owned = client.tasks
        refs = self.function_refs
        credited = 0  # a REPLY_DIRECT task is not in the client's submit window: no ack
        direct_unacked = not self.ACK_DIRECT  # (but under a journal: durable.py)
        for spec in message.tasks:
            if spec.flags & TaskFlags.REPLY_DIRECT and direct_unacked:
                credited += 1
            options = options_table.get(spec.options_id)
            if spec.task_id in tasks or spec.task_id >> m.TASK_ID_BITS != client.client_id:
                self._reject_spec(peer, spec, f"task id {spec.task_id:#x} is reused or not this client's")
                continue
            if spec.flags & ~CLIENT_FLAGS:
                # ON_LANE marks the daemon's own record of a lane task (never dispatched or
                # answered): a submitted one would be neither, and its dependents would hang.
                self._reject_spec(peer, spec, f"task flags {spec.flags:#x} are not a client's to set")
                continue
            if options is None:
                self._reject_spec(peer, spec, f"options record {spec.options_id} was never registered")
                continue
            if spec.fn_id and (spec.fn_id not in self.functions or spec.fn_id not in client.functions):
                self._reject_spec(peer, spec, f"function {spec.fn_id:#x} was never registered by this client or was released")
                continue
            deps = spec.deps
            if deps:
                if spec.task_id in deps:
                    self._reject_spec(peer, spec, f"task {spec.task_id:#x} depends on itself")
                    continue
                if len(deps) > 1 and len(set(deps)) < len(deps):
                    deps = list(dict.fromkeys(deps))  # each dependency once (f(x, x) of a future x)
            key = constraint_key(options.resources, options.tags) if options is not DEFAULT else None
            if key is not None and self.config.unsatisfiable_timeout == 0 and not self._satisfiable(key):
                self._reject_spec(peer, spec, self._unsatisfiable_text(key))
                continue
            task = TaskRecord(
                spec.task_id, peer, spec.fn_id, options, spec.flags, spec.payload, spec.objects or NONE,
                deps or NONE, spec.parent, self.state_counts,
            )
            tasks[spec.task_id] = task
            owned.add(spec.task_id)
            if spec.flags & TaskFlags.LANE_RETRY:  # its first attempt, on a worker's lane, did not end
                task.attempt = 1
                task.failures = ["attempt 1: on a worker's lane: the process running it died, or the worker left"]
            if spec.objects:
                self._hold(spec.objects)
            if spec.fn_id:
                refs[spec.fn_id] = refs.get(spec.fn_id, 0) + 1
            if deps and not self._link(task):
                continue  # answered (a dependency was gone) or waiting for its dependencies
            if key is None:
                ready.push(task)
            else:
                task.queue_key = key
                task.queued_at = self._now
                self._queue(task)
        n = len(message.tasks)
        self.counters["submitted"] += n
        if n > credited:
            self._acks[peer] = self._acks.get(peer, 0) + n - credited

    # ------------------------------------------------------------------ graph controller

    def _link(self, task: TaskRecord) -> bool:
        """Tie a new task to its dependencies; True if it is ready to queue now.

        A dependency this daemon no longer knows (it finished and was forgotten before the
        dependent arrived) is answered with DEP_GONE: the client then has its result and
        sends the dependent again with the value inlined.
        """
        task.set_state(TaskState.WAITING)
        linked: list[TaskRecord] = []
        for dep_id in task.deps:
            dep = self.tasks.get(dep_id)
            if dep is None or dep.client != task.client:
                for done in linked:
                    del done.dependents[task.task_id]  # type: ignore[union-attr]
                    done.holds -= 1
                    self._maybe_release(done)
                task.deps = []
                task.transition("dep-gone")
                self._forget(task)
                self._result_to(task.client, m.TaskResult(task.task_id, 0, Status.DEP_GONE, _packb([dep_id]), m.NO_FACTS, m.NO_OBJECTS))
                return False
            if dep.dependents is None:
                dep.dependents = {}
            dep.dependents[task.task_id] = None
            dep.holds += 1
            linked.append(dep)
            if dep.state is not TaskState.FINISHED:
                task.waiting += 1
        if task.waiting:
            return False
        task.set_state(TaskState.PENDING)
        return True

    def _dependents_ready(self, task: TaskRecord) -> None:
        for dep_id in task.dependents or ():
            dependent = self.tasks.get(dep_id)
            if dependent is not None and dependent.state is TaskState.WAITING:
                dependent.waiting -= 1
                if not dependent.waiting:
                    dependent.transition("deps-ready")
                    if dependent.queue_key is None:
                        self.ready.push(dependent)
                    else:
                        self._queue(dependent)

    def _fail_dependents(self, task: TaskRecord, status: int, payload: bytes) -> None:
        """A task ended without a result: its waiting dependents (transitively) end too, unrun.

        A cancelled task cancels them; any other failure fails them with DEP_FAILED carrying
        the original failure, so the client raises the original exception.
        """
        if not task.dependents:
            return
        if status == Status.CANCELLED:
            answer_status, answer = Status.CANCELLED, b""
        else:
            answer_status, answer = Status.DEP_FAILED, _packb([task.task_id, status, payload])
        stack = list(task.dependents)
        while stack:
            dependent = self.tasks.get(stack.pop())
            if dependent is None or dependent.state is not TaskState.WAITING:
                continue
            dependent.transition("dep-failed")
            self._forget(dependent)
            self.counters["cancelled" if answer_status == Status.CANCELLED else "failed"] += 1
            if not dependent.flags & TaskFlags.NO_RESULT:
                self._result_to(dependent.client, m.TaskResult(dependent.task_id, 0, answer_status, answer, m.NO_FACTS, m.NO_OBJECTS))
            stack.extend(dependent.dependents or ())

    def _satisfiable(self, key: ConstraintKey) -> bool:
        if self.template is not None and self.template.fits_ever(key):
            return True
        if self.managers.can_fit(key):
            return True
        return self.placement.satisfiable(key)

    def _unsatisfiable_text(self, key: ConstraintKey) -> str:
        have = "; ".join(
            f"{w.name}: {describe_key((tuple(sorted(w.resources.items())), tuple(sorted(w.tags)))) or 'nothing'}"
            for w in self.workers.values()
        )
        return (
            f"no worker can provide {describe_key(key)} (workers have: {have or 'no workers connected'}); "
            "start workers with --resources/--tags that match, or change the task's options"
        )

    def _reject_spec(self, peer: bytes, spec: m.TaskSpec, reason: str) -> None:
        log.warning("rejected task %#x from %r: %s", spec.task_id, peer, reason)
        self.counters["failed"] += 1
        self.recorder.ended(self._now, 0, 1)
        self.history.ended(self._now, 0, 1)
        self.recorder.event(self._now, "rejected", reason, task_id=spec.task_id, where=self.clients[peer].name if peer in self.clients else "")
        self._result_to(peer, m.TaskResult(spec.task_id, 0, Status.REJECTED, reason.encode(), m.NO_FACTS, m.NO_OBJECTS))

    def _on_cancel(self, peer: bytes, message: m.CancelTasks) -> None:
        """``force``: kill wherever it is.  Without it (``Future.cancel()``): drop only a task
        no worker holds, and say which were dropped, so ``cancel()`` returns True only for a
        task that never runs; one at a worker (maybe still in its prefetch queue) runs on.
        Another client's task is left alone and the attempt refused (counted, logged)."""
        for task_id in message.task_ids:
            other = self.tasks.get(task_id)
            if other is not None and other.client != peer:
                self._refuse(peer, "cancel-tasks", f"task id {task_id:#x} is not this client's")
        if message.force:
            for task_id in message.task_ids:
                task = self.tasks.get(task_id)
                if task is not None and task.client == peer:
                    if task.state is TaskState.UNCLAIMED:
                        self.hold_cancel(task_id, CANCEL_FORCE)
                    else:
                        self._cancel(task, True)
            return
        cancelled: list[int] = []
        refused: list[int] = []
        for task_id in message.task_ids:
            task = self.tasks.get(task_id)
            if task is not None and task.client == peer and (
                task.state in QUEUED_STATES or task.state is TaskState.WAITING
            ):
                self._cancel(task, False)
                cancelled.append(task_id)
            elif task is not None and task.client == peer and task.state is TaskState.UNCLAIMED:
                self.hold_cancel(task_id, CANCEL_ANSWER)  # answered once it is claimed or not
            else:
                refused.append(task_id)
        self._send(peer, m.TasksCancelled(cancelled, refused))

    def hold_cancel(self, task_id: int, how: int) -> None:
        """A cancel of an UNCLAIMED task (state.py): whether it can still be kept from
        running is known only once a worker claims it or the recovery ends; applied then
        (``_apply_held_cancel``).  ``how``: CANCEL_ANSWER and/or CANCEL_FORCE."""
        self.cancels_held[task_id] = self.cancels_held.get(task_id, 0) | how

    def _cancel(self, task: TaskRecord, force: bool) -> None:
        """Drop a task no worker holds; ask its worker to drop one it holds.  An UNCLAIMED
        one is dropped (its client left or no longer wants it: if a worker still holds it,
        that worker's report has it cancelled there as a task nobody awaits)."""
        if task.state in QUEUED_STATES or task.state is TaskState.WAITING or task.state is TaskState.UNCLAIMED:
            if task.state in QUEUED_STATES:
                self._unqueue(task)
            elif task.state is TaskState.UNCLAIMED:
                del self.unclaimed[task.task_id]
                self.cancels_held.pop(task.task_id, None)
            task.transition("cancel")
            self._forget(task)
            self.counters["cancelled"] += 1
            self._fail_dependents(task, Status.CANCELLED, b"")
        elif task.state in AT_WORKER_STATES:
            task.transition("cancel")
            assert task.worker is not None
            self._send(task.worker, m.CancelTasks([task.task_id], force))

    # ------------------------------------------------------------------ object controller

    def _hold(self, object_ids: list[bytes]) -> None:
        holds = self.object_holds
        for object_id in object_ids:
            holds[object_id] = holds.get(object_id, 0) + 1

    def _drop(self, object_ids: list[bytes]) -> None:
        holds = self.object_holds
        for object_id in object_ids:
            left = holds.get(object_id, 0) - 1
            if left > 0:
                holds[object_id] = left
            else:
                holds.pop(object_id, None)
                self._deletions.append(object_id)

    def _client_holds(self, peer: bytes, object_ids: list[bytes]) -> None:
        owned = self.clients[peer].objects
        for object_id in object_ids:
            owned[object_id] = owned.get(object_id, 0) + 1
        self._hold(object_ids)

    def _on_pin_objects(self, peer: bytes, message: m.PinObjects) -> None:
        self._client_holds(peer, message.object_ids)

    def _on_release_objects(self, peer: bytes, message: m.ReleaseObjects) -> None:
        owned = self.clients[peer].objects
        released = []
        for object_id in message.object_ids:
            count = owned.get(object_id, 0)
            if count > 0:
                if count == 1:
                    del owned[object_id]
                else:
                    owned[object_id] = count - 1
                released.append(object_id)
        self._drop(released)

    def _on_object_request(self, peer: bytes, message: m.ObjectRequest) -> None:
        self._fetchers.add(peer)
        self._commands.append(SendObjects(peer, tuple(message.object_ids)))

    def _end_object_sends(self, peer: bytes) -> None:
        """A peer that ever asked for objects is gone: the loop drops what it still had to send."""
        if peer in self._fetchers:
            self._fetchers.discard(peer)
            self._commands.append(EndObjectSends(peer))

    def _end_puts(self, peer: bytes) -> None:
        """A peer that streamed puts is gone: the loop aborts those it had not finished."""
        if peer in self._putters:
            self._putters.discard(peer)
            self._commands.append(AbortPuts(peer))

    def _on_object_chunk(self, peer: bytes, message: m.ObjectChunk) -> None:
        if not message.task_id:  # a put
            self._putters.add(peer)  # (its unfinished puts are aborted when it is lost)
            self._commands.append(StoreChunk(peer, message.object_id, message.offset, message.total))
            return
        if peer not in self.workers:
            self._refuse(peer, "result-chunk", "only a worker streams a task's result")
            return
        # A large result: stored, and forwarded to the task's client as it comes while the
        # task is this worker's attempt and its client wants the result.
        task = self.tasks.get(message.task_id)
        client = b""
        if (
            task is not None and task.worker == peer and task.attempt == message.attempt
            and not task.flags & TaskFlags.NO_RESULT and task.client in self.clients
        ):  # fmt: skip
            client = task.client
        forward, ended = self.result_streams.chunk(peer, message, client)
        self._streams_ended(ended)
        self._commands.append(StoreChunk(peer, message.object_id, message.offset, message.total, forward, message.task_id))
        if client and not forward:  # behind: parts it missed, from the store, if its window has room
            self._pump_results(client)

    def _on_result_parts_taken(self, peer: bytes, message: m.ResultPartsTaken) -> None:
        self.result_streams.taken(peer, message.parts)
        self._pump_results(peer)

    def _pump_results(self, client: bytes) -> None:
        """Parts of ``client``'s result streams that fell behind, from the store (ForwardStored)."""
        streams = self.result_streams
        before = streams.forwarded
        self._commands.extend(streams.pump(client))
        self.counters["result_streams_forwarded"] += streams.forwarded - before

    def _streams_ended(self, ended: list[Any]) -> None:
        """Tell each client whose result stream stopped early to drop its parts."""
        for end in ended:
            self.counters["result_streams_stopped"] += 1
            self._send(end.client, m.ResultStreamEnded(end.object_id, end.reason))

    def _on_history_request(self, peer: bytes, message: m.HistoryRequest) -> None:
        if peer not in self._monitors:
            self._send(peer, history_message(self))  # built on request: O(runs kept + buckets)
            return
        cached = self._monitor_history
        if cached is None or self._now - cached[0] >= MONITOR_HISTORY_SECONDS:
            cached = self._monitor_history = (self._now, history_message(self))
        if any(message is cached[1] for message in self._out.get(peer, ())):
            return  # one answer per monitor per turn, however many it asked for
        self._send(peer, cached[1])

    def _on_stats_request(self, peer: bytes, message: m.StatsRequest) -> None:
        if peer in self._monitors and peer in self._stats_wanted:
            return  # one answer per monitor per turn, however many it asked for
        client = self.clients.get(peer)
        if client is not None:  # its snapshot counts the lane results it had (stats_barrier.py)
            flush = self.stats_barrier.ask(peer, client.client_id, message.lanes, self.workers.values(), self._now)
            if flush is not None:
                for worker in flush:
                    self._send(worker, m.LaneFlush())
                return  # held: answered in _flush once those workers' LaneDone came
        self._stats_wanted.append(peer)  # answered in _flush, after this turn's dispatch

    def _lose_client(self, client: ClientRecord, why: str, clean: bool = False) -> None:
        """A client is gone: its tasks are cancelled and what it held freed.  ``clean``: it
        said Goodbye (``clients_left``), else it was lost (``clients_lost``)."""
        log.info(
            "client %r %s (%s); cancelling its %d tasks", client.name, "left" if clean else "lost", why, len(client.tasks)
        )
        self.counters["clients_left" if clean else "clients_lost"] += 1
        if not clean:
            self.recorder.event(self._now, "client-lost", why, where=client.name)
        del self.clients[client.peer]
        self._served.pop(client.peer, None)
        self._end_puts(client.peer)
        self.stats_barrier.client_lost(client.peer)
        self._end_object_sends(client.peer)
        self.result_streams.client_lost(client.peer)
        for task_id in list(client.tasks):
            task = self.tasks.get(task_id)
            if task is not None:
                self._cancel(task, force=False)
                if task_id in self.tasks:
                    # Still at a worker (cancelling): it belongs to no client now, so a client
                    # that joins again on the same connection gets neither its result nor a say.
                    task.client = NO_CLIENT
        for fn_id in list(client.functions):
            self._release_function(fn_id)
        for object_id, count in client.objects.items():
            self._drop([object_id] * count)
        client.objects.clear()
        self.last_sent.pop(client.peer, None)
        self._out.pop(client.peer, None)
        self._results.pop(client.peer, None)
        self._running.pop(client.peer, None)
        self._acks.pop(client.peer, None)
        self.no_worker.forget_client(client.peer)

    # ------------------------------------------------------------------ worker controller

    def _on_task_results(self, peer: bytes, message: m.TaskResults) -> None:
        worker = self.workers[peer]
        ended = failed = 0
        counters = self.counters
        counters["result_batches"] += 1
        streams = self.result_streams
        for result in message.results:
            if streams.by_task and result.task_id in streams.by_task:  # a streamed result's end
                before = streams.forwarded
                self._streams_ended(streams.ended(peer, result.task_id, result.objects))
                counters["result_streams_forwarded"] += streams.forwarded - before
            if result.status not in WORKER_STATUSES:
                # Only the daemon says a task was rejected, lost its worker or its dependency:
                # a worker that claims so could make its client resend or misreport a task.
                self._refuse(peer, "task-result", f"status {result.status} is not a worker's to send")
                result = result._replace(
                    status=Status.PROCESSOR_DIED,
                    payload=f"the worker sent an invalid result status {result.status}".encode(),
                )
            task = self.tasks.get(result.task_id)
            if task is None or task.worker != peer or task.attempt != result.attempt:
                if result.objects:
                    self._deletions.extend(result.objects)  # an orphan result's objects
                continue  # late: an earlier attempt, or a task already settled elsewhere
            self._unassign(worker, task)
            if result.status == Status.PROCESSOR_DIED:
                self.recorder.event(self._now, "processor-died", "", task_id=task.task_id, where=worker.name, payload=result.payload, status=result.status)
                self._attempt_failed(task, f"worker {worker.name}: {result.payload.decode(errors='replace')}", result.output)
                continue
            if result.status == Status.OK and result.facts.finished > result.facts.started:
                duration = result.facts.finished - result.facts.started
                mean = worker.mean_task_seconds
                worker.mean_task_seconds = duration if mean is None else mean + EWMA_WEIGHT * (duration - mean)
            ok = result.status == Status.OK
            ended += 1
            if not ok:
                failed += 1
                self._record_failure(worker, task, result)
            if self._direct_running:
                self._direct_running.pop(task.task_id, None)  # its result tells the client it ran
            if ok and task.holds > 0 and task.state is TaskState.DISPATCHED:
                task.transition("result-kept")  # dependents need it: it stays, FINISHED
                task.result = result.payload
                if result.objects:
                    task.result_objects = result.objects
                    self._hold(result.objects)
                self._release_deps(task)  # finished, it needs its own dependencies no more
                self._dependents_ready(task)
            else:
                cancelling = task.state is TaskState.CANCELLING
                task.transition("result")
                self._forget(task)
                if not ok:
                    self._fail_dependents(task, result.status, result.payload)
                elif cancelling:  # force-cancelled, it ended before the kill: its dependents do not run
                    self._fail_dependents(task, Status.CANCELLED, b"")
            if result.delivered:
                counters["delivered_direct"] += 1  # the client has it from the processor
            elif not task.flags & TaskFlags.NO_RESULT and task.client in self.clients:
                if result.objects:
                    self._client_holds(task.client, result.objects)  # until it has read them
                self._result_to(task.client, result)
            elif result.objects and task.result_objects is None:
                self._deletions.extend(result.objects)  # nobody will read them
        # Once per batch, not per result: the tasks that ran and ended.  (Dependents failed
        # with a task count in ``failed``, not here.)  Their run times and peak memory come
        # summed up in the worker's TaskRuns (_on_task_runs), nothing per task here.
        if ended:
            counters["finished"] += ended - failed
            counters["failed"] += failed
            self.recorder.ended(self._now, ended - failed, failed)
            self.history.ended(self._now, ended - failed, failed)

    def _record_failure(self, worker: WorkerRecord, task: TaskRecord | None, result: m.TaskResult) -> None:
        """``task``: None for a lane task's (the daemon has no record of it)."""
        kind = {Status.TIMEOUT: "timeout", Status.CANCELLED: "cancelled", Status.FORCE_CANCELLED: "cancelled"}.get(result.status, "failed")
        task_id = result.task_id if task is None else task.task_id
        self.recorder.event(self._now, kind, "", task_id=task_id, where=worker.name, payload=result.payload, status=result.status)

    def _on_lane_started(self, peer: bytes, message: m.LaneStarted) -> None:
        """Lane tasks still running: recorded as this worker's, DISPATCHED, so that its load,
        the task counts and monitors include them, until LaneDone names them.  The record
        has no payload: the daemon never dispatches, retries or answers it (ON_LANE)."""
        worker = self.workers[peer]
        tasks = self.tasks
        for task_id in message.task_ids:
            client_id = task_id >> m.TASK_ID_BITS
            client = next((c for c in self.clients.values() if c.client_id == client_id), None)
            if client is None or task_id in tasks:
                continue  # its client left (the worker runs it for nobody), or a bad id
            task = TaskRecord(
                task_id, client.peer, 0, DEFAULT, TaskFlags.ON_LANE, b"", NONE, NONE, 0, self.state_counts
            )
            tasks[task_id] = task
            client.tasks.add(task_id)
            task.transition("dispatch")
            task.worker = peer
            worker.inflight[task_id] = None

    def _on_task_runs(self, peer: bytes, message: m.TaskRuns) -> None:
        """A worker's task runs since its last report: kept as they came (one blob), for the
        history; decoded only when one is asked for (scheduler/history.py)."""
        count, seen, counts = message.kept, message.seen, message.durations
        if not 0 <= count <= min(seen, MAX_REPORT_RUNS) or seen > MAX_FIGURE or len(message.runs) != count * RUN_BYTES:
            self._refuse(peer, "task-runs", f"TaskRuns of {count} runs ({seen} seen) in {len(message.runs)} bytes")
            return
        if not (
            0 <= message.timed <= MAX_FIGURE and 0.0 <= message.longest <= message.seconds <= MAX_FIGURE  # NaN fails
            and 0 <= message.peak_memory <= MAX_FIGURE
            and (counts == [] if not message.timed else len(counts) == len(DURATION_BOUNDS) + 1 and min(counts) >= 0 and sum(counts) == message.timed)
        ):  # fmt: skip
            self._refuse(peer, "task-runs", f"TaskRuns run times out of range: {message.timed} timed, {message.seconds!r} s")
            return
        self.history.reported(self.workers[peer].name, count, seen, message.runs)
        if message.timed:
            recorder = self.recorder
            recorder.ended(self._now, 0, 0, message.timed, message.seconds, message.longest)
            recorder.timed(counts, message.seconds)
            if message.peak_memory:
                recorder.peak_memory[peer] = message.peak_memory

    def _on_lane_done(self, peer: bytes, message: m.LaneDone) -> None:
        """Lane tasks that ended: counted as if submitted here (a retried one is submitted
        here again by its client, and counted then); the records of announced ones go."""
        worker = self.workers[peer]
        counts = (message.finished, message.failed, message.retried, message.delivered)
        if not all(0 <= n <= MAX_FIGURE for n in counts) or not 0.0 <= message.seconds <= MAX_FIGURE:
            self._refuse(peer, "lane-done", f"LaneDone counts out of range: {counts!r}, {message.seconds!r} s")
            return
        if message.clients:  # cumulative: the latest is the whole count (held statistics wait for it)
            if not all(0 <= e.ended <= MAX_FIGURE for e in message.clients):
                self._refuse(peer, "lane-done", f"LaneDone client counts out of range: {message.clients!r}")
                return
            worker.lane_ends = {e.client_id: e.ended for e in message.clients}
        ended = message.finished + message.failed
        counters = self.counters
        counters["submitted"] += ended
        counters["finished"] += message.finished
        counters["failed"] += message.failed
        counters["retried"] += message.retried
        counters["delivered_direct"] += message.delivered
        counters["lane"] += ended + message.retried
        if ended:
            self.recorder.ended(self._now, message.finished, message.failed, ended if message.seconds > 0 else 0, message.seconds)
            self.history.ended(self._now, message.finished, message.failed)
        for result in message.failures[: message.failed]:
            if result.status in WORKER_STATUSES and result.status != Status.OK:
                self._record_failure(worker, None, result)
        if ended and message.seconds > 0:
            duration = message.seconds / ended
            mean = worker.mean_task_seconds
            worker.mean_task_seconds = duration if mean is None else mean + EWMA_WEIGHT * (duration - mean)
            self.placement.grew(peer)  # its prefetch window may have grown
        for task_id in message.announced:
            task = self.tasks.get(task_id)
            if task is None or not task.flags & TaskFlags.ON_LANE or task.worker != peer:
                continue
            self._unassign(worker, task)
            task.transition("result")
            self._forget(task)

    def _on_seceded(self, peer: bytes, message: m.Seceded) -> None:
        worker = self.workers[peer]
        for task_id in message.task_ids:
            if task_id in worker.inflight:
                worker.seceded.add(task_id)
                self.placement.grew(peer)  # a seceded task is not counted as load

    def _on_worker_draining(self, peer: bytes, message: m.WorkerDraining) -> None:
        """The worker drains (SIGTERM with ``--drain-seconds``: its job ends soon): nothing
        more is dispatched to it; the tasks it lists as never started (under the attempt it
        holds) go back to the front of their queues at no charge, to run elsewhere; the
        rest stay its own, and their results count as usual.  Its Goodbye follows the
        usual rules.  It may say this more than once (tasks that came back to it later)."""
        worker = self.workers[peer]
        if not worker.draining:
            log.info(
                "worker %r drains: it takes no more tasks, hands back %d and finishes the rest of its %d",
                worker.name, len(message.unstarted), len(worker.inflight),
            )
        worker.draining = True
        self.managers.worker_draining(worker)
        inflight, tasks = worker.inflight, self.tasks
        for listed in message.unstarted:
            task = tasks.get(listed.task_id)
            if (
                task is None
                or listed.task_id not in inflight
                or task.attempt != listed.attempt
                or task.flags & TaskFlags.ON_LANE
            ):
                continue  # not what it holds (a stale attempt, a lane's, or no task of its)
            self._unassign(worker, task)
            self._requeue_free(task, "returned")

    def _on_cluster_broken(self, peer: bytes, message: m.ClusterBroken) -> None:
        worker = self.workers[peer]
        worker.broken = message.reason
        log.error("worker %r cannot run tasks: %s", worker.name, message.reason)
        for client in self.clients.values():
            self._send(client.peer, message)

    def _lose_worker(
        self,
        worker: WorkerRecord,
        why: str,
        *,
        clean: bool = False,
        infrastructure: bool = False,
        unstarted: list[m.TaskAttempt] | None = None,
        manager: str = "",
    ) -> None:
        """The worker is gone; each task it held goes on by what the daemon knows of it.

        * ``unstarted``: the tasks (and attempts) its Goodbye hands back as never given to a
          processor. They are queued again at no charge: they never ran.
        * Any other task may have started. It counts as interrupted when the worker left in
          an orderly way (``clean``: its Goodbye) or its manager says the infrastructure
          ended it (``infrastructure``: preemption, walltime, cancellation): queued again
          without a charge against its retries, except a task that may run at most once
          (``max_retries=0``), which fails naming the worker (and its job, where known).
        * Otherwise (a crash, missed heartbeats, unreachable) its attempt failed.
        """
        (log.info if clean else log.warning)("worker %r lost: %s; %d tasks affected", worker.name, why, len(worker.inflight))
        self._end_object_sends(worker.peer)
        self._end_puts(worker.peer)
        if worker.peer in self.result_streams.by_worker:  # lost mid-upload: no partial object is a result
            # Whole objects whose result never came: nobody will name them (the task runs
            # again and streams a new one), so they go too, unless something holds one.
            unclaimed = self.result_streams.unclaimed(worker.peer)
            streaming, ended = self.result_streams.worker_lost(worker.peer)
            self._streams_ended(ended)
            self._commands.append(AbortPartial(worker.peer, tuple(streaming)))
            self._deletions.extend(o for o in unclaimed if o not in self.object_holds)
        if not clean:
            self.counters["workers_lost"] += 1
            self.recorder.event(self._now, "worker-lost", f"{why}; {len(worker.inflight)} tasks affected", where=worker.name)
        job = self.managers.job_of(worker) if clean else ""  # a manager's "gone" names it in ``why``
        who = f"worker {worker.name}" + (f" ({job})" if job else "")
        returned = {(u.task_id, u.attempt) for u in unstarted} if unstarted else set()
        manager = manager or self.managers.manager_of(worker)  # interruptions are charged to it
        interrupted = 0
        failed: list[tuple[int, int]] = []  # its report, if it comes later, says what ended them
        self.recorder.peak_memory.pop(worker.peer, None)
        del self.workers[worker.peer]
        self.placement.remove(worker)
        self._memory_total -= worker.memory
        self.history.gauge(self._now, len(self.workers), self._memory_total)
        self.managers.worker_left(worker)
        self.last_sent.pop(worker.peer, None)
        self._out.pop(worker.peer, None)
        for task_id in list(worker.inflight):
            task = self.tasks[task_id]
            self._unassign(worker, task)
            if task.flags & TaskFlags.ON_LANE:
                task.transition("result")  # its client sees the lane close, and submits it again here
                self._forget(task)
            elif (task_id, task.attempt) in returned:
                self._requeue_free(task, "returned")
            elif (clean or infrastructure) and self._retry_free(task):
                self._requeue_free(task, "interrupted")
                interrupted += 1
            elif clean or infrastructure:
                self._attempt_failed(
                    task,
                    f"{who}: {why}",
                    at_most_once=(
                        f"task {task.task_id:#x} failed: it may have started on worker {worker.name}, which "
                        f"{'left' if clean else 'the infrastructure ended'} while it held it, and max_retries=0 "
                        "lets a task run at most once, so it was not run again"
                    ),
                )
            else:
                self._attempt_failed(task, f"{who}: {why}")
                if manager and task.failures is not None and task_id in self.tasks:
                    failed.append((task_id, len(task.failures) - 1))
        if failed:
            self.managers.failed_on(worker, failed)
        if interrupted:
            self.counters["tasks_interrupted"] += interrupted
            if manager:
                self.managers.charge(manager, interrupted)

    def _requeue_free(self, task: TaskRecord, event: str) -> None:
        """Back to the front of its queue without a charge against its retries (``returned``:
        it never started; ``interrupted``: its worker's orderly leave or the infrastructure
        cut it short).  A task being cancelled ends here instead."""
        if task.state is TaskState.CANCELLING:
            self._end_cancelling(task, event)
            return
        # A new attempt number, so that a late answer from the old hand-out (the worker may
        # still finish or cancel it) cannot settle the new one; no failure is recorded, so it
        # does not count against max_retries.
        task.attempt += 1
        task.transition(event)
        self._queue(task, front=True)

    def _end_cancelling(self, task: TaskRecord, event: str) -> None:
        """A task being cancelled (force) whose worker will never answer: it ends cancelled,
        as that answer would have said; its client is told and its dependents end too."""
        task.transition(event)
        self._forget(task)
        self.counters["cancelled"] += 1
        self._fail_dependents(task, Status.CANCELLED, b"")
        if not task.flags & TaskFlags.NO_RESULT and task.client in self.clients:
            self._result_to(task.client, m.TaskResult(task.task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))

    def _retry_free(self, task: TaskRecord) -> bool:
        max_retries = task.options.max_retries
        return (self.config.max_retries if max_retries is None else max_retries) > 0

    def _attempt_failed(self, task: TaskRecord, line: str, output: bytes = b"", at_most_once: str = "") -> None:
        """``output``: what the attempt captured before its process died (capture_output),
        given to the client with the failure when it was the last attempt allowed.
        ``at_most_once``: the failure's text instead of the usual one (a crash on every
        attempt) when this ends a task that may have started and may not run again."""
        if task.failures is None:
            task.failures = []
        task.failures.append(f"attempt {len(task.failures) + 1}: {line}")
        max_retries = task.options.max_retries
        if max_retries is None:
            max_retries = self.config.max_retries
        if task.state is TaskState.CANCELLING:
            self._end_cancelling(task, "attempt-failed")
            return
        if len(task.failures) > max_retries:
            task.transition("retries-exhausted")
            self._forget(task)
            self.counters["failed"] += 1
            text = at_most_once or (
                f"task {task.task_id:#x} failed: the process running it died on all "
                f"{len(task.failures)} attempt(s) allowed (max_retries={max_retries})"
            )
            self.recorder.ended(self._now, 0, 1)
            self.history.ended(self._now, 0, 1)
            self.recorder.event(self._now, "retries-exhausted", f"{text}; last: {line}", task_id=task.task_id)
            payload = _pack_lost(text, task.failures)
            self._fail_dependents(task, Status.WORKER_LOST, payload)
            if not task.flags & TaskFlags.NO_RESULT:
                lost = m.TaskResult(task.task_id, task.attempt, Status.WORKER_LOST, payload, m.NO_FACTS, m.NO_OBJECTS, False, output)
                self._result_to(task.client, lost)
            return
        task.attempt += 1
        task.transition("attempt-failed")
        self.counters["retried"] += 1
        self._queue(task, front=True)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self) -> None:
        if not self.workers:
            return
        out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]] = {}
        self.placement.refresh()
        if not self.constrained:
            if self.ready.live:
                self._dispatch_ready(out)
        else:
            # Fairness across queues: the unconstrained queue and the per-constraint ones
            # share workers, and whichever is served first takes the free slots.  Serving
            # them in the order in which their next clients were last served keeps the
            # rotation between clients whole: one client's backlog of tagged tasks cannot
            # starve another client's plain ones, nor the other way round.  Within a queue
            # the rotation is ReadyQueue's; priority breaks ties (one client's own order).
            # Only the constrained queues some worker may serve now are visited (placement.py:
            # a stuck key waits, at no cost per turn, until a worker that fits it has room).
            served = self._served
            order: list[tuple[int, int, ConstraintKey | None]] = []
            if self.ready.live:
                order.append((served.get(self.ready.next_client() or b"", -1), -self.ready.head_priority(), None))
            placement = self.placement
            for key in list(placement.active):
                queue = self.constrained[key]
                if not queue.live:
                    del self.constrained[key]
                    placement.served(key)
                    continue
                order.append((served.get(queue.next_client() or b"", -1), -queue.head_priority(), key))
            order.sort(key=lambda entry: entry[:2])
            for _, _, which in order:
                if which is None:
                    self._dispatch_ready(out)
                else:
                    self._dispatch_constrained(which, out)
        for peer, (blobs, batch) in out.items():
            self._send(peer, m.DispatchTasks(blobs, batch))

    def _dispatch_ready(self, out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]]) -> None:
        """Tasks any worker can run: the policy's share of each worker's free slots."""
        # Only the workers that may have room (placement.py): those found full, broken or
        # draining leave the open set until they grow; the policy sees the rest, in join order.
        max_prefetch, placement = self.config.max_prefetch, self.placement
        if type(self.policy) is LeastLoaded:
            # Its first choices without a pass over every open worker: the idle ones, in join
            # order, each filled to its processors (policies.py; placement.py, "Idle workers");
            # the pass below is for the rest.
            idle = placement.take_idle(self.ready.live)
            for i, worker in enumerate(idle):
                for _ in range(worker.capacity):
                    task = self.ready.pop()
                    if task is None:
                        break
                    self._assign(worker, task, out)
                if not self.ready.live:
                    for unused in idle[i + 1:]:
                        placement.put_back(unused)
                    return
            if not self.ready.live:
                return
        workers, slots = [], []
        for w in placement.open_workers(self.workers):
            slot = WorkerSlot(w.capacity, len(w.inflight) - len(w.seceded), w.mean_task_seconds)
            if w.broken is not None or w.draining or prefetch_window(slot, max_prefetch) <= slot.inflight:
                placement.closed(w.peer)
                continue
            workers.append(w)
            slots.append(slot)
        counts = self.policy.allocate(self.ready.live, slots)  # one per slot, same order
        for worker, count in zip(workers, counts, strict=False):
            for _ in range(count):
                task = self.ready.pop()
                if task is None:
                    return
                self._assign(worker, task, out)

    def _dispatch_constrained(
        self, key: ConstraintKey, out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]]
    ) -> None:
        """Tasks that need resources or tags (one constraint's queue): each to a worker that
        has them free now.

        A task that fits nowhere yet stays in its own queue and delays no other task.
        Quantities are honoured: a worker's resources held by its in-flight tasks are in use.
        """
        max_prefetch = self.config.max_prefetch
        queue = self.constrained[key]
        placement = self.placement
        candidates = placement.candidates(key)
        if candidates is None:  # not stuck: every worker that could ever run it
            workers: Iterable[WorkerRecord] = placement.workers_for(key)
        else:  # stuck: only those that may have room since (every other one still has none)
            present = self.workers
            workers = [w for peer in candidates if (w := present.get(peer)) is not None]
        for worker in workers:
            if worker.broken is not None or worker.draining:
                continue
            window = prefetch_window(WorkerSlot(worker.capacity, 0, worker.mean_task_seconds), max_prefetch)
            while queue.live and len(worker.inflight) - len(worker.seceded) < window and worker.fits_now(key):
                task = queue.pop()
                if task is None:
                    break
                self._assign(worker, task, out)
            if not queue.live:
                break
        if queue.live:
            placement.stick(key)  # no worker can take one more of these now
        else:
            del self.constrained[key]
            placement.served(key)

    def _assign(
        self,
        worker: WorkerRecord,
        task: TaskRecord,
        out: dict[bytes, tuple[list[m.FunctionBlob], list[m.TaskDispatch]]],
    ) -> None:
        entry = out.get(worker.peer)
        if entry is None:
            entry = out[worker.peer] = ([], [])
        task.transition("dispatch")
        task.worker = worker.peer
        worker.inflight[task.task_id] = None
        self._dispatches += 1
        self._served[task.client] = self._dispatches
        if task.queue_key is not None:
            used = worker.used
            for name, quantity in task.queue_key[0]:
                used[name] = used.get(name, 0.0) + quantity
        fn_id = task.fn_id
        if fn_id and fn_id not in worker.functions:
            worker.functions.add(fn_id)
            entry[0].append(m.FunctionBlob(fn_id, self.functions[fn_id]))
        deps = [_dep_value(self.tasks[d]) for d in task.deps] if task.deps else []
        reply_to = authkey_file = ""
        client = self.clients.get(task.client)
        if client is not None and client.host == worker.host:
            # Only the file's path, only to a worker on the client's host: elsewhere the path
            # is useless, and only the client's user can read the file (client/authkey.py).
            authkey_file = client.authkey_file
            if task.flags & TaskFlags.REPLY_DIRECT:
                reply_to = client.reply_to
        entry[1].append(
            m.make(m.TaskDispatch, (
                task.task_id, task.attempt, fn_id, task.flags, task.payload, task.objects or [],
                task.options.task_timeout, deps, reply_to, authkey_file,
            ))
        )  # fmt: skip
        if task.flags & TaskFlags.REPLY_DIRECT:
            self._direct_running[task.task_id] = (task.client, self._now)
            return
        if task.flags & TaskFlags.NO_RESULT:
            return  # a graph's intermediate: its client keeps no future to mark running
        running = self._running.get(task.client)
        if running is None:
            running = self._running[task.client] = []
        running.append(task.task_id)

    def _claim(self, worker: WorkerRecord, task: TaskRecord) -> None:
        """An UNCLAIMED task is at this worker (its report lists it, or its result): DISPATCHED
        there under the attempt it has, as if dispatched (nothing is sent: the worker has it).
        Then ``_apply_held_cancel``."""
        del self.unclaimed[task.task_id]
        task.transition("claimed")
        task.worker = worker.peer
        worker.inflight[task.task_id] = None
        if task.queue_key is not None:
            used = worker.used
            for name, quantity in task.queue_key[0]:
                used[name] = used.get(name, 0.0) + quantity

    def _release_unclaimed(self, task: TaskRecord) -> None:
        """The recovery ended and no worker claimed this UNCLAIMED task: queued under a new
        attempt (a late answer from an earlier hand-out cannot settle it), at no charge
        against its retries.  Then ``_apply_held_cancel``."""
        del self.unclaimed[task.task_id]
        task.attempt += 1
        task.transition("unclaimed")
        task.queued_at = self._now
        self._queue(task)

    def _apply_held_cancel(self, task: TaskRecord, claimed: bool) -> None:
        """The cancel held while the task was UNCLAIMED (hold_cancel), now that it was
        claimed by a worker (as for a task at a worker: refused, and with force killed there)
        or released to its queue (as for a queued task: dropped, its client told by
        ``TasksCancelled``, or by a CANCELLED result for a forced cancel, which gets no
        answer of its own)."""
        how = self.cancels_held.pop(task.task_id, 0)
        if not how:
            return
        client = task.client if task.client in self.clients else None
        if claimed:
            if how & CANCEL_FORCE:
                self._cancel(task, True)
            if how & CANCEL_ANSWER and client is not None:
                self._send(client, m.TasksCancelled([], [task.task_id]))
            return
        self._cancel(task, False)
        if client is None:
            return
        if how & CANCEL_ANSWER:
            self._send(client, m.TasksCancelled([task.task_id], []))
        if how & CANCEL_FORCE and not task.flags & TaskFlags.NO_RESULT:
            self._result_to(client, m.TaskResult(task.task_id, task.attempt, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))

    def _unassign(self, worker: WorkerRecord, task: TaskRecord) -> None:
        del worker.inflight[task.task_id]
        worker.seceded.discard(task.task_id)
        self.placement.grew(worker.peer)
        if not worker.inflight:
            worker.idle_since = self._now
        task.worker = None
        if task.queue_key is not None:
            used = worker.used
            for name, quantity in task.queue_key[0]:
                left = used[name] - quantity
                if left <= 1e-9:
                    del used[name]
                else:
                    used[name] = left

    def _queue(self, task: TaskRecord, *, front: bool = False) -> None:
        key = task.queue_key
        if key is None:
            self.ready.push(task, front=front)
            return
        queue = self.constrained.get(key)
        if queue is None:
            queue = self.constrained[key] = ReadyQueue()
            self.placement.queued(key)
        queue.push(task, front=front)

    def _unqueue(self, task: TaskRecord) -> None:
        """A queued task leaves its queue other than by dispatch (lazily: skipped when popped)."""
        if task.queue_key is None:
            self.ready.discard()
        else:
            self.constrained[task.queue_key].discard()

    def _expire_unsatisfiable(self, now: float) -> None:
        timeout = self.config.unsatisfiable_timeout
        for key, queue in list(self.constrained.items()):
            if not queue.live:
                if key not in self.placement.active:  # a stuck key's tasks all went (cancelled): drop it
                    del self.constrained[key]
                    self.placement.served(key)
                continue
            if self._satisfiable(key):
                continue
            if key not in self._warned:
                self._warned.add(key)
                log.warning("tasks wait for %s, which no connected worker has", describe_key(key))
            if timeout is None:
                continue
            for task in queue.entries():
                if now - task.queued_at >= timeout:
                    self._unqueue(task)
                    task.transition("reject")
                    self._forget(task)
                    self.counters["failed"] += 1
                    reason = (self._unsatisfiable_text(key) + f" within unsatisfiable_timeout={timeout:g} s").encode()
                    self.recorder.ended(now, 0, 1)
                    self.history.ended(now, 0, 1)
                    self.recorder.event(now, "rejected", reason.decode(), task_id=task.task_id)
                    self._fail_dependents(task, Status.REJECTED, reason)
                    if not task.flags & TaskFlags.NO_RESULT:
                        self._result_to(task.client, m.TaskResult(task.task_id, 0, Status.REJECTED, reason, m.NO_FACTS, m.NO_OBJECTS))

    # ------------------------------------------------------------------ bookkeeping

    def _forget(self, task: TaskRecord) -> None:
        if not task.deps:  # most tasks: nothing of theirs to release
            if self.tasks.pop(task.task_id, None) is not None:
                task.unrecord()
                self._forget_one(task)
            return
        # Iterative: forgetting the end of a 10,000-task chain releases the whole chain.
        stack = [task]
        while stack:
            task = stack.pop()
            if self.tasks.pop(task.task_id, None) is None:
                continue
            task.unrecord()
            self._forget_one(task)
            stack.extend(self._release_deps(task, forget=False))

    def _release_deps(self, task: TaskRecord, forget: bool = True) -> list[TaskRecord]:
        """The task needs its dependencies' results no more: drop its hold on each (once).

        Kept results nothing holds any more are released; with ``forget`` they are
        forgotten here, else returned for the caller's worklist.
        """
        released: list[TaskRecord] = []
        if task.deps_released:
            return released
        task.deps_released = True
        for dep_id in task.deps:
            dep = self.tasks.get(dep_id)
            if dep is not None:
                dep.holds -= 1
                if dep.dependents is not None:  # (a task id used again later is not its dependent)
                    dep.dependents.pop(task.task_id, None)
                if dep.holds <= 0 and dep.state is TaskState.FINISHED:
                    dep.transition("released")
                    dep.result = None
                    released.append(dep)
        if forget:
            for dep in released:
                self._forget(dep)
        return released

    def _maybe_release(self, task: TaskRecord) -> None:
        if task.holds <= 0 and task.state is TaskState.FINISHED:
            task.transition("released")
            task.result = None
            self._forget(task)

    def _forget_one(self, task: TaskRecord) -> None:
        if task.objects:
            self._drop(task.objects)
        if task.result_objects:
            self._drop(task.result_objects)
            task.result_objects = None
        if task.fn_id:
            left = self.function_refs[task.fn_id] - 1
            self.function_refs[task.fn_id] = left
            if not left and task.fn_id in self.released_functions:
                self._release_function(task.fn_id)
        client = self.clients.get(task.client)
        if client is not None:
            client.tasks.discard(task.task_id)

    def _send(self, peer: bytes, message: Any) -> None:
        out = self._out.get(peer)
        if out is None:
            self._out[peer] = [message]
        else:
            out.append(message)

    def _result_to(self, peer: bytes, result: m.TaskResult) -> None:
        if peer not in self.clients:
            return  # the client is gone; nobody is waiting for this result
        results = self._results.get(peer)
        if results is None:
            self._results[peer] = [result]
        else:
            results.append(result)

    def _flush(self) -> list[Command]:
        barrier = self.stats_barrier
        if barrier.held:  # counted by now (a LaneDone came), its workers gone, or waited long enough
            expired = barrier.expired
            self._stats_wanted.extend(barrier.release(self.workers, self._now))
            self.counters["stats_barrier_expired"] += barrier.expired - expired
        if self._stats_wanted:
            fresh = None  # a client's snapshot is always fresh: its own tests read exact counts
            for peer in self._stats_wanted:
                if peer in self.clients:
                    fresh = fresh or stats_message(self)
                    self._send(peer, fresh)
                elif peer in self._monitors:
                    self._send(peer, self._snapshot_for_monitors())
            self._stats_wanted.clear()
        if self._acks or self._running:
            self._flush_notices()
        else:
            self._notices_since = None  # their client left: nothing is due (no wake-up spin)
        if self._direct_running:
            self._flush_direct_running()
        for peer, results in self._results.items():
            self._send(peer, m.TaskResults(results))
        self._results.clear()
        if self._heartbeats_due:
            self._heartbeats_due = False
            interval, now = self.config.heartbeat_interval, self._now
            beat = m.Heartbeat(self.ready.live, len(self.tasks) - self.ready.live)
            workers, clients, monitors, out, last_sent = self.workers, self.clients, self._monitors, self._out, self.last_sent
            worker_quiet = self.worker_quiet
            now_due: list[bytes] = []  # sent to this turn: next due an interval from now
            workers_due: list[bytes] = []  # and these a worker's quiet period from now
            for peer in self._quiet.due(now):
                is_worker = peer in workers
                if not is_worker and peer not in clients and peer not in monitors:
                    continue  # gone: its entry ends here
                quiet = worker_quiet if is_worker else interval
                if peer not in out:
                    last = last_sent.get(peer, 0.0)
                    if now - last < quiet:
                        self._quiet.add(peer, last + quiet)
                        continue
                    out[peer] = [beat]
                (workers_due if is_worker else now_due).append(peer)
            self._quiet.add_all(now_due, now + interval)
            self._quiet.add_all(workers_due, now + worker_quiet)
        commands: list[Command] = [Send(peer, messages) for peer, messages in self._out.items()]
        for peer in self._out:
            if peer in self.clients or peer in self.workers or peer in self._monitors:
                self.last_sent[peer] = self._now  # refused peers leave no trace
        self._out = {}
        if self._deletions:
            commands.append(DeleteObjects(tuple(self._deletions)))
            self._deletions = []
        if self._commands:
            commands.extend(self._commands)
            self._commands = []
        return commands

    def _snapshot_for_monitors(self) -> m.Stats:
        cached = self._monitor_snapshot
        if cached is None or self._now - cached[0] >= MONITOR_SNAPSHOT_SECONDS:
            cached = self._monitor_snapshot = (self._now, stats_message(self))
        return cached[1]

    def _flush_notices(self) -> None:
        """Send submit acks and running notices with a client's results, or once the oldest
        has waited NOTICE_DELAY.

        Sent at once they cost a transmission of their own per submit: about a fifth of a
        no-op round trip's CPU, in the daemon and the client, on the cores the task's own
        path needs.  Deferred, a short task's result arrives first and the notice that it
        runs is never sent (the client marks a future running on its result); a client's
        submit window (thousands) is never held up by a 2 ms delay in its acks.
        """
        now = self._now
        if self._notices_since is None:
            self._notices_since = now
        due = now >= self._notices_since + NOTICE_DELAY  # the same sum as wakeup_at: no float gap
        results, tasks = self._results, self.tasks
        for peer in [p for p in self._acks if due or p in results]:
            self._send(peer, m.SubmitAck(self._acks.pop(peer)))
        for peer in [p for p in self._running if due or p in results]:
            ids = [t for t in self._running.pop(peer) if t in tasks]  # finished ones: their result says it
            if ids and peer in self.clients:
                self._send(peer, m.TasksRunning(ids))
        if not self._acks and not self._running:
            self._notices_since = None

    def _flush_direct_running(self) -> None:
        """Running notices of REPLY_DIRECT tasks still running NOTICE_DELAY after dispatch
        (sent with the client's other notices or results if those go sooner)."""
        now, results, tasks = self._now, self._results, self.tasks
        due = [
            (task_id, peer)
            for task_id, (peer, since) in self._direct_running.items()
            if now >= since + NOTICE_DELAY or peer in results or peer in self._out
        ]
        for task_id, peer in due:
            del self._direct_running[task_id]
            if task_id in tasks and peer in self.clients:
                self._send(peer, m.TasksRunning([task_id]))

    def wakeup_at(self) -> float | None:
        """When the loop must call ``handle`` (with ``Wake``) even if nothing arrives."""
        since = self._notices_since
        if self._direct_running:  # at most a few: one per sequential caller
            first = min(dispatched for _, dispatched in self._direct_running.values())
            since = first if since is None else min(since, first)
        due = None if since is None else since + NOTICE_DELAY
        if self.stats_barrier.held:  # (rare: a client's statistics wait for lane reports)
            bound = self.stats_barrier.wakeup_at()
            due = bound if due is None or (bound is not None and bound < due) else due
        return due

    # ------------------------------------------------------------------ observability

    def statistics(self) -> Statistics:
        """The snapshot a client or monitor would receive now (scheduler/stats.py).  Task
        states are kept by every state change (TaskRecord.counts): a snapshot is no walk
        over every task, which at 10^6 pending cost the daemon a fifth of a second."""
        return Statistics.from_message(stats_message(self))

    def validate(self) -> None:
        """Check the cross-indexes; raises AssertionError naming the first broken invariant."""
        states: dict[TaskState, int] = {}
        for task in self.tasks.values():
            states[task.state] = states.get(task.state, 0) + 1
            assert task.counts is self.state_counts, f"{task!r} is recorded but not counted"
        counted = {state: n for state, n in self.state_counts.items() if n}
        assert counted == states, f"state counts {counted} but the tasks are in {states}"
        queued = {t.task_id for t in self.ready.entries()}
        assert len(queued) == self.ready.live, f"ready queue live={self.ready.live} but {len(queued)} queued entries"
        for key, queue in self.constrained.items():
            entries = queue.entries()
            assert len(entries) == queue.live, f"queue {key} live={queue.live} but {len(entries)} entries"
            assert all(t.queue_key == key for t in entries), f"queue {key} holds a task of another key"
            queued.update(t.task_id for t in entries)
        for task_id, task in self.tasks.items():
            assert task.task_id == task_id
            assert task.state is not TaskState.DONE, f"{task!r} is done but still recorded"
            assert (task.state in QUEUED_STATES) == (task_id in queued), f"{task!r} queue membership wrong"
            if task.state in AT_WORKER_STATES:
                assert task.worker in self.workers, f"{task!r} at an unknown worker"
                assert task_id in self.workers[task.worker].inflight, f"{task!r} missing from its worker"
            else:
                assert task.worker is None, f"{task!r} has a worker but is {task.state.value}"
            if task.client in self.clients:
                assert task_id in self.clients[task.client].tasks, f"{task!r} missing from its client"
            if task.state is TaskState.FINISHED:
                assert task.result is not None and task.holds > 0, f"{task!r} finished but kept for nothing"
            assert (task.state is TaskState.UNCLAIMED) == (task_id in self.unclaimed), f"{task!r} unclaimed index wrong"
            if task.state is TaskState.WAITING:
                unfinished = sum(1 for d in task.deps if self.tasks[d].state is not TaskState.FINISHED)
                assert task.waiting == unfinished > 0, f"{task!r} waits for {task.waiting}, {unfinished} unfinished"
            holders = sum(1 for d in (task.dependents or ()) if d in self.tasks and not self.tasks[d].deps_released)
            assert task.holds == holders, f"{task!r} holds={task.holds} but {holders} live dependents"
        for worker in self.workers.values():
            used: dict[str, float] = {}
            for task_id in worker.inflight:
                record = self.tasks.get(task_id)
                assert record is not None and record.worker == worker.peer, f"{worker!r} holds stray task {task_id:#x}"
                for name, quantity in (record.queue_key or ((), ()))[0]:
                    used[name] = used.get(name, 0.0) + quantity
            assert worker.seceded <= set(worker.inflight), f"{worker!r} has seceded tasks it does not hold"
            for name in set(used) | set(worker.used):
                assert abs(used.get(name, 0.0) - worker.used.get(name, 0.0)) < 1e-6, f"{worker!r} {name} use is off"
                assert used.get(name, 0.0) <= worker.resources.get(name, 0.0) + 1e-6, f"{worker!r} over its {name}"
        refs: dict[int, int] = {}
        for task in self.tasks.values():
            if task.fn_id:
                refs[task.fn_id] = refs.get(task.fn_id, 0) + 1
                assert task.fn_id in self.functions, f"{task!r} refers to a missing function {task.fn_id:#x}"
        for fn_id, count in self.function_refs.items():
            assert refs.get(fn_id, 0) == count, f"function {fn_id:#x}: {count} refs recorded, {refs.get(fn_id, 0)} real"
        expected: dict[bytes, int] = {}
        for task in self.tasks.values():
            for object_id in (task.objects or ()):
                expected[object_id] = expected.get(object_id, 0) + 1
            for object_id in (task.result_objects or ()):
                expected[object_id] = expected.get(object_id, 0) + 1
        for client in self.clients.values():
            for object_id, count in client.objects.items():
                expected[object_id] = expected.get(object_id, 0) + count
        assert expected == self.object_holds, "object holds disagree with tasks and clients"
        for client in self.clients.values():
            for task_id in client.tasks:
                assert self.tasks[task_id].client == client.peer, f"{client!r} owns stray task {task_id:#x}"
        assert len(self.unclaimed) == self.state_counts.get(TaskState.UNCLAIMED, 0), "unclaimed tasks gone but indexed"
        for task_id, how in self.cancels_held.items():
            assert task_id in self.unclaimed, f"a cancel held for task {task_id:#x}, which is not unclaimed"
            assert how and not how & ~(CANCEL_ANSWER | CANCEL_FORCE), f"task {task_id:#x}: held cancel {how!r}"
        self.managers.validate()
        self.result_streams.validate(self.workers, self.clients)
        self.stats_barrier.validate(self.clients)
        assert all(self.knows(p) for p in self._putters), f"putters no longer known: {self._putters}"
        self.placement.validate(self.workers, self.constrained)
        for key, queue in self.constrained.items():
            if queue.live:
                assert key in self.placement.active or key in self.placement.stuck, f"queue {key} is never tried"
        # Exactness of the index (placement.py): a worker with room is open (or about to be
        # looked at), and, in full where it is cheap, a stuck key with no candidate has no
        # worker that could take one more of its tasks now.
        placement = self.placement
        for worker in self.workers.values():
            if worker.broken is None and not worker.draining and not placement.pending(worker.peer):
                slot = WorkerSlot(worker.capacity, len(worker.inflight) - len(worker.seceded), worker.mean_task_seconds)
                if prefetch_window(slot, self.config.max_prefetch) > slot.inflight:
                    assert worker.peer in placement.open, f"{worker!r} has room but is not open"
        if len(placement.stuck) * len(self.workers) <= 50_000:
            for key, candidates in placement.stuck.items():
                if candidates or not self.constrained[key].live:
                    continue
                for worker in self.workers.values():
                    if placement.pending(worker.peer):
                        continue
                    if worker.broken is None and not worker.draining and worker.fits_ever(key):
                        window = prefetch_window(WorkerSlot(worker.capacity, 0, worker.mean_task_seconds), self.config.max_prefetch)
                        room = len(worker.inflight) - len(worker.seceded) < window
                        assert not (room and worker.fits_now(key)), f"stuck key {describe_key(key)} fits {worker!r} now"


def _figure(value: int) -> int:
    """A peer's reported figure within [0, MAX_FIGURE]."""
    return value if 0 <= value <= MAX_FIGURE else (0 if value < 0 else MAX_FIGURE)


def _dep_value(dep: TaskRecord) -> m.DepValue:
    assert dep.result is not None
    return m.DepValue(dep.task_id, dep.result, dep.result_objects or m.NO_OBJECTS)


def _pack_lost(text: str, failures: list[str]) -> bytes:
    return _packb([text, failures])


def _packb(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)

