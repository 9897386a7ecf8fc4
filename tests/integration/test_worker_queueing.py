"""How a worker agent deals its tasks to its processors, end to end.

A processor may hold tasks queued behind the one it runs (fewer write and wake-up round
trips for short tasks).  When the running one turns out long and another processor is
idle, the agent recalls the queued tasks, and they run there: a short task never waits
behind a long one while a core idles.  (Which callable's mean sets the depth is pinned by
tests/unit/test_processor_depth.py; how the dealing goes depends on when each task
reaches the agent, which no test here controls.)

Tasks here block on a Unix socket the test holds: a task connects, says its index, and
returns when the test answers (or hangs up), so which tasks are held is decided by the
test, not by the clock.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from scaler_testing import fast_config

from scaler_executor import ScalerExecutor


def held_until_told(i: int, address: str) -> int:
    """Tell the test this task started, then return once it answers or hangs up."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(address)
            conn.sendall(bytes([i]))
            conn.recv(1)
    except OSError:
        pass  # the test is gone: nothing to wait for
    return i


class Gate:
    """The test's side of ``held_until_told``: who started, and releasing them."""

    def __init__(self, directory: str) -> None:
        self.address = str(Path(directory) / "gate.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.address)
        self.server.listen(16)
        self.server.settimeout(30.0)  # a task that never starts fails the test, not hangs it
        self.held: dict[int, socket.socket] = {}

    def wait_started(self, i: int) -> None:
        while i not in self.held:
            conn, _ = self.server.accept()
            conn.settimeout(30.0)
            self.held[conn.recv(1)[0]] = conn

    def release(self, i: int) -> None:
        self.held.pop(i).sendall(b"x")

    def close(self) -> None:
        for conn in self.held.values():
            conn.close()
        self.server.close()


@pytest.fixture
def gate() -> Iterator[Gate]:
    with tempfile.TemporaryDirectory(prefix="scaler-gate-") as directory:
        g = Gate(directory)
        try:
            yield g
        finally:
            g.close()


def quick_or_held(i: int, address: str, held: bool) -> int:
    return held_until_told(i, address) if held else i


def time_as_short(ex: ScalerExecutor, gate: Gate) -> None:
    """Run enough quick tasks that the worker deals this callable several deep per processor."""
    assert [f.result() for f in [ex.submit(quick_or_held, i, gate.address, False) for i in range(300)]] == list(range(300))


def burst_behind_a_held_task(ex: ScalerExecutor, gate: Gate, held_id: int) -> None:
    """One burst of 13 quick tasks and a held one; the quick ones finish while it is held.

    The first goes alone (down the lane), the rest reach the agent in one batch and are
    dealt at once, several behind the held task on its processor: they finish only if
    recalled to the idle one."""
    quick = [ex.submit(quick_or_held, 1, gate.address, False)]
    held = ex.submit(quick_or_held, held_id, gate.address, True)
    quick += [ex.submit(quick_or_held, i, gate.address, False) for i in range(2, 14)]
    gate.wait_started(held_id)
    assert [f.result(timeout=30) for f in quick] == list(range(1, 14))
    assert not held.done()
    gate.release(held_id)
    assert held.result(timeout=30) == held_id


@pytest.mark.timeout(120)
def test_tasks_queued_behind_a_task_that_turned_out_long_are_recalled_to_an_idle_processor(gate: Gate) -> None:
    with ScalerExecutor(max_workers=2, config=fast_config()) as ex:
        time_as_short(ex, gate)
        try:
            burst_behind_a_held_task(ex, gate, 0)
        finally:
            gate.close()
        stats = ex.statistics()
        assert (stats["finished"], stats["failed"], stats["retried"]) == (314, 0, 0)


@pytest.mark.timeout(120)
def test_recalled_tasks_do_not_count_towards_max_tasks_per_child(gate: Gate) -> None:
    """A processor that handed tasks back still runs its whole quota, then is replaced.

    Counted as run, the recalled tasks would bring it to its quota early in the agent's
    books: the agent would send it nothing more, and it would sit idle, never replaced,
    leaving one processor to do the work of two.
    """
    quota = 60
    with ScalerExecutor(max_workers=2, max_tasks_per_child=quota, config=fast_config()) as ex:
        time_as_short(ex, gate)
        try:
            for burst in range(3):  # each burst may recall tasks from the processor holding the gated one
                burst_behind_a_held_task(ex, gate, 200 + burst)
            # Take every processor alive now past its quota, twice over...
            assert len([f.result(timeout=60) for f in [ex.submit(quick_or_held, i, "", False) for i in range(4 * quota)]]) == 4 * quota
            # ...and both processors still take tasks: two gated tasks run at once.
            both = [ex.submit(quick_or_held, i, gate.address, True) for i in (100, 101)]
            gate.wait_started(100)
            gate.wait_started(101)
            gate.release(100)
            gate.release(101)
            assert [f.result(timeout=30) for f in both] == [100, 101]
        finally:
            gate.close()  # whatever failed: held tasks return, so the executor can shut down
