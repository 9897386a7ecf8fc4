"""The statistics barrier (scheduler/stats_barrier.py): a client's StatsRequest that names lane
results it received is answered once their workers' LaneDone counted them, in the order asked;
through the pure core with a fake clock, validate() after every step."""

from __future__ import annotations

import pytest
from core_testing import Cluster, hello, tid

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.core import Wake
from scaler_executor.scheduler.stats_barrier import STATS_BARRIER_SECONDS
from scaler_executor.worker.lanes import LANE_DONE_LINGER, Lanes, LaneTally

pytestmark = pytest.mark.timeout(30)


def done(client_id: int, ended: int, finished: int = 0) -> m.LaneDone:
    return m.LaneDone(finished, 0, 0, 0, 0.0, [], [], [m.LaneEnds(client_id, ended)])


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def test_a_request_naming_nothing_uncounted_is_answered_at_once(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.send(b"w1", done(cid, 3, finished=3))
    out = cluster.send(b"c1", m.StatsRequest({"w1": 3}))
    assert out.one(b"c1", m.Stats).snapshot["lane"] == 3 and not out.of(b"w1", m.LaneFlush)
    # A worker it names that is not (or no longer) connected holds nothing back.
    assert cluster.send(b"c1", m.StatsRequest({"gone": 9})).one(b"c1", m.Stats)


def test_a_request_waits_for_the_lane_done_that_counts_what_the_client_saw(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.worker(b"w2")
    cluster.send(b"w1", done(cid, 2, finished=2))
    out = cluster.send(b"c1", m.StatsRequest({"w1": 3, "w2": 0}))
    assert not out.of(b"c1", m.Stats), "answered before w1 counted the third lane task"
    assert out.of(b"w1", m.LaneFlush) == [m.LaneFlush()] and not out.of(b"w2", m.LaneFlush)
    # Another client's count does not cover this one's.
    assert not cluster.send(b"w1", done(cid + 1, 5, finished=5)).of(b"c1", m.Stats)
    out = cluster.send(b"w1", m.LaneDone(1, 0, 0, 0, 0.0, [], [], [m.LaneEnds(cid, 3), m.LaneEnds(cid + 1, 5)]))
    (stats,) = out.of(b"c1", m.Stats)
    assert stats.snapshot["lane"] == 2 + 5 + 1, "the answer counts the report that released it"
    assert not cluster.scheduler.stats_barrier.held


def test_answers_go_in_the_order_asked(cluster: Cluster) -> None:
    cid = cluster.client(b"c1")
    cluster.worker(b"w1")
    assert not cluster.send(b"c1", m.StatsRequest({"w1": 1})).of(b"c1", m.Stats)
    out = cluster.send(b"c1", m.StatsRequest({}))
    assert not out.of(b"c1", m.Stats), "a later request may not overtake the held one (answers go to the oldest waiter)"
    assert len(cluster.send(b"w1", done(cid, 1, finished=1)).of(b"c1", m.Stats)) == 2


def test_a_worker_lost_releases_what_waited_for_it(cluster: Cluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.send(b"c1", m.StatsRequest({"w1": 4}))
    out = cluster.send(b"w1", m.Goodbye("stopping"))
    assert out.of(b"c1", m.Stats)


def test_a_client_lost_leaves_nothing_held(cluster: Cluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    cluster.send(b"c1", m.StatsRequest({"w1": 4}))
    cluster.send(b"c1", m.Goodbye("done"))
    assert not cluster.scheduler.stats_barrier.held and cluster.scheduler.wakeup_at() is None


def test_a_request_is_held_at_most_the_bound_and_that_is_counted(cluster: Cluster) -> None:
    cluster.client(b"c1")
    cluster.worker(b"w1")
    asked = cluster.now
    cluster.send(b"c1", m.StatsRequest({"w1": 4}))
    assert cluster.scheduler.wakeup_at() == pytest.approx(asked + STATS_BARRIER_SECONDS)
    cluster.now = asked + STATS_BARRIER_SECONDS * 0.99
    assert not cluster.step(Wake(cluster.now)).of(b"c1", m.Stats)
    cluster.now = asked + STATS_BARRIER_SECONDS
    (stats,) = cluster.step(Wake(cluster.now)).of(b"c1", m.Stats)
    assert stats.snapshot["stats_barrier_expired"] == 1 and cluster.scheduler.wakeup_at() is None


def test_a_monitor_is_never_held(cluster: Cluster) -> None:
    cluster.join(b"mon", hello(m.Role.MONITOR))
    cluster.worker(b"w1")
    assert cluster.send(b"mon", m.StatsRequest({"w1": 4})).of(b"mon", m.Stats)


# ---------------------------------------------------------------- the worker's side


def test_a_flush_sends_a_report_at_once_even_of_nothing_new_then_the_next_end_without_linger() -> None:
    lanes = Lanes(name="w")
    lanes.ends = {7: 3}
    assert lanes.report(10.0, force=False) is None
    lanes.flush()
    assert lanes.report_due(10.0) == 0.0
    assert lanes.report(10.0, force=False) == m.LaneDone(0, 0, 0, 0, 0.0, [], [], [m.LaneEnds(7, 3)])
    assert lanes.report(10.0, force=False) is None, "once"
    # The end the client saw arrives after the flush: it goes without waiting for company.
    lanes.tally = LaneTally(finished=1, since=10.0)
    lanes.ends[7] = 4
    assert lanes.report_due(10.0) == 0.0
    assert lanes.report(10.0, force=False) == m.LaneDone(1, 0, 0, 0, 0.0, [], [], [m.LaneEnds(7, 4)])
    # And after that the linger is back.
    lanes.tally = LaneTally(finished=1, since=11.0)
    assert lanes.report(11.0, force=False) is None
    assert lanes.report_due(11.0) == pytest.approx(LANE_DONE_LINGER)


def test_every_report_carries_each_clients_cumulative_ends() -> None:
    lanes = Lanes(name="w")
    lanes.ends = {1: 5, 2: 1}
    lanes.tally = LaneTally(finished=1, since=0.0)
    report = lanes.report(0.0)
    assert report is not None and sorted(report.clients) == [m.LaneEnds(1, 5), m.LaneEnds(2, 1)]
    assert tid(1, 0) >> m.TASK_ID_BITS == 1  # how the worker tells a lane task's client
