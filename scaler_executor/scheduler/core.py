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

``Scheduler`` is one object built of layers, a module each; a layer calls only the layers
below it (a method a lower layer needs belongs in that layer or lower)::

    core.py              Scheduler: handle(), the events, the handshake, statistics, validate()
    core_clients.py      client controller: functions, options, submissions, a client lost
    core_workers.py      worker controller: results, retries, lanes, draining, a worker lost
    core_dispatch.py     dispatch: ready queues to free slots (policies.py, placement.py)
    core_graphs.py       graph controller: dependencies, cancels, unsatisfiable constraints
    core_bookkeeping.py  queues, forgetting tasks, the turn's flush into commands
    core_objects.py      object controller: holds, puts, fetches, streamed results
    core_base.py         the state every layer shares, peers and roles, the outbox
    core_events.py       events in, commands out, the constants the layers share

Layers of one class rather than controller objects, so that the journaled daemon
(durable.py) overrides any step by subclassing ``Scheduler``, and the per-task paths
(submit, dispatch, results) read the state as ``self.x``, with no hop through a controller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Role
from scaler_executor.protocol.rejoin import NOT_RESUMABLE, UNKNOWN_PEER
from scaler_executor.scheduler.core_clients import ClientController
from scaler_executor.scheduler.core_events import (
    CANCEL_ANSWER,
    CANCEL_FORCE,
    MAX_FIGURE,
    MAX_NAME,
    AbortPuts,
    Command,
    DeleteObjects,
    Event,
    LocalWorkers,
    PeerUnreachable,
    Received,
    Send,
    SendObjects,
    StartWorkers,
    StopWorkers,
    StoreChunk,
    Tick,
    Wake,
    WorkerExited,
    _figure,
    refusal_for,
)
from scaler_executor.scheduler.managers import ManagerController
from scaler_executor.scheduler.object_stream import CreditObjects
from scaler_executor.scheduler.policies import (
    ScalingView,
    WorkerSlot,
    desired_workers,
    prefetch_window,
)
from scaler_executor.scheduler.state import (
    AT_WORKER_STATES,
    QUEUED_STATES,
    ClientRecord,
    TaskState,
    WorkerRecord,
    describe_key,
)
from scaler_executor.scheduler.stats import Statistics, stats_message

# The core's vocabulary, defined in core_events.py, is imported from here by the loop and
# the tests: the events it handles, the commands it returns.
__all__ = [
    "AbortPuts",
    "Command",
    "DeleteObjects",
    "Event",
    "LocalWorkers",
    "PeerUnreachable",
    "Received",
    "Scheduler",
    "Send",
    "SendObjects",
    "StartWorkers",
    "StopWorkers",
    "StoreChunk",
    "Tick",
    "Wake",
    "WorkerExited",
    "refusal_for",
]

log = logging.getLogger("scaler_executor.daemon")


class Scheduler(ClientController):
    """The whole daemon state.  ``handle`` is the only entry point that changes it."""

    def __init__(self, config: ClusterConfig, object_store: str = "") -> None:
        super().__init__(config, object_store)
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
