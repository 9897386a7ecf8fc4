"""The statistics barrier: a client's snapshot counts every result it has received.

A sequential caller's lane tasks (worker/lanes.py) never pass through the daemon: their
worker tallies their ends and reports them in a ``LaneDone``, which waits up to
``LANE_DONE_LINGER`` for company (one message per 50 ms of round trips instead of a daemon
turn per task).  So when ``ex.statistics()`` is asked right after ``result()`` returned,
the daemon may not have counted that task yet.  The barrier closes the gap exactly:

    client ──StatsRequest(lanes={worker name: lane results received})──► daemon
    daemon: every named worker's LaneDone.clients[client id] >= that count
            (or the worker is gone)?  answer now.  Else hold the request and
    daemon ──LaneFlush──► those workers: a LaneDone now, and the next without waiting
    worker ──LaneDone(clients={client id: lane ends in all})──► daemon: held requests
            that are now covered are answered, in the order each client asked.

Both counts are cumulative (a daemon restarted on its journal learns the worker's from
its next LaneDone), and the worker tallies an end before the client can see its result
(a processor's reply datagram comes before its DONE reaches the agent, but the agent
counts the end when that DONE comes, and the LaneFlush makes the report go then).  A
request is never held longer than ``STATS_BARRIER_SECONDS`` (a worker that hangs without
being lost yet): it is then answered as it stands and counted (``stats_barrier_expired``).

Pure: no I/O, time is an input.  The core (scheduler/core.py) owns one and calls it from
its handlers; ``validate()`` runs inside the core's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scaler_executor.scheduler.state import WorkerRecord

# The longest a client's StatsRequest waits for lane reports: far above a LaneDone's
# linger (50 ms) and a worker's turn, far below a heartbeat liveness period.
STATS_BARRIER_SECONDS = 1.0


@dataclass(slots=True)
class HeldRequest:
    peer: bytes  # the client's
    client_id: int
    wants: dict[bytes, int]  # worker peer -> its LaneDone count of this client's lane ends it must reach
    since: float


class StatsBarrier:
    def __init__(self) -> None:
        self.held: list[HeldRequest] = []  # in the order asked
        self.expired = 0  # requests answered at STATS_BARRIER_SECONDS without their counts

    def ask(
        self, peer: bytes, client_id: int, lanes: Mapping[str, int], workers: Iterable[WorkerRecord], now: float
    ) -> list[bytes] | None:
        """A client's StatsRequest.  None: answer it now.  Else it is held, and the workers
        returned are to be sent a LaneFlush (those it waits for)."""
        wants: dict[bytes, int] = {}
        if lanes:
            by_name = {w.name: w for w in workers if w.name in lanes}
            for name, seen in lanes.items():
                worker = by_name.get(name)
                if worker is not None and worker.lane_ends.get(client_id, 0) < seen:
                    wants[worker.peer] = seen
        if not wants and not any(h.peer == peer for h in self.held):
            return None  # (an earlier request of this client still held: answers go in order)
        self.held.append(HeldRequest(peer, client_id, wants, now))
        return list(wants)

    def release(self, workers: Mapping[bytes, WorkerRecord], now: float) -> list[bytes]:
        """The clients whose held requests are answerable now (once per request, in the
        order asked): their workers' counts caught up, or those workers are gone, or they
        waited STATS_BARRIER_SECONDS."""
        if not self.held:
            return []
        answered: list[bytes] = []
        blocked: set[bytes] = set()  # clients with an earlier request still held
        kept: list[HeldRequest] = []
        for request in self.held:
            if request.peer not in blocked:
                wants = request.wants
                for worker_peer in [p for p, n in wants.items() if (w := workers.get(p)) is None or w.lane_ends.get(request.client_id, 0) >= n]:
                    del wants[worker_peer]
                if not wants or now - request.since >= STATS_BARRIER_SECONDS:
                    if wants:
                        self.expired += 1
                    answered.append(request.peer)
                    continue
            blocked.add(request.peer)
            kept.append(request)
        self.held = kept
        return answered

    def client_lost(self, peer: bytes) -> None:
        if self.held:
            self.held = [h for h in self.held if h.peer != peer]

    def wakeup_at(self) -> float | None:
        """When the oldest held request must be answered anyway."""
        return self.held[0].since + STATS_BARRIER_SECONDS if self.held else None

    def validate(self, clients: Iterable[bytes]) -> None:
        known = set(clients)
        for request in self.held:
            assert request.peer in known, f"a held statistics request of a client that is gone: {request!r}"
