"""Watching a cluster: a read-only monitor connection (``Monitor``) and ``scaler-top``.

    from scaler_executor.monitor import Monitor

    with Monitor("tcp://scheduler:8786", credentials="mon.cred") as mon:
        stats = mon.snapshot()          # a scaler_executor.Statistics
        print(stats["tasks"], [w.load for w in stats.workers])
"""

from __future__ import annotations

from scaler_executor.monitor.client import Monitor, MonitorRefused

__all__ = ["Monitor", "MonitorRefused"]
