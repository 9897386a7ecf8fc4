"""The manager controller: the daemon's side of worker managers (docs/managers.rst).

A worker manager (role ``manager``) joins with ``Hello``, offers capacity (``ManagerOffer``),
and from then on the daemon decides and the manager executes::

    tick ─► desired_per_manager(queue, offers)   (scheduler/capacity.py, pure)
         ─► ScaleWorkers(start=n)                 more workers: the manager names them,
    WorkerKeys(name, public) ◄─                   sends their keys (secure daemons),
         ─► AdmitKeys command, KeysAdmitted        the loop admits them; the manager starts them
    WorkerChanges (requested, pending, running)   capacity on its way: not asked for twice
    worker's Hello(name) ─► linked to its record  tasks flow as to any worker
    idle long enough ─► draining, ScaleWorkers(stop=[name])   scale-down drains first
    worker's WorkerDraining (its job's SIGTERM) ─► draining   its replacement is asked for
    WorkerChange(gone, reason) ─► the worker is lost with that reason; its key withdrawn

This module is part of the pure core: no socket, no clock (time comes in ``now``), no key
material (the loop holds the keys; commands carry public keys only).

Keys are admitted only while their manager is connected, plus ``ORPHAN_SECONDS`` after it
was lost: a manager that restarts within that time adopts its workers (``ManagerOffer.
adopted``); after it, the keys are withdrawn and the security layer expels their workers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.capacity import Demand, ManagerView, desired_per_manager, fits
from scaler_executor.scheduler.state import ConstraintKey, WorkerRecord

if TYPE_CHECKING:
    from scaler_executor.scheduler.core import Scheduler

log = logging.getLogger("scaler_executor.daemon")

# How long a lost manager's workers keep their keys, so that a restarted manager can adopt
# them: long enough for a supervisor (systemd, a shell loop) to restart it, short enough that
# keys of a manager that is gone for good do not linger.
ORPHAN_SECONDS = 60.0
STATES = frozenset({"requested", "pending", "running", "draining", "gone"})
ON_ITS_WAY = frozenset({"requested", "pending"})
MAX_TEXT = 4096  # reason and log tail kept per worker


@dataclass(frozen=True, slots=True)
class AdmitKeys:
    """Command: let these (name, Z85 public key) workers in, with the worker role."""

    manager: str
    keys: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class WithdrawKeys:
    """Command: these public keys let nobody in any more (peers using them are expelled)."""

    public_keys: tuple[str, ...]


@dataclass(eq=False)
class ManagedWorker:
    name: str
    manager: str  # the manager's name: its owner across the manager's reconnects
    state: str
    since: float
    job: str = ""
    host: str = ""
    reason: str = ""
    ends_at: float = 0.0
    public_key: str = ""
    peer: bytes | None = None  # its connection, once it joined
    stopping: bool = False  # ScaleWorkers(stop) sent
    # Tasks whose attempt failed when this worker was lost before its manager said why
    # (id, index of the attempt's line): the manager's "gone" report completes those lines.
    failed_here: list[tuple[int, int]] = field(default_factory=list)


@dataclass(eq=False)
class ManagerRecord:
    peer: bytes
    manager_id: int
    name: str
    last_seen: float
    offer: m.ManagerOffer | None = None
    asked: int = 0  # workers asked for (ScaleWorkers.start) and not named yet
    surplus_since: float | None = None

    def __repr__(self) -> str:
        kind = self.offer.kind if self.offer else "no offer yet"
        return f"<Manager {self.name} id={self.manager_id} {kind}>"


class ManagerController:
    def __init__(self, core: Scheduler) -> None:
        self.core = core
        self.managers: dict[bytes, ManagerRecord] = {}
        self.workers: dict[str, ManagedWorker] = {}  # by worker name
        self.orphaned: dict[str, float] = {}  # manager name -> when it was lost
        # What each manager's infrastructure cost (by name, kept while the daemon runs):
        # workers it reported ended by the infrastructure (preemption, walltime, scancel),
        # and tasks interrupted on its workers and run again at no charge to their retries.
        self.ended: dict[str, int] = {}
        self.interrupted: dict[str, int] = {}
        # For the snapshot, also by name and kept while the daemon runs: workers that ended
        # on their own (not asked to stop, not the infrastructure), each manager's last
        # error (when, what), and its adapter's kind and size from its last offer.
        self.failed: dict[str, int] = {}
        self.last_error: dict[str, tuple[float, str]] = {}
        self.offered: dict[str, tuple[str, int]] = {}

    def _refuse(self, peer: bytes, what: str, why: str) -> None:
        """Counted and logged like any refusal, and told to the manager: its operator acts on it."""
        self.core._refuse(peer, what, why)
        self.core._send(peer, m.Refused(why))
        if (record := self.managers.get(peer)) is not None:
            self.last_error[record.name] = (self.core._now, f"refused ({what}): {why}")

    # ------------------------------------------------------------------ managers

    def join(self, peer: bytes, manager_id: int, name: str, now: float) -> None:
        for old in [r for r in self.managers.values() if r.name == name]:
            # A restarted manager (killed, its silence not noticed yet) takes over its workers;
            # two live managers with one name would own each other's: the name must be unique.
            log.warning("manager %r joined again on a new connection: the old one is dropped (give each manager its own --name)", name)
            self.lose(old.peer, "replaced by a new connection with its name", now)
        self.managers[peer] = ManagerRecord(peer, manager_id, name, now)
        self.orphaned.pop(name, None)
        log.info("manager %r joined", name)

    def lose(self, peer: bytes, why: str, now: float) -> None:
        record = self.managers.pop(peer, None)
        if record is None:
            return
        mine = [w for w in self.workers.values() if w.manager == record.name]
        log.warning("manager %r lost: %s; its %d worker(s) keep their keys for %.0f s", record.name, why, len(mine), ORPHAN_SECONDS)
        if mine:
            self.orphaned[record.name] = now
        else:
            self._drop_if_forgotten(record.name)

    def _drop_if_forgotten(self, name: str) -> None:
        """A manager that is gone and cost nothing the snapshot keeps (no worker, no failure,
        infrastructure end or interrupted task: one known only by a refusal or an offer) leaves
        no trace under its name: neither its last error nor its offer stays behind, to grow
        with every name that ever connected or to greet a later manager of that name."""
        if any(r.name == name for r in self.managers.values()) or name in self.orphaned:
            return
        if name in self.ended or name in self.interrupted or name in self.failed:
            return  # its costs are kept while the daemon runs, and it stays listed with them
        if any(w.manager == name for w in self.workers.values()):
            return
        self.last_error.pop(name, None)
        self.offered.pop(name, None)

    def on_offer(self, peer: bytes, offer: m.ManagerOffer) -> None:
        record = self.managers[peer]
        if offer.processors < 1 or offer.max_workers < 0 or not 0 <= offer.min_workers <= offer.max_workers:
            self._refuse(peer, "manager-offer", f"offer of {offer.max_workers} workers of {offer.processors} processors is not valid")
            return
        record.offer = offer
        record.asked = 0
        self.offered[record.name] = (offer.kind[:64], offer.max_workers)
        kept = set(offer.adopted)
        for worker in [w for w in self.workers.values() if w.manager == record.name and w.name not in kept]:
            self._forget(worker, "its manager restarted without it")
        log.info(
            "manager %r offers up to %d %s worker(s) of %d processors%s%s (%s, ~%.0f s to start)",
            record.name, offer.max_workers, offer.kind, offer.processors,
            "".join(f", {k}={v:g}" for k, v in sorted(offer.resources.items())),
            f", tags {','.join(offer.tags)}" if offer.tags else "", offer.where, offer.startup_seconds,
        )  # fmt: skip

    def on_keys(self, peer: bytes, message: m.WorkerKeys) -> None:
        record = self.managers[peer]
        cap = 2 * (record.offer.max_workers if record.offer else 0)
        admitted = []
        for key in message.keys:
            if sum(1 for w in self.workers.values() if w.manager == record.name and w.public_key) >= cap:
                self._refuse(peer, "worker-keys", f"manager {record.name!r} asked for more than {cap} worker keys")
                break
            worker = self._claim(record, key.name)
            if worker is None:
                continue
            if worker.public_key and worker.public_key != key.public_key:
                self.core._commands.append(WithdrawKeys((worker.public_key,)))
            worker.public_key = key.public_key
            admitted.append((key.name, key.public_key))
        if admitted:
            self.core._commands.append(AdmitKeys(record.name, tuple(admitted)))
        self.core._send(peer, m.KeysAdmitted([name for name, _ in admitted]))

    def on_changes(self, peer: bytes, message: m.WorkerStates) -> None:
        record = self.managers[peer]
        for change in message.changes:
            if change.state not in STATES:
                self._refuse(peer, "worker-state", f"unknown worker state {change.state[:32]!r}")
                continue
            worker = self._claim(record, change.name)
            if worker is None:
                continue
            self._apply(worker, change)

    def _claim(self, record: ManagerRecord, name: str) -> ManagedWorker | None:
        """The record of ``name``, made if new: names belong to the manager whose prefix they carry."""
        worker = self.workers.get(name)
        if worker is None:
            if not name.startswith(record.name + "-") or len(name) > 200:
                self._refuse(record.peer, "worker-name", f"worker name {name[:64]!r} does not start with {record.name + '-'!r}")
                return None
            worker = self.workers[name] = ManagedWorker(name, record.name, "requested", self.core._now)
            record.asked = max(0, record.asked - 1)
        elif worker.manager != record.name:
            self._refuse(record.peer, "worker-name", f"worker {name[:64]!r} belongs to manager {worker.manager!r}")
            return None
        return worker

    def _apply(self, worker: ManagedWorker, change: m.WorkerChange) -> None:
        previous, previous_reason = worker.state, worker.reason
        if worker.peer is None or change.state in ("draining", "gone"):
            worker.state = change.state  # a connected worker is running whatever its job says
        worker.job, worker.host = change.job[:200] or worker.job, change.host[:200] or worker.host
        worker.reason, worker.ends_at = change.reason[:MAX_TEXT], change.ends_at
        worker.since = self.core._now
        if change.state == "pending" and (previous != "pending" or previous_reason != worker.reason):
            log.info("worker %r (job %s) pending: %s", worker.name, worker.job or "?", worker.reason or "no reason given")
        if change.state != "gone":
            return
        text = f"manager {worker.manager}" + (f": job {worker.job} on {worker.host or '?'}" if worker.job else "")
        text += f": {worker.reason or 'ended'}"
        for task_id, line in worker.failed_here:  # lost before this report: say now what ended it
            task = self.core.tasks.get(task_id)
            if task is not None and task.failures is not None and line < len(task.failures):
                task.failures[line] = f"{task.failures[line]} ({text})"
        if change.log_tail:
            text += "; its log ends:\n" + change.log_tail[-MAX_TEXT:]
        (log.info if worker.stopping and not change.infrastructure else log.warning)("managed worker %r gone: %s", worker.name, text)
        connected = self.core.workers.get(worker.peer) if worker.peer is not None else None
        self._forget(worker, "")
        if change.infrastructure:
            self.ended[worker.manager] = self.ended.get(worker.manager, 0) + 1
        elif not worker.stopping:
            self.failed[worker.manager] = self.failed.get(worker.manager, 0) + 1
            self.last_error[worker.manager] = (self.core._now, f"worker {worker.name} gone: {text}"[:MAX_TEXT])
        if connected is not None:
            self.core._lose_worker(connected, text, infrastructure=change.infrastructure, manager=worker.manager)

    def failed_on(self, worker: WorkerRecord, failed: list[tuple[int, int]]) -> None:
        """Tasks whose attempt failed as ``worker`` was lost (not in order, no report yet)."""
        managed = self.workers.get(worker.name)
        if managed is not None and failed:
            managed.failed_here = failed

    def manager_of(self, worker: WorkerRecord) -> str:
        """The name of the manager that runs this connected worker, or ""."""
        managed = self.workers.get(worker.name)
        return managed.manager if managed is not None and managed.peer == worker.peer else ""

    def charge(self, manager: str, interrupted: int) -> None:
        """Tasks interrupted on a manager's worker and run again: the manager's cost, not theirs."""
        self.interrupted[manager] = self.interrupted.get(manager, 0) + interrupted

    def _forget(self, worker: ManagedWorker, why: str) -> None:
        del self.workers[worker.name]
        if worker.public_key:
            self.core._commands.append(WithdrawKeys((worker.public_key,)))
        if why:
            log.info("forgot managed worker %r: %s", worker.name, why)

    # ------------------------------------------------------------------ workers joining and leaving

    def worker_joined(self, worker: WorkerRecord) -> None:
        managed = self.workers.get(worker.name)
        if managed is None:
            return
        managed.peer = worker.peer
        if managed.state in ON_ITS_WAY:
            managed.state = "running"
        if managed.stopping:
            worker.draining = True  # it was cancelled before it came: no task for it

    def worker_draining(self, worker: WorkerRecord) -> None:
        """A managed worker drains by itself (WorkerDraining: its job's SIGTERM came, at its
        walltime drain or from ``scancel``): counted out of its manager's active workers at
        once, so that its replacement starts while it finishes, even before the manager's
        own report says so."""
        managed = self.workers.get(worker.name)
        if managed is not None and managed.peer == worker.peer:
            managed.state = "draining"

    def worker_left(self, worker: WorkerRecord) -> None:
        managed = self.workers.get(worker.name)
        if managed is None or managed.peer != worker.peer:
            return
        managed.peer = None
        if not any(r.name == managed.manager for r in self.managers.values()):
            self._forget(managed, "it left while its manager was away")

    def job_of(self, worker: WorkerRecord) -> str:
        """``manager m1: job 4711 on node-3`` for a connected managed worker whose manager
        reported its job, else ``""``: what names the job when the worker leaves first."""
        managed = self.workers.get(worker.name)
        if managed is None or managed.peer != worker.peer or not managed.job:
            return ""
        return f"manager {managed.manager}: job {managed.job} on {managed.host or '?'}"

    def can_fit(self, key: ConstraintKey) -> bool:
        """Could some manager's workers run tasks with these needs?"""
        demand = Demand(key[0], key[1], 1)
        return any(r.offer is not None and r.offer.max_workers > 0 and fits(_view(r.offer, 0), demand) for r in self.managers.values())

    # ------------------------------------------------------------------ scaling

    def tick(self, now: float) -> None:
        for name, since in list(self.orphaned.items()):
            if now - since >= ORPHAN_SECONDS:
                del self.orphaned[name]
                for worker in [w for w in self.workers.values() if w.manager == name]:
                    self._forget(worker, f"its manager {name!r} has been gone for {ORPHAN_SECONDS:.0f} s")
                self._drop_if_forgotten(name)
        offered = [r for r in self.managers.values() if r.offer is not None]
        if offered:
            self._scale(offered, now)

    def _demand(self) -> list[Demand]:
        core = self.core
        demand = [Demand((), (), core.ready.live)] if core.ready.live else []
        demand += [Demand(key[0], key[1], q.live) for key, q in core.constrained.items() if q.live]
        return demand

    def _scale(self, offered: list[ManagerRecord], now: float) -> None:
        core = self.core
        views = []
        for r in offered:
            assert r.offer is not None
            held = sum(
                len(core.workers[w.peer].inflight)
                for w in self.workers.values()
                if w.manager == r.name and w.peer is not None and w.peer in core.workers
            )
            views.append(_view(r.offer, held))
        for record, want in zip(offered, desired_per_manager(self._demand(), views), strict=True):
            self._scale_one(record, want, now)

    def _scale_one(self, record: ManagerRecord, want: int, now: float) -> None:
        assert record.offer is not None
        mine = [w for w in self.workers.values() if w.manager == record.name]
        active = [w for w in mine if w.state != "draining" and not w.stopping]
        have = len(active) + record.asked
        if want > have:
            record.surplus_since = None
            count = min(want - have, record.offer.max_workers - len(mine) - record.asked)
            if count > 0:
                record.asked += count
                log.info("scaling up: asking manager %r for %d worker(s)", record.name, count)
                self.core._send(record.peer, m.ScaleWorkers(count, []))
            return
        if want == have:
            record.surplus_since = None
            return
        if record.surplus_since is None:
            record.surplus_since = now
        idle = self.core.config.scale_down_idle
        if now - record.surplus_since < idle:
            return
        surplus = have - want
        # Workers not running yet go first: cancelling a queued job loses nothing.
        stop = [w for w in active if w.state in ON_ITS_WAY and w.peer is None][:surplus]
        connected = [
            (self.core.workers[w.peer], w) for w in active if w.peer is not None and w.peer in self.core.workers
        ]
        for worker, managed in sorted(connected, key=lambda pair: pair[0].idle_since):
            if len(stop) >= surplus:
                break
            if not worker.inflight and now - worker.idle_since >= idle:
                worker.draining = True  # no task may land on it between this decision and its end
                stop.append(managed)
        if stop:
            for managed in stop:
                managed.stopping = True
            log.info("scaling down: asking manager %r to stop %d worker(s)", record.name, len(stop))
            self.core._send(record.peer, m.ScaleWorkers(0, [w.name for w in stop]))

    # ------------------------------------------------------------------ observability

    def statistics(self) -> dict[str, int | float | str]:
        states: dict[str, int] = {}
        for w in self.workers.values():
            states[w.state] = states.get(w.state, 0) + 1
        snapshot: dict[str, int | float | str] = {"managers": len(self.managers)}
        snapshot.update({f"managed_{state}": n for state, n in states.items()})
        return snapshot

    def manager_stats(self, now: float) -> list[m.ManagerStat]:
        """Each manager connected or heard of (its workers, ends, errors are kept by name), by name.

        O(managers + managed workers): built only for a snapshot."""
        connected = {r.name: r for r in self.managers.values()}
        by_manager: dict[str, list[ManagedWorker]] = {}
        for w in self.workers.values():
            by_manager.setdefault(w.manager, []).append(w)
        names = set(connected) | set(self.orphaned) | set(self.ended) | set(self.interrupted) | set(self.failed)
        out = []
        for name in sorted(names | set(by_manager)):
            record = connected.get(name)
            mine = by_manager.get(name, [])
            states = {state: sum(1 for w in mine if w.state == state) for state in STATES}
            reasons = sorted({w.reason for w in mine if w.state == "pending" and w.reason})
            kind, max_workers = self.offered.get(name, ("", 0))
            when, error = self.last_error.get(name, (now, ""))
            out.append(
                m.ManagerStat(
                    name, kind, record is not None, max_workers, states["requested"] + (record.asked if record else 0),
                    states["pending"], states["running"], states["draining"], self.failed.get(name, 0),
                    sum(1 for w in mine if w.public_key and w.peer is None), "; ".join(reasons)[:MAX_TEXT], error,
                    max(0.0, now - when) if error else -1.0, self.ended.get(name, 0), self.interrupted.get(name, 0),
                )
            )
        return out

    def validate(self) -> None:
        names = [r.name for r in self.managers.values()]
        assert len(names) == len(set(names)), f"two managers share a name: {names}"
        listed = set(names) | set(self.orphaned) | set(self.ended) | set(self.interrupted) | set(self.failed)
        listed |= {w.manager for w in self.workers.values()}
        kept = set(self.last_error) | set(self.offered)
        assert kept <= listed, f"kept for managers the snapshot does not list: {sorted(kept - listed)}"
        for worker in self.workers.values():
            assert worker.state in STATES and worker.state != "gone", f"{worker.name} recorded as {worker.state}"
            if worker.peer is not None:
                joined = self.core.workers.get(worker.peer)
                assert joined is not None and joined.name == worker.name, f"{worker.name} linked to a peer that is not it"


def _view(offer: m.ManagerOffer, held: int) -> ManagerView:
    return ManagerView(
        offer.processors, dict(offer.resources), frozenset(offer.tags), offer.min_workers, offer.max_workers,
        offer.startup_seconds, held,
    )  # fmt: skip
