"""The statistics snapshot built by the daemon's pure core (scheduler/stats.py), with a fake
clock: what it shows of tasks, workers, clients, windows and recent events, that its ring
and buckets stay bounded, and that it survives the wire as a monitor receives it."""

from __future__ import annotations

import pytest
from core_testing import DEADLINE, Cluster, client_with_function, hello, result, spec, tid

from scaler_executor import Statistics
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status, TaskFlags
from scaler_executor.protocol.runlog import RunLog
from scaler_executor.scheduler.core import Wake
from scaler_executor.scheduler.stats import DURATION_BOUNDS, MAX_KEPT_PAYLOAD, RECENT_EVENTS
from scaler_executor.worker.processor import dump_exception


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def later(cluster: Cluster, dt: float) -> None:
    """Let ``dt`` pass: the core's clock is the time of its last event."""
    cluster.now += dt
    cluster.step(Wake(cluster.now))


def _timed(task_id: int, seconds: float, status: int = Status.OK, payload: bytes = b"v", memory: int = 0) -> m.TaskResult:
    return m.TaskResult(task_id, 0, status, payload, m.TaskFacts("w1", 100.0, 100.0 + seconds, memory), [])


def _results(cluster: Cluster, *results: m.TaskResult, dt: float = 0.0) -> None:
    """A worker's results, then what its RunLog reports of them beside its next heartbeat
    (the same turn here): their runs, and the run times and peak memory of those that ended well."""
    cluster.send(b"w1", m.TaskResults(list(results)), dt=dt)
    log = RunLog(100)
    for r in results:
        log.ended(r.facts.started, r.facts.finished, r.status, r.facts.peak_memory)
    if (report := log.take()) is not None:
        cluster.send(b"w1", report)


def _boom() -> bytes:
    try:
        raise ValueError("boom 42")
    except ValueError as exc:
        return dump_exception(exc)


def test_snapshot_is_a_mapping_over_the_counters_callers_read(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=2)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(2, 22)]))
    stats = cluster.scheduler.statistics()
    assert isinstance(stats, Statistics)
    assert stats["tasks"] == 20 and stats["submitted"] == 20 and stats["processors"] == 2
    dispatched = stats["tasks_dispatched"]
    assert 0 < dispatched < 20 and stats.get("tasks_pending", 0) == 20 - dispatched
    assert stats.tasks_by_state["dispatched"] == dispatched and stats.tasks_by_state["waiting"] == 0
    assert stats.workers[0].tasks == dispatched
    assert "clients_lost" in dict(stats) and len(stats) == len(dict(stats))
    merged: dict[str, object] = {}
    merged.update(stats)  # as tests/integration/test_graph.py does
    assert merged["workers"] == 1
    with pytest.raises(TypeError):
        stats["tasks"] = 0  # type: ignore[index]  # frozen: a snapshot, not a handle


def test_workers_and_clients_tables(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=2)
    cluster.worker(b"w2", capacity=1, host="node-2")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn)]))
    cluster.send(b"w1", m.Heartbeat(1, 1), dt=0.5)
    _results(cluster, _timed(tid(cid, 2), 0.25, memory=7 << 20), dt=1.0)
    later(cluster, 2.0)
    stats = cluster.scheduler.statistics()
    by_name = {w.name: w for w in stats.workers}
    w1, w2 = by_name["w1"], by_name["w2"]
    assert (w1.processors, w1.tasks, w1.queued, w1.running) == (2, 0, 1, 1)
    assert w1.mean_task_seconds == pytest.approx(0.25) and w1.peak_memory == 7 << 20
    assert w1.last_heard == pytest.approx(2.0) and w1.idle_for == pytest.approx(2.0)
    assert w2.host == "node-2" and w2.mean_task_seconds is None and w2.peak_memory is None
    assert w2.load == 0.0 and w2.broken is None and not w2.draining
    (client,) = stats.clients
    assert (client.name, client.tasks, client.functions) == ("c1", 0, 1)


def test_load_counts_what_a_worker_holds_per_processor(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=2)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(2, 6)]))
    cluster.send(b"w1", m.Seceded([tid(cid, 2)]))
    (w1,) = cluster.scheduler.statistics().workers
    assert (w1.tasks, w1.seceded) == (4, 1) and w1.load == 1.5


def test_windows_count_ended_tasks_and_their_run_times_then_forget_them(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=4)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in (2, 3, 4)]))
    _results(cluster, _timed(tid(cid, 2), 0.5), _timed(tid(cid, 3), 1.5))
    _results(cluster, _timed(tid(cid, 4), 0.0, Status.ERROR, _boom()), dt=5.0)
    short, long = cluster.scheduler.statistics().windows
    assert short.seconds == 10.0 and long.seconds == 60.0
    assert (short.finished, short.failed, short.timed) == (2, 1, 2)
    assert short.mean_seconds == pytest.approx(1.0) and short.max_seconds == pytest.approx(1.5)
    assert short.throughput == pytest.approx(0.3)
    later(cluster, 6.0)  # the first two ended 11 s ago: out of the 10 s window, in the 60 s one
    short, long = cluster.scheduler.statistics().windows
    assert (short.finished, short.failed) == (0, 1)
    assert (long.finished, long.failed) == (2, 1)
    later(cluster, 120.0)
    short, long = cluster.scheduler.statistics().windows
    assert (long.finished, long.failed, long.mean_seconds) == (0, 0, None)


def test_a_failure_shows_its_cause_and_traceback(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn), spec(tid(cid, 3), fn)]))
    cluster.send(b"w1", m.TaskResults([result(tid(cid, 2), status=Status.ERROR, payload=_boom())]), dt=1.0)
    cluster.send(b"w1", m.TaskResults([result(tid(cid, 3), status=Status.TIMEOUT, payload=b"ran past 5 s")]), dt=1.0)
    later(cluster, 3.0)
    failed, timeout = cluster.scheduler.statistics().failures
    assert failed.kind == "failed" and failed.task_id == tid(cid, 2) and failed.where == "w1"
    assert failed.cause == "builtins.ValueError: boom 42"
    assert 'raise ValueError("boom 42")' in failed.detail
    assert failed.ago == pytest.approx(4.0)
    assert (timeout.kind, timeout.cause, timeout.detail) == ("timeout", "ran past 5 s", "")


def test_lost_worker_its_retries_and_a_lost_client_are_events(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn)]))
    cluster.send(b"w1", m.TaskResults([result(tid(cid, 2), status=Status.PROCESSOR_DIED, payload=b"killed by SIGKILL")]))
    cluster.worker(b"w2")
    cluster.tick(DEADLINE + 0.5)  # w1, w2 and c1 are silent past the deadline
    stats = cluster.scheduler.statistics()
    kinds = [(e.kind, e.where) for e in stats.events]
    assert ("processor-died", "w1") in kinds
    assert ("worker-lost", "w1") in kinds and ("worker-lost", "w2") in kinds
    assert ("client-lost", "c1") in kinds
    died = next(e for e in stats.events if e.kind == "processor-died")
    assert died.cause == "killed by SIGKILL" and died.task_id == tid(cid, 2)
    lost = next(e for e in stats.events if e.kind == "worker-lost" and e.where == "w2")
    assert "missed heartbeats" in lost.cause and "tasks affected" in lost.cause
    assert stats["workers_lost"] == 2 and stats["retried"] >= 1


def test_a_clean_goodbye_is_no_event(cluster: Cluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.send(b"w1", m.Goodbye("done"))
    cluster.send(b"c1", m.Goodbye("done"))
    stats = cluster.scheduler.statistics()
    assert stats.events == () and stats["clients_left"] == 1 and stats["clients_lost"] == 0


def test_the_event_ring_is_bounded_and_keeps_the_newest(cluster: Cluster) -> None:
    cluster.join(b"m1", hello(m.Role.MONITOR))
    for n in range(RECENT_EVENTS * 3):
        cluster.send(b"m1", m.CancelTasks([n], False), dt=0.01)  # not a monitor's to send
    stats = cluster.scheduler.statistics()
    assert len(stats.events) == RECENT_EVENTS and stats["refused"] == RECENT_EVENTS * 3
    assert all(e.kind == "refused" for e in stats.events)
    assert stats.events[-1].ago == 0.0 and stats.events[0].ago == pytest.approx(0.01 * (RECENT_EVENTS - 1))


def test_a_huge_failure_payload_is_not_kept(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn)]))
    big = b"x" * (MAX_KEPT_PAYLOAD + 1)
    cluster.send(b"w1", m.TaskResults([result(tid(cid, 2), status=Status.PROCESSOR_DIED, payload=big)]))
    assert all(len(e.payload) <= MAX_KEPT_PAYLOAD for e in cluster.scheduler.recorder.events)


def test_lane_tasks_count_at_their_worker_and_in_the_windows(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.worker(b"w1", capacity=2)
    cluster.send(b"w1", m.LaneStarted([tid(cid, 9)]))
    (w1,) = cluster.scheduler.statistics().workers
    assert (w1.tasks, w1.lane_tasks) == (1, 1)
    cluster.send(b"w1", m.LaneDone(3, 1, 0, 0, 2.0, [tid(cid, 9)]))
    stats = cluster.scheduler.statistics()
    short = stats.windows[0]
    assert (short.finished, short.failed, short.timed) == (3, 1, 4)
    assert short.mean_seconds == pytest.approx(0.5)
    assert stats.workers[0].lane_tasks == 0 and stats["lane"] == 4


def test_a_monitor_receives_the_same_snapshot_over_the_wire(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.scheduler.store_stats = lambda: {"capacity": 1 << 20, "in_use": 4096, "objects": 1}
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn, 0)]))
    cluster.send(b"w1", m.TaskResults([result(tid(cid, 2), status=Status.ERROR, payload=_boom())]))
    cluster.join(b"m1", hello(m.Role.MONITOR))
    out = cluster.send(b"m1", m.StatsRequest())  # Cluster.step round-trips it through the codec
    received = Statistics.from_message(out.one(b"m1", m.Stats))
    assert received == cluster.scheduler.statistics()
    assert received.store["in_use"] == 4096 and received["monitors"] == 1
    assert received.failures[0].cause == "builtins.ValueError: boom 42"


def test_the_run_time_histogram_buckets_each_timed_task_once_and_keeps_it(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=8)
    runs = {2: 0.0005, 3: 0.002, 4: 0.7, 5: 0.9, 6: 5000.0}
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in runs]))
    cluster.send(b"w1", m.TaskResults([_timed(tid(cid, n), seconds) for n, seconds in runs.items()]))
    assert cluster.scheduler.statistics().durations.count == 0, "the worker counts them, then reports"
    _results(cluster, *[_timed(tid(cid, n), seconds) for n, seconds in runs.items()])
    durations = cluster.scheduler.statistics().durations
    assert durations.bounds == DURATION_BOUNDS and len(durations.counts) == len(DURATION_BOUNDS) + 1
    assert durations.count == 5 and durations.total_seconds == pytest.approx(sum(runs.values()))
    cumulative = dict(durations.cumulative())
    assert cumulative[0.001] == 1 and cumulative[0.0025] == 2 and cumulative[0.5] == 2
    assert cumulative[1.0] == 4 and cumulative[3600.0] == 4 and cumulative[float("inf")] == 5
    later(cluster, 600.0)  # unlike the windows, the histogram only grows
    assert cluster.scheduler.statistics().durations == durations
    log = RunLog()  # a bound is inclusive, as Prometheus' le (counted with no ring at all)
    for seconds in (0.001, 1.0, 3600.0):
        log.ended(1.0, 1.0 + seconds, Status.OK, 0)  # (1.001 - 1.0 <= 0.001 in floats)
    log.ended(100.0, 200.0, Status.ERROR, 0)  # only tasks that ended well are timed
    report = log.take()
    assert report is not None and (report.kept, report.seen, report.timed) == (0, 0, 3)
    assert [i for i, n in enumerate(report.durations) if n] == [0, 9, len(DURATION_BOUNDS) - 1]
    # A report whose counts do not add up is refused, and changes nothing.
    refused = cluster.scheduler.counters["refused"]
    cluster.send(b"w1", report._replace(timed=4), report._replace(longest=-1.0), report._replace(durations=[1]))
    assert cluster.scheduler.counters["refused"] == refused + 3
    assert cluster.scheduler.statistics().durations == durations


def test_a_snapshot_pickles_and_stays_read_only(cluster: Cluster) -> None:
    import pickle

    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn)]))
    cluster.send(b"w1", m.TaskResults([result(tid(cid, 2), status=Status.ERROR, payload=_boom())]))
    stats = cluster.scheduler.statistics()
    again = pickle.loads(pickle.dumps(stats))
    assert again == stats and again.failures == stats.failures
    with pytest.raises(TypeError):
        again.counters["tasks"] = 1  # type: ignore[index]


def test_uptime_counts_from_the_first_tick(cluster: Cluster) -> None:
    assert cluster.scheduler.statistics().uptime == 0.0
    cluster.tick()
    cluster.tick(5.0)
    assert cluster.scheduler.statistics().uptime == pytest.approx(5.0)


def test_a_rejected_task_is_a_failure_event(cluster: Cluster) -> None:
    cid, fn = client_with_function(cluster)
    bad = spec(tid(cid, 2), fn)._replace(flags=TaskFlags.CALL, fn_id=tid(cid, 77))  # an unregistered function
    cluster.send(b"c1", m.SubmitTasks([bad]))
    (event,) = cluster.scheduler.statistics().failures
    assert event.kind == "rejected" and event.task_id == tid(cid, 2) and event.where == "c1"


def test_monitors_share_one_snapshot_built_at_most_every_interval(cluster: Cluster) -> None:
    from scaler_executor.scheduler.core_events import MONITOR_SNAPSHOT_SECONDS

    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.join(b"m2", hello(m.Role.MONITOR))
    first = cluster.send(b"m1", m.StatsRequest()).one(b"m1", m.Stats)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn)]), dt=MONITOR_SNAPSHOT_SECONDS / 2)
    # Within the interval: the same snapshot, to either monitor, however often they ask.
    assert cluster.send(b"m2", m.StatsRequest()).one(b"m2", m.Stats) is first
    # One answer per monitor per turn, however many requests it sent (a client gets each).
    assert cluster.send(b"m1", *[m.StatsRequest()] * 100).of(b"m1", m.Stats) == [first]
    assert len(cluster.send(b"c1", m.StatsRequest(), m.StatsRequest()).of(b"c1", m.Stats)) == 2
    # A client's snapshot is always fresh.
    assert cluster.send(b"c1", m.StatsRequest()).one(b"c1", m.Stats).snapshot["submitted"] == 1
    later = cluster.send(b"m2", m.StatsRequest(), dt=MONITOR_SNAPSHOT_SECONDS).one(b"m2", m.Stats)
    assert later is not first and later.snapshot["submitted"] == 1 and first.snapshot["submitted"] == 0


def test_a_workers_heartbeat_figures_are_in_its_row(cluster: Cluster) -> None:
    cluster.worker(b"w1", capacity=2)
    (row,) = cluster.scheduler.statistics().workers
    assert (row.memory, row.memory_limit, row.cpu) == (None, None, None)  # not reported yet
    cluster.send(b"w1", m.Heartbeat(1, 2, 300 << 20, 4 << 30, 1.5))
    (row,) = cluster.scheduler.statistics().workers
    assert (row.queued, row.running, row.memory, row.memory_limit, row.cpu) == (1, 2, 300 << 20, 4 << 30, 1.5)
    cluster.send(b"w1", m.Heartbeat(0, 0, 10 << 20, 0, 0.0))  # no limit: None
    (row,) = cluster.scheduler.statistics().workers
    assert (row.memory, row.memory_limit, row.cpu) == (10 << 20, None, 0.0)


def test_each_worker_reports_its_host_store_and_stores_count_each_once(cluster: Cluster) -> None:
    """Workers report the store they map (its name and figures) on their heartbeats; the
    workers of one host share one store, so ``stores`` lists each store once: the daemon's
    with its own figures, any other with its freshest worker's."""
    scheduler = cluster.scheduler
    scheduler.object_store = "scaler-1-d"
    scheduler.store_stats = lambda: {"capacity": 1 << 30, "in_use": 5 << 20, "data_bytes": 5 << 20, "objects": 3}
    cluster.worker(b"w1", host="node-1")
    cluster.worker(b"w2", host="node-1")
    cluster.worker(b"w3", host="node-2")  # maps no store: fetches over the network
    cluster.worker(b"w4", host="node-3")
    cluster.worker(b"w5", host="node-3")
    cluster.send(b"w1", m.Heartbeat(0, 0, store="scaler-1-d", store_bytes=4 << 20, store_capacity=1 << 30, store_objects=2))
    cluster.send(b"w2", m.Heartbeat(0, 0, store="scaler-1-d", store_bytes=5 << 20, store_capacity=1 << 30, store_objects=3))
    cluster.send(b"w3", m.Heartbeat(0, 0))
    cluster.send(b"w4", m.Heartbeat(0, 0, store="other", store_bytes=100, store_capacity=1000, store_objects=1))
    cluster.send(b"w5", m.Heartbeat(0, 0, store="other", store_bytes=300, store_capacity=1000, store_objects=2), dt=1.0)
    stats = scheduler.statistics()
    w = {x.name: x for x in stats.workers}
    assert (w["w1"].store, w["w1"].store_bytes, w["w1"].store_capacity, w["w1"].store_objects) == ("scaler-1-d", 4 << 20, 1 << 30, 2)
    assert (w["w3"].store, w["w3"].store_bytes, w["w3"].store_capacity, w["w3"].store_objects) == (None, None, None, None)
    assert stats.store_name == "scaler-1-d"
    daemon, other = stats.stores
    assert (daemon.name, daemon.bytes, daemon.capacity, daemon.objects, daemon.daemon) == ("scaler-1-d", 5 << 20, 1 << 30, 3, True)
    assert daemon.workers == ("w1", "w2") and daemon.hosts == ("node-1",)
    assert (other.name, other.bytes, other.objects, other.daemon) == ("other", 300, 2, False), "w5 spoke last"
    assert other.workers == ("w4", "w5") and other.hosts == ("node-3",)
    assert sum(s.bytes for s in stats.stores) == (5 << 20) + 300  # never the workers' sum
    # A monitor sees the same; a snapshot pickles with them.
    import pickle

    cluster.join(b"m1", hello(m.Role.MONITOR))
    received = Statistics.from_message(cluster.send(b"m1", m.StatsRequest()).one(b"m1", m.Stats))
    assert received.stores == stats.stores and received.workers == stats.workers
    assert pickle.loads(pickle.dumps(stats)).stores == stats.stores
    # Without a host store the daemon reports none; workers' stores are still listed.
    scheduler.store_stats = None
    stats = scheduler.statistics()
    assert stats.store_name == "" and [s.name for s in stats.stores] == ["other", "scaler-1-d"]
