"""Capacity adapters: how the daemon grows and shrinks its pool of workers.

The daemon's core decides *how many* workers it wants (``desired_workers``, a pure policy
over the queue) and *which* to stop (idle ones, drained first); an adapter only carries
that out on some kind of capacity. ``manager.local.LocalWorkerManager`` (worker processes
on the daemon's host) is the one that ships; an adapter for a cluster manager (Slurm,
Kubernetes, ...) implements the same six methods. The daemon's loop calls them from its one
thread, so an adapter needs no locking, and none of them may block the loop for long except
``stop`` (the daemon is stopping then).

The contract lives here, with the loop that calls it, so that the scheduler does not
import ``manager/`` (the adapters implement it; they are a layer above).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CapacityAdapter(Protocol):
    """The contract between the daemon loop (``scheduler/loop.py``) and an adapter.

    Workers are identified by the process id each reports in its ``Hello``, on the
    daemon's host (the core matches ``Hello.pid`` and ``Hello.hostname`` against
    ``pids()``). An adapter whose workers run on other hosts will need that identity to
    carry the host as well: the one change the core needs for it.
    """

    def start(self) -> None:
        """Start the initial workers: the fixed count, or the minimum when autoscaling.
        Called once, before the loop runs; returns without waiting for them to connect."""

    def pids(self) -> frozenset[int]:
        """The workers this adapter runs now (started and not yet reported exited)."""

    def poll(self) -> list[tuple[int, str]]:
        """Workers that ended since the last call, as ``(pid, how)``; ``how`` is shown to
        users in ``WorkerLost`` ("exited with code 1", "killed by SIGKILL", ...). Called
        every tick; must not block. A fixed-size adapter starts replacements here."""

    def start_more(self, count: int) -> None:
        """Autoscaling: start up to ``count`` more workers at once (never beyond the
        adapter's maximum) and return without waiting for them."""

    def stop_some(self, pids: tuple[int, ...]) -> None:
        """Autoscaling: stop these workers, which the core has drained (no task runs on
        them, none will be sent); their ends are reported by ``poll``."""

    def stop(self) -> None:
        """Stop every worker: the daemon is stopping. May wait a grace period, then kill."""
