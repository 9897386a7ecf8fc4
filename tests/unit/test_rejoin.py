"""The reconnection policy's pure parts (protocol/rejoin.py) and the daemon's word for a peer
it does not know."""

from __future__ import annotations

import itertools

import pytest

from scaler_executor import ClusterConfig
from scaler_executor.protocol.rejoin import UNKNOWN_PEER, Backoff, is_unknown_peer


def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() -> None:
    low = Backoff(1.0, 8.0, rng=lambda: 0.0)
    assert [low.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    high = Backoff(1.0, 8.0, rng=lambda: 0.999)
    delays = [high.next_delay() for _ in range(6)]
    assert all(a < b for a, b in itertools.pairwise(delays[:4]))
    assert max(delays) < 8.0
    high.reset()
    assert high.next_delay() < 1.0


def test_backoff_survives_many_attempts() -> None:
    b = Backoff(0.5, 30.0, rng=lambda: 0.5)
    for _ in range(2000):
        delay = b.next_delay()
    assert delay == 22.5


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="0 < base <= cap"):
        Backoff(2.0, 1.0)


def test_unknown_peer_phrase() -> None:
    assert is_unknown_peer(f"{UNKNOWN_PEER}: send Hello first")
    assert not is_unknown_peer("version mismatch: unknown peer")


def test_worker_daemon_loss_timeout_is_a_config_key() -> None:
    assert ClusterConfig().worker_daemon_loss_timeout == 300.0
    assert ClusterConfig.load(file=None, env={"SCALER_WORKER_DAEMON_LOSS_TIMEOUT": "7"}).worker_daemon_loss_timeout == 7.0
