"""The run's history (scheduler/history.py) with a fake clock: the ring of task runs and the
coarse series stay bounded, the series merges pairwise and covers the whole run, each event
costs O(1) (amortised over merges), and the core feeds it from results, heartbeats and losses."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from core_testing import CONFIG, Cluster, client_with_function, hello, spec, tid

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.runlog import RunLog
from scaler_executor.scheduler.history import (
    BUCKET_SECONDS,
    MAX_BUCKETS,
    RUNS,
    History,
    history_message,
)
from scaler_executor.scheduler.report import render_report
from scaler_executor.worker.processor import dump_exception


def _boom() -> bytes:
    try:
        raise ValueError("boom 42")
    except ValueError as exc:
        return dump_exception(exc)


def _report(*runs: tuple[float, float, int], seen: int | None = None) -> m.TaskRuns:
    """A worker's TaskRuns of ``runs`` (started, finished, status), as its RunLog makes it."""
    log = RunLog(len(runs) or 1)
    for started, finished, status in runs:
        log.ran(started, finished, status)
    report = log.take()
    assert report is not None
    return report._replace(seen=report.seen if seen is None else seen)


def test_the_history_keeps_the_most_recent_reported_runs_and_counts_them_all() -> None:
    history = History(runs=5)
    for n in range(6):  # reports of two runs each, from two workers
        report = _report(*[(100.0 + 2 * n + i, 100.5 + 2 * n + i, Status.OK if i else Status.ERROR) for i in range(2)])
        history.reported(f"w{n % 2}", report.kept, report.seen, report.runs)
    assert len(history.runs) == 5 and history.runs_seen == 12
    assert [run[1] for run in history.runs] == [107.0, 108.0, 109.0, 110.0, 111.0]  # oldest dropped
    assert history.runs[-1] == ("w1", 111.0, 111.5, Status.OK) and history.runs[-2][3] == Status.ERROR
    assert len(history._reports) == 3, "reports no longer needed went, whole"
    assert History().capacity == RUNS == 20_000
    report = _report((200.0, 201.0, Status.OK), seen=4)  # its ring overflowed: 3 only counted
    history.reported("w9", report.kept, report.seen, report.runs)
    assert [run[:2] for run in history.runs] == [("w0", 108.0), ("w0", 109.0), ("w1", 110.0), ("w1", 111.0), ("w9", 200.0)]
    assert history.runs_seen == 16
    empty = History(runs=0)
    empty.reported("w0", report.kept, report.seen, report.runs)
    assert empty.runs == [] and empty.runs_seen == 0, "off: nothing recorded, whatever a worker sends"
    with pytest.raises(ValueError, match="runs must be at least 0"):
        History(runs=-1)


def test_the_series_buckets_counts_and_the_gauges_most() -> None:
    history = History(width=10.0)
    history.gauge(1000.0, 0, 0)  # the daemon's first tick: the origin
    history.ended(1001.0, 3, 1)
    history.gauge(1002.0, 2, 500)
    history.gauge(1003.0, 2, 300)  # lower: the bucket keeps its most
    history.ended(1009.9, 1, 0)
    history.ended(1035.0, 2, 2)  # two empty buckets between: not stored
    series = history.series()
    assert series == [m.SeriesBucket(0.0, 4, 1, 500, 2), m.SeriesBucket(30.0, 2, 2, 300, 2)]
    # A new bucket starts from the gauges' current values (300 B, 2 workers), not the old most.


def test_a_full_series_merges_pairwise_and_still_covers_the_whole_run() -> None:
    history = History(width=10.0, max_buckets=4)
    history.gauge(0.0, 1, 100)
    for second in range(0, 40, 10):  # four buckets: full
        history.ended(float(second), 1, 0)
    history.gauge(35.0, 3, 900)  # in the fourth bucket
    assert len(history) == 4 and history.width == 10.0
    history.ended(40.0, 5, 1)  # the fifth: the series halves first
    assert history.width == 20.0
    assert history.series() == [
        m.SeriesBucket(0.0, 2, 0, 100, 1),  # 0-10 and 10-20: counts summed
        m.SeriesBucket(20.0, 2, 0, 900, 3),  # 20-30 and 30-40: the gauges' most kept
        m.SeriesBucket(40.0, 5, 1, 900, 3),  # the gauges carried on
    ]
    assert sum(b.finished + b.failed for b in history.series()) == 10  # nothing lost


def test_a_long_run_stays_bounded_and_costs_o1_per_event_amortised(monkeypatch: pytest.MonkeyPatch) -> None:
    """A week of a task every second: never more than MAX_BUCKETS buckets, the first of
    them still at the run's start, and the merges' total work under twice the buckets made."""
    touched = [0]
    merge = History._merge

    def counting_merge(self: History) -> None:
        touched[0] += len(self)
        merge(self)

    monkeypatch.setattr(History, "_merge", counting_merge)
    history = History()
    week = 7 * 24 * 3600
    step = 7.0
    now = 0.0
    events = 0
    while now < week:
        history.ended(now, 1, 0)
        history.gauge(now, 4, 1 << 30)
        events += 1
        assert len(history) <= MAX_BUCKETS
        now += step
    series = history.series()
    assert series[0].start == 0.0 and series[-1].start + history.width > week - step
    assert sum(b.finished for b in series) == events
    assert history.width == BUCKET_SECONDS * 8  # 10 s to 24 h, 20 s to 48 h, 40 s to 96 h, 80 s to a week
    made = week / BUCKET_SECONDS  # buckets of the first width the run would have made
    assert 0 < touched[0] <= 2 * made


def test_the_core_records_runs_memory_and_workers_and_answers_clients(tmp_path: Any) -> None:
    cluster = Cluster()
    cluster.tick()
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1", capacity=2)
    cluster.send(b"w1", m.Heartbeat(0, 0, memory=1000, memory_limit=0, cpu=0.5), dt=1.0)
    cluster.worker(b"w2", capacity=1)
    cluster.send(b"w2", m.Heartbeat(0, 0, memory=500), dt=1.0)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(2, 5)]))
    core = cluster.scheduler
    at_w1 = [t for t, task in core.tasks.items() if task.worker == b"w1"]
    assert at_w1
    facts = m.TaskFacts("w1", 50.0, 51.5, 0)
    results = [m.TaskResult(t, 0, Status.OK if i else Status.ERROR, b"v", facts, []) for i, t in enumerate(at_w1)]
    results.append(m.TaskResult(at_w1[0] + 999, 0, Status.OK, b"v", facts, []))  # unknown: not a run
    cluster.send(b"w1", m.TaskResults(results), dt=1.0)
    assert history_message(core).runs == [], "the daemon's loop records no run: the worker reports them"
    cluster.send(b"w1", _report(*[(50.0, 51.5, Status.ERROR)] + [(50.0, 51.5, Status.OK)] * (len(at_w1) - 1)))
    history = history_message(core)
    assert [(r.worker, r.started, r.finished) for r in history.runs] == [("w1", 50.0, 51.5)] * len(at_w1)
    assert history.runs[0].status == Status.ERROR and history.runs_seen == len(at_w1)
    (bucket,) = history.series
    assert (bucket.finished, bucket.failed, bucket.memory, bucket.workers) == (len(at_w1) - 1, 1, 1500, 2)
    assert history.config["heartbeat_interval"] == str(core.config.heartbeat_interval)
    assert history.uptime == pytest.approx(3.0)
    cluster.send(b"w2", m.Goodbye("bye"), dt=20.0)  # a new bucket: one worker, its memory only
    assert history_message(core).series[-1][3:] == (1000, 1)
    # Lane tasks' runs come in LaneDone (worker "": the daemon names it), no more than it reports.
    failure = m.TaskResult(tid(cid, 77), 0, Status.ERROR, _boom(), m.TaskFacts("w1", 61.0, 61.5, 0), [])
    cluster.send(b"w1", m.LaneDone(2, 1, 0, 0, 1.5, [], [failure, failure]))  # one more than it failed
    lane_failures = [e for e in core.statistics().failures if e.task_id == tid(cid, 77)]
    assert len(lane_failures) == 1 and "boom 42" in lane_failures[0].cause and "raise ValueError" in lane_failures[0].detail
    # Its lane tasks' runs come in its TaskRuns like the others (the daemon names the worker).
    cluster.send(b"w1", _report(*[(60.0 + i, 60.5 + i, Status.OK) for i in range(3)]))
    runs = history_message(core).runs
    assert [(r.worker, r.started) for r in runs[-3:]] == [("w1", 60.0), ("w1", 61.0), ("w1", 62.0)]
    assert history_message(core).runs_seen == len(at_w1) + 3
    # A client asks: the answer is a History, valid on the wire; a worker may not ask.
    out = cluster.send(b"c1", m.HistoryRequest())
    answer = out.one(b"c1", m.History)
    assert decode(encode([answer]))[0] == [answer]
    refused = core.counters["refused"]
    cluster.send(b"w1", m.HistoryRequest())
    assert core.counters["refused"] == refused + 1
    # A worker that goes (its runs were reported) keeps what it had reported.
    cluster.send(b"w1", m.Goodbye("bye"))
    assert len(history_message(core).runs) == len(at_w1) + 3


def test_monitors_share_one_history_rebuilt_at_most_every_interval() -> None:
    from scaler_executor.scheduler.core_events import MONITOR_HISTORY_SECONDS

    cluster = Cluster()
    cluster.tick()
    cid, fn = client_with_function(cluster)
    cluster.worker(b"w1")
    cluster.join(b"m1", hello(m.Role.MONITOR))
    cluster.join(b"m2", hello(m.Role.MONITOR))
    first = cluster.send(b"m1", m.HistoryRequest()).one(b"m1", m.History)
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, 2), fn)]), dt=MONITOR_HISTORY_SECONDS / 2)
    # Within the interval: the same history, to either monitor; one answer per monitor per turn.
    assert cluster.send(b"m2", m.HistoryRequest()).one(b"m2", m.History) is first
    assert cluster.send(b"m1", *[m.HistoryRequest()] * 100).of(b"m1", m.History) == [first]
    # A client's is always fresh, one per request.
    assert len(cluster.send(b"c1", m.HistoryRequest(), m.HistoryRequest()).of(b"c1", m.History)) == 2
    later = cluster.send(b"m2", m.HistoryRequest(), dt=MONITOR_HISTORY_SECONDS).one(b"m2", m.History)
    assert later is not first and later.uptime > first.uptime


def _run_tasks(cluster: Cluster, count: int) -> list[int]:
    """``count`` tasks submitted, dispatched to w1 and reported done, with their run times."""
    cid, fn = client_with_function(cluster)
    welcome = cluster.worker(b"w1", capacity=count).one(b"w1", m.Welcome)
    assert welcome.runs == cluster.scheduler.config.history_runs
    cluster.send(b"c1", m.SubmitTasks([spec(tid(cid, n), fn) for n in range(2, 2 + count)]))
    core = cluster.scheduler
    at_w1 = [t for t, task in core.tasks.items() if task.worker == b"w1"]
    assert len(at_w1) == count
    results = [m.TaskResult(t, 0, Status.OK, b"v", m.TaskFacts("w1", 50.0 + i, 50.5 + i, 0), []) for i, t in enumerate(at_w1)]
    cluster.send(b"w1", m.TaskResults(results), dt=1.0)
    cluster.send(b"w1", m.LaneDone(1, 0, 0, 0, 0.5, [], []))
    # What its RunLog sends beside its next heartbeat, sized by its Welcome (0: it sends no runs).
    log = RunLog(welcome.runs)
    for i in range(count):
        log.ran(50.0 + i, 50.5 + i, Status.OK)
    log.ran(70.0, 70.5, Status.OK)  # the lane task's
    if (report := log.take()) is not None:
        cluster.send(b"w1", report)
    return at_w1


def test_history_runs_sets_the_rings_size() -> None:
    from scaler_executor.config import ClusterConfig

    assert ClusterConfig().history_runs == RUNS, "the config's default is the ring's documented size"
    cluster = Cluster(replace(CONFIG, history_runs=3))
    cluster.tick()
    _run_tasks(cluster, 4)
    history = history_message(cluster.scheduler)
    assert [r.started for r in history.runs] == [52.0, 53.0, 70.0] and history.runs_seen == 5
    # A worker whose ring held 3 of 5 reports them: the history keeps 3, counts 5.


def test_history_runs_0_records_no_run_and_keeps_the_counters() -> None:
    """Off means off: no run is recorded (the report and the page say so), while the
    counters, the throughput windows and the coarse series go on as before."""
    cluster = Cluster(replace(CONFIG, history_runs=0))
    cluster.tick()
    _run_tasks(cluster, 4)
    core = cluster.scheduler
    history = history_message(core)
    assert history.runs == [] and history.runs_seen == 0 and history.config["history_runs"] == "0"
    assert sum(b.finished for b in history.series) == 5, "the series still counts every task"
    stats = core.statistics()
    assert stats["finished"] == 5 and sum(w.finished for w in stats.windows if w.seconds == 60) == 5
    assert "task runs are not recorded (the daemon's history_runs is 0)" in render_report(stats, history)
    from scaler_executor.monitor.dashboard import history_json

    page = history_json(history, 100.0)
    assert page["runs_recorded"] is False and page["bars"] == []
    assert history_json(history_message(Cluster().scheduler), 100.0)["runs_recorded"] is True


def test_a_bad_task_runs_report_is_refused_and_clients_are_told_to_keep_none() -> None:
    cluster = Cluster()
    cluster.tick()
    assert cluster.join(b"c9", hello(m.Role.CLIENT)).one(b"c9", m.Welcome).runs == 0
    cluster.worker(b"w1")
    core = cluster.scheduler
    refused = core.counters["refused"]
    good = _report((1.0, 2.0, Status.OK), (3.0, 4.0, Status.OK))
    for bad in (good._replace(runs=good.runs[:-1]), good._replace(seen=1), good._replace(kept=-1, runs=b"")):
        cluster.send(b"w1", bad)
    assert core.counters["refused"] == refused + 3 and history_message(core).runs == []
    cluster.send(b"w1", good)
    assert [r.started for r in history_message(core).runs] == [1.0, 3.0]
