"""One processor's record as the worker agent drives it (worker/processes.py), against real
pipes, sockets and processes: what it writes reaches the other end in
``multiprocessing.connection``'s framing, its stderr is forwarded and its tail kept, its
end is put into words, and a kill or a retirement reaches the process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from scaler_executor.worker.processes import STDERR_TAIL_BYTES, Processor

pytestmark = pytest.mark.timeout(60)


class _Oom:
    """Stands for worker.memory.OomCounter: whether the cgroup counted an OOM kill."""

    def __init__(self, killed: bool) -> None:
        self.killed = killed
        self.asked = 0

    def killed_since_last(self) -> bool:
        self.asked += 1
        return self.killed


closed: set[int] = set()  # write ends of stderr pipes a test closed itself


@pytest.fixture
def record() -> Iterator[tuple[Processor, Connection, int]]:
    """A Processor for a child that sleeps, the processor's end of its socket, and the
    write end of its stderr pipe (a test that closes it adds it to ``closed``); everything
    closed and the child reaped afterwards."""
    closed.clear()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours, theirs = socket.socketpair()
    err_r, err_w = os.pipe()
    os.set_blocking(err_r, False)
    p = Processor(child.pid, Connection(ours.detach()), err_r)
    far = Connection(theirs.detach())
    try:
        yield p, far, err_w
    finally:
        child.kill()
        child.wait(10)
        p.close_fds()
        p.close_stderr()
        far.close()
        if err_w not in closed:
            os.close(err_w)


def test_frames_written_at_once_arrive_one_by_one_in_order(record: tuple[Processor, Connection, int]) -> None:
    p, far, _ = record
    frames = [b"first", b"", os.urandom(70_000), b"last"]
    p.send_frames(frames)
    p.send(b"alone")
    assert [far.recv_bytes() for _ in range(5)] == [*frames, b"alone"]


def test_memfds_beside_a_message_follow_what_waits(record: tuple[Processor, Connection, int]) -> None:
    p, far, _ = record
    memfd = os.memfd_create("test")
    os.write(memfd, b"in the memfd")
    try:
        p.send_with_fds(b"with a descriptor", [memfd])
        sock = socket.socket(fileno=os.dup(far.fileno()))
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1024, 1)
        finally:
            sock.close()
        assert data.endswith(b"with a descriptor") and len(fds) == 1
        assert os.pread(fds[0], 64, 0) == b"in the memfd"
        os.close(fds[0])
    finally:
        os.close(memfd)


def test_a_write_to_a_processor_that_is_gone_is_dropped(record: tuple[Processor, Connection, int]) -> None:
    p, far, _ = record
    far.close()
    p.send(b"x" * 300_000)  # EPIPE or ECONNRESET: the poller will see its end
    p.send_frames([b"a", b"b"])


def test_stderr_is_forwarded_and_its_tail_kept_until_it_ends(record: tuple[Processor, Connection, int]) -> None:
    p, _, err_w = record
    out_r, out_w = os.pipe()
    try:
        os.write(err_w, b"".join(b"line %d\n" % i for i in range(10)) + b"\n   \n")
        assert p.read_stderr(forward_to=out_w) is False, "more may come"
        assert os.read(out_r, 4096).startswith(b"line 0\n")
        assert p.last_lines() == [f"line {i}" for i in range(4, 10)], "the last six that say something"
        os.write(err_w, b"x" * (2 * STDERR_TAIL_BYTES))
        p.read_stderr(forward_to=out_w)
        assert len(p.err_tail) == STDERR_TAIL_BYTES
        os.close(err_w)  # its end
        closed.add(err_w)
        fd = p.err_fd
        assert p.read_stderr(forward_to=out_w) is True and p.err_fd == fd, "ended; the caller closes it"
        p.close_stderr()
        assert p.err_fd == -1
    finally:
        os.close(out_r)
        os.close(out_w)


def _status_of(code: str) -> int:
    child = subprocess.Popen([sys.executable, "-c", code])
    _, status = os.waitpid(child.pid, 0)
    child.returncode = 0  # reaped here
    return status


def test_its_end_in_words() -> None:
    p = Processor.__new__(Processor)  # only the fields how_it_ended reads
    p.err_tail, p.memory, p.kill = bytearray(b"Traceback\nMemoryError\n"), 3 << 20, None
    p.wait_status = _status_of("raise SystemExit(3)")
    assert p.how_it_ended(_Oom(True), None) == "exit code 3; its last stderr lines:\n    Traceback\n    MemoryError"
    p.err_tail = bytearray()
    p.wait_status = _status_of("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    oom = _Oom(True)
    assert p.how_it_ended(oom, None) == (
        "killed by signal SIGKILL by the kernel's out-of-memory killer (the cgroup's memory.events counted an oom_kill)"
    )
    assert p.how_it_ended(_Oom(False), 4 << 20) == (
        "killed by signal SIGKILL, last private memory 3.0 MiB of the worker's limit 4.0 MiB"
    )
    assert p.how_it_ended(_Oom(False), None) == "killed by signal SIGKILL"
    p.kill = (1, "ours")
    oom = _Oom(True)
    assert p.how_it_ended(oom, 4 << 20) == "killed by signal SIGKILL", "a kill of ours is explained by its reason"
    assert oom.asked == 0, "and does not use up the cgroup's count"
    p.wait_status = None
    assert p.how_it_ended(_Oom(False), None) == "exit status unknown"


def test_a_kill_keeps_its_first_reason_and_a_retirement_asks_it_to_go() -> None:
    for kill in (True, False):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        p = Processor.__new__(Processor)
        p.pid, p.kill, p.retired = child.pid, None, False
        if kill:
            p.kill_for(7, "first")
            p.kill_for(8, "second")
            assert p.kill == (7, "first")
        else:
            p.retire()
            assert p.retired
        assert child.wait(10) == -(signal.SIGKILL if kill else signal.SIGTERM)
        p.kill_for(9, "gone")  # no such process any more: nothing raised
        p.retire()


def test_tasks_taken_back_leave_its_queue_and_its_count(record: tuple[Processor, Connection, int]) -> None:
    p, _, _ = record
    for task_id, attempt in ((1, 0), (2, 1), (3, 0)):
        p.outstanding.append(task_id)
        p.attempts[task_id] = attempt
        p.sent += 1
    assert p.take_back([2, 3]) == {2: 1, 3: 0}
    assert list(p.outstanding) == [1] and p.attempts == {1: 0} and p.sent == 1


def test_writes_after_its_descriptors_closed_reach_no_other_file(record: tuple[Processor, Connection, int]) -> None:
    p, _, _ = record
    number = p.fd
    r, w = os.pipe()
    p.close_fds()
    os.dup2(w, number)  # the processor's old descriptor number, now another file's
    os.set_blocking(r, False)
    try:
        p.send_frames([b"a", b"b"])
        p.send(b"c")
        p.send_with_fds(b"d", [])
        with pytest.raises(BlockingIOError):
            os.read(r, 64)
    finally:
        os.close(number)
        os.close(r)
        os.close(w)
