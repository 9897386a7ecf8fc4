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
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from scaler_executor.config import ClusterConfig
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import DecodeError, _record
from scaler_executor.protocol.messages import DEFAULT_OPTIONS, Role, Status
from scaler_executor.protocol.rejoin import JOURNAL_FULL, NOT_RESUMABLE, UNKNOWN_PEER
from scaler_executor.scheduler.core import (
    Command,
    PeerUnreachable,
    Received,
    Scheduler,
    Send,
    Tick,
)
from scaler_executor.scheduler.core_events import NONE
from scaler_executor.scheduler.journal_format import JournalRecordInvalid
from scaler_executor.scheduler.reconcile import client_report, worker_report
from scaler_executor.scheduler.state import (
    AT_WORKER_STATES,
    ClientRecord,
    TaskRecord,
    TaskState,
    WorkerRecord,
    constraint_key,
)

log = logging.getLogger("scaler_executor.daemon")

LOGICAL = b"\xffP"  # a journaled peer's id in the core; no transport identity starts so
NEXT_PEER = b"n"
ON_LANE = m.TaskFlags.ON_LANE
STORE = b"s"  # the host's store region: kept by a restarted daemon (scheduler/objects.py)

Entries = list[tuple[bytes, bytes | None]]
MAX_PEER_ID = 1 << (64 - m.TASK_ID_BITS)  # a client's id prefixes its 64-bit task ids
MAX_HOLDS = 1 << 24  # holds of one object by one client: more is a garbled record


@dataclass(frozen=True, slots=True)
class SendNow:
    """Send at once, even while the loop holds the turns its journal could not write yet
    (the refusals of submissions while the journal is full: they change no journaled state)."""

    peer: bytes
    messages: list[Any]


@dataclass(frozen=True, slots=True)
class SweepStore:
    """Every peer the journal knew has reported or is gone: delete the objects the adopted
    store region held at the restart that nobody holds (HostStore.sweep)."""


@dataclass(frozen=True, slots=True)
class JournalWrite:
    """Write these entries to the journal before executing the turn's other commands."""

    entries: Entries


def logical(peer_id: int) -> bytes:
    return LOGICAL + peer_id.to_bytes(8, "big")


def _key(kind: bytes, number: int) -> bytes:
    return _KEY(kind, number)


_KEY = struct.Struct(">cQ").pack
_DISPATCH = struct.Struct(">QI").pack  # a dispatch: the worker's peer id (8 bytes) and the attempt (4)


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


KEPT = "kept"  # first field of a ``t`` record that holds the task's result, not the task


# The shapes of the records' values, checked at restore (the codec's validators): a record
# the files hold intact but whose value makes no sense is refused, naming its key
# (JournalRecordInvalid), never a crash inside restore or a core in a state it never had.
class _Client(NamedTuple):
    name: str
    host: str
    reply_to: str
    authkey_file: str
    token: bytes


class _Worker(NamedTuple):
    name: str
    capacity: int
    resources: dict[str, float]
    tags: list[str]
    pid: int
    host: str
    token: bytes


class _Task(NamedTuple):
    fn_id: int
    flags: int
    payload: bytes
    deps: list[int]
    objects: list[bytes]
    parent: int
    options: m.TaskOptions | None
    attempt: int
    failures: list[str] | None  # one line per failed attempt
    dispatch: bytes  # b"", or the worker's id (8 bytes) and the attempt (4)


class _Kept(NamedTuple):
    kept: str
    result: m.TaskResult


class _Finished(NamedTuple):
    result: bytes  # (a finished task holds its result for its dependents)
    objects: list[bytes]


_SHAPES: dict[type, Callable[[Any], Any]] = {}


def _fields(key: bytes, value: bytes) -> Any:
    try:
        return _unpack(value)
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:  # (a list as a map key: TypeError)
        raise JournalRecordInvalid(key, f"its value is not msgpack ({type(exc).__name__}: {exc})") from None


def _load(key: bytes, value: bytes, shape: type, fields: Any = None) -> Any:
    """The record's value as ``shape``, or JournalRecordInvalid naming ``key``."""
    check = _SHAPES.get(shape) or _SHAPES.setdefault(shape, _record(shape))
    try:
        return check(_fields(key, value) if fields is None else fields)
    except DecodeError as exc:
        raise JournalRecordInvalid(key, f"its value is not a {shape.__name__.strip('_').lower()} record: {exc}") from None


def _number(key: bytes, value: bytes) -> int:
    if len(value) != 8:
        raise JournalRecordInvalid(key, f"its value is {len(value)} bytes, not an 8-byte number")
    return int.from_bytes(value, "big")


class Ledger:
    """A client's results sent and not yet acknowledged: kept (and journaled, ``k``) until its
    ResultsAck counts the TaskResults message that carried them."""

    __slots__ = ("batches", "client_id", "kept", "seq")

    def __init__(self, client_id: int) -> None:
        self.client_id = client_id
        self.kept: dict[int, m.TaskResult] = {}
        self.batches: deque[tuple[int, list[int]]] = deque()  # (seq, task ids) of messages sent
        self.seq = 0  # TaskResults messages sent since the client's last Welcome


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
        self._now = now
        self.restored = True
        grace_end = now + self.grace
        garbage: list[bytes] = []
        holds: list[tuple[bytes, bytes]] = []
        by_kind: dict[bytes, list[tuple[int, bytes]]] = {}
        for key, value in live.items():
            if key == NEXT_PEER:
                number = _number(key, value)
                if not 0 < number < MAX_PEER_ID:
                    raise JournalRecordInvalid(key, f"next peer id {number} out of range")
                self._next_peer_id = max(self._next_peer_id, number)
            elif key == STORE:
                try:
                    self._sweep = self.object_store == value.decode()  # the loop kept that region
                except UnicodeDecodeError:
                    raise JournalRecordInvalid(key, "its value is not a store region's name") from None
            elif key[:1] == b"o" and len(key) >= 9:  # (an object id may be empty)
                holds.append((key, value))
            elif len(key) == 9 and key[:1] in b"cwftdrk":
                number = int.from_bytes(key[1:], "big")
                if key[:1] in b"cw" and not 0 < number < MAX_PEER_ID:
                    raise JournalRecordInvalid(key, f"peer id {number} out of range")
                by_kind.setdefault(key[:1], []).append((number, value))
            else:
                raise JournalRecordInvalid(key, "an unknown key: not a journal of this version")
        liveness = self.config.heartbeat_interval * self.config.heartbeat_liveness
        for peer_id, value in by_kind.get(b"c", []):
            name, host, reply_to, authkey_file, token = _load(_key(b"c", peer_id), value, _Client)
            peer = logical(peer_id)
            self.clients[peer] = ClientRecord(peer, peer_id, name, grace_end, host=host, reply_to=reply_to, authkey_file=authkey_file)
            self._tokens[peer] = token
            self._ledgers[peer] = Ledger(peer_id)
            self.absent.add(peer)
            self._liveness.add(peer, grace_end + max(liveness, self.config.client_timeout))
            self._next_peer_id = max(self._next_peer_id, peer_id + 1)
        for peer_id, value in by_kind.get(b"w", []):
            name, capacity, resources, tags, pid, host, token = _load(_key(b"w", peer_id), value, _Worker)
            if capacity < 1 or any(not 0.0 <= q < float("inf") for q in resources.values()):
                raise JournalRecordInvalid(_key(b"w", peer_id), f"capacity {capacity} or resources {resources!r} out of range")
            peer = logical(peer_id)
            self.workers[peer] = WorkerRecord(
                peer, peer_id, name, capacity, resources, frozenset(tags), grace_end, pid=pid, host=host,
                idle_since=now, draining=True,
            )
            self.placement.add(self.workers[peer])  # held back (draining) until its report
            self._tokens[peer] = token
            self._results_in[peer] = 0
            self.absent.add(peer)
            self._held_back.add(peer)
            self._liveness.add(peer, grace_end + liveness)
            self._next_peer_id = max(self._next_peer_id, peer_id + 1)
        for key, value in holds:
            peer = LOGICAL + key[1:9]
            client = self.clients.get(peer)
            if client is None:
                garbage.append(key)
                continue
            object_id, count = key[9:], _number(key, value)
            if not 0 < count <= MAX_HOLDS:
                raise JournalRecordInvalid(key, f"a hold count of {count} (a hold that ended is deleted)")
            client.objects[object_id] = count
            self.object_holds[object_id] = self.object_holds.get(object_id, 0) + count
            self._jo[(peer, object_id)] = count
        for fn_id, value in by_kind.get(b"f", []):
            client = self.clients.get(logical(fn_id >> m.TASK_ID_BITS))
            if client is None:
                garbage.append(_key(b"f", fn_id))
                continue
            self.functions[fn_id] = value
            client.functions.add(fn_id)
        dispatched = dict(by_kind.get(b"d", []))
        finished = dict(by_kind.get(b"r", []))
        for task_id, value in by_kind.get(b"t", []):
            self._restore_task(task_id, value, dispatched, finished, garbage)
        for task_id in list(self._jr):  # a result kept for no dependent (a garbled record's): forgotten
            task = self.tasks[task_id]
            if task.holds <= 0:
                self._maybe_release(task)
        for task_id in dispatched:
            if task_id not in self._dkeys:
                garbage.append(_key(b"d", task_id))
        for task_id in finished:
            if task_id not in self._jr:
                garbage.append(_key(b"r", task_id))
        for task_id, value in by_kind.get(b"k", []):
            ledger = self._ledgers.get(logical(task_id >> m.TASK_ID_BITS))
            if ledger is None:
                garbage.append(_key(b"k", task_id))
                continue
            kept = _load(_key(b"k", task_id), value, m.TaskResult)
            if kept.task_id != task_id:
                raise JournalRecordInvalid(_key(b"k", task_id), f"it holds the result of task {kept.task_id:#x}")
            ledger.kept[task_id] = kept
            self._kkey[task_id] = b"k"
        self._entries.extend((key, None) for key in garbage)
        if any(True for _ in self.workers):
            self.recovering_until = grace_end
        log.info(
            "daemon: restored %d clients, %d workers, %d tasks (%d at workers, %d maybe at workers: unclaimed until they "
            "report), %d results to deliver from the journal; waiting up to %g s for them (restart_grace)",
            len(self.clients), len(self.workers), len(self.tasks), sum(len(w.inflight) for w in self.workers.values()),
            len(self.unclaimed),
            sum(len(ledger.kept) for ledger in self._ledgers.values()), self.grace,
        )

    def _restore_task(
        self, task_id: int, value: bytes, dispatched: dict[int, bytes], finished: dict[int, bytes], garbage: list[bytes]
    ) -> None:
        tkey = _key(b"t", task_id)
        peer = logical(task_id >> m.TASK_ID_BITS)
        client = self.clients.get(peer)
        fields = _fields(tkey, value)
        if type(fields) is list and fields and fields[0] == KEPT:  # the task ended; its result waits for its client's acknowledgement
            kept = _load(tkey, value, _Kept, fields).result
            if kept.task_id != task_id:
                raise JournalRecordInvalid(tkey, f"it holds the result of task {kept.task_id:#x}")
            if client is None:
                garbage.append(tkey)
            else:
                self._ledgers[peer].kept[task_id] = kept
                self._kkey[task_id] = b"t"
            return
        fn_id, flags, payload, deps, objects, parent, options, attempt, failures, in_t = _load(tkey, value, _Task, fields)
        if not 0 <= attempt < 1 << 32 or len(in_t) not in (0, 12) or flags & m.TaskFlags.ON_LANE:
            raise JournalRecordInvalid(tkey, f"attempt {attempt}, flags {flags:#x} or dispatch {in_t!r} impossible")
        if client is None or (fn_id and fn_id not in self.functions):
            garbage.append(_key(b"t", task_id))
            return
        task_options = DEFAULT_OPTIONS if options is None else options
        task = TaskRecord(
            task_id, peer, fn_id, task_options, flags, payload, objects or NONE, deps or NONE, parent, self.state_counts
        )
        task.attempt = attempt
        task.failures = failures
        self.tasks[task_id] = task
        client.tasks.add(task_id)
        self._jt[task_id] = attempt
        if objects:
            self._hold(objects)
        if fn_id:
            self.function_refs[fn_id] = self.function_refs.get(fn_id, 0) + 1
        kept = finished.get(task_id)
        if kept is not None:  # done, its result kept for dependents
            result, result_objects = _load(_key(b"r", task_id), kept, _Finished)
            task.deps_released = True
            task.set_state(TaskState.FINISHED)
            task.result = result
            if result_objects:
                task.result_objects = result_objects
                self._hold(result_objects)
            self._jr.add(task_id)
            return
        if task.deps and not self._link(task):
            self._dirty.add(task_id)  # waiting, or answered (a dependency is gone): rewritten at the turn's end
            return
        key = constraint_key(task_options.resources, task_options.tags) if task_options is not DEFAULT_OPTIONS else None
        task.queue_key = key
        record = dispatched.get(task_id) or in_t
        if len(record) not in (0, 12):
            raise JournalRecordInvalid(_key(b"d", task_id), f"its value is {len(record)} bytes, not a worker id and attempt (12)")
        if record:
            worker = self.workers.get(logical(int.from_bytes(record[:8], "big")))
            if worker is not None and int.from_bytes(record[8:], "big") == attempt:
                task.transition("dispatch")
                task.worker = worker.peer
                worker.inflight[task_id] = None
                if key is not None:
                    for name, quantity in key[0]:
                        worker.used[name] = worker.used.get(name, 0.0) + quantity
                self._jd[task_id] = record
                if task_id in dispatched:
                    self._dkeys.add(task_id)
                return
        if self.workers and not self._at_most_once(task):
            # No dispatch journaled (none is, in a later turn, for a task with retries left),
            # or one naming a worker gone: it may be at a worker that has not reported yet
            # (queued, running, or its result kept).  Until one claims it or the recovery
            # ends it goes nowhere else: sent elsewhere, it would be cancelled there as a
            # stray and run twice.  (Released, it gets a new attempt: its ``t`` is rewritten.)
            task.set_state(TaskState.UNCLAIMED)
            self.unclaimed[task_id] = None
            return
        task.queued_at = self._now
        self._queue(task)
        self._dirty.add(task_id)

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

