"""Fair queueing between clients in the daemon's pure core (scheduler/state.py ReadyQueue).

One client's backlog must not starve another's tasks: ready tasks are served one per
client in rotation; ``priority`` orders tasks within one client only.  Driven through the
core's public ``handle`` with an injected clock, as in test_core.py.
"""

from __future__ import annotations

from core_testing import Cluster, hello, result, spec, tid

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TASK_ID_BITS


def owner(task_id: int) -> int:
    return task_id >> TASK_ID_BITS


def drain(cluster: Cluster, worker: bytes, first: list[int]) -> list[int]:
    """Answer every task the worker holds, in order, until none is left; the dispatch order."""
    order, held = list(first), list(first)
    while held:
        out = cluster.send(worker, m.TaskResults([result(held.pop(0))]))
        got = [t.task_id for t in out.dispatched(worker)]
        order += got
        held += got
    return order


def test_a_second_client_is_served_before_the_first_clients_backlog_drains() -> None:
    cluster = Cluster()
    first, second = cluster.client(b"c1"), cluster.client(b"c2")
    window = [t.task_id for t in cluster.worker(b"w1", capacity=1).dispatched(b"w1")]
    assert window == []
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(first, n)) for n in range(1, 201)]))
    held = [t.task_id for t in out.dispatched(b"w1")]
    assert held and all(owner(t) == first for t in held)
    # c1's backlog (200) is queued and a worker window of it dispatched; now c2 submits 5.
    out = cluster.send(b"c2", m.SubmitTasks([spec(tid(second, n)) for n in range(1, 6)]))
    order = drain(cluster, b"w1", [*held, *[t.task_id for t in out.dispatched(b"w1")]])
    assert sorted(order) == sorted([tid(first, n) for n in range(1, 201)] + [tid(second, n) for n in range(1, 6)])
    last_of_second = max(i for i, t in enumerate(order) if owner(t) == second)
    # Bounded: what was already at the worker, then at most one c1 task per c2 task.
    assert last_of_second < len(held) + 2 * 5 + 1, (last_of_second, len(held))
    still_queued_of_first = sum(1 for t in order[last_of_second + 1 :] if owner(t) == first)
    assert still_queued_of_first >= 180


def test_clients_are_served_in_rotation() -> None:
    cluster = Cluster()
    ids = [cluster.client(p) for p in (b"c1", b"c2", b"c3")]
    for peer, cid in zip((b"c1", b"c2", b"c3"), ids, strict=True):
        cluster.send(peer, m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 5)]))
    out = cluster.worker(b"w1", capacity=1)
    order = drain(cluster, b"w1", [t.task_id for t in out.dispatched(b"w1")])
    assert [owner(t) for t in order] == ids * 4
    # FIFO within each client.
    for cid in ids:
        assert [t for t in order if owner(t) == cid] == [tid(cid, n) for n in range(1, 5)]


def test_priority_orders_one_clients_tasks_but_does_not_jump_another_client() -> None:
    cluster = Cluster()
    a, b = cluster.client(b"c1"), cluster.client(b"c2")
    urgent = m.RegisterOptions(7, m.TaskOptions({}, [], 10, None, None))
    cluster.send(b"c1", m.SubmitTasks([spec(tid(a, n)) for n in range(1, 4)]))
    cluster.send(b"c2", urgent, m.SubmitTasks([spec(tid(b, n), options_id=7 if n == 3 else 0) for n in range(1, 4)]))
    out = cluster.worker(b"w1", capacity=1)
    order = drain(cluster, b"w1", [t.task_id for t in out.dispatched(b"w1")])
    assert [owner(t) for t in order] == [a, b] * 3
    assert [t for t in order if owner(t) == b] == [tid(b, 3), tid(b, 1), tid(b, 2)], "c2's urgent task first among c2's"


def test_cancelled_tasks_of_one_client_are_skipped_and_the_other_served() -> None:
    cluster = Cluster()
    a, b = cluster.client(b"c1"), cluster.client(b"c2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(a, n)) for n in range(1, 11)]))
    cluster.send(b"c2", m.SubmitTasks([spec(tid(b, n)) for n in range(1, 3)]))
    cancelled = cluster.send(b"c1", m.CancelTasks([tid(a, n) for n in range(1, 11)], False))
    assert sorted(cancelled.one(b"c1", m.TasksCancelled).cancelled) == [tid(a, n) for n in range(1, 11)]
    out = cluster.worker(b"w1", capacity=1)
    assert drain(cluster, b"w1", [t.task_id for t in out.dispatched(b"w1")]) == [tid(b, 1), tid(b, 2)]
    assert cluster.scheduler.ready.live == 0 and cluster.scheduler.ready.pop() is None


def test_a_client_that_leaves_loses_its_turn() -> None:
    cluster = Cluster()
    a, b = cluster.client(b"c1"), cluster.client(b"c2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(a, n)) for n in range(1, 6)]))
    cluster.send(b"c2", m.SubmitTasks([spec(tid(b, n)) for n in range(1, 3)]))
    cluster.send(b"c1", m.Goodbye("done"))
    out = cluster.worker(b"w1", capacity=1)
    assert drain(cluster, b"w1", [t.task_id for t in out.dispatched(b"w1")]) == [tid(b, 1), tid(b, 2)]


def _flood_and_a_late_client(flood_tags: list[str], late_tags: list[str]) -> tuple[list[int], int, int, int]:
    """c1 queues 200 tasks (tagged ``flood_tags``), a window of them reaches the one worker
    (tagged "gpu"), then c2 queues 5 (tagged ``late_tags``): the dispatch order."""
    cluster = Cluster()
    a, b = cluster.client(b"c1"), cluster.client(b"c2")
    cluster.join(b"w1", hello(m.Role.WORKER, name="w1", capacity=1, tags=["gpu"]))
    flood_options = m.RegisterOptions(7, m.TaskOptions({}, flood_tags, 0, None, None))
    out = cluster.send(b"c1", flood_options, m.SubmitTasks([spec(tid(a, n), options_id=7) for n in range(1, 201)]))
    held = [t.task_id for t in out.dispatched(b"w1")]
    assert held and all(owner(t) == a for t in held)
    late_options = m.RegisterOptions(8, m.TaskOptions({}, late_tags, 0, None, None))
    out = cluster.send(b"c2", late_options, m.SubmitTasks([spec(tid(b, n), options_id=8) for n in range(1, 6)]))
    order = drain(cluster, b"w1", [*held, *[t.task_id for t in out.dispatched(b"w1")]])
    cluster.scheduler.validate()
    return order, len(held), a, b


def test_a_tagged_backlog_does_not_starve_another_clients_plain_tasks() -> None:
    """The constraint queues and the plain queue share the worker: whichever was served
    first took every free slot, so c2's plain tasks waited for c1's 200 tagged ones."""
    order, held, a, b = _flood_and_a_late_client(["gpu"], [])
    assert len(order) == 205
    last_of_second = max(i for i, t in enumerate(order) if owner(t) == b)
    assert last_of_second < held + 2 * 5 + 1, (last_of_second, held)
    assert sum(1 for t in order[last_of_second + 1 :] if owner(t) == a) >= 180


def test_a_plain_backlog_does_not_starve_another_clients_tagged_tasks() -> None:
    order, held, a, b = _flood_and_a_late_client([], ["gpu"])
    assert len(order) == 205
    last_of_second = max(i for i, t in enumerate(order) if owner(t) == b)
    assert last_of_second < held + 2 * 5 + 1, (last_of_second, held)
    assert sum(1 for t in order[last_of_second + 1 :] if owner(t) == a) >= 180
