"""When a worker reports its lane tasks' ends to the daemon (LaneDone, worker/lanes.py)."""

from __future__ import annotations

import pytest

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status
from scaler_executor.worker.lanes import LANE_DONE_LINGER, Lanes, LaneTally

pytestmark = pytest.mark.timeout(30)


def _failure(task_id: int) -> m.TaskResult:
    return m.TaskResult(task_id, 0, Status.ERROR, b"", m.TaskFacts("w", 1.0, 2.0, 0), [], False, b"")


def test_ends_that_went_well_wait_for_company_up_to_the_linger() -> None:
    lanes = Lanes(name="w")
    assert lanes.report(100.0, force=False) is None and lanes.report_due(100.0) is None
    lanes.tally = LaneTally(finished=3, delivered=2, seconds=0.003, since=100.0)
    assert lanes.report(100.0 + LANE_DONE_LINGER / 2, force=False) is None
    assert lanes.report_due(100.0 + LANE_DONE_LINGER / 2) == pytest.approx(LANE_DONE_LINGER / 2)
    assert lanes.report_due(100.0 + 2 * LANE_DONE_LINGER) == 0.0  # overdue: wake at once
    report = lanes.report(100.0 + LANE_DONE_LINGER * 1.001, force=False)
    assert report == m.LaneDone(3, 0, 0, 2, 0.003, [], [])
    assert lanes.report(200.0, force=False) is None and not lanes.tally, "a report is sent once"


def test_a_report_goes_at_once_when_forced_or_when_it_names_what_the_daemon_acts_on() -> None:
    lanes = Lanes(name="w")
    lanes.tally = LaneTally(finished=1, since=5.0)
    assert lanes.report(5.0) == m.LaneDone(1, 0, 0, 0, 0.0, [], []), "forced (something else is sent)"
    urgent = {
        "announced": LaneTally(finished=1, announced=[7], since=5.0),  # the daemon holds its record
        "failed": LaneTally(failed=1, failures=[_failure(8)], since=5.0),  # its recent failures
        "retried": LaneTally(retried=1, since=5.0),  # the client resubmits it
    }
    for why, tally in urgent.items():
        lanes.tally = tally
        report = lanes.report(5.0, force=False)
        assert report is not None, why
        assert (report.announced, report.failed, report.retried) == (tally.announced, tally.failed, tally.retried)
