"""A task's reply leaves its processor before the task's arguments and value are freed.

Freeing a large argument or value gives its pages back to the kernel (about 7 ms for
100 MB on the 2-core machine); done before the reply, as it was, it delayed the result
by as much (``docs/security.rst``, "Freed after the reply, faulted in ahead").
``ProcessPoolExecutor``'s workers send the result first too. Checked by order, not by time: the object's finalizer
waits (bounded) until the client has the result and notes whether it came. Freed before
the reply, the finalizer holds the reply back, so the client waits out the bound.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from scaler_testing import wait_until

from scaler_executor import ScalerExecutor

WAIT = 30.0  # the finalizer's bound: far beyond a result's round trip on a loaded machine


class Finalized:
    """Notes in ``note`` whether ``gate`` existed when it was freed (waiting up to WAIT for
    it), in any process but the client's: there a copy is freed at the test's end."""

    def __init__(self, gate: str, note: str, client_pid: int) -> None:
        self.gate, self.note, self.client_pid = gate, note, client_pid

    def __del__(self) -> None:
        if os.getpid() == self.client_pid:
            return
        deadline = time.monotonic() + WAIT
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        Path(self.note).write_text("after the result" if os.path.exists(self.gate) else "before the result")


def takes(value: Finalized) -> int:
    return os.getpid()


def makes(gate: str, note: str, client_pid: int) -> Finalized:
    return Finalized(gate, note, client_pid)


def freed_after_the_result(tmp_path: Path, run: Callable[[str, str], object]) -> str:
    gate, note = str(tmp_path / "result-came"), str(tmp_path / "note")
    run(gate, note)  # raises TimeoutError if the reply waited for the finalizer
    Path(gate).touch()
    assert wait_until(lambda: os.path.exists(note), WAIT), "the object was never freed in the processor"
    return Path(note).read_text()


def test_an_argument_is_freed_after_the_result(fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path) -> None:
    ex = fresh_executor(max_workers=1)

    def run(gate: str, note: str) -> object:
        return ex.submit(takes, Finalized(gate, note, os.getpid())).result(timeout=WAIT / 2)

    assert freed_after_the_result(tmp_path, run) == "after the result"


def test_a_value_is_freed_after_the_result(fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path) -> None:
    ex = fresh_executor(max_workers=1)

    def run(gate: str, note: str) -> object:
        return ex.submit(makes, gate, note, os.getpid()).result(timeout=WAIT / 2)

    assert freed_after_the_result(tmp_path, run) == "after the result"


def test_a_map_chunk_is_freed_after_its_results(fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path) -> None:
    ex = fresh_executor(max_workers=1)

    def run(gate: str, note: str) -> object:
        values = [Finalized(gate, note + str(i), os.getpid()) for i in range(3)]
        return list(ex.map(takes, values, chunksize=3, timeout=WAIT / 2))

    gate, note = str(tmp_path / "result-came"), str(tmp_path / "note")
    run(gate, note)
    Path(gate).touch()
    notes = [Path(note + str(i)) for i in range(3)]
    assert wait_until(lambda: all(p.exists() for p in notes), WAIT), "the chunk's items were never freed"
    assert [p.read_text() for p in notes] == ["after the result"] * 3
