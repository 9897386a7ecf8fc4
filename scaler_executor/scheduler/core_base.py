"""The bottom layer of the core (core.py explains the layers): the state every controller
shares, who a peer is, and the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scaler_executor.config import ClusterConfig, parse_resources, parse_tags
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Role
from scaler_executor.protocol.rejoin import idle_heartbeat
from scaler_executor.protocol.runlog import MAX_REPORT_RUNS
from scaler_executor.scheduler.core_events import MAX_REFUSAL_KEYS, REFUSAL_LOG_SECONDS, Command
from scaler_executor.scheduler.deadlines import DeadlineQueue
from scaler_executor.scheduler.history import History
from scaler_executor.scheduler.managers import ManagerController
from scaler_executor.scheduler.no_worker import NoWorkerWatch
from scaler_executor.scheduler.placement import Placement
from scaler_executor.scheduler.policies import LeastLoaded
from scaler_executor.scheduler.result_stream import ResultStreams
from scaler_executor.scheduler.state import (
    ClientRecord,
    ConstraintKey,
    ReadyQueue,
    TaskRecord,
    TaskState,
    WorkerRecord,
)
from scaler_executor.scheduler.stats import Recorder
from scaler_executor.scheduler.stats_barrier import StatsBarrier
from scaler_executor.scheduler.turns import TurnHistogram

log = logging.getLogger("scaler_executor.daemon")


def new_counters() -> dict[str, int]:
    """The daemon's counters (in every snapshot: stats.py), all at zero."""
    return {
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


class CoreBase:
    """The state every layer of the core shares (``__init__``), peers and their roles, and the
    outbox (``_send``, ``_refuse``).  Not a scheduler alone: ``Scheduler`` completes it."""

    # Whether REPLY_DIRECT submissions are acknowledged (SubmitAck) like any: only under a
    # journal, whose client keeps every submission until then (durable.py, client/resume.py).
    ACK_DIRECT = False

    # Worker managers (scheduler/managers.py): made by Scheduler, which they are given.
    managers: ManagerController

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
        self.counters = new_counters()
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
        self.autoscale = config.workers > 0 and config.min_workers is not None
        self.local_pids: frozenset[int] = frozenset()
        self.local_host = ""
        self.stopping_pids: set[int] = set()
        self._commands: list[Command] = []
        self.turns = TurnHistogram()  # recorded by the loop (scheduler/loop.py), reported here

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

    def _send(self, peer: bytes, message: Any) -> None:
        out = self._out.get(peer)
        if out is None:
            self._out[peer] = [message]
        else:
            out.append(message)
