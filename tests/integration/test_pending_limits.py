"""max_pending_tasks end to end, on an embedded cluster: submit blocks (or raises) at the
limit on a user thread, and a done-callback that submits at the limit gets
PendingLimitReached instead of a deadlock."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scaler_testing import Gate, fast_config

from scaler_executor import PendingLimitReached, ScalerExecutor

pytestmark = pytest.mark.timeout(180)
BOUND = 60.0  # a bound on a wait that must end, never a measured time


def gated(gate: str, started_dir: str, value: Any) -> Any:
    """Note that it started, then wait until the file ``gate`` exists."""
    Path(started_dir, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + BOUND
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)
    return value


def echo(x: Any) -> Any:
    return x


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[list[Gate]]:
    made = [Gate(tmp_path / f"gate{i}") for i in range(2)]
    yield made
    for g in made:
        g.open()


def executor(**changes: Any) -> ScalerExecutor:
    return ScalerExecutor(max_workers=2, config=fast_config(max_pending_tasks=2, **changes))


def test_raise_mode_refuses_the_third_task(gates: list[Gate]) -> None:
    gate = gates[0]
    with executor(pending_full="raise") as ex:
        held = [ex.submit(gated, gate.path, gate.started_dir, i) for i in range(2)]
        with pytest.raises(PendingLimitReached, match="max_pending_tasks=2"):
            ex.submit(echo, 3)
        gate.open()
        assert [f.result(timeout=BOUND) for f in held] == [0, 1]
        assert ex.submit(echo, 3).result(timeout=BOUND) == 3


def test_block_mode_waits_for_a_completion(gates: list[Gate]) -> None:
    gate = gates[0]
    with executor() as ex:
        held = [ex.submit(gated, gate.path, gate.started_dir, i) for i in range(2)]
        returned = threading.Event()
        third: list[Any] = []

        def submitter() -> None:
            third.append(ex.submit(echo, 3))
            returned.set()

        thread = threading.Thread(target=submitter)
        thread.start()
        try:
            # No gated task can complete before the gate opens: the submit cannot return.
            assert not returned.is_set()
            assert not any(f.done() for f in held)
            gate.open()
            assert returned.wait(BOUND)
        finally:
            gate.open()
            thread.join(BOUND)
        assert third[0].result(timeout=BOUND) == 3
        assert [f.result(timeout=BOUND) for f in held] == [0, 1]


def test_done_callback_at_the_limit_gets_the_error(gates: list[Gate]) -> None:
    first, second = gates
    with executor() as ex:  # pending_full="block": still, a callback may not wait
        outcomes: list[Any] = []
        called = threading.Event()
        a = ex.submit(gated, first.path, first.started_dir, "a")
        b = ex.submit(gated, second.path, second.started_dir, "b")

        def on_done(_future: Any) -> None:
            try:
                # a is done: one pending (b), so one more fits and the next does not.
                outcomes.append(ex.submit(echo, "c"))
                outcomes.append(ex.submit(echo, "d"))
            except BaseException as exc:  # noqa: BLE001 - recorded for the test
                outcomes.append(exc)
            finally:
                called.set()

        a.add_done_callback(on_done)  # a is gated: it cannot be done yet, so this runs on the client's thread
        first.open()
        assert called.wait(BOUND), "the done-callback never returned (deadlock?)"
        assert isinstance(outcomes[-1], PendingLimitReached), outcomes
        assert "client's own thread" in str(outcomes[-1])
        second.open()
        assert b.result(timeout=BOUND) == "b"
        assert outcomes[0].result(timeout=BOUND) == "c"


def test_a_flood_keeps_the_daemon_within_the_limit() -> None:
    """A submitter that never waits: the daemon never holds more than max_pending_tasks of
    its tasks (plus the few finished ones whose worker's report has not reached it yet),
    and every future completes with its value."""
    limit, n = 200, 3000
    with ScalerExecutor(max_workers=1, config=fast_config(max_pending_tasks=limit)) as ex:
        futures: list[Any] = []
        thread = threading.Thread(target=lambda: futures.extend(ex.submit(echo, i) for i in range(n)))
        thread.start()
        samples = []
        try:
            while thread.is_alive():
                samples.append(ex.statistics(timeout=BOUND)["tasks"])
        finally:
            thread.join(BOUND)
        # The client's count is exact; the daemon's lags it by the results a processor sent
        # straight to the client (REPLY_DIRECT) whose worker's report is still on its way:
        # the client has freed their slots, the daemon still holds them for a moment.
        in_flight_reports = 8
        assert samples and max(samples) <= limit + in_flight_reports, (limit, max(samples))
        assert [f.result(timeout=BOUND) for f in futures] == list(range(n))
