"""The debug lock-order checker (scaler_executor/_locks.py)."""

from __future__ import annotations

import threading

import pytest

from scaler_executor import _locks
from scaler_executor._locks import LockOrderError, RankedLock, ranked_lock


def test_locks_taken_in_rank_order_are_fine_and_an_inversion_raises() -> None:
    outer, inner = RankedLock("outer", 10), RankedLock("inner", 20)
    with outer, inner:
        pass
    with inner, pytest.raises(LockOrderError, match=r"outer \(rank 10\) taken while holding inner \(rank 20\)"):
        outer.acquire()
    assert not outer.locked() and not inner.locked()


def test_a_reentrant_lock_may_be_taken_again_and_a_plain_one_may_not_be_nested() -> None:
    again = RankedLock("again", 5, reentrant=True)
    with again, again:
        pass
    same = RankedLock("same", 5)
    other = RankedLock("other", 5)
    with same, pytest.raises(LockOrderError):
        other.acquire()  # two locks of one rank: no order between them is written down


def test_each_thread_has_its_own_held_locks() -> None:
    first, second = RankedLock("first", 1), RankedLock("second", 2)
    errors: list[BaseException] = []
    with second:

        def elsewhere() -> None:
            try:
                with first:
                    pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join(10)
    assert not errors


def test_the_suite_runs_with_the_checker_on() -> None:
    assert _locks.DEBUG, "tests/conftest.py sets SCALER_DEBUG_LOCKS=1 before the package is imported"
    assert isinstance(ranked_lock("x", 1), RankedLock)
