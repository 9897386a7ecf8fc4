"""The peers' side of a journaled daemon's restart (worker/resume.py, client/resume.py),
driven with plain calls: what they keep, what they report, when they ask to resume."""

from __future__ import annotations

from collections import deque

from scaler_executor.client.resume import ClientResume
from scaler_executor.client.state import ClientCore
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.rejoin import JOURNAL_FULL, is_not_resumable
from scaler_executor.worker.resume import WorkerResume

JOURNALED = m.Welcome(7, 0.5, 10, "", True, 30.0, b"secret")
PLAIN = m.Welcome(7, 0.5, 10, "")


def result(task_id: int, attempt: int = 0) -> m.TaskResult:
    return m.TaskResult(task_id, attempt, Status.OK, b"v", m.NO_FACTS, [])


def test_a_worker_keeps_results_until_journaled_and_reports_them_after_a_restart() -> None:
    resume = WorkerResume()
    assert not resume.welcomed(JOURNALED)
    first, second = m.TaskResults([result(1)]), m.TaskResults([result(2), result(3, 1)])
    resume.sent([first, m.Heartbeat(0, 0), second])
    resume.journaled(1)
    assert list(resume.unacked) == [second]
    assert resume.start() == m.Resume(7, b"secret")
    assert resume.start() is None  # one Resume per restart
    assert resume.welcomed(JOURNALED)  # the answer to it
    report = resume.report([m.TaskAttempt(4, 0)], [result(5)])
    assert report[0] == m.WorkerReport([m.TaskAttempt(4, 0)], [m.TaskAttempt(2, 0), m.TaskAttempt(3, 1), m.TaskAttempt(5, 0)])
    assert report[1:] == [second]  # sent again: delivered, not recomputed
    assert resume.silence_limit(0.5, 10) == 35.0


def test_a_worker_of_a_daemon_without_a_journal_keeps_nothing_and_never_resumes() -> None:
    resume = WorkerResume()
    resume.welcomed(PLAIN)
    resume.sent([m.TaskResults([result(1)])])
    assert not resume.unacked
    assert resume.start() is None
    assert resume.silence_limit(0.5, 10) == 0.0


def test_a_client_reports_what_it_awaits_holds_and_never_had_acknowledged() -> None:
    resume = ClientResume()
    resume.welcomed(JOURNALED)
    core = ClientCore(window=100)
    core.base = 7 << m.TASK_ID_BITS
    core.sent_unacked = deque([m.TaskSpec(core.base | 1, 0, 0, 0, b"p", [], [], 0)])
    core.holds = {b"o" * 16: 2}
    assert resume.start(10.0) == m.Resume(7, b"secret")
    assert not resume.again_due(10.5) and resume.again_due(11.0)
    report = resume.report(core)
    assert report.tasks == list(core.sent_unacked) and report.objects == [b"o" * 16] * 2
    assert resume.welcomed(JOURNALED)


def test_a_client_forgets_submissions_the_daemon_refused_for_its_full_journal() -> None:
    core = ClientCore(window=100)
    core.sent_unacked = deque(m.TaskSpec(n, 0, 0, 0, b"", [], [], 0) for n in (1, 2, 3))
    core.unacked = 3
    full = m.TaskResult(2, 0, Status.REJECTED, f"{JOURNAL_FULL}: journal /j is full".encode(), m.NO_FACTS, [])
    other = m.TaskResult(3, 0, Status.REJECTED, b"options record 9 was never registered", m.NO_FACTS, [])
    assert not ClientResume().refused(core, [full, other])  # a mixed message: a daemon's, counted
    assert [s.task_id for s in core.sent_unacked] == [1, 3] and core.unacked == 2
    assert ClientResume().refused(core, [full])  # refusals only (SendNow): not counted


def test_not_resumable_is_an_unknown_peer_refusal() -> None:
    assert is_not_resumable("unknown peer: not resumable: this daemon has no journal")
    assert not is_not_resumable("unknown peer: send Hello first (was the daemon restarted?)")


def test_a_client_reports_what_it_released_cancelled_and_cancelled_with_force_while_its_daemon_was_down() -> None:
    """State, not messages: what it released is missing from what it holds; cancels asked
    and not answered, and forced ones of tasks still outstanding, are listed."""
    from scaler_executor.client.state import SENT, UNSENT

    resume = ClientResume()
    resume.welcomed(JOURNALED)
    core = ClientCore(window=100)
    core.base = base = 7 << m.TASK_ID_BITS
    sent = [core.new_task(None, SENT, 0.0) for _ in range(4)]
    unsent = core.new_task(None, UNSENT, 0.0)
    core.fn_payloads = {1: b"kept"}  # fn 2 was released (release_function pops it)
    core.holds = {b"k" * 16: 1}  # b"r" * 16 was released (the drain counted it down)
    sent[0].cancel = object()  # asked, no answer yet
    resume.force_cancelled(core, sent[1].n)
    resume.force_cancelled(core, unsent.n)  # (not at the daemon: not reported)
    resume.force_cancelled(core, 99)  # gone already: pruned
    report = resume.report(core)
    assert report.awaiting == [base | r.n for r in sent]
    assert report.cancels == [base | sent[0].n]
    assert report.forced == [base | sent[1].n]
    assert [f.fn_id for f in report.functions] == [base | 1] and report.objects == [b"k" * 16]
    assert resume.forced == {sent[1].n}


def test_requests_unanswered_when_the_daemon_died_are_asked_again_once_after_the_resume() -> None:
    """ex.statistics(), ex.report() and a fetch through the daemon during an outage: their requests went to a dead
    daemon (or were refused before the Resume); the resumed Welcome asks again, after the
    report, each once (taken out of the outbox), and an answered one is not asked again."""
    from scaler_executor.client.events import Answered, Posted, SendToDaemon, Tick, Welcomed
    from scaler_executor.client.state import FETCH_OBJECTS, HISTORY, STATS

    core = ClientCore(window=100)
    core.handle(Welcomed(JOURNALED, 0.5))
    for kind in (STATS, STATS, HISTORY):
        core.handle(Posted(kind, None))
    [sent] = [c for c in core.handle(Tick(1.0)) if type(c) is SendToDaemon]
    assert [type(x) for x in sent.messages] == [m.StatsRequest, m.StatsRequest, m.HistoryRequest]
    core.handle(Answered(STATS))  # the first was answered before the daemon died
    core.handle(Posted(STATS, None))  # asked during the outage: still in the outbox
    core.handle(Posted(FETCH_OBJECTS, [b"o" * 16]))
    core.resume.start(2.0)
    commands = core.handle(Welcomed(JOURNALED, 0.5))
    assert [type(c) for c in commands] == [SendToDaemon]
    again = commands[0].messages
    assert type(again[0]) is m.ClientReport
    assert [type(x) for x in again[1:]] == [m.StatsRequest, m.StatsRequest, m.HistoryRequest, m.ObjectRequest]
    assert again[-1] == m.ObjectRequest([b"o" * 16])
    assert not core.outbox  # asked once: not a second time from the outbox
    core.validate()
    for kind in (STATS, STATS, HISTORY, FETCH_OBJECTS):
        core.handle(Answered(kind))
    core.resume.start(3.0)
    assert [type(x) for x in core.handle(Welcomed(JOURNALED, 0.5))[0].messages] == [m.ClientReport]
