"""A client's side of a journaled daemon's restart (docs/durability.rst; protocol/rejoin.py, case d).

A daemon with a journal says so in its Welcome (``journal``, ``grace``, ``token``).  Its
client then

* keeps every task it submitted until the daemon acknowledges it (SubmitAck, sent only
  once the task is journaled; a sequential caller's ``REPLY_DIRECT`` task too, with its
  flag): ``ClientCore.sent_unacked`` (client/state.py);
* acknowledges the results it receives (``ResultsAck``: how many TaskResults messages
  since its Welcome), so that the daemon forgets the copies it journaled for redelivery;
* waits for its daemon through silence and refused connections for the grace period
  (plus a liveness limit) instead of failing its futures;
* answers the restarted daemon's ``Refused(UNKNOWN_PEER)`` with ``Resume(peer_id, token)``
  and, once welcomed again, reports the futures it awaits, its callables and options, and
  the unacknowledged submissions (``ClientReport``).  Nothing else changes for the user: a
  thread waiting in ``result()`` sees a delay.  A Resume the daemon cannot honour fails the
  futures with DaemonLost (case c);
* says in that report what it did while its daemon was down, whose messages went nowhere:
  the callables and objects it released are missing from what it holds, and the cancels
  it asked (without an answer, or with force) are listed; the restarted daemon releases,
  cancels and forgets accordingly (scheduler/reconcile.py) and answers the cancels.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.rejoin import JOURNAL_FULL

if TYPE_CHECKING:
    from scaler_executor.client.state import ClientCore

FORCED_PRUNE = 4096  # force-cancelled task numbers kept before those no longer outstanding are dropped
RESUME_AGAIN = 1.0  # seconds before a Resume that got no answer is sent again (its daemon died again)
ACK_EVERY = 64  # TaskResults messages received before an acknowledgement goes without waiting


class ClientResume:
    def __init__(self) -> None:
        self.journal = False
        self.grace = 0.0
        self.peer_id = 0
        self.token = b""
        self.resuming = False
        self.resumed_at = 0.0  # when the Resume was sent
        self.received = 0  # TaskResults messages since the last Welcome
        self.acked = 0  # the count our last ResultsAck said
        self.acked_at = 0.0
        self.restarts = 0  # resumes, for the logs
        # Task numbers cancelled with force (FORCE_CANCEL gets no answer): named again in the
        # report, since the request may have gone to a daemon that was down.  Pruned to the
        # outstanding tasks at each report and whenever it grows past FORCED_PRUNE.
        self.forced: set[int] = set()

    def welcomed(self, message: m.Welcome) -> bool:
        """Take a Welcome; True if it answers our Resume (the caller then sends ``report``)."""
        resumed = self.resuming and message.peer_id == self.peer_id and message.journal
        self.resuming = False
        self.journal, self.grace = message.journal, message.grace
        self.peer_id, self.token = message.peer_id, message.token
        self.received = self.acked = 0
        if resumed:
            self.restarts += 1
        return resumed

    def start(self, now: float) -> m.Resume:
        self.resuming = True
        self.resumed_at = now
        return m.Resume(self.peer_id, self.token)

    def again_due(self, now: float) -> bool:
        return self.resuming and now - self.resumed_at >= RESUME_AGAIN

    def ack_due(self, now: float, interval: float) -> bool:
        """A ResultsAck to send now: many results since the last, or some and a while."""
        unacked = self.received - self.acked
        return unacked > 0 and (unacked >= ACK_EVERY or now - self.acked_at >= interval)

    def ack(self, now: float) -> m.ResultsAck:
        self.acked, self.acked_at = self.received, now
        return m.ResultsAck(self.received)

    def acknowledged(self, retained: deque[m.TaskSpec], count: int) -> None:
        """A SubmitAck: the daemon journaled ``count`` more of our submissions, in order
        (a sequential caller's ``REPLY_DIRECT`` ones too, though their results come
        straight from a processor and often before the acknowledgement)."""
        for _ in range(min(count, len(retained))):
            retained.popleft()

    def refused(self, core: ClientCore, results: list[m.TaskResult]) -> bool:
        """Submissions the daemon refused because its journal could not be written: never
        acknowledged, they leave what we keep to send again (their futures fail).  True if
        the message holds only such refusals (the daemon sent it without keeping it: it is
        not counted in our ResultsAck)."""
        gone = {
            r.task_id for r in results
            if r.status == m.Status.REJECTED and r.payload.startswith(JOURNAL_FULL.encode())
        }
        retained = core.sent_unacked
        if gone and retained is not None:
            kept = [spec for spec in retained if spec.task_id not in gone]
            core.unacked -= len(retained) - len(kept)
            retained.clear()
            retained.extend(kept)
        return bool(gone) and len(gone) == len(results)

    def silence_limit(self, heartbeat_interval: float) -> float:
        """How long a journaled daemon may be silent, or refuse connections, before its
        futures fail: its restart's grace period, plus two of its heartbeats."""
        return self.grace + 2 * heartbeat_interval if self.journal else 0.0

    def force_cancelled(self, core: ClientCore, n: int) -> None:
        """(Under a journaled daemon) task ``n`` was cancelled with force: kept for the report."""
        forced = self.forced
        forced.add(n)
        if len(forced) > FORCED_PRUNE:
            self.forced = {k for k in forced if k in core.records}

    def report(self, core: ClientCore) -> m.ClientReport:
        """(Under the agent's lock) what the restarted daemon needs from us.

        State, not the messages we sent: what we sent while the daemon was down went nowhere
        (or to the restarted daemon, which refused it before our Resume).  So the report says
        which callables we hold and which objects (what we released is not in it), which
        tasks we await (any other task of ours the daemon has is not wanted), and which of
        them we asked to cancel without an answer (``record.cancel`` is cleared by the
        answer, TasksCancelled, or the task's end) or cancelled with force."""
        from scaler_executor.client.state import SENT

        base = core.base
        records = core.records
        awaiting = [base | n for n, record in records.items() if record.where is SENT]
        cancels = [base | n for n, record in records.items() if record.where is SENT and record.cancel is not None]
        self.forced = {n for n in self.forced if (record := records.get(n)) is not None and record.where is SENT}
        forced = [base | n for n in sorted(self.forced)]
        functions = [m.FunctionBlob(base | fn_id, payload) for fn_id, payload in core.fn_payloads.items()]
        options = [m.RegisterOptions(options_id, options) for options_id, options in core.option_records.items()]
        tasks = list(core.sent_unacked or ())
        objects = [object_id for object_id, count in core.holds.items() for _ in range(count)]
        return m.ClientReport(awaiting, functions, options, tasks, objects, cancels, forced)
