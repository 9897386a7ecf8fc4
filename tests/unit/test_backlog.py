"""The daemon's backlogs for peers that do not read (scheduler/backlog.py): in order, bounded
per peer in transmissions and for all peers in bytes, largest dropped first."""

from __future__ import annotations

from scaler_executor.scheduler.backlog import Backlogs, nbytes


def test_held_in_order_and_sent_oldest_first() -> None:
    backlogs = Backlogs(max_transmissions=10, max_bytes=1000)
    assert backlogs.hold(b"a", [b"12", memoryview(b"345")]) == []
    assert backlogs.hold(b"a", [b"6"]) == []
    assert backlogs.held(b"a") == (2, 6) and backlogs.total == 6
    assert backlogs.front(b"a") == [b"12", memoryview(b"345")]
    backlogs.sent(b"a")
    assert backlogs.front(b"a") == [b"6"] and backlogs.total == 1
    backlogs.sent(b"a")
    assert b"a" not in backlogs and not backlogs and backlogs.total == 0


def test_a_peer_past_its_transmission_count_is_dropped() -> None:
    backlogs = Backlogs(max_transmissions=3, max_bytes=10**9)
    for _ in range(3):
        assert backlogs.hold(b"slow", [b"x"]) == []
    (dropped,) = backlogs.hold(b"slow", [b"x"])
    assert dropped[0] == b"slow" and "4 transmissions" in dropped[1]
    assert b"slow" not in backlogs and backlogs.total == 0


def test_past_the_byte_bound_the_largest_backlogs_go_first() -> None:
    backlogs = Backlogs(max_transmissions=100, max_bytes=100)
    for _ in range(3):
        backlogs.hold(b"big", [b"x" * 20])  # 60
    backlogs.hold(b"small", [b"y" * 10])
    backlogs.hold(b"small", [b"y" * 10])  # 20: 80 in all
    dropped = backlogs.hold(b"other", [b"z" * 30])  # 110 > 100: "big" goes, the rest fits
    assert [peer for peer, _ in dropped] == [b"big"] and "max_backlog_bytes 100" in dropped[0][1]
    assert backlogs.peers() == [b"small", b"other"] and backlogs.total == 50


def test_a_single_transmission_is_never_dropped_for_its_size() -> None:
    backlogs = Backlogs(max_transmissions=100, max_bytes=100)
    assert backlogs.hold(b"fetch", [b"o" * 500]) == []  # one large object a client asked for
    assert backlogs.held(b"fetch") == (1, 500)
    (dropped,) = backlogs.hold(b"fetch", [b"more"])  # a second one behind it: now it is a backlog
    assert dropped[0] == b"fetch" and backlogs.total == 0


def test_clear_forgets_a_peer() -> None:
    backlogs = Backlogs(max_transmissions=100, max_bytes=100)
    backlogs.hold(b"a", [b"abc"])
    backlogs.clear(b"a")
    backlogs.clear(b"a")  # twice is harmless
    assert backlogs.total == 0 and backlogs.front(b"a") is None
    assert nbytes([b"ab", bytearray(b"c"), memoryview(b"defg")[1:]]) == 6
