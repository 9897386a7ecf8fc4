"""A worker's ring of task runs (protocol/runlog.py): what it records, what one report
carries (the runs since the last, oldest first, and how many ended), and the blob's layout."""

from __future__ import annotations

from array import array

import pytest

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import decode, encode
from scaler_executor.protocol.messages import Status
from scaler_executor.protocol.runlog import MAX_REPORT_RUNS, RUN_BYTES, RunLog, pack, unpack


def _runs(report: m.TaskRuns) -> list[tuple[float, float, int]]:
    starts, ends, statuses = unpack(report.runs, report.kept)
    return list(zip(starts, ends, statuses, strict=True))


def test_a_report_carries_the_runs_since_the_last_oldest_first_then_starts_afresh() -> None:
    log = RunLog(4)
    assert log.take() is None and not log.pending, "nothing ran: no report"
    log.ran(10.0, 10.5, Status.OK)
    assert log.pending
    log.ran(11.0, 11.25, Status.ERROR)
    log.ran(12.0, 12.0, Status.OK)  # no time: no run (a processor that died reports none)
    log.ran(0.0, 1.0, Status.OK)  # no start: no run
    report = log.take()
    assert report is not None and (report.kept, report.seen) == (2, 2) and len(report.runs) == 2 * RUN_BYTES
    assert _runs(report) == [(10.0, 10.5, Status.OK), (11.0, 11.25, Status.ERROR)]
    assert log.take() is None
    log.ran(20.0, 21.0, Status.TIMEOUT)
    report = log.take()
    assert report is not None and _runs(report) == [(20.0, 21.0, Status.TIMEOUT)]
    assert decode(encode([report]))[0] == [report], "valid on the wire"


def test_a_full_ring_keeps_the_most_recent_and_counts_them_all() -> None:
    log = RunLog(3)
    for n in range(7):
        log.ran(100.0 + n, 100.5 + n, n % 3)
    report = log.take()
    assert report is not None and (report.kept, report.seen) == (3, 7)
    assert _runs(report) == [(104.0, 104.5, 1), (105.0, 105.5, 2), (106.0, 106.5, 0)]


def test_capacity_0_records_nothing_and_a_resize_reallocates() -> None:
    log = RunLog()
    log.ran(1.0, 2.0, Status.OK)
    assert log.capacity == 0 and not log.pending and log.take() is None, "off: not even counted"
    log.ended(1.0, 2.0, Status.OK, 0)  # its run time is still reported (the histogram, the windows)
    assert log.pending
    report = log.take()
    assert report is not None and (report.kept, report.seen, report.runs, report.timed) == (0, 0, b"", 1)
    log.resize(2)
    log.ran(1.0, 2.0, Status.OK)
    log.resize(2)  # the same size (a Welcome again): what was not sent stays
    report = log.take()
    assert report is not None and report.kept == 1
    log.ran(3.0, 4.0, Status.OK)
    log.resize(0)
    assert log.take() is None
    assert RunLog(10 * MAX_REPORT_RUNS).capacity == MAX_REPORT_RUNS
    with pytest.raises(ValueError, match="at least 0"):
        RunLog(-1)


def test_the_blob_is_its_starts_ends_and_status_bytes() -> None:
    blob = pack(array("d", [1.0, 2.0]), array("d", [1.5, 2.5]), bytes([0, 5]))
    assert len(blob) == 2 * RUN_BYTES and blob[-2:] == b"\x00\x05"
    starts, ends, statuses = unpack(blob, 2)
    assert list(starts) == [1.0, 2.0] and list(ends) == [1.5, 2.5] and statuses == b"\x00\x05"
    with pytest.raises(ValueError, match="must be 34 bytes"):
        unpack(blob[:-1], 2)
    with pytest.raises(ValueError, match="differ in length"):
        pack(array("d", [1.0]), array("d", []), b"")
