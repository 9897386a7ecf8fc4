"""A task's reply leaves its processor before the task's arguments and value are freed.

Freeing a large argument or value gives its pages back to the kernel (about 7 ms for
100 MB on the 2-core machine); done before the reply, as it was, it delayed the result
by as much (``docs/security.rst``, "Freed after the reply, faulted in ahead").
``ProcessPoolExecutor``'s workers send the result first too. Checked by order, not by
time: the object's finalizer waits (bounded) for the client to say it has the result and
notes whether it did. Freed before the reply, the finalizer holds the reply back, so the
client waits out the bound.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from scaler_testing import wait_until

from scaler_executor import ScalerExecutor

WAIT = 30.0  # the finalizer's bound: far beyond a result's round trip on a loaded machine


class Finalized:
    """Notes in ``note`` whether the client said it had the result when this object was
    freed: it connects to the client's socket ``gate`` and waits up to WAIT for a byte.
    Acts in any process but the client's (there a copy is freed at the test's end)."""

    def __init__(self, gate: str, note: str, client_pid: int) -> None:
        self.gate, self.note, self.client_pid = gate, note, client_pid

    def __del__(self) -> None:
        if os.getpid() == self.client_pid:
            return
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(WAIT)
            try:
                sock.connect(self.gate)
                came = sock.recv(1) == b"!"
            except OSError:  # the bound passed, or the client gave up and closed its socket
                came = False
        Path(self.note).write_text("after the result" if came else "before the result")


def takes(value: Finalized) -> int:
    return os.getpid()


def makes(gate: str, note: str, client_pid: int) -> Finalized:
    return Finalized(gate, note, client_pid)


def freed_after_the_result(tmp_path: Path, run: Callable[[str, str], object], count: int = 1) -> list[str]:
    """Runs ``run(gate, note)`` (it raises TimeoutError if the reply waited for a
    finalizer), then tells the ``count`` finalizers that the result came; their notes."""
    gate, note = str(tmp_path / "gate"), str(tmp_path / "note")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(gate)
        listener.listen(count)
        listener.settimeout(WAIT)
        run(gate, note)
        for _ in range(count):
            connection, _ = listener.accept()  # a finalizer, now or once the object is freed
            with connection:
                connection.sendall(b"!")
    notes = [Path(note + (str(i) if count > 1 else "")) for i in range(count)]
    assert wait_until(lambda: all(p.exists() for p in notes), WAIT), "the object was never freed in the processor"
    return [p.read_text() for p in notes]


def test_an_argument_is_freed_after_the_result(fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path) -> None:
    ex = fresh_executor(max_workers=1)

    def run(gate: str, note: str) -> object:
        return ex.submit(takes, Finalized(gate, note, os.getpid())).result(timeout=WAIT / 2)

    assert freed_after_the_result(tmp_path, run) == ["after the result"]


def test_a_value_is_freed_after_the_result(fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path) -> None:
    ex = fresh_executor(max_workers=1)

    def run(gate: str, note: str) -> object:
        return ex.submit(makes, gate, note, os.getpid()).result(timeout=WAIT / 2)

    assert freed_after_the_result(tmp_path, run) == ["after the result"]


def test_a_map_chunk_is_freed_after_its_results(fresh_executor: Callable[..., ScalerExecutor], tmp_path: Path) -> None:
    ex = fresh_executor(max_workers=1)

    def run(gate: str, note: str) -> object:
        values = [Finalized(gate, note + str(i), os.getpid()) for i in range(3)]
        return list(ex.map(takes, values, chunksize=3, timeout=WAIT / 2))

    assert freed_after_the_result(tmp_path, run, count=3) == ["after the result"] * 3
