"""The embedded cluster's fast paths under a journal (docs/durability.rst): results sent
straight from processors to the client (REPLY_DIRECT) and worker lanes stay on, and a
daemon SIGKILLed while they carry a task neither loses it nor answers it twice.

The seams are exact, not timed: a task (durable_tasks.gated, gated_callable) waits until
the test writes to a FIFO, and the daemon is stopped (SIGSTOP) before the task ends, so that a result that
completes its future meanwhile can only have come straight from the processor, and the
worker's TaskResults wait, unread and unjournaled, in the stopped daemon's socket when it
is SIGKILLed.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import psutil
import pytest
from durable_tasks import add, gated, gated_callable, record, runs
from scaler_testing import wait_until
from test_durable import CLIENT, _embedded_daemon
from test_lanes import echo, lane_open

from scaler_executor import ScalerExecutor

pytestmark = pytest.mark.timeout(300)


class Gate:
    """The write end of a FIFO a ``gated`` task reads: ``wait_open`` returns once the task
    runs (it opened the read end); ``release`` lets it end."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.mkfifo(path, 0o600)
        self.fd = -1

    def _try_open(self) -> bool:
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            return False
        return True

    def wait_open(self) -> None:
        assert wait_until(self._try_open, timeout=60), "the gated task never started"

    def release(self) -> None:
        os.write(self.fd, b"go")  # BrokenPipeError if the task was killed meanwhile
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


@pytest.fixture
def gate(tmp_path) -> Iterator[Gate]:
    g = Gate(str(tmp_path / "gate"))
    try:
        yield g
    finally:
        g.close()


def test_a_direct_reply_whose_result_the_killed_daemon_never_journaled_is_answered_once(tmp_path, gate: Gate) -> None:
    """Killed between a processor's direct reply and the journaling of its TaskResults: the
    restarted daemon restores the task; the worker sends the result again, marked delivered;
    the client, which has it, is not answered again, and the task does not run again."""
    path = str(tmp_path / "runs")
    config = CLIENT.replace(restart_grace=600.0, worker_lanes=False)  # lanes: the next test
    with ScalerExecutor(max_workers=1, journal=tmp_path / "journal", config=config) as ex:
        assert ex.submit(add, 1, 2).result(timeout=60) == 3
        # Alone: REPLY_DIRECT.  Held as its callable is unpickled, before its clock starts: a
        # result sent straight back is that of a task that ran under DIRECT_SECONDS.
        future = ex.submit(gated_callable(gate.path, path), 7)
        gate.wait_open()
        daemon = _embedded_daemon(ex)
        daemon.suspend()  # it reads nothing now: the worker's TaskResults wait in its socket
        try:
            gate.release()
            # The daemon is stopped: this result came straight from the processor.
            assert future.result(timeout=60) == 14
        finally:
            daemon.kill()
        daemon.wait(30)
        # Restarted, its recovery reconciles the restored task with the worker's report and
        # the result it sends again; then the next task goes through it.
        assert ex.submit(add, 2, 3).result(timeout=120) == 5
        assert _embedded_daemon(ex).pid != daemon.pid
        assert ex._agent.core.resume.restarts == 1
        # Once the daemon has the worker's last result, it has handled the one sent again
        # before it (one connection, in order); its answer to this comes after anything it
        # sent us before.
        assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=60), ex.statistics()
        assert ex._agent.core.resume.received == 0, "the restarted daemon sent a result: one the client had"
        # Every submission acknowledged, the sequential ones too (at most NOTICE_DELAY later).
        assert wait_until(lambda: not ex._agent.core.sent_unacked, timeout=30), ex._agent.core.sent_unacked
        assert future.result() == 14
    assert runs(path) == [7], "the task ran again after the restart"


def test_lane_tasks_in_flight_across_a_sigkilled_daemon_complete_exactly_once(tmp_path, gate: Gate) -> None:
    """A lane task (worker/lanes.py) never reaches the daemon, so its journal has no record
    of it: the client does not await it of the restarted daemon, its worker does not report
    it as held (the daemon would cancel it as a stray), and it ends on its lane, once."""
    path = str(tmp_path / "runs")
    with ScalerExecutor(max_workers=2, journal=tmp_path / "journal", config=CLIENT.replace(restart_grace=600.0)) as ex:
        assert lane_open(ex), "no lane under a journal"
        on_lane = ex.submit(gated, 1, path, gate.path)
        assert ex._agent.lane.tasks, "the lone task did not take the lane"
        gate.wait_open()
        # Running past LANE_NOTICE, the worker announces it (LaneStarted): taken under a journal.
        assert wait_until(lambda: ex.statistics().get("tasks_dispatched", 0) == 1, timeout=30), ex.statistics()
        daemon = _embedded_daemon(ex)
        daemon.kill()
        daemon.wait(30)
        # Not alone (the lane task is outstanding): through the restarted daemon, which
        # dispatches nothing to a restored worker before its report; so once this ends, the
        # lane worker (the only one) has reported, and a cancel of the lane task would
        # have gone before this task's dispatch.
        through_daemon = ex.submit(record, 2, path)
        assert through_daemon.result(timeout=120) == 4
        assert ex._agent.core.resume.restarts == 1
        assert not on_lane.done()
        gate.release()
        assert on_lane.result(timeout=60) == 2
        assert [ex.submit(echo, i).result(timeout=60) for i in range(5)] == list(range(5))
        assert wait_until(lambda: ex.statistics()["tasks"] == 0, timeout=60), ex.statistics()
        assert psutil.pid_exists(_embedded_daemon(ex).pid)
    assert sorted(runs(path)) == [1, 2], "a task ran twice or not at all"
