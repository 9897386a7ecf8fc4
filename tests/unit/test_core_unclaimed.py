"""Tasks reloaded without a journaled dispatch: UNCLAIMED until claimed or released (state.py).

A journaled daemon writes a ``d`` record (the worker a task was dispatched to) only for a task
that may run at most once (``max_retries=0``); any other task dispatched in a turn after its
``t`` record was written is reloaded without it, and may be at a worker that has not reported
yet.  It waits UNCLAIMED, in no queue: a worker's report that lists it (held, or its result
kept) claims it (DISPATCHED there, its result delivered, never run again); at the recovery's
end (every worker reported, or ``restart_grace`` over) it is queued again under a new
attempt.  A cancel asked meanwhile is held until one or the other.  Driven through the pure
core with the model peers and the restart seam of ``test_core_journal`` (a fake clock,
``validate()`` after every step, every message through the codec).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from typing import Any

from test_core_journal import (
    CONFIG,
    ONCE,
    ClientModel,
    WorkerModel,
    World,
    check_every_crash_point,
    check_exactly_once,
    find,
    finish,
    hello,
    live_map,
    restart,
    value_of,
)

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags
from scaler_executor.scheduler.core import Tick
from scaler_executor.scheduler.durable import DurableScheduler
from scaler_executor.scheduler.state import TaskState


def _spec(client: ClientModel, n: int, options_id: int = 0, deps: list[int] | None = None) -> m.TaskSpec:
    return m.TaskSpec(client.tid(n), 0, options_id, TaskFlags.INLINE_FN, b"p%d" % n, deps or [], [], 0)


def _kinds(world: World) -> set[bytes]:
    return {key[:1] for key in live_map(world.records)}


def _now(world: World) -> tuple[int, dict[bytes, Any], float]:
    """A crash point: the daemon dies now, every record written, the peers as they are."""
    return len(world.records), copy.deepcopy(world.peers), world.now


def _reloaded(world: World, point: tuple[int, dict[bytes, Any], float], config: Any = CONFIG) -> DurableScheduler:
    core = DurableScheduler(config, token=lambda: b"t")
    core.restore(live_map(world.records[: point[0]]), point[2] + 1.0)
    core.validate()
    return core


def _queued_then_dispatched(capacity: int = 2, once: bool = False) -> tuple[World, ClientModel, list[m.TaskSpec]]:
    """Two tasks written queued (no worker yet), then dispatched in a later turn, when a
    worker joins: with retries left, no ``d`` record says where they went."""
    world = World()
    client = world.join_client()
    options = 0
    if once:
        world.register(client, 1, ONCE)
        options = 1
    specs = [_spec(client, 1, options), _spec(client, 2, options)]
    world.send(client.conn, [client.submit(specs)])
    world.join_worker(b"\x00W1", capacity=capacity)
    assert set(find(world, WorkerModel).held) == {s.task_id for s in specs}
    return world, client, specs


def _resume(after: World, conn: bytes) -> None:
    after.send(conn, [m.Heartbeat(0, 0)])  # answered UNKNOWN_PEER: the peer resumes


def test_only_tasks_that_may_run_at_most_once_get_a_d_record() -> None:
    world, _, specs = _queued_then_dispatched()
    assert b"d" not in _kinds(world)
    core = _reloaded(world, _now(world))
    assert [core.tasks[s.task_id].state for s in specs] == [TaskState.UNCLAIMED] * 2
    assert core.ready.live == 0 and core.state_counts[TaskState.UNCLAIMED] == 2
    assert core.statistics().tasks_by_state["unclaimed"] == 2

    once_world, _, once_specs = _queued_then_dispatched(once=True)
    assert b"d" in _kinds(once_world)
    core = _reloaded(once_world, _now(once_world))
    assert [core.tasks[s.task_id].state for s in once_specs] == [TaskState.DISPATCHED] * 2  # unchanged


def test_a_held_task_claimed_by_its_workers_report_is_not_run_again_and_its_kept_result_is_delivered() -> None:
    world, client, specs = _queued_then_dispatched()
    worker = find(world, WorkerModel)
    worker.run(1)  # one ran; its result is kept at the worker (never reached the daemon)
    assert len(worker.unacked) == 1 and len(worker.held) == 1
    after = restart(world, _now(world))
    client = find(after, ClientModel)
    worker = find(after, WorkerModel)
    assert not after.core.unclaimed and after.core.recovering_until is None  # both claimed
    finish(after, client)
    check_exactly_once(client)
    assert worker.runs == {specs[0].task_id: 1, specs[1].task_id: 1}  # neither ran twice
    assert worker.cancels == 0


def test_a_held_task_nobody_claims_is_released_at_the_grace_periods_end_and_runs_once_under_a_new_attempt() -> None:
    world, client, specs = _queued_then_dispatched()
    after = restart(world, _now(world), without_workers=True)  # its worker never comes back
    client = find(after, ClientModel)
    core = after.core
    fresh = after.join_worker(b"\x00W2", capacity=2)
    for _ in range(9):  # within the grace period: the tasks go nowhere, not even to a new worker
        after.send(client.conn, [m.Heartbeat(0, 0)])
        after.send(fresh.conn, [m.Heartbeat(0, 0)])
        after.tick(1.0)
        assert fresh.held == {} and set(core.unclaimed) == {s.task_id for s in specs}
    after.tick(1.5)  # the grace period is over
    assert not core.unclaimed
    assert {t: d.attempt for t, d in fresh.held.items()} == {s.task_id: 1 for s in specs}  # a new attempt
    finish(after, client)
    check_exactly_once(client)
    assert fresh.runs == {s.task_id: 1 for s in specs}
    assert core.counters["retried"] == 0  # no charge against its retries


def test_a_held_task_is_released_once_every_worker_reported_without_it() -> None:
    world, _, specs = _queued_then_dispatched()

    def lost_dispatch(after: World) -> None:  # the daemon died before its dispatch went out
        find(after, WorkerModel).held.clear()

    after = restart(world, _now(world), meanwhile=lost_dispatch)
    assert not after.core.unclaimed and after.core.recovering_until is None
    worker = find(after, WorkerModel)
    assert {t: d.attempt for t, d in worker.held.items()} == {s.task_id: 1 for s in specs}
    finish(after, find(after, ClientModel))
    check_exactly_once(find(after, ClientModel))


def _held(world: World) -> tuple[World, ClientModel, WorkerModel]:
    """Restarted; the client resumed, the worker (as it was at the crash) not yet."""
    worker = copy.deepcopy(find(world, WorkerModel))
    worker.conn = b"\x00N" + worker.conn
    after = restart(world, _now(world), without_workers=True)
    return after, find(after, ClientModel), worker


def _worker_back(after: World, worker: WorkerModel) -> None:
    after.peers[worker.conn] = worker
    _resume(after, worker.conn)


def _cancelled_while_held() -> tuple[World, ClientModel, WorkerModel, list[m.TaskSpec]]:
    """Two tasks held by a worker across a restart (``_held``); the client then asks to
    cancel the first while the daemon holds it UNCLAIMED."""
    world, _, specs = _queued_then_dispatched()
    after, client, worker = _held(world)
    client.cancel_asked.add(specs[0].task_id)
    after.send(client.conn, [m.CancelTasks([specs[0].task_id], False)])
    return after, client, worker, specs


def test_a_cancel_of_a_held_task_is_answered_once_a_worker_claims_it_refused() -> None:
    after, client, worker, specs = _cancelled_while_held()
    task_id = specs[0].task_id
    assert task_id in client.cancel_asked  # held: not answered yet
    assert after.core.tasks[task_id].state is TaskState.UNCLAIMED
    _worker_back(after, worker)  # it holds both: claimed, the cancel refused (it may run)
    assert task_id not in client.cancel_asked and task_id not in client.cancelled
    finish(after, client)
    check_exactly_once(client)
    assert worker.runs == {s.task_id: 1 for s in specs}


def test_a_cancel_of_a_held_task_drops_it_when_it_is_released() -> None:
    after, client, worker, specs = _cancelled_while_held()
    task_id = specs[0].task_id
    worker.held.clear()  # its dispatches never reached it
    _worker_back(after, worker)
    assert client.cancelled == {task_id: 1} and task_id not in client.awaiting
    del client.expected[task_id]
    finish(after, client)
    check_exactly_once(client)
    assert worker.runs == {specs[1].task_id: 1}
    assert task_id not in after.core.tasks


def test_a_forced_cancel_of_a_held_task_kills_it_at_the_worker_that_claims_it_or_drops_it() -> None:
    for claimed in (True, False):
        world, _, specs = _queued_then_dispatched()
        after, client, worker = _held(world)
        task_id = specs[0].task_id
        client.forced.add(task_id)
        after.send(client.conn, [m.CancelTasks([task_id], True)])
        assert after.core.cancels_held == {task_id: 2}
        if not claimed:
            worker.held.clear()
        _worker_back(after, worker)
        (result,) = client.got[task_id]
        assert result.status == Status.CANCELLED, result
        assert worker.cancels == (1 if claimed else 0)  # killed there (the model drops it unstarted)
        del client.expected[task_id]
        finish(after, client)
        check_exactly_once(client)
        assert task_id not in worker.runs and task_id not in after.core.tasks


def test_a_cancel_asked_while_the_daemon_was_down_is_held_for_a_held_task_too() -> None:
    world, _, specs = _queued_then_dispatched()
    task_id = specs[0].task_id

    def asked(after: World) -> None:  # its CancelTasks went nowhere: its report names it
        find(after, ClientModel).cancel_asked.add(task_id)

    after = restart(world, _now(world), meanwhile=asked, order=lambda p: 0 if isinstance(p, ClientModel) else 1)
    client = find(after, ClientModel)
    assert task_id not in client.cancel_asked and task_id not in client.cancelled  # refused at the claim
    finish(after, client)
    check_exactly_once(client)


def test_a_client_lost_while_its_tasks_are_held_has_them_dropped_and_cancelled_at_their_worker() -> None:
    world, _, _ = _queued_then_dispatched()
    after, client, worker = _held(world)
    worker.run(1)  # one ran (its result kept at the worker), one is still held there
    after.send(client.conn, [m.Goodbye("done")])
    core = after.core
    assert not core.tasks and not core.unclaimed and not core.cancels_held
    _worker_back(after, worker)  # it reports both: strays now, cancelled; the kept result discarded
    assert worker.cancels == 1 and worker.held == {}
    assert not core.tasks
    assert core.counters["refused"] == 0


def test_tasks_its_client_no_longer_awaits_are_forgotten_while_held() -> None:
    world, _, specs = _queued_then_dispatched()
    gone = specs[0].task_id

    def dropped(after: World) -> None:  # the client dropped its future while the daemon was down
        model = find(after, ClientModel)
        model.awaiting.discard(gone)
        del model.expected[gone]

    after = restart(world, _now(world), meanwhile=dropped, order=lambda p: 0 if isinstance(p, ClientModel) else 1)
    client = find(after, ClientModel)
    worker = find(after, WorkerModel)
    assert gone not in after.core.tasks
    assert worker.cancels == 1  # it held it: cancelled there, as a task nobody awaits
    finish(after, client)
    check_exactly_once(client)


def test_a_held_task_is_not_seen_by_the_unsatisfiable_expiry_nor_placement() -> None:
    config = dataclasses.replace(CONFIG, unsatisfiable_timeout=1.0)
    tokens = itertools.count(1)
    world = World(DurableScheduler(config, token=lambda: b"token-%d" % next(tokens)))
    client = world.join_client()
    gpu = m.TaskOptions({"gpu": 1.0}, [], 0, None, None)
    world.register(client, 1, gpu)
    spec = _spec(client, 1, 1)
    world.send(client.conn, [client.submit([spec])])
    worker = world.peers[b"\x00W1"] = WorkerModel(b"\x00W1")
    world.send(worker.conn, [hello(m.Role.WORKER, "W1", 1)._replace(resources={"gpu": 1.0})])
    assert spec.task_id in worker.held
    core = DurableScheduler(config, token=lambda: b"t")
    core.restore(live_map(world.records), world.now + 1.0)
    now = world.now + 1.0
    for _ in range(8):  # well past unsatisfiable_timeout, no worker with a gpu back yet
        now += 1.0
        core.handle(Tick(now))
        core.validate()
        assert core.tasks[spec.task_id].state is TaskState.UNCLAIMED
        assert not any(q.live for q in core.constrained.values()) and core.ready.live == 0
    assert core.counters["failed"] == 0


def test_held_tasks_survive_a_crash_at_every_record_boundary() -> None:
    """Tasks queued, then dispatched in later turns (no ``d`` records but for the
    at-most-once one), with a dependency: every crash point replays, nothing runs twice on
    a worker that stayed, and some crash points reload tasks UNCLAIMED."""
    world = World()
    client = world.join_client()
    world.register(client, 1, ONCE)
    worker = world.join_worker(b"\x00W1", capacity=1)  # holds two at a time: the others wait queued
    a, c = client.tid(1), client.tid(3)
    specs = [_spec(client, 1), _spec(client, 4), _spec(client, 2, 1), _spec(client, 3, deps=[a]), _spec(client, 5)]
    expected = {c: value_of(b"p3+" + value_of(b"p1"))}
    world.send(client.conn, [client.submit(specs[:4], expected)])
    world.send(client.conn, [client.submit(specs[4:])])
    for _ in range(6):
        world.run_worker(worker, 1)
        world.ack(client)
        world.tick()
    assert not client.awaiting
    check_exactly_once(client)
    held = sum(1 for point in world.crash_points if _reloaded(world, point).unclaimed)
    assert held >= 3, held
    assert check_every_crash_point(world) == len(world.records)
    for point in world.crash_points:  # and nothing a worker held was taken from it as a stray
        after = restart(world, point)
        finish(after, find(after, ClientModel))
        assert all(p.cancels == 0 for p in after.peers.values() if isinstance(p, WorkerModel)), point[0]


def test_a_task_whose_journaled_dispatch_names_a_worker_gone_is_held_then_run_under_a_new_attempt() -> None:
    """A ``t`` record that names a worker the journal no longer has (its ``w`` delete written,
    the task's new attempt not: a turn torn in the files): the task may be anywhere, so it is
    held like one without a dispatch, and released under a new attempt (its ``t`` rewritten)."""
    world = World()
    client = world.join_client()
    world.join_worker(b"\x00W1", capacity=2)
    spec = _spec(client, 1)
    world.send(client.conn, [client.submit([spec])])  # dispatched the turn it was written: in its t record
    live = live_map(world.records)
    w1 = next(key for key in live if key[:1] == b"w")
    del live[w1]
    world.join_worker(b"\x00W2", capacity=2)
    w2 = next(key for key in live_map(world.records) if key[:1] == b"w" and key != w1)
    live[w2] = live_map(world.records)[w2]
    core = DurableScheduler(CONFIG, token=lambda: b"t")
    core.restore(live, world.now + 1.0)
    core.validate()
    assert core.tasks[spec.task_id].state is TaskState.UNCLAIMED
    core.handle(Tick(world.now + 11.5))  # the grace period ends: W2 never reported either
    core.validate()
    task = core.tasks[spec.task_id]
    assert task.state is TaskState.PENDING and task.attempt == 1
