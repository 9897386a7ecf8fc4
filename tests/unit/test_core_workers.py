"""The daemon's pure core and its workers: late results, a worker lost (retries, draining,
goodbyes), a broken cluster (driven as in test_core.py)."""

from __future__ import annotations

import msgpack
import pytest
from core_testing import (
    CONFIG,
    DEADLINE,
    Cluster,
    cluster,  # noqa: F401  (a fixture)
    hello,
    lose,
    result,
    spec,
    tid,
)

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.scheduler.core import (
    WorkerExited,
)
from scaler_executor.scheduler.state import TaskState

# ====================================================================== late results


def test_late_results_are_dropped(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    cluster.worker(b"w2")
    t = tid(cid, 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    (first,) = [p for p in (b"w1", b"w2") if out.dispatched(p)]
    other = b"w2" if first == b"w1" else b"w1"
    # The processor died: the task is retried (on the least loaded worker).
    out = cluster.send(
        first, m.TaskResults([result(t, status=Status.PROCESSOR_DIED, payload=b"SIGSEGV")])
    )
    (retried,) = [d for p in (b"w1", b"w2") for d in out.dispatched(p)]
    assert retried.attempt == 1
    holder = cluster.scheduler.tasks[t].worker
    assert holder is not None
    stranger = first if holder == other else other

    for late in (
        (holder, result(t, attempt=0)),  # an earlier attempt
        (holder, result(t, attempt=2)),  # an attempt never made
        (stranger, result(t, attempt=1)),  # another worker
        (holder, result(tid(cid, 999), attempt=0)),  # an unknown task
    ):
        out = cluster.send(late[0], m.TaskResults([late[1]]))
        assert not out.results(b"c1"), f"late result {late} was forwarded"
        assert cluster.scheduler.tasks[t].worker == holder

    answer = result(t, attempt=1)
    assert cluster.send(holder, m.TaskResults([answer])).results(b"c1") == [answer]
    # A duplicate of the result that settled it is late too.
    assert not cluster.send(holder, m.TaskResults([answer])).results(b"c1")


# ====================================================================== worker loss


def test_worker_lost_by_missed_heartbeats(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    t = tid(cid, 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    assert out.dispatched(b"w1")
    cluster.worker(b"w2")
    cluster.now += DEADLINE
    cluster.keepalive(b"c1", b"w2")
    out = cluster.tick()
    assert cluster.stat("workers") == 2, "exactly at the deadline is not yet lost"
    cluster.now += 0.01
    cluster.keepalive(b"c1", b"w2")
    out = cluster.tick()
    assert cluster.stat("workers") == 1 and cluster.stat("workers_lost") == 1
    (retry,) = out.dispatched(b"w2")
    assert (retry.task_id, retry.attempt) == (t, 1)
    assert b"w1" not in out.peers, "nothing is sent to a lost worker"
    assert cluster.notices().running(b"c1") == [t]
    assert cluster.stat("retried") == 1


def test_heartbeats_and_any_message_keep_a_worker(cluster: Cluster) -> None:
    cluster.client()
    cluster.worker(b"w1")
    for _ in range(10):
        cluster.now += DEADLINE * 0.9
        cluster.send(b"c1", m.Heartbeat(0, 0))
        cluster.send(b"w1", m.TaskResults([]))  # any message counts
        cluster.tick()
    assert cluster.stat("workers") == 1 and cluster.stat("clients") == 1


@pytest.mark.parametrize("how", ["silence", "exited", "unreachable"])
def test_retries_until_max_retries_then_worker_lost(cluster: Cluster, how: str) -> None:
    cid = cluster.client()
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    names = []
    for attempt in range(CONFIG.max_retries + 1):
        peer = b"w%d" % attempt
        out = cluster.worker(peer, pid=1000 + attempt)
        names.append(peer.decode())
        assert [(d.task_id, d.attempt) for d in out.dispatched(peer)] == [(t, attempt)]
        if attempt:
            assert cluster.scheduler.tasks[t].attempt == attempt
        out = lose(cluster, peer, how)
        if attempt < CONFIG.max_retries:
            assert cluster.scheduler.tasks[t].state is TaskState.RETRYING
            assert not out.results(b"c1")
    (lost,) = out.results(b"c1")
    assert (lost.task_id, lost.attempt, lost.status) == (t, CONFIG.max_retries, Status.WORKER_LOST)
    text, lines = msgpack.unpackb(lost.payload)
    assert f"{t:#x}" in text and f"{CONFIG.max_retries + 1} attempt" in text
    assert f"max_retries={CONFIG.max_retries}" in text
    assert len(lines) == CONFIG.max_retries + 1
    for n, (line, name) in enumerate(zip(lines, names), start=1):
        assert line.startswith(f"attempt {n}: worker {name}: ")
        cause = {
            "silence": "missed heartbeats",
            "exited": "exited: killed by signal SIGKILL",
            "unreachable": "unreachable",
        }[how]
        assert cause in line
    assert t not in cluster.scheduler.tasks
    assert cluster.stat("failed") == 1 and cluster.stat("retried") == CONFIG.max_retries


@pytest.mark.parametrize("max_retries, attempts", [(0, 1), (1, 2), (4, 5)])
def test_per_task_max_retries(cluster: Cluster, max_retries: int, attempts: int) -> None:
    cid = cluster.client()
    t = tid(cid, 1)
    options = m.TaskOptions({}, [], 0, None, max_retries)
    cluster.send(b"c1", m.RegisterOptions(1, options), m.SubmitTasks([spec(t, options_id=1)]))
    for attempt in range(attempts):
        peer = b"w%d" % attempt
        out = cluster.worker(peer)
        assert out.dispatched(peer)[0].attempt == attempt
        out = lose(cluster, peer, "unreachable")
        assert bool(out.results(b"c1")) == (attempt == attempts - 1)
    (lost,) = out.results(b"c1")
    assert lost.status == Status.WORKER_LOST
    assert len(msgpack.unpackb(lost.payload)[1]) == attempts


def test_config_max_retries_zero(cluster: Cluster) -> None:
    cluster = Cluster(CONFIG.replace(max_retries=0))
    cid = cluster.client()
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    (lost,) = lose(cluster, b"w1", "exited").results(b"c1")
    assert lost.status == Status.WORKER_LOST


def test_processor_died_is_retried(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    for attempt in range(CONFIG.max_retries):
        out = cluster.send(
            b"w1", m.TaskResults([result(t, attempt, Status.PROCESSOR_DIED, b"killed by SIGSEGV")])
        )
        assert not out.results(b"c1"), "PROCESSOR_DIED is for the daemon, never a client"
        assert [(d.task_id, d.attempt) for d in out.dispatched(b"w1")] == [(t, attempt + 1)]
    out = cluster.send(
        b"w1",
        m.TaskResults([result(t, CONFIG.max_retries, Status.PROCESSOR_DIED, b"killed by SIGSEGV")]),
    )
    (lost,) = out.results(b"c1")
    assert lost.status == Status.WORKER_LOST
    _text, lines = msgpack.unpackb(lost.payload)
    assert lines == [
        f"attempt {n}: worker w1: killed by SIGSEGV" for n in range(1, CONFIG.max_retries + 2)
    ]
    assert cluster.stat("workers") == 1, "a processor death does not lose the worker"


def test_worker_exited_matches_pid_and_host(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", pid=11, host="a")
    cluster.worker(b"w2", pid=11, host="b")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    assert not cluster.step(WorkerExited(12, "a", "exit code 1", cluster.now)).peers
    assert cluster.stat("workers") == 2
    cluster.step(WorkerExited(11, "a", "exit code 1", cluster.now))
    assert set(cluster.scheduler.workers) == {b"w2"}


def test_worker_goodbye_returns_tasks_without_an_attempt(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    ids = [tid(cid, n) for n in (1, 2)]
    cluster.send(b"c1", m.SubmitTasks([spec(t) for t in ids]))
    cluster.send(b"c1", m.CancelTasks([ids[1]], True))  # CANCELLING when the worker leaves
    cluster.worker(b"w2", capacity=1)
    out = cluster.send(b"w1", m.Goodbye("scaling down"))
    # A fresh attempt number (a late answer to the old hand-out cannot settle it), but no
    # failure recorded: it does not count against max_retries.
    assert [(d.task_id, d.attempt) for d in out.dispatched(b"w2")] == [(ids[0], 1)]
    assert b"w1" not in out.peers
    assert ids[1] not in cluster.scheduler.tasks
    assert cluster.stat("workers_lost") == 0 and cluster.stat("retried") == 0
    assert cluster.scheduler.tasks[ids[0]].failures is None


def test_worker_goodbye_requeues_for_free_only_what_it_vouches_never_started(cluster: Cluster) -> None:
    """At most once (max_retries=0) holds through an orderly leave (SIGTERM, scancel): the
    worker's Goodbye lists the tasks it hands back never given to a processor, and only those
    run again, at another worker, for free. Any other task may have started: an at-most-once
    one fails naming the worker; an ordinary one goes back without a charge (no crash)."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=4)
    started, unstarted, ordinary, stale = (tid(cid, n) for n in (1, 2, 3, 4))
    out = cluster.send(
        b"c1",
        m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)),
        m.SubmitTasks([spec(started, options_id=1), spec(unstarted, options_id=1), spec(ordinary), spec(stale, options_id=1)]),
    )
    assert sorted(d.task_id for d in out.dispatched(b"w1")) == [started, unstarted, ordinary, stale]
    # ``stale`` is vouched for under another attempt than the one it holds, and the last
    # is no task of the worker's: neither says anything of what the worker holds.
    listed = [m.TaskAttempt(unstarted, 0), m.TaskAttempt(stale, 1), m.TaskAttempt(tid(cid, 99), 0)]
    out = cluster.send(b"w1", m.Goodbye("worker stopping", listed))
    lost = {r.task_id: r for r in out.results(b"c1")}
    assert set(lost) == {started, stale}
    for r in lost.values():
        assert r.status == Status.WORKER_LOST
        text, lines = msgpack.unpackb(r.payload)
        assert "may have started on worker w1" in text and "max_retries=0" in text, text
        assert lines == ["attempt 1: worker w1: left: worker stopping"]
    tasks = cluster.scheduler.tasks
    assert set(tasks) == {unstarted, ordinary}
    assert tasks[unstarted].failures is None and tasks[ordinary].failures is None
    assert cluster.stat("workers_lost") == 0 and cluster.stat("retried") == 0
    out = cluster.worker(b"w2", capacity=2)
    assert sorted((d.task_id, d.attempt) for d in out.dispatched(b"w2")) == [(unstarted, 1), (ordinary, 1)]


def test_a_draining_worker_hands_back_its_unstarted_tasks_for_free_and_finishes_the_rest(cluster: Cluster) -> None:
    """Walltime without loss: a worker told its job ends soon (SIGTERM with --drain-seconds)
    says WorkerDraining, listing the tasks it never started.  Those run elsewhere at once,
    for free; nothing more is dispatched to it; the tasks it runs stay its own, and their
    results (an at-most-once task's too) are accepted and delivered once."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    once, running, queued1, queued2 = (tid(cid, n) for n in (1, 2, 3, 4))
    out = cluster.send(
        b"c1",
        m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)),
        m.SubmitTasks([spec(once, options_id=1), spec(running), spec(queued1, options_id=1), spec(queued2)]),
    )
    assert sorted(d.task_id for d in out.dispatched(b"w1")) == [once, running, queued1, queued2]
    cluster.worker(b"w2", capacity=4)
    # A stale attempt and a task that is not the worker's say nothing of what it holds.
    listed = [m.TaskAttempt(queued1, 0), m.TaskAttempt(queued2, 0), m.TaskAttempt(running, 1), m.TaskAttempt(tid(cid, 99), 0)]
    out = cluster.send(b"w1", m.WorkerDraining(listed))
    assert sorted((d.task_id, d.attempt) for d in out.dispatched(b"w2")) == [(queued1, 1), (queued2, 1)]
    assert not out.results(b"c1") and b"w1" not in out.peers
    w1 = cluster.scheduler.workers[b"w1"]
    assert w1.draining and set(w1.inflight) == {once, running}
    tasks = cluster.scheduler.tasks
    assert tasks[queued1].failures is None and tasks[queued2].failures is None
    assert cluster.stat("retried") == 0 and cluster.stat("workers_lost") == 0
    # New work never lands on it, even with its slots free and nowhere else to go.
    later = tid(cid, 5)
    cluster.send(b"w2", m.TaskResults([result(queued1, 1), result(queued2, 1)]))
    out = cluster.send(b"c1", m.SubmitTasks([spec(later)]))
    assert [d.task_id for d in out.dispatched(b"w2")] == [later] and not out.dispatched(b"w1")
    # Its running tasks' results count as usual: each delivered once.
    out = cluster.send(b"w1", m.TaskResults([result(once, 0), result(running, 0), result(queued1, 0)]))
    delivered = [(r.task_id, r.status) for r in out.results(b"c1")]
    assert sorted(delivered) == sorted([(once, Status.OK), (running, Status.OK)])
    assert not w1.inflight and not out.dispatched(b"w1")
    # Its Goodbye, holding nothing, changes nothing.
    out = cluster.send(b"w1", m.Goodbye("worker stopping", []))
    assert not out.results(b"c1") and cluster.stat("workers_lost") == 0 and cluster.stat("failed") == 0
    assert set(cluster.scheduler.tasks) == {later}


def test_a_draining_workers_goodbye_follows_the_usual_rules(cluster: Cluster) -> None:
    """The drain ran out (or the worker was stopped at once): what it still held when it
    said Goodbye may have started, so an at-most-once task fails as before; a draining
    worker alone gets nothing even with tasks waiting, which wait for another."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    once = tid(cid, 1)
    cluster.send(b"c1", m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)), m.SubmitTasks([spec(once, options_id=1)]))
    cluster.send(b"w1", m.WorkerDraining([]))
    waiting = tid(cid, 2)
    out = cluster.send(b"c1", m.SubmitTasks([spec(waiting)]))
    assert not out.dispatched(b"w1")
    out = cluster.send(b"w1", m.WorkerDraining([m.TaskAttempt(once, 3)]))  # not its attempt: nothing
    assert set(cluster.scheduler.workers[b"w1"].inflight) == {once} and not out.peers - {b"w1"}
    out = cluster.send(b"w1", m.Goodbye("worker stopping", []))
    (lost,) = out.results(b"c1")
    assert lost.task_id == once and lost.status == Status.WORKER_LOST
    out = cluster.worker(b"w2")
    assert [d.task_id for d in out.dispatched(b"w2")] == [waiting]


def test_a_worker_that_drains_shows_as_draining_in_statistics(cluster: Cluster) -> None:
    cluster.worker(b"w1")
    cluster.send(b"w1", m.WorkerDraining([]))
    (worker,) = cluster.scheduler.statistics().workers
    assert worker.name == "w1" and worker.draining


def test_a_worker_joining_again_interrupts_what_it_held(cluster: Cluster) -> None:
    """A worker's repeated Hello means it forgot (and killed) what it held: nothing it held
    is vouched for, so an at-most-once task fails, an ordinary one goes back for free."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=2)
    once, ordinary = tid(cid, 1), tid(cid, 2)
    cluster.send(
        b"c1", m.RegisterOptions(1, m.TaskOptions({}, [], 0, None, 0)), m.SubmitTasks([spec(once, options_id=1), spec(ordinary)])
    )
    out = cluster.send(b"w1", hello(m.Role.WORKER, name="w1", capacity=2))
    (lost,) = out.results(b"c1")
    assert lost.task_id == once and lost.status == Status.WORKER_LOST
    assert msgpack.unpackb(lost.payload)[1] == ["attempt 1: worker w1: left: joined again"]
    assert [(d.task_id, d.attempt) for d in out.dispatched(b"w1")] == [(ordinary, 1)]
    assert cluster.scheduler.tasks[ordinary].failures is None


def test_lost_worker_with_a_cancelling_task(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    cluster.send(b"c1", m.CancelTasks([t], True))
    out = lose(cluster, b"w1", "unreachable")
    assert t not in cluster.scheduler.tasks, "a cancelled task is not retried"
    # Its worker's answer will never come: the daemon gives it (the future would hang).
    assert [(r.task_id, r.status) for r in out.results(b"c1")] == [(t, Status.CANCELLED)]
    cluster.worker(b"w2")
    assert not cluster.scheduler.workers[b"w2"].inflight


def test_a_force_cancelled_task_whose_worker_is_lost_ends_its_dependents(cluster: Cluster) -> None:
    """Found by the core fuzz: the dependent waited on a task that was gone."""
    cid = cluster.client()
    cluster.worker(b"w1")
    a, b = tid(cid, 1), tid(cid, 2)
    cluster.send(b"c1", m.SubmitTasks([spec(a)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))
    cluster.send(b"c1", m.CancelTasks([a], True))
    out = lose(cluster, b"w1", "unreachable")
    assert sorted((r.task_id, r.status) for r in out.results(b"c1")) == [(a, Status.CANCELLED), (b, Status.CANCELLED)]
    assert not cluster.scheduler.tasks


def test_a_force_cancelled_task_that_ended_first_ends_its_dependents(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    a, b = tid(cid, 1), tid(cid, 2)
    cluster.send(b"c1", m.SubmitTasks([spec(a)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))
    cluster.send(b"c1", m.CancelTasks([a], True))
    out = cluster.send(b"w1", m.TaskResults([result(a)]))  # it ended before the kill
    assert sorted((r.task_id, r.status) for r in out.results(b"c1")) == [(a, Status.OK), (b, Status.CANCELLED)]
    assert not cluster.scheduler.tasks


def test_a_task_id_used_again_after_a_cancel_is_not_a_dependent(cluster: Cluster) -> None:
    """Found by the core fuzz: a dependent cancelled while waiting stayed on its dependency's
    list, so a task submitted later under the same id counted as its dependent."""
    cid = cluster.client()
    cluster.worker(b"w1")
    a, b = tid(cid, 1), tid(cid, 2)
    cluster.send(b"c1", m.SubmitTasks([spec(a)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))
    cluster.send(b"c1", m.CancelTasks([b], False))
    cluster.send(b"c1", m.SubmitTasks([spec(b)]))  # validate() runs after each step
    out = cluster.send(b"w1", m.TaskResults([result(a)]))
    assert [(r.task_id, r.status) for r in out.results(b"c1")] == [(a, Status.OK)]
    assert cluster.scheduler.tasks[b].waiting == 0


def test_a_task_that_depends_on_itself_is_rejected_and_twice_on_one_counts_once(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    a, b, c = tid(cid, 1), tid(cid, 2), tid(cid, 3)
    out = cluster.send(b"c1", m.SubmitTasks([spec(a, deps=[a])]))
    assert [(r.task_id, r.status) for r in out.results(b"c1")] == [(a, Status.REJECTED)]
    assert b"depends on itself" in out.results(b"c1")[0].payload
    cluster.send(b"c1", m.SubmitTasks([spec(b), spec(c, deps=[b, b])]))
    assert cluster.scheduler.tasks[c].deps == [b] and cluster.scheduler.tasks[b].holds == 1
    out = cluster.send(b"w1", m.TaskResults([result(b)]))
    assert [d.task_id for d in out.dispatched(b"w1")] == [c]


# ====================================================================== broken cluster


def test_cluster_broken_is_forwarded_and_the_worker_gets_no_more_tasks(cluster: Cluster) -> None:
    a = cluster.client(b"a")
    cluster.client(b"b")
    cluster.worker(b"w1", capacity=1)
    cluster.send(b"a", m.SubmitTasks([spec(tid(a, 1))]))
    broken = m.ClusterBroken("initializer failed: ImportError", b"pickled-exc")
    out = cluster.send(b"w1", broken)
    assert out.to(b"a") == [broken] and out.to(b"b") == [broken]
    out = cluster.send(b"a", m.SubmitTasks([spec(tid(a, n)) for n in range(2, 5)]))
    assert not out.dispatched(b"w1"), "a broken worker gets no more tasks"
    assert cluster.stat("tasks_pending") == 3
    # What it already held still settles.
    answer = result(tid(a, 1), status=Status.ERROR, payload=b"exc")
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"a") == [answer]
    assert not cluster.tick().dispatched(b"w1")
    out = cluster.worker(b"w2", capacity=2)
    assert len(out.dispatched(b"w2")) == 3
