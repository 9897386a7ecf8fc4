"""The daemon's pure core and its clients: functions, cancels, specs it rejects, a client
lost (driven as in test_core.py)."""

from __future__ import annotations

import pytest
from core_testing import (
    DEADLINE,
    Cluster,
    client_with_function,
    cluster,  # noqa: F401  (a fixture)
    hello,
    lose,
    result,
    spec,
    tid,
)

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags
from scaler_executor.scheduler.core import (
    PeerUnreachable,
)
from scaler_executor.scheduler.state import TaskState

# ====================================================================== functions


def test_function_sent_to_each_worker_once(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(1, 4)]))
    assert out.blobs(b"w1") == [m.FunctionBlob(fn, b"pickled-fn")]
    assert len(out.dispatched(b"w1")) == 2
    out = cluster.send(b"w1", m.TaskResults([result(tid(cid, 1))]))
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 3)]
    assert out.blobs(b"w1") == [], "the worker already has the function"
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(4, 7)]))
    out = cluster.worker(b"w2", capacity=1)
    assert out.blobs(b"w2") == [m.FunctionBlob(fn, b"pickled-fn")], "each worker gets it once"


def test_inline_functions_need_no_blob(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    assert out.blobs(b"w1") == []
    assert out.dispatched(b"w1")[0].flags == TaskFlags.INLINE_FN


def test_function_released_after_its_last_task(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    cluster.worker(b"w2", capacity=1)
    cluster.worker(b"w3", capacity=1)
    t1, t2 = tid(cid, 1), tid(cid, 2)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t1, fn), spec(t2, fn)]))
    holders = {p for p in (b"w1", b"w2", b"w3") if out.blobs(p)}
    assert len(holders) == 2
    where = {t.task_id: p for p in holders for t in out.dispatched(p)}

    out = cluster.send(b"c1", m.ReleaseFunctions([fn]))
    assert not out.peers, "tasks still refer to it: nothing released yet"
    assert fn in cluster.scheduler.functions

    out = cluster.send(where[t1], m.TaskResults([result(t1)]))
    assert not out.of(where[t1], m.ReleaseFunctions)
    assert fn in cluster.scheduler.functions

    out = cluster.send(where[t2], m.TaskResults([result(t2)]))
    assert {p for p in out.peers if out.of(p, m.ReleaseFunctions)} == holders
    assert all(out.of(p, m.ReleaseFunctions) == [m.ReleaseFunctions([fn])] for p in holders)
    assert fn not in cluster.scheduler.functions

    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 3), fn)]))
    (rejected,) = out.results(b"c1")
    assert rejected.status == Status.REJECTED and b"released" in rejected.payload


def test_function_released_at_once_when_no_task_refers(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.worker(b"w2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn)]))
    holder = next(p for p in (b"w1", b"w2") if fn in cluster.scheduler.workers[p].functions)
    cluster.send(holder, m.TaskResults([result(tid(cid, 1))]))
    assert fn in cluster.scheduler.functions, "kept while the client caches it"
    out = cluster.send(b"c1", m.ReleaseFunctions([fn]))
    assert out.to(holder) == [m.ReleaseFunctions([fn])]
    assert out.peers == {holder}, "only workers that had it hear of it"
    assert fn not in cluster.scheduler.functions


def test_function_of_a_cancelled_task_is_released(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn)]), m.ReleaseFunctions([fn]))
    assert fn in cluster.scheduler.functions
    cluster.send(b"c1", m.CancelTasks([tid(cid, 1)], False))
    assert fn not in cluster.scheduler.functions


def test_released_function_still_reaches_the_worker_a_retry_goes_to(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t, fn)]), m.ReleaseFunctions([fn]))
    cluster.worker(b"w2")
    out = lose(cluster, b"w1", "unreachable")
    assert out.blobs(b"w2") == [m.FunctionBlob(fn, b"pickled-fn")]
    assert [(d.task_id, d.attempt) for d in out.dispatched(b"w2")] == [(t, 1)]
    out = cluster.send(b"w2", m.TaskResults([result(t, 1)]))
    assert out.to(b"w2") == [m.ReleaseFunctions([fn])]
    assert fn not in cluster.scheduler.functions


def test_release_of_a_function_the_client_never_registered_is_ignored(cluster: Cluster) -> None:
    _cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    cluster.send(b"c2", m.ReleaseFunctions([fn, tid(other, 5)]))
    assert fn in cluster.scheduler.functions
    assert cluster.stat("refused") == 1  # another client's function: refused; an unknown id: ignored


def test_a_client_cannot_cancel_another_clients_task(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.client(b"c2")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t, fn_id=fn)]))  # queued: no worker yet
    out = cluster.send(b"c2", m.CancelTasks([t], False))
    assert out.to(b"c2") == [m.TasksCancelled([], [t])]
    cluster.send(b"c2", m.CancelTasks([t], True))
    assert t in cluster.scheduler.tasks and cluster.stat("refused") == 2  # still c1's, still queued


def test_a_client_cannot_register_over_another_clients_function(cluster: Cluster) -> None:
    """The hijack of issue 22: c2 registers c1's function id with its own payload."""
    cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    for fn_id in (fn, tid(cid, 2), tid(other, 0)):
        cluster.send(b"c2", m.RegisterFunction(fn_id, b"HIJACKED"))
    assert cluster.scheduler.functions == {fn: b"pickled-fn"}
    assert cluster.stat("refused") == 3
    cluster.worker(b"w1")
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn_id=fn)]))
    assert [b.payload for b in out.blobs(b"w1")] == [b"pickled-fn"]


def test_a_client_cannot_register_its_own_function_id_twice(cluster: Cluster) -> None:
    _cid, fn = client_with_function(cluster)
    cluster.send(b"c1", m.RegisterFunction(fn, b"other"))
    assert cluster.scheduler.functions == {fn: b"pickled-fn"}
    assert cluster.stat("refused") == 1


def test_a_task_may_call_only_a_function_its_own_client_registered(cluster: Cluster) -> None:
    _cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    cluster.worker(b"w1")
    out = cluster.send(b"c2", m.SubmitTasks([spec(tid(other, 1), fn_id=fn)]))
    [rejected] = out.results(b"c2")
    assert rejected.status == Status.REJECTED and b"never registered by this client" in rejected.payload
    assert not out.dispatched(b"w1")


def test_refusals_are_logged_once_per_peer_and_kind_per_minute(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cid, fn = client_with_function(cluster)
    cluster.client(b"c2")
    caplog.set_level("WARNING", logger="scaler_executor")
    for _ in range(100):
        cluster.send(b"c2", m.RegisterFunction(fn, b"x"), dt=0.1)
    assert cluster.stat("refused") == 100
    assert len([r for r in caplog.records if "refused register-function" in r.getMessage()]) == 1
    cluster.send(b"c2", m.RegisterFunction(fn, b"x"), dt=60.0)
    assert len([r for r in caplog.records if "refused register-function" in r.getMessage()]) == 2


@pytest.mark.parametrize("status", [Status.REJECTED, Status.WORKER_LOST, Status.DEP_FAILED, Status.DEP_GONE, 99])
def test_a_worker_cannot_send_a_status_only_the_daemon_may_give(cluster: Cluster, status: int) -> None:
    """A DEP_GONE from a worker would make the client resend, a WORKER_LOST carry a payload
    the client decodes as the daemon's: the core treats it as the processor's failure."""
    cid = cluster.client()
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    out = cluster.send(b"w1", m.TaskResults([result(tid(cid, 1), status=status, payload=b"\x93forged")]))
    assert cluster.stat("refused") == 1
    assert not out.results(b"c1")  # retried (PROCESSOR_DIED), not forwarded
    assert cluster.scheduler.tasks[tid(cid, 1)].attempt == 1


def test_a_hello_with_a_huge_name_is_refused_briefly_and_logged_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="scaler_executor")
    for i in range(50):
        out = cluster.send(b"rogue", hello(name="\x1b[31mERROR forged\n" + "x" * 100_000), dt=0.01)
        [refused] = out.of(b"rogue", m.Refused)
        assert len(refused.reason) < 200 and "at most 256 characters" in refused.reason
    lines = [r.getMessage() for r in caplog.records if "refused hello" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0]) < 800 and "\n" not in lines[0] and "\x1b" not in lines[0], lines
    assert cluster.stat("refused") == 50
    assert not cluster.scheduler.knows(b"rogue")


# ====================================================================== cancel


def test_cancel_pending(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1)), spec(tid(cid, 2))]))
    out = cluster.send(b"c1", m.CancelTasks([tid(cid, 1)], False))
    assert out.to(b"c1") == [m.TasksCancelled([tid(cid, 1)], [])], "dropped, and the client told so"
    assert out.peers == {b"c1"}
    assert tid(cid, 1) not in cluster.scheduler.tasks
    out = cluster.worker(b"w1", capacity=4)
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 2)]
    assert cluster.stat("cancelled") == 1


def test_cancel_dispatched(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    out = cluster.send(b"c1", m.CancelTasks([t], True))
    assert out.to(b"w1") == [m.CancelTasks([t], True)]
    assert cluster.scheduler.tasks[t].state is TaskState.CANCELLING
    assert cluster.stat("tasks_cancelling") == 1
    # Cancelling again is harmless: a task a worker holds is not dropped without force.
    out = cluster.send(b"c1", m.CancelTasks([t], False))
    assert out.to(b"c1") == [m.TasksCancelled([], [t])]
    answer = result(t, status=Status.CANCELLED, payload=b"")
    out = cluster.send(b"w1", m.TaskResults([answer]))
    assert out.results(b"c1") == [answer]
    assert t not in cluster.scheduler.tasks


def test_cancel_of_someone_elses_or_unknown_task_is_ignored(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.client(b"c2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1))]))
    out = cluster.send(b"c2", m.CancelTasks([tid(cid, 1), tid(cid, 999), 12345], False))
    assert out.to(b"c2") == [m.TasksCancelled([], [tid(cid, 1), tid(cid, 999), 12345])]
    assert out.peers == {b"c2"}
    out = cluster.send(b"c2", m.CancelTasks([tid(cid, 1)], True))
    assert not out.peers
    assert cluster.scheduler.tasks[tid(cid, 1)].state is TaskState.PENDING


# ====================================================================== rejection


@pytest.mark.parametrize(
    "case", ["unknown-fn", "foreign-id", "reused-id", "unknown-options"]
)
def test_rejected_tasks(cluster: Cluster, case: str) -> None:
    cid, fn = client_with_function(cluster)
    other = cluster.client(b"c2")
    cluster.worker(b"w1", capacity=4)
    live = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(live, fn)]))
    cluster.notices()
    bad, reason = {
        "unknown-fn": (spec(tid(cid, 2), tid(cid, 77)), b"never registered"),
        "foreign-id": (spec(tid(other, 2), fn), b"not this client's"),
        "reused-id": (spec(live, fn), b"reused"),
        "unknown-options": (spec(tid(cid, 2), fn, options_id=5), b"options record 5"),
    }[case]
    out = cluster.send(b"c1", m.SubmitTasks([bad]))
    (rejected,) = out.results(b"c1")
    assert (rejected.task_id, rejected.status) == (bad.task_id, Status.REJECTED)
    assert reason in rejected.payload
    assert out.acked(b"c1") == 1
    assert not out.dispatched(b"w1")
    assert set(cluster.scheduler.tasks) == {live}
    assert cluster.scheduler.tasks[live].state is TaskState.DISPATCHED
    assert not out.to(b"c2")
    assert cluster.stat("failed") == 1


# ====================================================================== client loss


@pytest.mark.parametrize("how", ["goodbye", "silence", "unreachable"])
def test_client_lost(cluster: Cluster, how: str) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    ids = [tid(cid, n) for n in range(1, 5)]
    out = cluster.send(b"c1", m.SubmitTasks([spec(t, fn) for t in ids]))
    at_worker = [d.task_id for d in out.dispatched(b"w1")]
    assert len(at_worker) == 2
    if how == "goodbye":
        out = cluster.send(b"c1", m.Goodbye("done"))
    elif how == "silence":
        cluster.now += DEADLINE + 0.1
        cluster.keepalive(b"w1")
        out = cluster.tick()
    else:
        out = cluster.step(PeerUnreachable(b"c1", cluster.now))
    assert cluster.stat("clients") == 0
    # A client that said Goodbye left; one that went silent or unreachable was lost.
    assert (cluster.stat("clients_left"), cluster.stat("clients_lost")) == ((1, 0) if how == "goodbye" else (0, 1))
    assert {type(x) for x in out.to(b"w1")} == {m.CancelTasks}
    assert sorted(t for c in out.of(b"w1", m.CancelTasks) for t in c.task_ids) == sorted(at_worker)
    assert not out.dispatched(b"w1")
    assert b"c1" not in out.peers
    assert set(cluster.scheduler.tasks) == set(at_worker), "its pending tasks are dropped"
    # Results that come later go nowhere, and the function goes with the last of them.
    out = cluster.send(b"w1", m.TaskResults([result(at_worker[0])]))
    assert b"c1" not in out.peers and not out.of(b"w1", m.ReleaseFunctions)
    out = cluster.send(
        b"w1", m.TaskResults([result(at_worker[1], status=Status.CANCELLED, payload=b"")])
    )
    assert out.to(b"w1") == [m.ReleaseFunctions([fn])]
    assert b"c1" not in out.peers
    assert cluster.stat("tasks") == 0 and cluster.stat("functions") == 0


def test_client_lost_does_not_touch_other_clients(cluster: Cluster) -> None:
    a = cluster.client(b"a")
    b = cluster.client(b"b")
    cluster.worker(b"w1", capacity=4)
    cluster.send(b"a", m.SubmitTasks([spec(tid(a, 1))]))
    cluster.send(b"b", m.SubmitTasks([spec(tid(b, 1))]))
    out = cluster.send(b"a", m.Goodbye("done"))
    assert out.to(b"w1") == [m.CancelTasks([tid(a, 1)], False)]
    answer = result(tid(b, 1))
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"b") == [answer]
