"""How a worker agent deals its tasks to its processors, end to end.

A processor may hold tasks queued behind the one it runs (fewer write and wake-up round
trips for short tasks); a queued task cannot move to a processor that has gone idle.
The depth is chosen per callable, from how long that callable's tasks took on this
worker: tasks of a callable not timed there yet are never dealt up front in a burst, even
right after a run of no-ops has made the worker's recent tasks look short.

Tasks here block on a Unix socket the test holds: a task connects, says its index, and
returns when the test answers (or hangs up), so which tasks have started, and in which
processor's turn, is decided by the test, not by the clock.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from scaler_testing import fast_config

from scaler_executor import ScalerExecutor


def echo(i: int) -> int:
    return i


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


@pytest.mark.timeout(120)
def test_tasks_of_an_untimed_callable_are_not_dealt_up_front_after_short_tasks(gate: Gate) -> None:
    with ScalerExecutor(max_workers=2, config=fast_config()) as ex:
        list(ex.map(echo, range(300)))  # the worker's recent tasks are all short
        stats = ex.statistics()
        assert (stats["workers"], stats["processors"]) == (1, 2)
        futures = [ex.submit(held_until_told, i, gate.address) for i in range(6)]
        try:
            gate.wait_started(0)
            gate.wait_started(1)
            # 0 and 1 run on the two processors.  Each may hold one more task of this
            # untimed callable (2 and 3); 4 and 5 stay with the agent.  Dealt by the
            # worker's recent short tasks instead, each processor held three: 4 behind 0
            # and 2, 5 behind 1 and 3.
            for i in (0, 2, 4):
                gate.release(i)
                gate.wait_started(i + 2 if i < 4 else 5)
            # 5 started on the processor that ran 0, 2 and 4, while 1 still holds the other.
            assert 1 in gate.held and 3 not in gate.held
            for i in (1, 3, 5):
                if i not in gate.held:
                    gate.wait_started(i)
                gate.release(i)
            assert [f.result(timeout=30) for f in futures] == list(range(6))
        finally:
            gate.close()  # tasks still waiting return at once
