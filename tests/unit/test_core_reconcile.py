"""A restarted daemon reconciles a resumed client's report (scheduler/reconcile.py).

What a client does while its daemon is down (releases, cancels, futures dropped) goes
nowhere; its ``ClientReport`` says it as state, and the restarted daemon frees, cancels and
forgets accordingly.  Driven through the pure core with the model peers and the restart seam
of ``test_core_journal`` (a fake clock, ``validate()`` after every step, every message
through the codec); ``meanwhile`` is what the client did while the daemon was down.
"""

from __future__ import annotations

from typing import Any

from test_core_journal import (
    ClientModel,
    World,
    WorkerModel,
    check_exactly_once,
    find,
    finish,
    live_map,
    restart,
    value_of,
)

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TaskFlags
from scaler_executor.scheduler.state import TaskState

O1, O2, O3 = b"1" * 16, b"2" * 16, b"3" * 16


def _journaled_kinds(world: World) -> set[bytes]:
    return {key[:1] for key in live_map(world.records)}


def _spec(client: ClientModel, n: int, *, fn: int = 0, deps: list[int] | None = None, objects: list[bytes] | None = None,
          flags: int = TaskFlags.INLINE_FN) -> m.TaskSpec:
    return m.TaskSpec(client.tid(n), fn, 0, flags if not fn else TaskFlags.CALL, b"p%d" % n, deps or [], objects or [], 0)


def _client_first(peer: Any) -> int:
    return 0 if isinstance(peer, ClientModel) else 1


def test_callables_and_objects_released_while_the_daemon_was_down_are_freed_on_resume() -> None:
    world = World()
    client = world.join_client()
    worker = world.join_worker(b"\x00W1", capacity=1)
    kept_fn, gone_fn, busy_fn = client.tid(1), client.tid(2), client.tid(3)
    for fn in (kept_fn, gone_fn, busy_fn):
        client.functions[fn] = b"blob-%d" % fn
        world.send(client.conn, [m.RegisterFunction(fn, client.functions[fn])])
    client.pins += [O1, O2]
    world.send(client.conn, [m.PinObjects([O1, O2])])
    done = _spec(client, 10, fn=gone_fn)
    world.send(client.conn, [client.submit([done])])
    world.run_worker(worker)
    world.ack(client)
    busy = _spec(client, 11, fn=busy_fn, objects=[O3])  # still queued at the crash: holds its callable
    world.send(client.conn, [client.submit([busy])])
    assert set(world.core.functions) == {kept_fn, gone_fn, busy_fn}

    def released(after: World) -> None:  # while the daemon is down: these messages went nowhere
        model = find(after, ClientModel)
        del model.functions[gone_fn], model.functions[busy_fn]
        model.pins.remove(O2)

    after = restart(world, world.crash_points[-1], meanwhile=released)
    core = after.core
    # gone_fn goes at once; busy_fn once no task refers to it any more; O2's hold ended.
    assert set(core.functions) == {kept_fn, busy_fn}
    assert core.object_holds == {O1: 1, O3: 1}
    assert O2 in after.deleted
    model = find(after, ClientModel)
    after.send(model.conn, [m.ReleaseFunctions([gone_fn])])  # the release sent late, after the resume
    assert core.counters["refused"] == 0, "a release sent again was refused"
    finish(after, model)
    check_exactly_once(model)
    assert set(core.functions) == {kept_fn}
    assert core.object_holds == {O1: 1}
    assert {b"f" + gone_fn.to_bytes(8, "big"), b"f" + busy_fn.to_bytes(8, "big")}.isdisjoint(live_map(after.records))


def test_a_cancel_asked_while_the_daemon_was_down_is_answered_and_the_task_never_runs() -> None:
    world = World()
    client = world.join_client()  # no worker yet: the tasks wait at the daemon
    victim = _spec(client, 1, objects=[O1])
    other = _spec(client, 2)
    world.send(client.conn, [client.submit([victim, other])])

    def cancel(after: World) -> None:
        find(after, ClientModel).cancel_asked.add(victim.task_id)  # its CancelTasks went nowhere

    after = restart(world, world.crash_points[-1], meanwhile=cancel)
    model = find(after, ClientModel)
    assert model.cancelled == {victim.task_id: 1}
    assert victim.task_id not in after.core.tasks
    assert after.core.object_holds == {} and O1 in after.deleted  # the task's argument object went with it
    worker = after.join_worker(b"\x00W9", capacity=2)
    finish(after, model)
    assert worker.runs == {other.task_id: 1}
    assert model.got.keys() == {other.task_id}


def test_a_cancel_the_daemon_wrote_but_never_answered_is_answered_after_the_restart() -> None:
    """At every crash point after the client asked: the task is cancelled exactly once (never
    failed as lost, never run), whether the dead daemon had written the cancel or not."""
    world = World()
    client = world.join_client()
    victim, other = _spec(client, 1), _spec(client, 2)
    world.send(client.conn, [client.submit([victim, other])])
    asked_at = len(world.crash_points)
    client.cancel_asked.add(victim.task_id)
    world.send(client.conn, [m.CancelTasks([victim.task_id], False)])
    assert client.cancelled == {victim.task_id: 1}
    for point in world.crash_points[asked_at:]:
        after = restart(world, point)
        model = find(after, ClientModel)
        worker = after.join_worker(b"\x00W9", capacity=2)
        finish(after, model)
        assert model.cancelled == {victim.task_id: 1}, (point[0], model.cancelled)
        assert victim.task_id not in model.got and victim.task_id not in worker.runs
        assert model.got[other.task_id][0].payload == value_of(other.payload)


def test_a_cancel_of_a_task_at_a_worker_is_refused_and_its_result_comes() -> None:
    world = World()
    client = world.join_client()
    world.join_worker(b"\x00W1", capacity=1)
    running = _spec(client, 1)
    world.send(client.conn, [client.submit([running])])

    def cancel(after: World) -> None:
        find(after, ClientModel).cancel_asked.add(running.task_id)

    after = restart(world, world.crash_points[-1], meanwhile=cancel)
    model = find(after, ClientModel)
    assert model.cancel_asked == set() and model.cancelled == {}  # refused: it may run already
    finish(after, model)
    check_exactly_once(model)


def test_a_forced_cancel_while_the_daemon_was_down_reaches_the_worker_once_it_is_back() -> None:
    world = World()
    client = world.join_client()
    world.join_worker(b"\x00W1", capacity=1)
    at_worker = _spec(client, 1)
    world.send(client.conn, [client.submit([at_worker])])
    queued = _spec(client, 2, deps=[at_worker.task_id], objects=[O1])  # waits at the daemon
    world.send(client.conn, [client.submit([queued])])

    def force(after: World) -> None:
        find(after, ClientModel).forced.update({at_worker.task_id, queued.task_id})

    # The client resumes before the worker does: the kill goes out once the worker reports.
    after = restart(world, world.crash_points[-1], meanwhile=force, order=_client_first)
    model, worker = find(after, ClientModel), find(after, WorkerModel)
    (cancelled,) = model.got[queued.task_id]
    assert cancelled.status == m.Status.CANCELLED  # queued: cancelled at the daemon, and said so
    assert after.core.object_holds == {}
    assert worker.cancels == 1 and worker.held == {}  # the forced cancel reached it on its report
    assert after.core.tasks == {}
    assert model.got[at_worker.task_id][0].status == m.Status.CANCELLED


def test_tasks_the_client_no_longer_awaits_are_forgotten_and_their_objects_freed() -> None:
    world = World()
    client = world.join_client()
    world.join_worker(b"\x00W1", capacity=1)
    # At the worker when the daemon dies; then queued ones; then a graph whose intermediate
    # (no future of its own) the client needs for a task it awaits.
    at_worker = _spec(client, 1, objects=[O1])
    dropped = _spec(client, 2, objects=[O2])
    awaited = _spec(client, 3)
    middle = _spec(client, 4, flags=TaskFlags.INLINE_FN | TaskFlags.NO_RESULT)
    top = _spec(client, 5, deps=[middle.task_id], objects=[O3])
    world.send(client.conn, [client.submit([at_worker])])
    world.send(client.conn, [client.submit([dropped, awaited, middle, top])])
    assert world.core.tasks[at_worker.task_id].state is TaskState.DISPATCHED
    assert at_worker.task_id in find(world, WorkerModel).held

    def drop(after: World) -> None:  # their futures went while the daemon was down
        find(after, ClientModel).awaiting -= {at_worker.task_id, dropped.task_id}

    after = restart(world, world.crash_points[-1], meanwhile=drop, order=_client_first)
    core = after.core
    model, worker = find(after, ClientModel), find(after, WorkerModel)
    # The one at the worker was cancelled there once the worker reported (it had not
    # started): it never runs; the queued one is dropped; the graph's intermediate stays.
    assert worker.cancels == 1 and at_worker.task_id not in worker.runs
    assert core.tasks.keys() == {awaited.task_id, middle.task_id, top.task_id}
    assert core.object_holds == {O3: 1} and {O1, O2} <= set(after.deleted)
    finish(after, model)
    assert worker.runs.keys() == {awaited.task_id, middle.task_id, top.task_id}
    assert model.got.keys() == {awaited.task_id, top.task_id}
    assert core.tasks == {} and core.object_holds == {}
    assert _journaled_kinds(after) <= {b"n", b"c", b"w"}
