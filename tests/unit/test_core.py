"""The daemon's pure core, driven by plain calls with a fake clock: the handshake, a task
from submit to result, priorities, heartbeats, statistics and roles.

Every step goes through ``Cluster.step`` (core_testing.py), which calls ``Scheduler.handle``,
then ``validate()``, and checks that the commands are one batch per peer and that every
message the core emits survives the codec (so core and protocol agree on field types).
Other parts: test_core_clients.py, test_core_workers.py, test_core_random.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from core_testing import (
    CONFIG,
    DEADLINE,
    INTERVAL,
    LIVENESS,
    Cluster,
    client_with_function,
    cluster,  # noqa: F401  (a fixture)
    hello,
    result,
    spec,
    tid,
)

from scaler_executor._compat import python_version
from scaler_executor._version import __version__
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import TASK_ID_BITS, Status, TaskFlags
from scaler_executor.protocol.rejoin import is_unknown_peer
from scaler_executor.scheduler.core import (
    Received,
    Tick,
    Wake,
)
from scaler_executor.scheduler.core_events import NOTICE_DELAY
from scaler_executor.scheduler.state import TaskState

# ====================================================================== handshake


@pytest.mark.parametrize("role", [m.Role.CLIENT, m.Role.WORKER, m.Role.MONITOR])
def test_welcome_for_each_role(cluster: Cluster, role: str) -> None:
    out = cluster.send(b"p", hello(role))
    # A worker is told how many task runs to keep for the history (the daemon's history_runs).
    runs = cluster.scheduler.config.history_runs if role == m.Role.WORKER else 0
    assert out.to(b"p") == [m.Welcome(1, INTERVAL, LIVENESS, "", runs=runs)]
    assert (cluster.stat("clients"), cluster.stat("workers")) == {
        m.Role.CLIENT: (1, 0),
        m.Role.WORKER: (0, 1),
        m.Role.MONITOR: (0, 0),
    }[role]
    assert not cluster.send(b"p", m.Heartbeat(0, 0)).peers, "a welcomed peer is known"


def test_peer_ids_are_distinct(cluster: Cluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.client(b"c2")
    assert len(set(cluster.ids.values())) == 4


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"python": "2.7"}, "Python 2.7"),
        ({"cloudpickle": "0.0.1"}, "cloudpickle 0.0.1"),
        ({"package": "9.9.9"}, "scaler-executor 9.9.9"),
        ({"protocol": m.PROTOCOL_VERSION + 1}, f"protocol {m.PROTOCOL_VERSION + 1}"),
    ],
    ids=["python", "cloudpickle", "package", "protocol"],
)
@pytest.mark.parametrize("role", [m.Role.CLIENT, m.Role.WORKER])
def test_refused_for_version_mismatch(
    cluster: Cluster, role: str, changes: dict[str, Any], expected: str
) -> None:
    out = cluster.send(b"p", hello(role, **changes))
    refused = out.one(b"p", m.Refused)
    assert out.to(b"p") == [refused]
    assert expected in refused.reason
    assert cluster.stat("clients") == cluster.stat("workers") == 0
    # A refused peer stays unknown.
    again = cluster.send(b"p", m.Heartbeat(0, 0))
    assert "send Hello first" in again.one(b"p", m.Refused).reason


def test_version_refusal_names_daemon_versions_and_fix(cluster: Cluster) -> None:
    reason = cluster.send(b"p", hello(python="2.7", package="9.9.9")).one(b"p", m.Refused).reason
    assert python_version() in reason and __version__ in reason
    assert "install the same versions" in reason


def test_refused_for_bad_role(cluster: Cluster) -> None:
    reason = cluster.send(b"p", hello(role="admin")).one(b"p", m.Refused).reason
    assert "'admin'" in reason and "client" in reason


def test_refused_worker_without_capacity(cluster: Cluster) -> None:
    reason = cluster.send(b"w", hello(m.Role.WORKER, capacity=0)).one(b"w", m.Refused).reason
    assert "capacity 0" in reason
    assert cluster.stat("workers") == 0


def test_a_hello_beyond_max_peers_is_refused_and_a_place_that_frees_is_taken() -> None:
    cluster = Cluster(CONFIG.replace(max_peers=3))
    cluster.join(b"c1", hello(m.Role.CLIENT))
    cluster.join(b"w1", hello(m.Role.WORKER))
    cluster.join(b"m1", hello(m.Role.MONITOR))
    reason = cluster.send(b"w2", hello(m.Role.WORKER)).one(b"w2", m.Refused).reason
    assert "max_peers" in reason and "3" in reason
    assert cluster.stat("workers") == 1 and not cluster.scheduler.knows(b"w2")
    cluster.join(b"c1", hello(m.Role.CLIENT))  # a peer that joined may say Hello again
    cluster.send(b"c1", m.Goodbye("done"))
    cluster.join(b"w2", hello(m.Role.WORKER))
    assert cluster.scheduler.peer_count() == 3


def test_client_needs_no_capacity(cluster: Cluster) -> None:
    cluster.join(b"c", hello(m.Role.CLIENT, capacity=0))


def test_unknown_peer_must_send_hello_first(cluster: Cluster) -> None:
    out = cluster.send(b"stranger", m.SubmitTasks([spec(1)]), m.Heartbeat(0, 0))
    reason = out.one(b"stranger", m.Refused).reason
    assert "send Hello first" in reason and is_unknown_peer(reason)  # what peers act on (protocol/rejoin.py)
    assert cluster.stat("dropped_messages") == 2
    assert cluster.stat("tasks") == 0


def test_unknown_peer_saying_goodbye_gets_no_answer(cluster: Cluster) -> None:
    assert not cluster.send(b"stranger", m.Goodbye("bye")).peers


def test_messages_after_hello_in_the_same_batch(cluster: Cluster) -> None:
    out = cluster.send(b"mon", hello(m.Role.MONITOR), m.StatsRequest())
    assert [type(x) for x in out.to(b"mon")] == [m.Welcome, m.Stats]


def test_refused_hello_drops_the_rest_of_the_batch(cluster: Cluster) -> None:
    out = cluster.send(b"c", hello(python="2.7"), m.SubmitTasks([spec(tid(1, 1))]))
    assert [type(x) for x in out.to(b"c")] == [m.Refused]
    assert cluster.stat("tasks") == 0


def test_worker_saying_hello_again_is_welcomed_afresh(cluster: Cluster) -> None:
    """A worker that heard nothing from the daemon for its liveness period forgets what it held
    and says Hello again on the same connection (worker/agent.py ``_forget_daemon_state``).
    The daemon must answer, and must not leave the tasks it sent that worker waiting there."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=1)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 10), fn), spec(tid(cid, 11), fn)]))
    out = cluster.send(b"w1", hello(m.Role.WORKER, name="w1", capacity=1))
    assert out.of(b"w1", m.Welcome), "a rejoining worker gets no Welcome: it waits forever"
    redispatched = {t.task_id for t in out.dispatched(b"w1")}
    assert redispatched == {tid(cid, 10), tid(cid, 11)}, (
        "the tasks the worker dropped are never run"
    )
    assert [b.fn_id for b in out.blobs(b"w1")] == [fn], "the worker forgot its functions"


def test_rejoining_worker_is_not_handed_the_same_attempt_again(cluster: Cluster) -> None:
    """The rejoining worker may still be running what it held: it marks those runs unwanted
    and, when one finishes, answers CANCELLED with the *old* attempt number
    (worker/agent.py ``_forget_daemon_state`` and ``_on_processor_message``).  If the daemon
    hands it the same (task, attempt) again, that late answer settles the new hand-out and the
    client sees a cancellation it never asked for."""
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    t = tid(cid, 1)
    assert [d.attempt for d in cluster.send(b"c1", m.SubmitTasks([spec(t)])).dispatched(b"w1")] == [
        0
    ]
    out = cluster.send(b"w1", hello(m.Role.WORKER, name="w1", capacity=1))
    (again,) = out.dispatched(b"w1")
    late = result(t, 0, Status.CANCELLED, b"")
    out = cluster.send(b"w1", m.TaskResults([late]))
    assert not out.results(b"c1"), (
        f"the abandoned run's answer (attempt 0) settled the new hand-out (attempt {again.attempt})"
    )
    answer = result(t, again.attempt)
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"c1") == [answer]


# ====================================================================== submit → result


def test_notices_travel_with_results_and_skip_finished_tasks(cluster: Cluster) -> None:
    """A short task's result carries its ack, and no running notice is ever sent for it."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    short, long_ = tid(cid, 1), tid(cid, 2)
    out = cluster.send(b"c1", m.SubmitTasks([spec(short, fn), spec(long_, fn)]))
    assert len(out.dispatched(b"w1")) == 2 and not out.to(b"c1")
    assert cluster.scheduler.wakeup_at() == cluster.now + NOTICE_DELAY
    assert not cluster.step(Wake(cluster.now)).peers, "a Wake before the delay sends nothing"
    answer = result(short)
    out = cluster.send(b"w1", m.TaskResults([answer]), dt=NOTICE_DELAY / 2)
    assert out.to(b"c1") == [m.SubmitAck(2), m.TasksRunning([long_]), m.TaskResults([answer])]
    assert cluster.scheduler.wakeup_at() is None


def test_a_client_leaving_with_notices_pending_leaves_no_wakeup(cluster: Cluster) -> None:
    """Otherwise the loop would be asked to wake at a past time, forever: a busy spin."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 1), fn)]))
    assert cluster.scheduler.wakeup_at() is not None
    cluster.send(b"c1", m.Goodbye("done"))
    assert cluster.scheduler.wakeup_at() is None


def test_running_notice_of_a_long_task_comes_after_the_delay(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    t = tid(cid, 1)
    cluster.send(b"c1", m.SubmitTasks([spec(t, fn)]))
    assert cluster.notices().to(b"c1") == [m.SubmitAck(1), m.TasksRunning([t])]
    answer = result(t)
    assert cluster.send(b"w1", m.TaskResults([answer]), dt=1.0).to(b"c1") == [m.TaskResults([answer])]


def test_a_graph_intermediate_gets_no_running_notice(cluster: Cluster) -> None:
    """Its client keeps no future for a NO_RESULT task (client/graph.py): a notice that it
    runs would cost a transmission and a wake-up of the client for nothing."""
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    middle, top = tid(cid, 2), tid(cid, 3)
    graph = [spec(middle, fn)._replace(flags=TaskFlags.CALL | TaskFlags.NO_RESULT), spec(top, fn, deps=[middle])]
    out = cluster.send(b"c1", m.SubmitTasks(graph))
    assert [d.task_id for d in out.dispatched(b"w1")] == [middle]
    assert cluster.notices().to(b"c1") == [m.SubmitAck(2)]  # middle runs: no notice of it
    out = cluster.send(b"w1", m.TaskResults([result(middle)]), dt=1.0)
    assert [d.task_id for d in out.dispatched(b"w1")] == [top] and not out.to(b"c1")
    assert cluster.notices().to(b"c1") == [m.TasksRunning([top])]


def test_submit_dispatch_result_forget(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    t = tid(cid, 7)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t, fn)]))
    assert out.to(b"w1") == [
        m.DispatchTasks(
            [m.FunctionBlob(fn, b"pickled-fn")],
            [m.TaskDispatch(t, 0, fn, TaskFlags.CALL, b"args-%d" % t, [], None, [])],
        )
    ]
    assert out.to(b"c1") == [], "acks and running notices wait for results or NOTICE_DELAY"
    assert cluster.notices().to(b"c1") == [m.SubmitAck(1), m.TasksRunning([t])]
    assert cluster.scheduler.tasks[t].state is TaskState.DISPATCHED

    answer = result(t)
    out = cluster.send(b"w1", m.TaskResults([answer]))
    assert out.to(b"c1") == [m.TaskResults([answer])]
    assert out.peers == {b"c1"}
    assert t not in cluster.scheduler.tasks
    assert cluster.stat("finished") == 1 and cluster.stat("tasks") == 0


def test_error_results_are_forwarded_and_counted_as_failed(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=4)
    ids = [tid(cid, n) for n in range(1, 5)]
    cluster.send(b"c1", m.SubmitTasks([spec(t) for t in ids]))
    answers = [
        result(ids[0], status=Status.ERROR, payload=b"exc"),
        result(ids[1], status=Status.TIMEOUT, payload=b"took too long"),
        result(ids[2], status=Status.FORCE_CANCELLED, payload=b"killed"),
        result(ids[3]),
    ]
    out = cluster.send(b"w1", m.TaskResults(answers))
    assert out.results(b"c1") == answers
    assert cluster.stat("failed") == 3 and cluster.stat("finished") == 1


REPLY_SOCKET = "/tmp/scaler-1-x/reply.sock"
DIRECT = TaskFlags.INLINE_FN | TaskFlags.REPLY_DIRECT


@pytest.mark.parametrize(
    "client_reply, worker_host, flags, expected",
    [
        (REPLY_SOCKET, "node-1", DIRECT, REPLY_SOCKET),
        (REPLY_SOCKET, "node-2", DIRECT, ""),  # another host cannot reach the client's socket
        (REPLY_SOCKET, "node-1", TaskFlags.INLINE_FN, ""),  # not a sequential caller's task
        ("", "node-1", DIRECT, ""),  # a client without a reply socket
    ],
    ids=["same-host", "other-host", "no-flag", "no-socket"],
)
def test_a_dispatch_names_the_reply_socket_only_for_direct_tasks_on_the_clients_host(
    client_reply: str, worker_host: str, flags: int, expected: str
) -> None:
    cluster = Cluster()
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", host="node-1", reply_to=client_reply))
    cluster.worker(b"w1", host=worker_host)
    t = tid(cluster.ids[b"c1"], 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)._replace(flags=flags)]))
    assert [d.reply_to for d in out.dispatched(b"w1")] == [expected]


def test_a_delivered_result_is_not_forwarded_but_is_kept_for_a_dependent(cluster: Cluster) -> None:
    """A result the processor already sent to the client is bookkeeping only: finished,
    counted, never sent again; and a dependent linked while it ran still gets its value."""
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", reply_to=REPLY_SOCKET))
    cid = cluster.ids[b"c1"]
    cluster.worker(b"w1", capacity=4)
    a, b, c = tid(cid, 1), tid(cid, 2), tid(cid, 3)
    cluster.send(b"c1", m.SubmitTasks([spec(a)._replace(flags=DIRECT), spec(c)._replace(flags=DIRECT)]))
    cluster.send(b"c1", m.SubmitTasks([spec(b, deps=[a])]))  # a future passed as an argument
    out = cluster.send(
        b"w1", m.TaskResults([result(a, payload=b"va")._replace(delivered=True), result(c)._replace(delivered=True)])
    )
    assert out.results(b"c1") == [], "the client has both results already"
    assert cluster.stat("delivered_direct") == 2 and cluster.stat("finished") == 2
    assert c not in cluster.scheduler.tasks
    (dependent,) = out.dispatched(b"w1")
    assert dependent.task_id == b and dependent.deps == [m.DepValue(a, b"va", [])]
    out = cluster.send(b"w1", m.TaskResults([result(b)]))
    assert out.results(b"c1") == [result(b)], "an undelivered result still goes to the client"
    assert cluster.stat("tasks") == 0


def test_a_delivered_lone_task_leaves_nothing_due_to_its_client(cluster: Cluster) -> None:
    """A sequential caller's task is outside the submit window (no SubmitAck), and once its
    result was delivered straight, no running notice is due: the client is not woken."""
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", reply_to=REPLY_SOCKET))
    cluster.worker(b"w1")
    t = tid(cluster.ids[b"c1"], 1)
    assert cluster.send(b"c1", m.SubmitTasks([spec(t)._replace(flags=DIRECT)])).to(b"c1") == []
    assert cluster.scheduler.wakeup_at() is not None, "its running notice is deferred"
    out = cluster.send(b"w1", m.TaskResults([result(t)._replace(delivered=True)]))
    assert out.to(b"c1") == []
    assert cluster.scheduler.wakeup_at() is None, "nothing is left to tell the client"
    # Not delivered (too large, say): the result travels, still with no ack.
    t2 = tid(cluster.ids[b"c1"], 2)
    cluster.send(b"c1", m.SubmitTasks([spec(t2)._replace(flags=DIRECT)]))
    out = cluster.send(b"w1", m.TaskResults([result(t2)]))
    assert out.to(b"c1") == [m.TaskResults([result(t2)])]
    # Still running NOTICE_DELAY after its dispatch: the client hears it runs, once.
    t3 = tid(cluster.ids[b"c1"], 3)
    cluster.send(b"c1", m.SubmitTasks([spec(t3)._replace(flags=DIRECT)]))
    assert cluster.notices().to(b"c1") == [m.TasksRunning([t3])]
    assert cluster.send(b"w1", m.TaskResults([result(t3)._replace(delivered=True)])).to(b"c1") == []


def test_submit_ack_counts_every_spec_of_the_step(cluster: Cluster) -> None:
    cid = cluster.client()
    out = cluster.send(
        b"c1",
        m.SubmitTasks([spec(tid(cid, 1)), spec(tid(cid, 2)), spec(tid(cid, 3))]),
        m.SubmitTasks(
            [spec(tid(cid, 4)), spec(tid(cid, 5), fn_id=tid(cid, 99))]
        ),  # the last is rejected
    )
    assert out.of(b"c1", m.SubmitAck) == [m.SubmitAck(5)], (
        "one ack per step, counting rejected specs too"
    )
    assert out.running(b"c1") == []  # no worker yet
    assert cluster.stat("tasks_pending") == 4


def test_tasks_wait_for_a_worker(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 4)]))
    out = cluster.worker(b"w1", capacity=2)
    assert [type(x) for x in out.to(b"w1")] == [m.Welcome, m.DispatchTasks]
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 1), tid(cid, 2), tid(cid, 3)]
    assert cluster.notices().running(b"c1") == [tid(cid, 1), tid(cid, 2), tid(cid, 3)]


def test_prefetch_window_limits_dispatch(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)  # window 2 before any task time is known
    out = cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 6)]))
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 1), tid(cid, 2)]
    out = cluster.send(b"w1", m.TaskResults([result(tid(cid, 1))]))
    assert [t.task_id for t in out.dispatched(b"w1")] == [tid(cid, 3)]
    assert cluster.stat("tasks_pending") == 2


def test_new_worker_takes_queued_work(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 6)]))
    out = cluster.worker(b"w2", capacity=1)
    assert [t.task_id for t in out.dispatched(b"w2")] == [tid(cid, 3), tid(cid, 4)]
    assert not out.of(b"w1", m.DispatchTasks)


def test_options_travel_with_the_task(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    options = m.TaskOptions({}, [], 0, 12.5, None)
    out = cluster.send(
        b"c1", m.RegisterOptions(3, options), m.SubmitTasks([spec(tid(cid, 1), options_id=3)])
    )
    assert out.dispatched(b"w1")[0].task_timeout == 12.5


# ====================================================================== priorities


def test_higher_priority_first(cluster: Cluster) -> None:
    cid = cluster.client()
    levels = {1: 0, 2: 5, 3: 1, 4: 5, 5: -2, 6: 3}
    registers = [
        m.RegisterOptions(10 + p, m.TaskOptions({}, [], p, None, None))
        for p in set(levels.values())
    ]
    cluster.send(
        b"c1",
        *registers,
        m.SubmitTasks([spec(tid(cid, n), options_id=10 + p) for n, p in levels.items()]),
    )
    out = cluster.worker(b"w1", capacity=1)
    order = [t.task_id for t in out.dispatched(b"w1")]
    held = list(order)
    while held:
        out = cluster.send(b"w1", m.TaskResults([result(held.pop(0))]))
        got = [t.task_id for t in out.dispatched(b"w1")]
        order += got
        held += got
    assert [n & ((1 << TASK_ID_BITS) - 1) for n in order] == [2, 4, 6, 3, 1, 5], (
        "priority, then FIFO"
    )


# ====================================================================== heartbeats


def test_heartbeats_to_silent_peers(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.worker(b"w1", capacity=1)
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.send(
        b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 5)])
    )  # 2 dispatched, 2 queued
    assert cluster.notices().peers == {b"c1"}  # its acks, NOTICE_DELAY later
    out = cluster.tick(INTERVAL / 2)
    assert not out.peers, "nobody has been silent for an interval yet"
    out = cluster.tick(INTERVAL / 2)
    assert out.peers == {b"c1", b"w1", b"m1"}
    for peer in out.peers:
        assert out.to(peer) == [m.Heartbeat(2, 2)]
    # Just heard from the daemon: no heartbeat until another interval of silence.
    assert not cluster.tick(INTERVAL / 2).peers


def test_no_heartbeat_where_a_message_is_going_anyway(cluster: Cluster) -> None:
    cluster.client()
    cluster.worker(b"w1")
    cluster.now += INTERVAL
    out = cluster.step(Received(b"c1", [m.StatsRequest()], cluster.now), Tick(cluster.now))
    assert [type(x) for x in out.to(b"c1")] == [m.Stats]
    assert out.to(b"w1") == [m.Heartbeat(0, 0)]


def test_workers_hear_from_the_daemon_four_times_a_liveness_limit_not_every_interval() -> None:
    """protocol/rejoin.py's idle_heartbeat: a worker judges the daemon's silence by at least
    the daemon's interval × liveness (its Welcome), so the daemon beats to a quiet worker a
    quarter of that; clients and monitors, which judge it by their own settings, still get one
    every interval."""
    cluster = Cluster(CONFIG.replace(heartbeat_liveness=10, client_timeout=10.0))
    quiet = 10 * INTERVAL / 4
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.join(b"m1", hello(m.Role.MONITOR))
    beats: dict[bytes, list[float]] = {b"c1": [], b"w1": [], b"m1": []}
    start = cluster.now
    while cluster.now < start + 5 * quiet:
        out = cluster.tick(INTERVAL / 8)
        for peer in out.peers:
            assert out.to(peer) == [m.Heartbeat(0, 0)]
            beats[peer].append(round(cluster.now - start, 6))
        cluster.keepalive(b"c1", b"w1", b"m1")  # they beat too: none is lost meanwhile
    assert beats[b"w1"] == [quiet * k for k in range(1, 6)]
    for peer in (b"c1", b"m1"):
        assert beats[peer] == [INTERVAL * k for k in range(1, 13)], peer


def test_refused_peers_get_no_heartbeats(cluster: Cluster) -> None:
    cluster.send(b"p", hello(python="2.7"))
    assert not cluster.tick(INTERVAL * 2).peers


def test_silent_monitor_is_forgotten(cluster: Cluster) -> None:
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.tick(DEADLINE + 0.1)
    out = cluster.send(b"m1", m.StatsRequest())
    assert "send Hello first" in out.one(b"m1", m.Refused).reason


# ====================================================================== statistics, roles, faults


def test_stats(cluster: Cluster) -> None:
    cid = cluster.client()
    cluster.worker(b"w1", capacity=1)
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n)) for n in range(1, 4)]))
    for peer in (b"c1", b"m1"):
        stats = cluster.send(peer, m.StatsRequest()).one(peer, m.Stats).snapshot
        assert (
            stats["tasks"] == 3 and stats["tasks_dispatched"] == 2 and stats["tasks_pending"] == 1
        )
        assert stats["workers"] == 1 and stats["processors"] == 1 and stats["clients"] == 1
        assert stats["submitted"] == 3


@pytest.mark.parametrize(
    "role, message",
    [
        (m.Role.CLIENT, m.TaskResults([result(1)])),
        (m.Role.CLIENT, m.ClusterBroken("x", b"")),
        (m.Role.CLIENT, m.DispatchTasks([], [])),
        (m.Role.WORKER, m.SubmitTasks([spec(1)])),
        (m.Role.WORKER, m.StatsRequest()),
        (m.Role.MONITOR, m.SubmitTasks([spec(1)])),
        (m.Role.MONITOR, m.CancelTasks([1], True)),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else x,
)
def test_message_not_accepted_from_role_is_refused_and_counted(
    cluster: Cluster, role: str, message: Any
) -> None:
    cluster.join(b"p", hello(role))
    before = cluster.scheduler.statistics()
    out = cluster.send(b"p", message, m.Heartbeat(0, 0))
    assert not out.peers
    after = cluster.scheduler.statistics()
    assert after["refused"] == int(before["refused"]) + 1
    assert {k: v for k, v in after.items() if k != "refused"} == {
        k: v for k, v in before.items() if k != "refused"
    }


def test_an_exception_in_a_handler_costs_one_message(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cid = cluster.client()
    cluster.worker(b"w1")
    # A message that passed the codec cannot be malformed; one built by a buggy peer
    # library in-process can.  The handler fails on it; the next message still counts.
    out = cluster.send(b"c1", m.CancelTasks(None, False), m.SubmitTasks([spec(tid(cid, 1))]))  # type: ignore[arg-type]
    assert out.dispatched(b"w1") and cluster.notices().acked(b"c1") == 1
    assert cluster.stat("dropped_messages") == 1
    assert "failed to handle CancelTasks" in caplog.text
    answer = result(tid(cid, 1))
    assert cluster.send(b"w1", m.TaskResults([answer])).results(b"c1") == [answer]
