"""Large objects between a worker agent and its processors as memfds (worker/handoff.py):
the descriptor crosses the agent <-> processor socket beside its message (SCM_RIGHTS), and
the processor maps the agent's pages, so no copy of the object is made on the way."""

from __future__ import annotations

import mmap
import os
import pickle
import socket

import cloudpickle
import pytest

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming
from scaler_executor.worker import handoff
from scaler_executor.worker.framing import FrameReader, send_with_fds

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pair():
    agent, processor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader = FrameReader(processor.fileno(), socket.socket(fileno=os.dup(processor.fileno())))
    try:
        yield agent, reader
    finally:
        reader.close()
        agent.close()
        processor.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_an_object_written_in_parts_reaches_the_processor_as_the_same_pages(pair) -> None:
    agent, reader = pair
    opened = _open_fds()
    incoming = Incoming(allocate=handoff.allocate, write=handoff.write, finish=handoff.seal)
    data = bytes(range(256)) * 40_000
    for offset in range(0, len(data), 1 << 20):
        incoming.part(m.ObjectPart(b"o" * 16, offset, len(data)), data[offset : offset + (1 << 20)])
    blob = incoming.take(b"o" * 16, b"")
    assert blob.readonly and handoff.fd_of(blob) >= 0
    blobs, fds = handoff.blobs_for_run({b"o" * 16: blob, b"s" * 16: b"small"})
    assert blobs == {b"o" * 16: len(data), b"s" * 16: b"small"} and fds == [handoff.fd_of(blob)]
    send_with_fds(agent, pickle.dumps(blobs), fds)
    frame = reader.next()
    got = pickle.loads(frame)
    fd = reader.take_fd()
    # The same memory, not a copy: the agent's memfd itself.
    assert os.fstat(fd).st_ino == os.fstat(handoff.fd_of(blob)).st_ino
    # Sealed: the processor (tasks of other clients may read the same object on this worker)
    # can neither write it nor map it writable.
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)
    with pytest.raises(PermissionError):
        mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    seen = handoff.attach(fd, got[b"o" * 16])
    assert seen.readonly and bytes(seen) == data
    del seen, blob, incoming
    assert _open_fds() == opened  # attach closed the received descriptor, the blob its own


def test_a_large_result_pickled_into_a_memfd_comes_back_whole(pair) -> None:
    agent, reader = pair
    value = os.urandom(handoff.LARGE + 3)
    assert handoff.is_large(value) and not handoff.is_large(b"x" * 10) and not handoff.is_large([value])
    result = handoff.pickle_large(value, cloudpickle)
    assert len(result) == result.size
    send_with_fds(agent, b"done", [result.fd])
    os.close(result.fd)
    assert reader.next() == b"done"
    assert pickle.loads(handoff.attach(reader.take_fd(), result.size)) == value
    made = handoff.to_memfd(pickle.dumps([value]))
    send_with_fds(agent, b"again", [made.fd])
    os.close(made.fd)
    assert reader.next() == b"again"
    assert pickle.loads(handoff.attach(reader.take_fd(), made.size)) == [value]


def test_what_plain_pickle_cannot_pickle_goes_by_cloudpickle() -> None:
    result = handoff.pickle_large(lambda: "x" * handoff.LARGE, cloudpickle)
    try:
        assert pickle.loads(handoff.attach(os.dup(result.fd), result.size))() == "x" * handoff.LARGE
    finally:
        os.close(result.fd)


def test_a_message_naming_a_descriptor_that_did_not_come_is_an_error(pair) -> None:
    agent, reader = pair
    agent.sendall(len(b"x").to_bytes(4, "big") + b"x")
    assert reader.next() == b"x"
    with pytest.raises(OSError, match="did not come"):
        reader.take_fd()


def test_a_memfd_smaller_than_named_is_refused() -> None:
    made = handoff.to_memfd(b"abc")
    with pytest.raises(ValueError, match="came in a memfd of 3"):
        handoff.attach(made.fd, 10)


def test_at_most_max_fds_descriptors_go_beside_one_run() -> None:
    blobs = {i.to_bytes(16, "big"): handoff.seal(handoff.allocate(1)) for i in range(handoff.MAX_FDS + 2)}
    out, fds = handoff.blobs_for_run(blobs)
    assert len(fds) == handoff.MAX_FDS
    assert sum(type(v) is int for v in out.values()) == handoff.MAX_FDS  # the rest inline
