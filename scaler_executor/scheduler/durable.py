"""The journaled daemon: the pure core, plus what it must not forget across its own death.

::

    DurableScheduler.handle(*events) -> [JournalWrite(entries), Send..., ...]
                                         └ first: the loop writes it before any send

``DurableScheduler`` is the core (core.py) with a journal (docs/durability.rst).  Each turn
it returns, first, the turn's journal entries (``(key, value)`` puts and ``(key, None)``
deletes of a key-value write-ahead log, scheduler/journal.py); the loop writes them before
it sends anything, so a daemon killed at any point never said what it had not written.
``restore(live_map, now)`` rebuilds a fresh core from the journal's live map; the core then
waits up to ``restart_grace`` for the workers it had, and every peer resumes:

* **Peers by journaled id, not by connection.**  A connection's identity is the
  transport's (the ipc stream router numbers connections; ZeroMQ's ROUTER draws a new one
  per reconnection), so under a journal every client and worker is known to the core by a
  *logical* id, ``LOGICAL + peer_id``, and the turn maps connections to logical ids on the
  way in and back on the way out.  A restarted daemon refuses an unknown connection as
  before (``Refused(UNKNOWN_PEER)``); a peer that was welcomed by a journaled daemon
  answers with ``Resume(peer_id, token)`` (the token is a secret from its Welcome), is
  welcomed again under its old id, and reports (``ClientReport`` / ``WorkerReport``).
* **What is journaled** (keys are a kind byte and an 8-byte big-endian number):
  ``n`` the next peer id; ``c``+peer id a client (name, host, token...); ``w``+peer id a
  worker; ``f``+fn id a callable; ``t``+task id a task as submitted plus its attempt and
  failures; ``d``+task id the worker it was dispatched to and under which attempt (only for a
  task that may run at most once, ``max_retries=0``: another task reloaded without a
  journaled dispatch is ``UNCLAIMED`` until a worker's report claims it or the recovery
  ends, state.py); ``r``+task
  id a result kept for dependents; ``k``+task id a result sent to a client and not yet
  acknowledged by it (``ResultsAck``).  Deletions follow the records' ends.  Tasks are
  written at the end of the turn from their state (a set of tasks touched this turn), so a
  task submitted and finished in one turn costs its ``k`` entry only.
* **Acknowledgements**: a client's submissions are acknowledged (SubmitAck) only after they
  were written; until then it keeps them and sends them again in its report (the daemon
  ignores the ones it knows).  A worker keeps each TaskResults message until the daemon
  says it journaled it (``ResultsJournaled``, a count); its report lists what it holds and
  what it finished, and sends those results again: they are delivered, not recomputed.
  A client acknowledges results by count (``ResultsAck``); until then they stay journaled
  and are sent again, if it still awaits them, after a restart.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
from collections.abc import Callable
from typing import Any

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import DEFAULT_OPTIONS, Role, Status
from scaler_executor.protocol.rejoin import JOURNAL_FULL, NOT_RESUMABLE, UNKNOWN_PEER
from scaler_executor.scheduler import durable_restore
from scaler_executor.scheduler.core import Command, PeerUnreachable, Received, Scheduler, Send, Tick
from scaler_executor.scheduler.durable_records import (
    _DISPATCH,
    _KEY,
    KEPT,
    LOGICAL,
    NEXT_PEER,
    ON_LANE,
    STORE,
    Entries,
    JournalWrite,
    Ledger,
    SendNow,
    SweepStore,
    _key,
    _pack,
    logical,
)
from scaler_executor.scheduler.reconcile import client_report, worker_report
from scaler_executor.scheduler.state import (
    AT_WORKER_STATES,
    ClientRecord,
    TaskRecord,
    TaskState,
    WorkerRecord,
)

log = logging.getLogger("scaler_executor.daemon")


class DurableScheduler(Scheduler):
    """The core with a journal; see the module doc."""

    ACK_DIRECT = True  # its clients keep a sequential caller's submission until acknowledged too

    def __init__(
        self, config: ClusterConfig, object_store: str = "", *, token: Callable[[], bytes] = lambda: os.urandom(16)
    ) -> None:
        super().__init__(config, object_store)
        self._new_token = token
        self.grace = config.restart_grace
        self._entries: Entries = []
        self._dirty: set[int] = set()  # tasks whose records may have changed this turn
        self._jt: dict[int, int] = {}  # task id -> the attempt its ``t`` record says
        self._jd: dict[int, bytes] = {}  # task id -> the dispatch journaled (in its ``t`` or ``d`` record)
        self._dkeys: set[int] = set()  # tasks with a ``d`` record of their own
        self._jr: set[int] = set()  # tasks with an ``r`` record
        self._conn_of: dict[bytes, bytes] = {}  # logical id -> its connection now
        self._left: dict[bytes, bytes] = {}  # logical id -> the connection it had, this turn
        self._logical: dict[bytes, bytes] = {}  # connection -> logical id
        self._tokens: dict[bytes, bytes] = {}  # logical id -> the secret its Resume must show
        self._ledgers: dict[bytes, Ledger] = {}
        self.absent: set[bytes] = set()  # journaled peers not back since the restart
        self._unreported: set[bytes] = set()  # welcomed again, report not in yet
        self._held_back: set[bytes] = set()  # restored workers dispatched nothing until they report
        self._results_in: dict[bytes, int] = {}  # TaskResults messages from a worker since its Welcome
        self._ack_due: set[bytes] = set()  # workers whose TaskResults came this turn
        self.recovering_until: float | None = None
        self.restored = False
        self.journal_full: str | None = None  # why the journal cannot be written (the loop says)
        self._refusals: dict[bytes, list[m.TaskResult]] = {}
        # Results kept for their clients until acknowledged: written at the turn's end, in
        # the task's own ``t`` record when the task ended that turn (one entry instead of a
        # ``k`` put and a ``t`` delete), else in a ``k`` record; by task id, which key holds it.
        self._kpending: dict[int, m.TaskResult] = {}
        self._kkey: dict[int, bytes] = {}
        self._jo: dict[tuple[bytes, bytes], int] = {}  # (client, object id) -> hold count journaled
        self._odirty: set[tuple[bytes, bytes]] = set()
        self._sweep = False  # a SweepStore is due once the journaled clients are back or gone
        self._forced: set[int] = set()  # tasks at workers cancelled with force (their cancel may be resent)
        # ``d`` records are written only for tasks that may run at most once (docs/durability.rst):
        # a task with retries left that is reloaded without one waits UNCLAIMED for the
        # workers' reports.  Whether a task of the default options may: the config's default.
        self._once_by_default = config.max_retries == 0
        if object_store:
            self._entries.append((STORE, object_store.encode()))
        self._handlers[m.ClientReport] = self._on_client_report
        self._handlers[m.WorkerReport] = self._on_worker_report
        self._handlers[m.ResultsAck] = self._on_results_ack

    # ------------------------------------------------------------------ connections <-> logical ids

    def _alias(self, conn: bytes, peer: bytes) -> None:
        old = self._conn_of.get(peer)
        if old is not None:
            self._logical.pop(old, None)
        self._conn_of[peer] = conn
        self._logical[conn] = peer

    def connection(self, peer: bytes) -> bytes | None:
        return self._conn_of.get(peer)

    def _unalias(self, peer: bytes) -> None:
        conn = self._conn_of.pop(peer, None)
        if conn is not None:
            self._logical.pop(conn, None)
            self._left[peer] = conn  # this turn's last commands for it (EndObjectSends...) still reach it

    def knows(self, peer: bytes) -> bool:
        return super().knows(self._logical.get(peer, peer))

    def _on_received(self, event: Received) -> None:
        conn = event.peer
        messages = event.messages
        peer = self._logical.get(conn)
        first = type(messages[0]) if messages else None
        if peer is not None:
            if first is m.Resume:  # resumed already on this connection (its Resume was repeated)
                messages = messages[1:]
                first = type(messages[0]) if messages else None
            if first is not m.Hello:
                if messages:
                    super()._on_received(Received(peer, messages, event.now))
                return
            # Joining afresh on this connection: the old peer is gone, a new one joins.
            self._on_goodbye(peer, m.Goodbye("joined again"))
            self._unalias(peer)
        if first is m.Resume:
            self._on_resume(conn, messages[0])
            peer = self._logical.get(conn)
            if peer is not None and len(messages) > 1:
                super()._on_received(Received(peer, messages[1:], event.now))
            return
        if first is m.Hello and messages[0].role in (Role.CLIENT, Role.WORKER):
            peer = logical(self._next_peer_id)
            self._alias(conn, peer)
            super()._on_received(Received(peer, messages, event.now))
            if peer not in self.clients and peer not in self.workers:  # refused: answer its connection
                self._unalias(peer)
                refusal = self._out.pop(peer, None)
                if refusal:
                    self._out.setdefault(conn, []).extend(refusal)
            return
        super()._on_received(event)

    def _on_unreachable(self, event: PeerUnreachable) -> None:
        peer = self._logical.get(event.peer)
        if peer is None:
            super()._on_unreachable(event)
            return
        self._unalias(peer)
        super()._on_unreachable(PeerUnreachable(peer, event.now))

    # ------------------------------------------------------------------ joining and resuming

    def _welcome(self, peer: bytes, peer_id: int) -> m.Welcome:
        token = self._tokens.get(peer)
        if token is None:
            token = self._tokens[peer] = self._new_token()
        return m.Welcome(
            peer_id, self.config.heartbeat_interval, self.config.heartbeat_liveness, self.object_store,
            True, self.grace, token, self._worker_runs if peer in self.workers else 0,
        )

    def _on_hello(self, peer: bytes, hello: m.Hello) -> None:
        super()._on_hello(peer, hello)
        token = self._tokens.get(peer, b"")
        if (client := self.clients.get(peer)) is not None:
            self._ledgers[peer] = Ledger(client.client_id)
            self._entries.append((_key(b"c", client.client_id), _pack(
                [client.name, client.host, client.reply_to, client.authkey_file, token]
            )))
        elif (worker := self.workers.get(peer)) is not None:
            self._results_in[peer] = 0
            self._entries.append((_key(b"w", worker.worker_id), _pack(
                [worker.name, worker.capacity, worker.resources, sorted(worker.tags), worker.pid, worker.host, token]
            )))
        else:
            return
        self._entries.append((NEXT_PEER, self._next_peer_id.to_bytes(8, "big")))

    def _on_resume(self, conn: bytes, message: m.Resume) -> None:
        peer = logical(message.peer_id) if 0 < message.peer_id < 1 << 64 else b""  # (no such id)
        record: Any = self.clients.get(peer) or self.workers.get(peer)
        token = self._tokens.get(peer)
        if record is None or token is None or not hmac.compare_digest(token, message.token):
            self.counters["dropped_messages"] += 1
            self._out.setdefault(conn, []).append(m.Refused(
                f"{UNKNOWN_PEER}: {NOT_RESUMABLE}: peer {message.peer_id} is not in this daemon's journal (it was forgotten, "
                "or the daemon restarted without its journal)"
            ))
            return
        self._alias(conn, peer)
        now = self._now
        self.absent.discard(peer)
        self._unreported.add(peer)
        record.last_seen = now
        limit = self.config.heartbeat_interval * self.config.heartbeat_liveness
        if peer in self.clients:
            limit = max(limit, self.config.client_timeout)
            ledger = self._ledgers[peer]
            ledger.seq = 0
            ledger.batches.clear()  # unacknowledged results go again with its report, if awaited
            self._results.pop(peer, None)
        else:
            self._results_in[peer] = 0
            self._ack_due.discard(peer)
            record.functions = set()  # what it has it may keep; blobs are sent again as needed
        self._liveness.add(peer, now + limit)
        self._quiet.add(peer, now + self.config.heartbeat_interval)
        log.info("%s %r resumed after the daemon's restart", "client" if peer in self.clients else "worker", record.name)
        self._send(peer, self._welcome(peer, message.peer_id))

    def _on_client_report(self, peer: bytes, message: m.ClientReport) -> None:
        self._unreported.discard(peer)
        client_report(self, peer, message)  # scheduler/reconcile.py

    def _on_worker_report(self, peer: bytes, message: m.WorkerReport) -> None:
        self._unreported.discard(peer)
        worker_report(self, peer, message)  # scheduler/reconcile.py
        self._end_recovery_if_back()

    def _end_recovery_if_back(self) -> None:
        if self.recovering_until is not None and not any(w in self.absent or w in self._unreported for w in self.workers):
            log.info("daemon: every journaled worker is back; recovery done")
            self.recovering_until = None
            self._release_unclaimed_all()

    def _release_unclaimed_all(self) -> None:
        """The recovery is over: no worker claimed these reloaded tasks, so none holds them
        (or it never came back): queued under a new attempt, in reload order."""
        if not self.unclaimed:
            return
        log.info("daemon: %d reloaded tasks no worker claimed are queued again", len(self.unclaimed))
        for task_id in list(self.unclaimed):
            task = self.tasks[task_id]
            self._release_unclaimed(task)
            self._dirty.add(task_id)  # a new attempt: its ``t`` record is written again
            self._apply_held_cancel(task, claimed=False)

    def _on_results_ack(self, peer: bytes, message: m.ResultsAck) -> None:
        ledger = self._ledgers.get(peer)
        if ledger is None:
            return
        batches, kept = ledger.batches, ledger.kept
        while batches and batches[0][0] <= message.received:
            for task_id in batches.popleft()[1]:
                if kept.pop(task_id, None) is not None:
                    self._unkeep(task_id)

    def _unkeep(self, task_id: int) -> None:
        """A kept result is acknowledged (or not wanted): its record goes."""
        if self._kpending.pop(task_id, None) is None:
            self._entries.append((_KEY(self._kkey.pop(task_id, b"k"), task_id), None))

    # ------------------------------------------------------------------ hooks on the core's paths

    def set_journal_full(self, reason: str | None) -> None:
        """(The loop) the journal cannot be written (a full disk), or can again (None).
        Meanwhile new submissions are refused at once, naming ``reason``; the loop holds
        every turn's sends until their entries are written."""
        if reason is not None and self.journal_full is None:
            log.error("daemon: %s; refusing new submissions until it can be written again", reason)
        elif reason is None and self.journal_full is not None:
            log.warning("daemon: the journal can be written again; accepting submissions")
        self.journal_full = reason

    def _on_submit(self, peer: bytes, message: m.SubmitTasks) -> None:
        if self.journal_full is not None:
            # Neither recorded nor acknowledged: the client drops these from what it keeps
            # to send again (client/resume.py), and its futures fail with the reason.
            text = f"{JOURNAL_FULL}: {self.journal_full}; the task was not accepted".encode()
            refused = self._refusals.setdefault(peer, [])
            for spec in message.tasks:
                refused.append(m.TaskResult(spec.task_id, 0, Status.REJECTED, text, m.NO_FACTS, m.NO_OBJECTS))
            self.counters["failed"] += len(message.tasks)
            return
        super()._on_submit(peer, message)
        self._dirty.update(spec.task_id for spec in message.tasks)

    def _assign(self, worker: WorkerRecord, task: TaskRecord, out: Any) -> None:
        super()._assign(worker, task, out)
        # A dispatch is journaled only for a task that may run at most once (its ``d``
        # record), or in the ``t`` record of a task written this turn (submitted, or under a
        # new attempt: already touched).  Any other's dispatch changes no record: no visit.
        retries = task.options.max_retries
        if self._once_by_default if retries is None else retries == 0:
            self._dirty.add(task.task_id)

    def _unassign(self, worker: WorkerRecord, task: TaskRecord) -> None:
        super()._unassign(worker, task)
        self._dirty.add(task.task_id)

    def _forget_one(self, task: TaskRecord) -> None:
        super()._forget_one(task)
        self._dirty.add(task.task_id)
        if self._forced:
            self._forced.discard(task.task_id)

    def _cancel(self, task: TaskRecord, force: bool) -> None:
        if force and task.state in AT_WORKER_STATES:
            self._forced.add(task.task_id)  # sent again with force if its worker was away
        super()._cancel(task, force)

    def _result_to(self, peer: bytes, result: m.TaskResult) -> None:
        ledger = self._ledgers.get(peer)
        if ledger is None:
            return  # the client is gone (or not a client): nobody waits for it
        super()._result_to(peer, result)
        if result.task_id >> m.TASK_ID_BITS == ledger.client_id:
            ledger.kept[result.task_id] = result
            self._kpending[result.task_id] = result
        # else the refusal of an id not its own (a bad id): sent, never journaled under
        # another client's key (or an impossible one)

    def _on_task_results(self, peer: bytes, message: m.TaskResults) -> None:
        super()._on_task_results(peer, message)
        self._results_in[peer] = self._results_in.get(peer, 0) + 1
        self._ack_due.add(peer)

    def _client_holds(self, peer: bytes, object_ids: list[bytes]) -> None:
        super()._client_holds(peer, object_ids)
        self._odirty.update((peer, object_id) for object_id in object_ids)

    def _on_release_objects(self, peer: bytes, message: m.ReleaseObjects) -> None:
        super()._on_release_objects(peer, message)
        self._odirty.update((peer, object_id) for object_id in message.object_ids)

    def _on_register_function(self, peer: bytes, message: m.RegisterFunction) -> None:
        had = message.fn_id in self.functions
        super()._on_register_function(peer, message)
        if not had and message.fn_id in self.functions:
            self._entries.append((_key(b"f", message.fn_id), message.payload))

    def _release_function(self, fn_id: int) -> None:
        had = fn_id in self.functions
        super()._release_function(fn_id)
        if had and fn_id not in self.functions:
            self._entries.append((_key(b"f", fn_id), None))

    def _lose_client(self, client: ClientRecord, why: str, clean: bool = False) -> None:
        peer = client.peer
        self._odirty.update((peer, object_id) for object_id in client.objects)
        super()._lose_client(client, why, clean)
        ledger = self._ledgers.pop(peer, None)
        if ledger is not None:
            for task_id in ledger.kept:
                self._unkeep(task_id)
        self._entries.append((_key(b"c", client.client_id), None))
        self._forget_peer(peer)

    def _lose_worker(self, worker: WorkerRecord, why: str, **kwargs: Any) -> None:
        super()._lose_worker(worker, why, **kwargs)
        self._entries.append((_key(b"w", worker.worker_id), None))
        self._results_in.pop(worker.peer, None)
        self._ack_due.discard(worker.peer)
        self._held_back.discard(worker.peer)
        self._forget_peer(worker.peer)
        self._end_recovery_if_back()

    def _forget_peer(self, peer: bytes) -> None:
        self._unalias(peer)
        self._tokens.pop(peer, None)
        self.absent.discard(peer)
        self._unreported.discard(peer)

    def _on_tick(self, event: Tick) -> None:
        super()._on_tick(event)
        until = self.recovering_until
        if until is not None and event.now >= until:
            self.recovering_until = None
            for worker in [w for w in self.workers.values() if w.peer in self.absent or w.peer in self._unreported]:
                self._lose_absent(worker)
            self._release_unclaimed_all()

    def _lose_absent(self, worker: WorkerRecord) -> None:
        """A worker the journal knew did not come back within the grace period: its tasks may
        have run there; each is charged an attempt, and one that may run at most once fails."""
        why = f"did not come back within restart_grace={self.grace:g} s of the daemon's restart"
        for task_id in list(worker.inflight):
            task = self.tasks[task_id]
            self._unassign(worker, task)
            self._attempt_failed(
                task,
                f"worker {worker.name}: {why}",
                at_most_once=(
                    f"task {task_id:#x} failed: it may have started on worker {worker.name}, which {why}, "
                    "and max_retries=0 lets a task run at most once, so it was not run again"
                ),
            )
        self._lose_worker(worker, why)

    # ------------------------------------------------------------------ the turn's end

    def _flush(self) -> list[Command]:
        results = self._results
        for peer in list(results):
            if peer in self.absent or peer in self._unreported or peer not in self._conn_of:
                del results[peer]  # kept in its ledger: sent with its report
            else:
                ledger = self._ledgers[peer]
                ledger.seq += 1
                ledger.batches.append((ledger.seq, [r.task_id for r in results[peer]]))
        if self._ack_due:
            self._confirm_results()
        commands = super()._flush()
        if self._dirty:
            self._journal_tasks()
        if self._kpending:
            for task_id, result in self._kpending.items():
                self._kkey[task_id] = b"k"
                self._entries.append((_KEY(b"k", task_id), _pack(result)))
            self._kpending = {}
        if self._odirty:
            self._journal_holds()
        if self._sweep and not any(p in self.clients for p in self.absent | self._unreported):
            self._sweep = False
            commands.append(SweepStore())  # type: ignore[arg-type]  # the loop knows it
        conn_of = self._conn_of
        out: list[Command] = []
        if self._entries:
            out.append(JournalWrite(self._entries))  # type: ignore[arg-type]  # the loop knows it
            self._entries = []
        if self._refusals:
            for peer, refused in self._refusals.items():
                conn = conn_of.get(peer)
                if conn is not None:
                    out.append(SendNow(conn, [m.TaskResults(refused)]))  # type: ignore[arg-type]
            self._refusals = {}
        for command in commands:
            # Every command addressed to a peer (Send, SendObjects, CreditObjects,
            # EndObjectSends...) goes to its connection now.
            addressed: bytes | None = getattr(command, "peer", None)
            if addressed is not None and addressed.startswith(LOGICAL):
                conn = conn_of.get(addressed) or self._left.get(addressed)
                if conn is None:
                    continue  # not back yet: what matters is kept and sent on its report
                if type(command) is Send:  # the common case, without dataclasses.replace's cost
                    command = Send(conn, command.messages)
                else:
                    command = dataclasses.replace(command, peer=conn)  # type: ignore[arg-type]
            out.append(command)
        self._left.clear()
        return out

    def _confirm_results(self) -> None:
        """A ResultsJournaled to each worker whose TaskResults came this turn: first in what
        goes to it anyway (a worker takes a batch that ends in a dispatch as work to start
        now, and one that ends in anything else as a cue for its housekeeping), else alone.
        (Deferring the lone ones to a later batch saved the worker ~50 µs of CPU per
        sequential round trip but made the round trip ~15 % slower: docs/durability.rst.)"""
        out, conn_of, results_in = self._out, self._conn_of, self._results_in
        for peer in self._ack_due:
            if peer in conn_of:  # (away: its report resets the counts)
                going = out.get(peer)
                if going:
                    going.insert(0, m.ResultsJournaled(results_in[peer]))
                else:
                    out[peer] = [m.ResultsJournaled(results_in[peer])]
        self._ack_due.clear()

    def _journal_tasks(self) -> None:
        """The records of the tasks this turn touched, from their state.  A task's dispatch
        travels in its ``t`` record when both are written in one turn (submitted and
        dispatched at once: the common case), else, for a task that may run at most once, in
        a ``d`` record of its own (any other is reloaded UNCLAIMED: state.py); a task leaves
        a worker other than by ending only with a new attempt, which rewrites ``t``.
        (Every task passes here two or three times: locals, and no work a branch does not
        need: docs/durability.rst, "What the journal costs".)"""
        entries, tasks, clients, workers = self._entries, self.tasks, self.clients, self.workers
        jt, jd, jr, dkeys, kpending = self._jt, self._jd, self._jr, self._dkeys, self._kpending
        at_worker, finished, once = AT_WORKER_STATES, TaskState.FINISHED, self._once_by_default
        for task_id in self._dirty:
            task = tasks.get(task_id)
            # A lane task's record (ON_LANE, core._on_lane_started) is never journaled: it has
            # no payload, and after a restart its worker still runs it for its client.
            if task is None or task.client not in clients or task.flags & ON_LANE:
                if jt.pop(task_id, None) is not None:
                    kept = kpending.pop(task_id, None) if kpending else None
                    if kept is None:
                        entries.append((_KEY(b"t", task_id), None))
                    else:  # ended this turn, its result sent: the record becomes the result
                        self._kkey[task_id] = b"t"
                        entries.append((_KEY(b"t", task_id), _pack([KEPT, kept])))
                if jd.pop(task_id, None) is not None and task_id in dkeys:
                    dkeys.discard(task_id)
                    entries.append((_KEY(b"d", task_id), None))
                if task_id in jr:
                    jr.discard(task_id)
                    entries.append((_KEY(b"r", task_id), None))
                continue
            state = task.state
            attempt = task.attempt
            if state in at_worker:
                dispatch = _DISPATCH(workers[task.worker].worker_id, attempt)  # type: ignore[index]
            else:
                dispatch = b""
            if jt.get(task_id) != attempt:
                jt[task_id] = attempt
                options = None if task.options is DEFAULT_OPTIONS else list(task.options)
                entries.append((_KEY(b"t", task_id), _pack([
                    task.fn_id, task.flags, task.payload, task.deps, task.objects, task.parent,
                    options, attempt, task.failures, dispatch,
                ])))
                if dispatch:
                    jd[task_id] = dispatch
                else:
                    jd.pop(task_id, None)
                if task_id in dkeys:  # an earlier attempt's
                    dkeys.discard(task_id)
                    entries.append((_KEY(b"d", task_id), None))
            elif dispatch:
                if jd.get(task_id) != dispatch:
                    # Only for a task that may run at most once (max_retries=0): any other
                    # task reloaded without it is UNCLAIMED until a worker claims it.
                    retries = task.options.max_retries
                    if once if retries is None else retries == 0:
                        jd[task_id] = dispatch
                        dkeys.add(task_id)
                        entries.append((_KEY(b"d", task_id), dispatch))
            elif task_id in dkeys:
                dkeys.discard(task_id)
                jd.pop(task_id, None)
                entries.append((_KEY(b"d", task_id), None))
            if state is finished and task_id not in jr:
                jr.add(task_id)
                entries.append((_KEY(b"r", task_id), _pack([task.result, task.result_objects or []])))
        self._dirty.clear()

    def _journal_holds(self) -> None:
        """The store objects each client holds, as counts (``o`` + client id + object id)."""
        entries, clients, jo = self._entries, self.clients, self._jo
        for peer, object_id in self._odirty:
            client = clients.get(peer)
            count = client.objects.get(object_id, 0) if client is not None else 0
            key = (peer, object_id)
            if jo.get(key, 0) == count:
                continue
            record = b"o" + peer[len(LOGICAL):] + object_id
            if count:
                jo[key] = count
                entries.append((record, count.to_bytes(8, "big")))
            else:
                del jo[key]
                entries.append((record, None))
        self._odirty.clear()

    # ------------------------------------------------------------------ restore

    def restore(self, live: dict[bytes, bytes], now: float) -> None:
        """Rebuild from a journal's live map (first-insertion order); the daemon then recovers
        for ``restart_grace`` seconds.  Records that refer to what is gone are deleted."""
        durable_restore.restore(self, live, now)

    def _at_most_once(self, task: TaskRecord) -> bool:
        """May this task run at most once (``max_retries=0``)?  Only such tasks' dispatches
        are journaled in ``d`` records."""
        retries = task.options.max_retries
        return self._once_by_default if retries is None else retries == 0

    def validate(self) -> None:
        super().validate()
        if self.unclaimed:
            assert self.recovering_until is not None, "tasks unclaimed after the recovery ended"
            for task_id in self.unclaimed:
                assert not self._at_most_once(self.tasks[task_id]), f"task {task_id:#x} may run at most once, yet unclaimed"
        for peer, conn in self._conn_of.items():
            assert self._logical.get(conn) == peer, f"connection map broken for {peer!r}"
            assert peer in self.clients or peer in self.workers, f"a connection for a peer that is gone: {peer!r}"
        for peer in self.absent | self._unreported:
            assert peer in self.clients or peer in self.workers, f"an absent peer that is gone: {peer!r}"
        for peer in self._ledgers:
            assert peer in self.clients, f"a ledger without its client: {peer!r}"
        for task_id in self._forced:
            assert task_id in self.tasks, f"task {task_id:#x} was cancelled with force and is gone, yet noted"
        if not self._dirty:
            for task_id, task in self.tasks.items():
                if task.flags & ON_LANE:
                    assert task_id not in self._jt, f"{task!r}: a lane task's record is journaled"
                elif task.client in self.clients:
                    assert self._jt.get(task_id) == task.attempt, f"{task!r} is not journaled as it is"
            for task_id in self._jt:
                assert task_id in self.tasks, f"task {task_id:#x} is journaled but gone"
            for task_id, task in self.tasks.items():
                if task.client in self.clients and task.state in AT_WORKER_STATES and not task.flags & ON_LANE:
                    assert task.worker is not None
                    dispatch = self.workers[task.worker].worker_id.to_bytes(8, "big") + task.attempt.to_bytes(4, "big")
                    if self._at_most_once(task):
                        assert self._jd.get(task_id) == dispatch, f"{task!r}: its dispatch is not journaled"
                    else:  # journaled only in its ``t`` record, if it was dispatched the turn it was written
                        assert self._jd.get(task_id) in (None, dispatch), f"{task!r}: another dispatch is journaled"
            assert self._dkeys <= set(self._jd), "a d record for a task not journaled as dispatched"
            assert not self._kpending, "results kept but not written"

