"""The daemon's rate-limited warnings: one line per key and interval, counting the rest."""

from __future__ import annotations

import logging

import pytest

from scaler_executor.scheduler.loop import RateLimitedLog


def test_held_back_lines_are_counted_on_the_next_one(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test_rate_limited_log")
    limited = RateLimitedLog(logger, interval=0.0)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        limited.warning("k", "dropped a bad transmission from %r: %s", b"peer", "oops")
        limited.interval = 3600.0
        limited.warning("k", "dropped a bad transmission from %r: %s", b"peer", "again")
        limited.warning("k", "dropped a bad transmission from %r: %s", b"peer", "again")
        limited.warning("other", "refused %s", "x")  # keys are limited separately
        limited.interval = 0.0
        limited.warning("k", "dropped a bad transmission from %r: %s", b"peer", "last")
    assert caplog.messages == [
        "dropped a bad transmission from b'peer': oops",
        "refused x",
        "dropped a bad transmission from b'peer': last (2 similar lines suppressed)",
    ]
