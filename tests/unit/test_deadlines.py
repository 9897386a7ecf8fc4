"""Liveness and heartbeat checks by deadline queue (scheduler/deadlines.py), not per-tick sweeps."""

from __future__ import annotations

from core_testing import DEADLINE, INTERVAL, Cluster, hello

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.deadlines import DeadlineQueue


def test_deadline_queue_pops_due_peers_once_within_a_slot_and_keeps_the_earlier_entry() -> None:
    q = DeadlineQueue(0.5)
    q.add(b"a", 5.0)
    q.add(b"b", 3.2)
    q.add(b"a", 1.0)  # already queued: kept at 5.0 (its check re-queues it as needed)
    assert q.due(2.9) == []
    assert q.due(3.0) == [b"b"]  # its slot [3.0, 3.5): up to a resolution early, never late
    q.add(b"b", 3.2)  # not yet due, says the caller's check: back in the current slot
    assert q.due(3.1) == [b"b"]  # looked at again at the next call
    assert q.due(1000.0) == [b"a"]  # a long gap
    assert len(q) == 0 and q.due(2000.0) == []
    q.add(b"a", 11.0)  # in the past: due at the next look
    assert q.due(2000.1) == [b"a"]


def test_deadline_queue_refuses_a_zero_resolution() -> None:
    import pytest

    with pytest.raises(ValueError, match="resolution > 0"):
        DeadlineQueue(0.0)


def test_many_workers_exactly_the_silent_ones_are_lost_at_their_deadline() -> None:
    cluster = Cluster()
    peers = [b"w%d" % i for i in range(300)]
    for peer in peers:
        cluster.join(peer, hello(m.Role.WORKER, name=peer.decode()))
    talkers, silent = peers[::2], peers[1::2]
    steps = int(DEADLINE / (INTERVAL / 4)) + 2
    for _ in range(steps):
        cluster.keepalive(*talkers)
        cluster.tick(dt=INTERVAL / 4)
    workers = cluster.scheduler.workers
    assert sorted(workers) == sorted(talkers)
    assert cluster.stat("workers_lost") == len(silent)


def test_a_quiet_peer_gets_one_heartbeat_per_interval() -> None:
    cluster = Cluster()
    cluster.worker(b"w1")
    got = 0
    ticks = 40
    for _ in range(ticks):
        cluster.keepalive(b"w1")  # it talks; the daemon has nothing to say but heartbeats
        got += len(cluster.tick(dt=INTERVAL / 4).of(b"w1", m.Heartbeat))
    assert ticks // 4 - 1 <= got <= ticks // 4 + 1
