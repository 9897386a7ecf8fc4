"""The client's pending limits (client/pending.py), driven directly by threads."""

from __future__ import annotations

import threading

import pytest
from scaler_testing import wait_until

from scaler_executor import PendingLimitReached
from scaler_executor.client.pending import PendingLimit

BOUND = 30.0  # a bound on a wait that must end, never a measured time


def limit(max_tasks: int = 2, max_bytes: int = 100, block: bool = True, own: bool = False) -> PendingLimit:
    return PendingLimit(max_tasks, max_bytes, block=block, own_thread=lambda: own)


def test_raise_at_max_tasks_names_the_limit() -> None:
    pending = limit(block=False)
    pending.charge(1)
    pending.charge(1)
    with pytest.raises(PendingLimitReached, match=r"max_pending_tasks=2.*pending_full='raise'"):
        pending.charge(1)
    pending.free(1)
    pending.charge(1)  # room again
    assert (pending.tasks, pending.bytes) == (2, 2)


def test_raise_at_max_bytes_but_a_large_task_alone_is_admitted() -> None:
    pending = limit(max_tasks=10, max_bytes=100, block=False)
    pending.charge(500)  # alone: admitted, or it could never be submitted
    with pytest.raises(PendingLimitReached, match="max_pending_bytes=100"):
        pending.charge(1)
    pending.free(500)
    pending.charge(60)
    with pytest.raises(PendingLimitReached, match="max_pending_bytes"):
        pending.charge(41)
    pending.charge(40)


def test_own_thread_raises_even_when_blocking() -> None:
    pending = limit(max_tasks=1, block=True, own=True)
    pending.charge(1)
    with pytest.raises(PendingLimitReached, match="client's own thread"):
        pending.charge(1)


def test_block_waits_until_a_task_is_freed() -> None:
    pending = limit(max_tasks=1, block=True)
    pending.charge(1)
    admitted = threading.Event()

    def submitter() -> None:
        pending.charge(1)
        admitted.set()

    thread = threading.Thread(target=submitter)
    thread.start()
    try:
        assert wait_until(lambda: pending._waiting == 1, timeout=BOUND)
        assert not admitted.is_set(), "admitted while the limit was reached"
        pending.free(1)
        assert admitted.wait(BOUND)
    finally:
        pending.close()
        thread.join(BOUND)
    assert (pending.tasks, pending.bytes) == (1, 1)


def test_close_releases_waiters() -> None:
    pending = limit(max_tasks=1, block=True)
    pending.charge(1)
    thread = threading.Thread(target=pending.charge, args=(1,))
    thread.start()
    assert wait_until(lambda: pending._waiting == 1, timeout=BOUND)
    pending.close()
    thread.join(BOUND)
    assert not thread.is_alive()
