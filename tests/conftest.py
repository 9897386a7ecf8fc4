"""Fixtures shared by the whole suite.

* ``executor``: one embedded cluster per test module (2 processors, fast heartbeats).
* ``gate``: a ``scaler_testing.Gate`` in the test's temp dir, opened at the end.
* ``fresh_executor``: a factory for tests that exercise a cluster's lifecycle; every
  executor it made is shut down after the test.
* The package is byte-compiled at session start (see ``pytest_sessionstart``).
* ``@pytest.mark.requires_system(commands=(...), root=...)``: skips a test that lacks a system
  part (``scaler_testing.requires_system``), a failure under ``CI=true``.
* Leak checks: after every module, no child process of the test process may remain,
  no ``scaler-*`` socket directory this run created may be left in the temp dir, and no
  object-store region may outlive the daemon that created it.
"""

from __future__ import annotations

import glob
import os

# The client's lock order is checked in every test (scaler_executor/_locks.py): set before
# the package is imported.
os.environ.setdefault("SCALER_DEBUG_LOCKS", "1")
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from scaler_testing import FAST, Gate, fast_config, missing_system, requires_system, wait_until  # noqa: F401  (re-exported)

from scaler_executor import ScalerExecutor


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the package once, as ``pip install`` would. An editable install under
    PYTHONDONTWRITEBYTECODE (some CI images set it) otherwise compiles every module again in
    every daemon, worker and client process the suite starts."""
    import compileall

    import scaler_executor

    compileall.compile_dir(os.path.dirname(scaler_executor.__file__), quiet=1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires_system(commands=(), root=False): needs these commands on PATH (and root); "
        "skipped without them, a failure under CI=true",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires_system"):
        requires_system(missing_system(tuple(mark.kwargs.get("commands", ())), bool(mark.kwargs.get("root", False))))


def _scaler_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"scaler-{os.getpid()}-*")))


def _orphan_regions() -> list[str]:
    """Object-store regions whose daemon is gone: a daemon that stopped must remove its own."""
    out = []
    for directory in ("/dev/shm", tempfile.gettempdir()):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            parts = name.split("-")
            if len(parts) == 3 and parts[0] == "scaler" and parts[1].isdigit() and len(parts[2]) == 16:
                if not psutil.pid_exists(int(parts[1])):
                    out.append(os.path.join(directory, name))
    return out


def _children() -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module", autouse=True)
def no_leaks() -> Iterator[None]:
    before = _scaler_dirs()
    yield
    # Every executor was shut down by its fixture; shutdown(wait=True) returns after the
    # cluster's processes have exited, so nothing may remain now.
    leftover = _children()
    for p in leftover:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    assert not leftover, f"processes leaked by this module: {[(p.pid, p.cmdline()) for p in leftover]}"
    new_dirs = _scaler_dirs() - before
    assert not new_dirs, f"socket directories leaked by this module: {sorted(new_dirs)}"
    # (Journaled daemons' regions, scalerj-*, are not swept here: one that appeared while
    # this module ran may be another test session's on this machine, kept for its daemon's
    # restart; removing it made that session's restarted daemon lose its objects.  The tests
    # that run journaled daemons remove their own: test_durable.py's Cluster discards them.)
    regions = _orphan_regions()
    for path in regions:
        try:
            os.unlink(path)
        except OSError:
            pass
    assert not regions, f"shared-memory regions outlived their daemon: {regions}"


@pytest.fixture(scope="module")
def executor() -> Iterator[ScalerExecutor]:
    ex = ScalerExecutor(max_workers=2, config=FAST)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def fresh_executor() -> Iterator[Callable[..., ScalerExecutor]]:
    made: list[ScalerExecutor] = []

    def make(*args: Any, **kwargs: Any) -> ScalerExecutor:
        kwargs.setdefault("config", FAST)
        ex = ScalerExecutor(*args, **kwargs)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    """A ``Gate`` (scaler_testing.py) opened at the end whatever happened."""
    g = Gate(tmp_path / "gate")
    yield g
    g.open()  # whatever happened, no gated task waits any longer
