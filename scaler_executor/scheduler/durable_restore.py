"""A journaled daemon's restart (durable.py): its state rebuilt from the journal's live
records, and the records that refer to what is gone deleted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import DEFAULT_OPTIONS
from scaler_executor.scheduler.core_events import NONE
from scaler_executor.scheduler.durable_records import (
    KEPT,
    LOGICAL,
    MAX_HOLDS,
    MAX_PEER_ID,
    NEXT_PEER,
    STORE,
    Ledger,
    _Client,
    _fields,
    _Finished,
    _Kept,
    _key,
    _load,
    _number,
    _Task,
    _Worker,
    logical,
)
from scaler_executor.scheduler.journal_format import JournalRecordInvalid
from scaler_executor.scheduler.state import (
    ClientRecord,
    TaskRecord,
    TaskState,
    WorkerRecord,
    constraint_key,
)

if TYPE_CHECKING:
    from scaler_executor.scheduler.durable import DurableScheduler

log = logging.getLogger("scaler_executor.daemon")


def restore(core: DurableScheduler, live: dict[bytes, bytes], now: float) -> None:
    """Rebuild from a journal's live map (first-insertion order); the daemon then recovers
    for ``restart_grace`` seconds.  Records that refer to what is gone are deleted."""
    core._now = now
    core.restored = True
    grace_end = now + core.grace
    garbage: list[bytes] = []
    holds: list[tuple[bytes, bytes]] = []
    by_kind: dict[bytes, list[tuple[int, bytes]]] = {}
    for key, value in live.items():
        if key == NEXT_PEER:
            number = _number(key, value)
            if not 0 < number < MAX_PEER_ID:
                raise JournalRecordInvalid(key, f"next peer id {number} out of range")
            core._next_peer_id = max(core._next_peer_id, number)
        elif key == STORE:
            try:
                core._sweep = core.object_store == value.decode()  # the loop kept that region
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
    liveness = core.config.heartbeat_interval * core.config.heartbeat_liveness
    for peer_id, value in by_kind.get(b"c", []):
        name, host, reply_to, authkey_file, token = _load(_key(b"c", peer_id), value, _Client)
        peer = logical(peer_id)
        core.clients[peer] = ClientRecord(peer, peer_id, name, grace_end, host=host, reply_to=reply_to, authkey_file=authkey_file)
        core._tokens[peer] = token
        core._ledgers[peer] = Ledger(peer_id)
        core.absent.add(peer)
        core._liveness.add(peer, grace_end + max(liveness, core.config.client_timeout))
        core._next_peer_id = max(core._next_peer_id, peer_id + 1)
    for peer_id, value in by_kind.get(b"w", []):
        name, capacity, resources, tags, pid, host, token = _load(_key(b"w", peer_id), value, _Worker)
        if capacity < 1 or any(not 0.0 <= q < float("inf") for q in resources.values()):
            raise JournalRecordInvalid(_key(b"w", peer_id), f"capacity {capacity} or resources {resources!r} out of range")
        peer = logical(peer_id)
        core.workers[peer] = WorkerRecord(
            peer, peer_id, name, capacity, resources, frozenset(tags), grace_end, pid=pid, host=host,
            idle_since=now, draining=True,
        )
        core.placement.add(core.workers[peer])  # held back (draining) until its report
        core._tokens[peer] = token
        core._results_in[peer] = 0
        core.absent.add(peer)
        core._held_back.add(peer)
        core._liveness.add(peer, grace_end + liveness)
        core._next_peer_id = max(core._next_peer_id, peer_id + 1)
    for key, value in holds:
        peer = LOGICAL + key[1:9]
        client = core.clients.get(peer)
        if client is None:
            garbage.append(key)
            continue
        object_id, count = key[9:], _number(key, value)
        if not 0 < count <= MAX_HOLDS:
            raise JournalRecordInvalid(key, f"a hold count of {count} (a hold that ended is deleted)")
        client.objects[object_id] = count
        core.object_holds[object_id] = core.object_holds.get(object_id, 0) + count
        core._jo[(peer, object_id)] = count
    for fn_id, value in by_kind.get(b"f", []):
        client = core.clients.get(logical(fn_id >> m.TASK_ID_BITS))
        if client is None:
            garbage.append(_key(b"f", fn_id))
            continue
        core.functions[fn_id] = value
        client.functions.add(fn_id)
    dispatched = dict(by_kind.get(b"d", []))
    finished = dict(by_kind.get(b"r", []))
    for task_id, value in by_kind.get(b"t", []):
        restore_task(core, task_id, value, dispatched, finished, garbage)
    for task_id in list(core._jr):  # a result kept for no dependent (a garbled record's): forgotten
        task = core.tasks[task_id]
        if task.holds <= 0:
            core._maybe_release(task)
    for task_id in dispatched:
        if task_id not in core._dkeys:
            garbage.append(_key(b"d", task_id))
    for task_id in finished:
        if task_id not in core._jr:
            garbage.append(_key(b"r", task_id))
    for task_id, value in by_kind.get(b"k", []):
        ledger = core._ledgers.get(logical(task_id >> m.TASK_ID_BITS))
        if ledger is None:
            garbage.append(_key(b"k", task_id))
            continue
        kept = _load(_key(b"k", task_id), value, m.TaskResult)
        if kept.task_id != task_id:
            raise JournalRecordInvalid(_key(b"k", task_id), f"it holds the result of task {kept.task_id:#x}")
        ledger.kept[task_id] = kept
        core._kkey[task_id] = b"k"
    core._entries.extend((key, None) for key in garbage)
    if any(True for _ in core.workers):
        core.recovering_until = grace_end
    log.info(
        "daemon: restored %d clients, %d workers, %d tasks (%d at workers, %d maybe at workers: unclaimed until they "
        "report), %d results to deliver from the journal; waiting up to %g s for them (restart_grace)",
        len(core.clients), len(core.workers), len(core.tasks), sum(len(w.inflight) for w in core.workers.values()),
        len(core.unclaimed),
        sum(len(ledger.kept) for ledger in core._ledgers.values()), core.grace,
    )


def restore_task(
    core: DurableScheduler, task_id: int, value: bytes, dispatched: dict[int, bytes], finished: dict[int, bytes], garbage: list[bytes]
) -> None:
    tkey = _key(b"t", task_id)
    peer = logical(task_id >> m.TASK_ID_BITS)
    client = core.clients.get(peer)
    fields = _fields(tkey, value)
    if type(fields) is list and fields and fields[0] == KEPT:  # the task ended; its result waits for its client's acknowledgement
        kept = _load(tkey, value, _Kept, fields).result
        if kept.task_id != task_id:
            raise JournalRecordInvalid(tkey, f"it holds the result of task {kept.task_id:#x}")
        if client is None:
            garbage.append(tkey)
        else:
            core._ledgers[peer].kept[task_id] = kept
            core._kkey[task_id] = b"t"
        return
    fn_id, flags, payload, deps, objects, parent, options, attempt, failures, in_t = _load(tkey, value, _Task, fields)
    if not 0 <= attempt < 1 << 32 or len(in_t) not in (0, 12) or flags & m.TaskFlags.ON_LANE:
        raise JournalRecordInvalid(tkey, f"attempt {attempt}, flags {flags:#x} or dispatch {in_t!r} impossible")
    if client is None or (fn_id and fn_id not in core.functions):
        garbage.append(_key(b"t", task_id))
        return
    task_options = DEFAULT_OPTIONS if options is None else options
    task = TaskRecord(
        task_id, peer, fn_id, task_options, flags, payload, objects or NONE, deps or NONE, parent, core.state_counts
    )
    task.attempt = attempt
    task.failures = failures
    core.tasks[task_id] = task
    client.tasks.add(task_id)
    core._jt[task_id] = attempt
    if objects:
        core._hold(objects)
    if fn_id:
        core.function_refs[fn_id] = core.function_refs.get(fn_id, 0) + 1
    kept = finished.get(task_id)
    if kept is not None:  # done, its result kept for dependents
        result, result_objects = _load(_key(b"r", task_id), kept, _Finished)
        task.deps_released = True
        task.set_state(TaskState.FINISHED)
        task.result = result
        if result_objects:
            task.result_objects = result_objects
            core._hold(result_objects)
        core._jr.add(task_id)
        return
    if task.deps and not core._link(task):
        core._dirty.add(task_id)  # waiting, or answered (a dependency is gone): rewritten at the turn's end
        return
    key = constraint_key(task_options.resources, task_options.tags) if task_options is not DEFAULT_OPTIONS else None
    task.queue_key = key
    record = dispatched.get(task_id) or in_t
    if len(record) not in (0, 12):
        raise JournalRecordInvalid(_key(b"d", task_id), f"its value is {len(record)} bytes, not a worker id and attempt (12)")
    if record:
        worker = core.workers.get(logical(int.from_bytes(record[:8], "big")))
        if worker is not None and int.from_bytes(record[8:], "big") == attempt:
            task.transition("dispatch")
            task.worker = worker.peer
            worker.inflight[task_id] = None
            if key is not None:
                for name, quantity in key[0]:
                    worker.used[name] = worker.used.get(name, 0.0) + quantity
            core._jd[task_id] = record
            if task_id in dispatched:
                core._dkeys.add(task_id)
            return
    if core.workers and not core._at_most_once(task):
        # No dispatch journaled (none is, in a later turn, for a task with retries left),
        # or one naming a worker gone: it may be at a worker that has not reported yet
        # (queued, running, or its result kept).  Until one claims it or the recovery
        # ends it goes nowhere else: sent elsewhere, it would be cancelled there as a
        # stray and run twice.  (Released, it gets a new attempt: its ``t`` is rewritten.)
        task.set_state(TaskState.UNCLAIMED)
        core.unclaimed[task_id] = None
        return
    task.queued_at = core._now
    core._queue(task)
    core._dirty.add(task_id)
