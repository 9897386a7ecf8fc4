"""A worker's side of a journaled daemon's restart (docs/durability.rst; protocol/rejoin.py, case d).

A daemon with a journal says so in its Welcome (``journal``, ``grace``, ``token``).  Its
worker then

* keeps every TaskResults message it sent until the daemon says it journaled it
  (``ResultsJournaled``: how many of this worker's TaskResults messages since its Welcome
  it has written), so that a daemon killed before writing one gets it again;
* outlives the daemon's silence, and its own lifeline's end (the embedded cluster's
  workers), for the grace period and the liveness limit after it, instead of discarding
  what it holds;
* answers the restarted daemon's ``Refused(UNKNOWN_PEER)`` with ``Resume(peer_id, token)``
  and, once welcomed again, reports what it holds and what it finished
  (``WorkerReport``), then sends the unacknowledged results again: they are delivered,
  not recomputed.  A daemon that cannot resume it (no journal, or it was forgotten)
  refuses the Resume as not resumable: the worker then joins again empty (case c).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from scaler_executor.protocol import messages as m


class WorkerResume:
    def __init__(self) -> None:
        self.journal = False  # the daemon that welcomed us has a journal
        self.grace = 0.0
        self.peer_id = 0
        self.token = b""
        self.resuming = False  # Resume sent, its Welcome awaited
        self.unacked: deque[m.TaskResults] = deque()  # sent since the Welcome, not journaled yet
        self.acked = 0

    def welcomed(self, message: m.Welcome) -> bool:
        """Take a Welcome; True if it answers our Resume (the caller then sends ``report``)."""
        resumed = self.resuming and message.peer_id == self.peer_id
        self.resuming = False
        self.journal, self.grace = message.journal, message.grace
        self.peer_id, self.token = message.peer_id, message.token
        self.acked = 0
        if not resumed or not self.journal:
            self.unacked.clear()
        return resumed and self.journal

    def sent(self, batch: Iterable[object]) -> None:
        """Messages just handed to the transport (in order): their TaskResults are kept."""
        if self.journal:
            for message in batch:
                if type(message) is m.TaskResults:
                    self.unacked.append(message)

    def journaled(self, count: int) -> None:
        unacked = self.unacked
        while self.acked < count and unacked:
            unacked.popleft()
            self.acked += 1

    def start(self) -> m.Resume | None:
        """The daemon does not know us: the Resume to send, or None (no journal: join again)."""
        if not self.journal or self.resuming:
            return None
        self.resuming = True
        return m.Resume(self.peer_id, self.token)

    def report(self, holding: list[m.TaskAttempt], pending: list[m.TaskResult]) -> list[object]:
        """What follows the resumed Welcome: the report, then every unacknowledged TaskResults
        again (``sent`` keeps them once more as they go).  ``pending``: results not sent yet."""
        again = list(self.unacked)
        self.unacked.clear()
        finished = [m.TaskAttempt(r.task_id, r.attempt) for batch in again for r in batch.results]
        finished += [m.TaskAttempt(r.task_id, r.attempt) for r in pending]
        return [m.WorkerReport(holding, finished), *again]

    def forget(self) -> None:
        """The daemon forgot us (or we joined afresh): nothing of ours is expected any more."""
        self.unacked.clear()
        self.acked = 0
        self.resuming = False

    def silence_limit(self, heartbeat_interval: float, liveness: int) -> float:
        """How long a journaled daemon may be silent before we give up on it: its restart's
        grace period, plus a liveness limit for the restart itself."""
        return self.grace + heartbeat_interval * liveness if self.journal else 0.0
