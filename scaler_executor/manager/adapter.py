"""The capacity-adapter contract for worker managers (``scaler-worker-manager``).

A *worker manager* is a process (role ``manager``) that offers capacity to the daemon and
starts and stops workers on the daemon's scaling decisions. It does so through a
*capacity adapter*: the one piece that knows a kind of infrastructure (local processes,
Slurm jobs, Kubernetes pods, cloud instances). The manager process (``manager/runner.py``)
owns the connection, the credentials and the bookkeeping; the adapter only turns "start
these workers" and "stop these workers" into its infrastructure's calls, and reports what
became of each worker. docs/managers.rst is this contract in prose.

Flow of one worker::

    daemon                    manager process                 adapter
    ScaleWorkers(start=1) ──► name it, make its key ──┐
                          ◄── WorkerKeys(name, public) │
    KeysAdmitted(names)   ──► request([WorkerLaunch]) ─┴──►  REQUESTED (sbatch/Popen)
                                                        ◄──  poll(): PENDING (reason "Priority")
                                                        ◄──  poll(): RUNNING (host, job)
    worker's Hello(name=...) matches the name: the worker is the manager's
    ScaleWorkers(stop=[name]) (drained first) ──────────►   stop([name]): DRAINING → GONE
    WorkerStates ◄── every change, with reason and log tail

Rules every adapter keeps:

* **One thread, no blocking.** The manager calls every method from its one loop thread; a
  method returns in well under a second (``shutdown`` excepted). Slow infrastructure calls
  are throttled inside the adapter (Slurm: one ``squeue`` per interval for all its jobs,
  never one call per job) or run in the adapter's own thread, whose results ``poll`` hands
  over.
* **Names are the identity.** The manager chooses every worker's name
  (``<manager name>-<boot>-<n>``, ``worker_name``; ``AdapterSetup.prefix`` is
  ``<manager name>-``) and the worker says it in its ``Hello``; the daemon matches workers
  to managers by name, never by pid (a job's host and pid are unknown until it runs). An
  adapter must make the worker run ``worker_command(launch)`` (or an equivalent with the
  same ``--name``), and must be able to find its own workers again (``adopt``). The name
  does not say which cluster a worker serves: an adapter whose infrastructure other
  clusters' managers share (Slurm) also records ``AdapterSetup.cluster`` where it names
  its workers, and takes as its own only what carries both, matched whole (Slurm's job
  names: ``manager/slurm.py``).
* **Credentials never leave the worker's hands.** ``WorkerLaunch.credential`` (None on an
  insecure daemon) is that worker's own short-lived key. The adapter hands it to that one
  worker on its standard input (``--credentials-stdin``) or in a file readable only by the
  worker's user and removed when the worker ends; never in a command line, the
  environment, or a file shared by several workers.
* **Every state change is reported once**, by ``poll``, as a ``WorkerReport``; the manager
  forwards them to the daemon. ``PENDING`` workers count as capacity on its way (the daemon
  does not ask for more while they wait), and their ``reason`` is shown in statistics and
  logs. A ``GONE`` report carries why, in words a user can act on, and the tail of the
  worker's log when the worker died before it could say so itself.
* **Stop only what you are told to.** ``stop`` is called with workers the daemon has
  drained (they hold no task) or that never ran. ``shutdown`` stops all of them.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from scaler_executor.security.keys import Credential


class WorkerState(enum.StrEnum):
    """Where a worker is in its life. The values travel on the wire (``WorkerStates``)."""

    REQUESTED = "requested"  # asked of the infrastructure (sbatch/Popen called), no answer yet
    PENDING = "pending"  # accepted, waiting for room (a queued job); ``reason`` says why
    RUNNING = "running"  # its process runs (it may not have connected to the daemon yet)
    DRAINING = "draining"  # being stopped: takes no new tasks, finishing or handing back its own
    GONE = "gone"  # ended; ``reason`` says how (exit code, signal, Slurm state, preemption)


# Transitions an adapter may report (anything may become GONE).
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.REQUESTED: frozenset({WorkerState.PENDING, WorkerState.RUNNING, WorkerState.DRAINING, WorkerState.GONE}),
    WorkerState.PENDING: frozenset({WorkerState.RUNNING, WorkerState.DRAINING, WorkerState.GONE}),
    WorkerState.RUNNING: frozenset({WorkerState.DRAINING, WorkerState.GONE}),
    WorkerState.DRAINING: frozenset({WorkerState.GONE}),
    WorkerState.GONE: frozenset(),
}


@dataclass(frozen=True, slots=True)
class WorkerTemplate:
    """What every worker an adapter starts brings; announced to the daemon (``ManagerOffer``)."""

    processors: int  # processor processes per worker
    resources: dict[str, float] = field(default_factory=dict)  # e.g. {"gpu": 1}
    tags: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """What an adapter tells the manager once, at start (``info()``)."""

    kind: str  # "local", "slurm", ...
    max_workers: int  # the most workers it may run at once (pending ones included)
    startup_seconds: float  # estimate of request → worker connected; the daemon's policy uses it
    where: str = ""  # human-readable: "host h1", "partition gpu on cluster c", ...


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """One worker to start: its name, its own key, and the daemon to join."""

    name: str  # unique, chosen by the manager; the worker's ``--name``
    address: str  # the daemon's address
    credential: Credential | None  # None on an insecure daemon (ipc:// or --insecure)


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """A change in one worker's life, as ``poll`` (or ``adopt``) reports it."""

    name: str
    state: WorkerState
    job: str = ""  # the adapter's handle: a pid ("12345"), a Slurm job id ("4711"), a pod name
    host: str = ""  # where it runs, once known
    reason: str = ""  # PENDING: why it waits ("Resources", "Priority"); GONE: how it ended
    log_tail: str = ""  # GONE before the worker could tell: the last lines of its log
    ends_at: float = 0.0  # wall-clock (time.time()) end of its allocation (walltime), 0 if none
    # GONE because of the infrastructure (preempted, cancelled by an operator, walltime, node
    # failure), not because of what it ran: its tasks' retries are not charged to the tasks.
    infrastructure: bool = False


@runtime_checkable
class CapacityAdapter(Protocol):
    """The six methods a worker manager calls (all from its one thread)."""

    def info(self) -> AdapterInfo:
        """What it can provide. Called once, before anything else."""

    def adopt(self) -> list[WorkerReport]:
        """Workers a previous run of this manager started and left behind, found by their
        names (and, on shared infrastructure, the cluster id): reported as they are now (PENDING/RUNNING) to be kept, or stopped here and
        reported GONE. Called once after ``info``. Without a way to find them, return []."""

    def request(self, launches: list[WorkerLaunch]) -> None:
        """Start these workers (never beyond ``max_workers`` in all: the manager checks) and
        return without waiting for them; each is REQUESTED from now on, and the next
        ``poll`` calls report what follows. A request the infrastructure refuses (bad
        partition, quota) comes back from ``poll`` as GONE with the refusal in ``reason``;
        a refusal that every request will meet may also raise ``AdapterError`` here."""

    def poll(self) -> list[WorkerReport]:
        """State changes since the last call (each change once). Called about every
        heartbeat interval; throttles its infrastructure queries itself."""

    def stop(self, names: list[str]) -> None:
        """Stop these workers (drained by the daemon, or never running): SIGTERM, scancel,
        delete the pod. Their GONE reports follow through ``poll``. Unknown names are ignored."""

    def shutdown(self) -> None:
        """Stop every worker it started and wait (bounded) until they are gone: the manager
        is stopping. Must leave nothing behind (no job in the queue, no process)."""


class AdapterModule(Protocol):
    """How ``scaler-worker-manager --adapter NAME`` finds an adapter: the module
    ``scaler_executor.manager.NAME`` (``local``: ``manager/local_adapter.py``, registered in
    ``ADAPTERS``) has these two functions."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this adapter's own options (``--partition``, ...) to the manager's parser;
        prefix them with the adapter's name where they could clash (``--slurm-account``)."""

    def from_args(self, args: argparse.Namespace, setup: AdapterSetup) -> CapacityAdapter:
        """Build the adapter from the parsed options; raise ``AdapterError`` naming the bad
        option and its fix."""


@dataclass(frozen=True, slots=True)
class AdapterSetup:
    """What the manager gives every adapter it builds."""

    prefix: str  # every worker name starts with it (``<manager name>-``); find your own by it
    max_workers: int
    template: WorkerTemplate  # the processors, resources and tags of each worker
    # Which cluster (daemon) the workers join: ``cluster_id()`` of the daemon's address and
    # key. The worker names carry only the manager's name, which another cluster's manager
    # may share (the default ``manager-HOST`` on one login host); an adapter whose
    # infrastructure several clusters share (Slurm) tells its own by this too. "": unknown.
    cluster: str = ""


CLUSTER_ID_LENGTH = 8  # hex digits: 32 bits, short in a job name, no collision in practice


def cluster_id(address: str, daemon_public_key: str = "") -> str:
    """A short token naming the cluster a manager serves: a hash of the daemon's address as
    the manager was given it and, where security is on, of the daemon's public key (from the
    manager's credential; "" on ipc:// or --insecure).

    It is stable across a manager's restart, which adoption relies on: both inputs come from
    the manager's command line and credential file, not from this run (no random boot token,
    no pid, no time), so the same command line gives the same id. It changes when the
    daemon's address is written differently or its key is made anew; a manager started so
    no longer recognises the workers of its previous run."""
    digest = hashlib.sha256(f"scaler-cluster\0{address}\0{daemon_public_key}".encode())
    return digest.hexdigest()[:CLUSTER_ID_LENGTH]


def new_boot() -> str:
    """A manager run's own token in its workers' names: no name of this run repeats one of a
    previous run."""
    return secrets.token_hex(3)


def worker_name(prefix: str, boot: str, serial: int) -> str:
    """The name of a manager's ``serial``-th worker (from 1) in the run ``boot``:
    ``<manager name>-<boot>-<serial>``."""
    return f"{prefix}{boot}-{serial}"


_WORKER_SUFFIX = re.compile(r"[0-9a-f]{6}-[1-9][0-9]*")  # new_boot()'s 6 hex digits, a serial


def is_worker_of(prefix: str, name: str) -> bool:
    """Whether ``name`` is one of ``worker_name(prefix, ...)``: ``prefix`` and then exactly a
    run's token and a serial.  Never a bare prefix match: manager ``pool``'s workers are
    ``pool-3f9a1c-1``, and ``pool-gpu-3f9a1c-1`` belongs to manager ``pool-gpu``."""
    return name.startswith(prefix) and _WORKER_SUFFIX.fullmatch(name[len(prefix) :]) is not None


# --adapter NAME -> the module implementing AdapterModule.
ADAPTERS = {"local": "scaler_executor.manager.local_adapter", "slurm": "scaler_executor.manager.slurm"}


class AdapterError(Exception):
    """The adapter cannot do what it was asked, with the reason and the fix in the message."""


def worker_command(
    launch: WorkerLaunch,
    template: WorkerTemplate,
    *,
    python: str = sys.executable,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The command line that runs one worker for ``launch``; the credential (if any) is read
    from standard input (``--credentials-stdin``), so the adapter writes
    ``launch.credential.to_line()`` and a newline there. An adapter may wrap it (a job
    script, a container entry point) but keeps its arguments."""
    cmd = [
        python,
        "-m",
        "scaler_executor.cli.worker",
        launch.address,
        "--name",
        launch.name,
        "--processors",
        str(template.processors),
        "--resources",
        ",".join(f"{k}={v:g}" for k, v in sorted(template.resources.items())),
        "--tags",
        ",".join(sorted(template.tags)),
    ]
    cmd.append("--credentials-stdin" if launch.credential is not None else "--insecure")
    return cmd + list(extra)
