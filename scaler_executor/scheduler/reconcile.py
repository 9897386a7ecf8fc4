"""A restarted daemon reconciles its resumed peers' reports with its journal (docs/durability.rst).

A worker's ``WorkerReport`` (``worker_report``) lists the tasks it holds and those it
finished whose results the daemon had not acknowledged (they follow, sent again): a task
restored at it that it does not list never reached it (queued again at no charge); an
UNCLAIMED task it lists under the attempt it has is claimed (DISPATCHED there: state.py);
a task it holds that the daemon does not expect there is cancelled; cancels asked while it
was away are sent again, and those held for the tasks it claimed are applied.

The journal holds what the dead daemon had written; the client's ``ClientReport`` holds what
the client holds now.  They differ by what the daemon wrote but never got to say (the client
sends it again) and by what the client did while its daemon was down: its releases and
cancels then went nowhere (or to the restarted daemon, which refused them before the
client's Resume).  The report is state, not a replay of messages, so it says all of it,
and it wins, in this order:

1. options and callables the journal lacks are registered;
2. the submissions never acknowledged are taken (those the journal has are acknowledged);
3. callables the journal holds for the client and the report does not list were released
   while the daemon was down: released now (after 2, whose tasks may still refer to them;
   a callable goes once no task refers to it);
4. the cancels it asked and got no answer for are answered (``TasksCancelled``): a task
   still queued or waiting is dropped; one the daemon no longer has was dropped before the
   restart (the answer was lost); one at a worker, finished, or whose result is kept for
   the client is refused (its result comes).  A cancel with force kills the task at its
   worker, or cancels it here if no worker has it (a CANCELLED result tells the client).
   A task reloaded UNCLAIMED (state.py: maybe at a worker that has not reported) has its
   cancel held, and answered as above once a worker claims it or the recovery ends;
5. its tasks that it neither awaits nor needs for one it awaits (a dependency, at any depth)
   are forgotten as those of a client that left: queued and waiting ones dropped, one at a
   worker asked to drop it (if it runs already, it runs to its end and its result is
   discarded), and what they held released (not a lane task's record, ``ON_LANE``: a
   client never awaits those of the daemon; it goes with its worker's LaneDone);
6. the results kept for it (``k``) that it no longer awaits are forgotten, the others sent
   again;
7. its store holds are what it says, plus the objects of the results sent again;
8. an awaited task the journal does not know fails with a clear error, never hangs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.scheduler.core_events import CANCEL_ANSWER, CANCEL_FORCE, NO_CLIENT, _pack_lost
from scaler_executor.scheduler.state import AT_WORKER_STATES, QUEUED_STATES, TaskState, WorkerRecord

if TYPE_CHECKING:
    from scaler_executor.scheduler.durable import DurableScheduler

log = logging.getLogger("scaler_executor.daemon")


def client_report(core: DurableScheduler, peer: bytes, message: m.ClientReport) -> None:
    """Apply a resumed client's report (the module doc's steps, in order)."""
    client = core.clients[peer]
    ledger = core._ledgers[peer]
    own = client.client_id
    for options in message.options:
        core._on_register_options(peer, options)
    listed = set()
    for blob in message.functions:
        listed.add(blob.fn_id)
        if blob.fn_id not in core.functions:
            core._on_register_function(peer, m.RegisterFunction(blob.fn_id, blob.payload))
    known = 0
    fresh = []
    for spec in message.tasks:
        if spec.task_id in core.tasks or spec.task_id in ledger.kept:
            known += 1  # written before the daemon died; only its acknowledgement was lost
        else:
            fresh.append(spec)
    if fresh:
        core._on_submit(peer, m.SubmitTasks(fresh))
    if known:
        core._acks[peer] = core._acks.get(peer, 0) + known
    released = [fn_id for fn_id in client.functions if fn_id not in listed]
    for fn_id in released:
        client.functions.discard(fn_id)
        core._release_function(fn_id)
    awaiting = dict.fromkeys(t for t in message.awaiting if t >> m.TASK_ID_BITS == own)
    cancelled = _answer_cancels(core, peer, message.cancels, ledger.kept)
    cancelled += _apply_forced(core, peer, [t for t in dict.fromkeys(message.forced) if t in awaiting], ledger.kept)
    for task_id in cancelled:
        awaiting.pop(task_id, None)
    unwanted = _forget_unwanted(core, peer, awaiting)
    for task_id in [t for t in ledger.kept if t not in awaiting]:
        del ledger.kept[task_id]  # it has that result (or no longer wants it)
        core._unkeep(task_id)
    again = [result for task_id, result in ledger.kept.items() if task_id in awaiting]
    if again:
        core._results.setdefault(peer, [])[:0] = again
    # Its holds are what it says (a pin sent to the dead daemon may never have been
    # written, a release sent while it was down never arrived), plus the objects of the
    # results it gets again (held until read).
    old = client.objects
    client.objects = {}
    core._client_holds(peer, list(message.objects) + [o for result in again for o in result.objects])
    for object_id, count in old.items():
        core._drop([object_id] * count)
        core._odirty.add((peer, object_id))
    # (Only its own ids: another's, or one out of range, would be journaled as this
    # client's result under another client's key, or not at all.)
    lost = [t for t in awaiting if t not in core.tasks and t not in ledger.kept]
    for task_id in lost:
        text = (
            f"task {task_id:#x} was lost across the daemon's restart: its journal has no record of it "
            "(it was submitted but never acknowledged, and the client did not send it again)"
        )
        core._result_to(peer, m.TaskResult(task_id, 0, Status.WORKER_LOST, _pack_lost(text, []), m.NO_FACTS, m.NO_OBJECTS))
    log.info(
        "client %r reported: %d tasks awaited, %d sent again (%d known), %d results delivered again, %d lost; "
        "since the restart it released %d callables, cancelled %d tasks, no longer wants %d",
        client.name, len(awaiting), len(message.tasks), known, len(again), len(lost),
        len(released), len(cancelled), unwanted,
    )


def _answer_cancels(core: DurableScheduler, peer: bytes, asked: list[int], kept: dict[int, m.TaskResult]) -> list[int]:
    """Step 4: answer the cancels the client got no answer for; the ids dropped."""
    if not asked:
        return []
    own = core.clients[peer].client_id
    cancelled: list[int] = []
    refused: list[int] = []
    for task_id in dict.fromkeys(asked):
        if task_id >> m.TASK_ID_BITS != own:
            continue  # not its own: not its to ask (and never answered as dropped)
        task = core.tasks.get(task_id)
        if task is None:
            # Kept: its result goes again.  Neither kept nor known: dropped by the daemon
            # before its restart (which wrote that, then died before the answer went out).
            (refused if task_id in kept else cancelled).append(task_id)
        elif task.client == peer and (task.state in QUEUED_STATES or task.state is TaskState.WAITING):
            core._cancel(task, False)
            cancelled.append(task_id)
        elif task.client == peer and task.state is TaskState.UNCLAIMED:
            core.hold_cancel(task_id, CANCEL_ANSWER)  # answered once it is claimed or released
        else:
            refused.append(task_id)
    core._send(peer, m.TasksCancelled(cancelled, refused))
    return cancelled


def _apply_forced(core: DurableScheduler, peer: bytes, forced: list[int], kept: dict[int, m.TaskResult]) -> list[int]:
    """Step 4, with force: a task at a worker is killed there (its result, FORCE_CANCELLED,
    comes); one queued or waiting, or one the daemon no longer has (dropped before the
    restart), is cancelled and the client told so by a CANCELLED result (a forced cancel
    gets no TasksCancelled); the ids settled so."""
    settled: list[int] = []
    for task_id in forced:
        task = core.tasks.get(task_id)
        if task is not None and task.client == peer and task.state in AT_WORKER_STATES:
            core._cancel(task, True)
            continue
        if task is not None and task.client == peer and task.state is TaskState.UNCLAIMED:
            core.hold_cancel(task_id, CANCEL_FORCE)  # killed at the worker that claims it, or dropped
            continue
        if task is None and task_id in kept:
            continue  # its result goes again
        if task is not None:
            if task.client != peer or not (task.state in QUEUED_STATES or task.state is TaskState.WAITING):
                continue  # finished, kept for dependents: its result comes
            core._cancel(task, False)
        settled.append(task_id)
        core._result_to(peer, m.TaskResult(task_id, 0, Status.CANCELLED, b"", m.NO_FACTS, m.NO_OBJECTS))
    return settled


def _forget_unwanted(core: DurableScheduler, peer: bytes, awaiting: dict[int, None]) -> int:
    """Step 5: forget the client's tasks it neither awaits nor needs for one it awaits;
    returns how many."""
    client = core.clients[peer]
    tasks = core.tasks
    wanted: set[int] = set()
    stack = [t for t in awaiting if t in tasks]
    while stack:
        task_id = stack.pop()
        if task_id in wanted:
            continue
        wanted.add(task_id)
        task = tasks.get(task_id)
        if task is not None and task.deps and not task.deps_released:
            stack.extend(d for d in task.deps if d in tasks and d not in wanted)
    unwanted = [t for t in client.tasks if t not in wanted]
    # Dependents first (ids grow with submission, and a dependent is submitted after what
    # it depends on): a dependency is then released by its last dependent, not failed
    # under it.  A finished task kept for dependents goes with the last of them.  An
    # UNCLAIMED one is dropped (core._cancel): a worker that still holds it has it
    # cancelled on its report, as a task nobody awaits.
    count = 0
    for task_id in sorted(unwanted, reverse=True):
        task = tasks.get(task_id)
        if task is None or task.client != peer or task.state is TaskState.FINISHED or task.flags & m.TaskFlags.ON_LANE:
            continue  # (a lane task's record: its client has it on a lane, not awaited of us)
        count += 1
        if task.state in AT_WORKER_STATES:
            # As for a client that left (core._lose_client): it belongs to nobody now, so
            # its result, if it still comes, is discarded with its objects.
            core._cancel(task, False)
            task.client = NO_CLIENT
            client.tasks.discard(task_id)
            core._dirty.add(task_id)  # its records go at the turn's end
        else:
            core._cancel(task, False)
    return count


def worker_report(core: DurableScheduler, peer: bytes, message: m.WorkerReport) -> None:
    """Apply a resumed worker's report (the module doc's first paragraph)."""
    worker = core.workers[peer]
    if peer in core._held_back:
        core._held_back.discard(peer)
        worker.draining = False
        core.placement.grew(peer)  # open to dispatch again
    reported = {(a.task_id, a.attempt) for a in message.holding}
    reported.update((a.task_id, a.attempt) for a in message.finished)
    claimed = _claim_reported(core, worker, [*message.holding, *message.finished]) if core.unclaimed else []
    returned = 0
    for task_id in list(worker.inflight):
        task = core.tasks[task_id]
        if (task_id, task.attempt) not in reported:  # its dispatch never reached the worker
            core._unassign(worker, task)
            core._requeue_free(task, "returned")
            returned += 1
    stray = [
        a.task_id for a in message.holding
        if a.task_id not in worker.inflight or core.tasks[a.task_id].attempt != a.attempt
    ]
    if stray:
        core._send(peer, m.CancelTasks(stray, True))  # nobody awaits them any more
    # Cancels made while it was away (a resumed client's, client_report) never reached it:
    # sent again, as they were asked.
    cancelling = [
        a.task_id for a in message.holding
        if a.task_id in worker.inflight and core.tasks[a.task_id].state is TaskState.CANCELLING
    ]
    for force in (False, True):
        again = [t for t in cancelling if (t in core._forced) is force]
        if again:
            core._send(peer, m.CancelTasks(again, force))
    for task_id in claimed:  # after the resends: a cancel held for it goes once
        core._apply_held_cancel(core.tasks[task_id], claimed=True)
    log.info(
        "worker %r reported: holds %d, finished %d; %d tasks it never got queued again, %d it holds cancelled, "
        "%d reloaded without their dispatch claimed",
        worker.name, len(message.holding), len(message.finished), returned, len(stray), len(claimed),
    )


def _claim_reported(core: DurableScheduler, worker: WorkerRecord, reported: list[m.TaskAttempt]) -> list[int]:
    """The UNCLAIMED tasks a worker's report lists (held or finished) under the attempt they
    have: DISPATCHED there (its results, sent again, then settle them); the ids claimed.  A
    report of another attempt is an earlier hand-out's: a stray."""
    claimed = []
    tasks, unclaimed = core.tasks, core.unclaimed
    for task_id, attempt in reported:
        task = tasks.get(task_id)
        if task_id in unclaimed and task is not None and task.attempt == attempt:
            core._claim(worker, task)  # (no record changes: only a task with retries left is unclaimed)
            claimed.append(task_id)
    return claimed
