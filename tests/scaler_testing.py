"""Helpers shared by the tests, in a module with a unique name.

Test modules import these from here, never ``from conftest import ...``: a task function
defined in a test module is pickled by reference, so worker processes import that module,
and the name ``conftest`` may resolve to another directory's conftest.py there.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from scaler_executor import ClusterConfig, ScalerExecutor

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)

# Heartbeats five times as often as the default, but liveness limits that a loaded 2-core CI
# machine still meets (a starved process may be silent for a second or two).
# cancel_wait: how long cancel() waits for the daemon's answer before it says False ("cannot
# know"). The default, 50 ms, is a user's bound; a test that asserts cancel() is True for a
# task the daemon holds asserts that the answer comes, and on a loaded 2-core machine it
# can take longer than 50 ms (seen: 2-8 of 398 sequential cancels returned False).
FAST = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=10.0, cancel_wait=10.0)


def fast_config(**changes: Any) -> ClusterConfig:
    return FAST.replace(**changes)


class Gate:
    """A directory a gated task watches: it notes that it started (a file in ``started_dir``)
    and waits until ``open()`` creates ``path``.  The ``gate`` fixture (conftest.py) opens
    it whatever happened, so no gated task outlives its test."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = str(directory / "open")
        self.started_dir = str(directory / "started")
        os.makedirs(self.started_dir, exist_ok=True)

    def open(self) -> None:
        Path(self.path).touch()

    def started(self) -> int:
        return len(os.listdir(self.started_dir))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (for states only the real clock decides)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def listening_or_exited(proc: Any, port: int) -> Callable[[], bool]:
    """A predicate for ``wait_until``: something accepts on ``127.0.0.1:port``, or ``proc`` exited
    (whose log then says why)."""
    import socket

    def ready() -> bool:
        if proc.poll() is not None:
            return True
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    return ready


# --------------------------------------------------------------------------- system parts


def under_ci() -> bool:
    """CI sets CI=true (.ci/run does too): there every system part must be present."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_system(commands: tuple[str, ...] = (), root: bool = False) -> str | None:
    """Why a test cannot have the system parts it needs (commands on PATH, root), or None."""
    import shutil

    absent = [c for c in commands if shutil.which(c) is None]
    if absent:
        return f"needs {', '.join(absent)} on PATH (install the packages .ci/system-deps lists)"
    if root and os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    return None


def requires_system(reason: str | None) -> None:
    """Skip the running test for a missing system part, named in ``reason`` (None: present).

    Under CI (CI=true) the skip is a failure: CI installs every part (.ci/system-deps), so a
    part missing there is a broken image, not a test to pass over quietly.
    """
    import pytest

    if reason is None:
        return
    if under_ci():
        pytest.fail(f"CI=true and a system part is missing: {reason}; run .ci/system-deps", pytrace=False)
    pytest.skip(reason)




# --------------------------------------------------------------------------- processes


def child_env() -> dict[str, str]:
    """The environment for a script or standalone process a test starts.

    As the embedded cluster does: what imports here imports there (the repository, the
    integration tests' own modules, this process's sys.path); no SCALER_* setting leaks in.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
    paths = [REPO, os.path.join(TESTS, "integration")] + [os.getcwd() if p == "" else p for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    return env


def socket_dir(ex: ScalerExecutor) -> str:
    """The private directory of an embedded cluster (its ipc socket's)."""
    address = ex.address
    assert address.startswith("ipc://"), address
    return os.path.dirname(address[len("ipc://") :])


def daemon_of(ex: ScalerExecutor) -> psutil.Process:
    """The embedded daemon of ``ex``: the child whose command line names ``ex``'s socket directory."""
    directory = socket_dir(ex)
    for p in psutil.Process().children():
        try:
            cmd = p.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "scaler_executor.cli.daemon" in cmd and any(directory in part for part in cmd):
            return p
    raise AssertionError(f"no daemon process found for {ex!r}")


def workers_of(daemon: psutil.Process) -> list[psutil.Process]:
    """Worker agents: the daemon's live children running ``scaler_executor.cli.worker``
    (zygotes and processors share that command line, but they are the agents' descendants)."""
    out = []
    for p in daemon.children():
        try:
            if "scaler_executor.cli.worker" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def mix_lone_submits_and_bursts(ex: ScalerExecutor, echo: Callable[[int], int], join_timeout: float) -> int:
    """Three threads submitting one task at a time (each alone, whenever the others have
    none outstanding) beside one submitting bursts of 100: every result must come back
    once and right.  ``echo`` returns its argument.  Returns how many tasks ran."""
    import threading

    errors: list[str] = []

    def sequential(k: int) -> None:
        for i in range(300):
            got = ex.submit(echo, k * 1000 + i).result(timeout=60)
            if got != k * 1000 + i:
                errors.append(f"sequential {k}: {got} != {k * 1000 + i}")

    def bursts() -> None:
        for r in range(20):
            futures = [ex.submit(echo, 10**6 + r * 100 + i) for i in range(100)]
            for i, f in enumerate(futures):
                if f.result(timeout=60) != 10**6 + r * 100 + i:
                    errors.append(f"burst {r}: item {i} wrong")

    threads = [threading.Thread(target=sequential, args=(k,)) for k in range(3)] + [threading.Thread(target=bursts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=join_timeout)
    assert not any(t.is_alive() for t in threads), "a submitting thread hung"
    assert not errors, errors[:5]
    return 3 * 300 + 20 * 100
