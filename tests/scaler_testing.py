"""Helpers shared by the tests, in a module with a unique name.

Test modules import these from here, never ``from conftest import ...``: a task function
defined in a test module is pickled by reference, so worker processes import that module,
and the name ``conftest`` may resolve to another directory's conftest.py there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scaler_executor import ClusterConfig

# Heartbeats five times as often as the default, but liveness limits that a loaded 2-core CI
# machine still meets (a starved process may be silent for a second or two).
FAST = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=10.0)


def fast_config(**changes: Any) -> ClusterConfig:
    return FAST.replace(**changes)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (for states only the real clock decides)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


