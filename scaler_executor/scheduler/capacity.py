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

from typing import NamedTuple, Protocol, runtime_checkable


@runtime_checkable
class CapacityAdapter(Protocol):
    """The contract between the daemon loop (``scheduler/loop.py``) and an adapter.

    Workers are identified by the process id each reports in its ``Hello``, on the
    daemon's host (the core matches ``Hello.pid`` and ``Hello.hostname`` against
    ``pids()``). Capacity on other hosts comes from worker managers instead, whose
    adapters follow ``manager.adapter.CapacityAdapter`` (docs/managers.rst).
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


# --------------------------------------------------------------------------- several managers
#
# Worker managers (``scaler-worker-manager``, docs/managers.rst) offer capacity from outside
# the daemon. The policy below decides how many workers each should have; the core's manager
# controller (scheduler/managers.py) turns the difference into ScaleWorkers decisions.


class ManagerView(NamedTuple):
    """What the scaling policy sees of one manager."""

    processors: int  # per worker
    resources: dict[str, float]  # each worker's
    tags: frozenset[str]  # each worker's
    minimum: int
    maximum: int
    startup_seconds: float
    held: int  # tasks its connected workers hold now (queued there or running)


class Demand(NamedTuple):
    """Tasks waiting in the daemon with the same needs (no needs: empty resources and tags)."""

    resources: tuple[tuple[str, float], ...]
    tags: tuple[str, ...]
    tasks: int


def fits(view: ManagerView, demand: Demand) -> bool:
    return view.tags.issuperset(demand.tags) and all(view.resources.get(n, 0.0) >= q - 1e-9 for n, q in demand.resources)


def tasks_per_worker(view: ManagerView, demand: Demand) -> int:
    """How many tasks of this kind one of the manager's workers runs at once."""
    n = view.processors
    for name, quantity in demand.resources:
        if quantity > 0:
            n = min(n, int(view.resources.get(name, 0.0) / quantity + 1e-9))
    return max(1, n)


def _surplus(view: ManagerView, demand: Demand) -> tuple[int, float]:
    """How much a manager offers beyond what the demand needs: fewer extras first (CPU work
    does not take the GPU nodes while CPU nodes can have it), then the faster start-up."""
    extra = len(view.tags - set(demand.tags)) + len(set(view.resources) - {n for n, _ in demand.resources})
    return extra, view.startup_seconds


def desired_per_manager(demand: list[Demand], managers: list[ManagerView]) -> list[int]:
    """How many workers each manager (same order) should have now, within its [minimum, maximum].

    Each manager keeps enough workers for the tasks its workers hold. Each kind of waiting
    task goes, most constrained kind first, to the managers whose workers can run it: the one
    offering least beyond what it needs first (then the faster start-up), filled up to its
    maximum before the next is asked. Tasks no manager can run ask for nothing. Like
    ``desired_workers``, scale-up goes to the target in one step and scale-down is decided by
    idle time, not here.
    """
    need = [-(-m.held // max(1, m.processors)) for m in managers]
    order = sorted(demand, key=lambda d: (-len(d.resources) - len(d.tags), d.resources, d.tags))
    for kind in order:
        remaining = kind.tasks
        eligible = sorted((i for i, m in enumerate(managers) if fits(m, kind)), key=lambda i: (_surplus(managers[i], kind), i))
        for i in eligible:
            if remaining <= 0:
                break
            per = tasks_per_worker(managers[i], kind)
            room = managers[i].maximum - need[i]
            if room <= 0:
                continue
            workers = min(room, -(-remaining // per))
            need[i] += workers
            remaining -= workers * per
    return [max(m.minimum, min(m.maximum, n)) for m, n in zip(managers, need, strict=True)]
