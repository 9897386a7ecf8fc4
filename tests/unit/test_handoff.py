"""Large objects between a worker agent and its processors as memfds (worker/handoff.py):
the descriptor crosses the agent <-> processor socket beside its message (SCM_RIGHTS), and
the processor maps the agent's pages, so no copy of the object is made on the way."""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import socket
import threading
import time

import cloudpickle
import pytest

from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming, StreamError
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
    gc.collect()  # (garbage of earlier tests, collected during a test, would close its fds then)
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
    blobs, fds, streams = handoff.blobs_for_run({b"o" * 16: blob, b"s" * 16: b"small"})
    assert blobs == {b"o" * 16: len(data), b"s" * 16: b"small"} and fds == [handoff.fd_of(blob)] and streams == []
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
    out, fds, streams = handoff.blobs_for_run(blobs)
    assert len(fds) == handoff.MAX_FDS and streams == []
    assert sum(type(v) is int for v in out.values()) == handoff.MAX_FDS  # the rest inline


# ------------------------------------------------------------------ a pickle stream read as it arrives

_began = threading.Event()


def _mark() -> str:
    _began.set()
    return "began"


class _Mark:
    """Unpickled first in a stream: tells the test the reader has begun."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_mark, ())


OID = b"s" * 16
PART = 1 << 20


def _streams() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "scaler-object-stream"]


def _no_streams_left() -> bool:
    """Every stream thread has ended (each joined, 10 s at most in all)."""
    deadline = time.monotonic() + 10
    for thread in _streams():
        thread.join(max(0.0, deadline - time.monotonic()))
    return not _streams()


def _first_part(stream: bytes) -> tuple[Incoming, handoff.Unsealed]:
    """An Incoming (as the worker agent makes it) given ``stream``'s first part; its memfd."""
    started: list[handoff.Unsealed] = []
    incoming = Incoming(
        allocate=handoff.allocate,
        write=handoff.write,
        finish=handoff.seal,
        started=lambda _oid, memfd: started.append(memfd),
        abort=handoff.Unsealed.abort,
    )
    incoming.part(m.ObjectPart(OID, 0, len(stream)), stream[:PART])
    assert len(started) == 1 and started[0].landed == PART
    return incoming, started[0]


def _rest(incoming: Incoming, stream: bytes) -> None:
    for offset in range(PART, len(stream), PART):
        incoming.part(m.ObjectPart(OID, offset, len(stream)), stream[offset : offset + PART])


def _read_in_thread(streamed: handoff.Streamed) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def read() -> None:
        try:
            out["value"] = pickle.load(streamed.reader())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            out["error"] = exc

    thread = threading.Thread(target=read)
    thread.start()
    return thread, out


def test_a_pickle_stream_is_read_while_its_parts_arrive_then_mapped_sealed() -> None:
    opened = _open_fds()
    data = os.urandom(5 * PART + 123)
    stream = pickle.dumps((_Mark(), data), protocol=5)
    incoming, memfd = _first_part(stream)
    out, fds, streams = handoff.blobs_for_run({OID: memfd})
    assert out == {OID: -len(stream)} and fds == streams and len(fds) == 1
    streamed = handoff.Streamed(fds[0], OID, len(stream))
    _began.clear()
    thread, got = _read_in_thread(streamed)
    # The reader has begun on the first part alone: the rest has not been written yet.
    assert _began.wait(10), "the task's reader did not begin before the object's last part"
    assert thread.is_alive()
    _rest(incoming, stream)
    thread.join(10)
    assert got == {"value": ("began", data)}
    # Any later read of it in the task is the sealed memfd that came after its bytes, mapped.
    whole = streamed.join()
    assert whole.readonly and bytes(whole) == stream
    again = streamed.reader()
    again.release()  # as payload.unpack does with a stream's view once read
    assert bytes(streamed.reader()) == stream
    assert incoming.take(OID, b"") is not None and memfd.whole is not None
    del whole, again, streamed, memfd, incoming, out, got
    assert _no_streams_left()
    assert _open_fds() == opened


def test_the_processor_is_given_the_memfd_only_once_sealed() -> None:
    opened = _open_fds()
    stream = pickle.dumps(os.urandom(3 * PART), protocol=5)
    incoming, memfd = _first_part(stream)
    _out, _fds, (fd,) = handoff.blobs_for_run({OID: memfd})
    sock = socket.socket(fileno=fd)
    try:
        sock.settimeout(10)
        received = bytearray()
        while len(received) < PART:
            received += sock.recv(PART)
        assert bytes(received) == stream[:PART]
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing more, and no descriptor, until the rest
            sock.recvmsg(1, socket.CMSG_SPACE(4))
        sock.settimeout(10)
        _rest(incoming, stream)
        while len(received) < len(stream):
            received += sock.recv(len(stream) - len(received))
        assert bytes(received) == stream
        data, ancillary, _flags, _address = sock.recvmsg(1, socket.CMSG_SPACE(4))
        ((level, kind, raw),) = ancillary
        assert (data, level, kind) == (b"\x01", socket.SOL_SOCKET, socket.SCM_RIGHTS)
        sealed = int.from_bytes(raw[:4], "little")
        try:
            with pytest.raises(PermissionError):
                os.pwrite(sealed, b"x", 0)
            with pytest.raises(PermissionError):
                mmap.mmap(sealed, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            assert os.pread(sealed, 16, 0) == stream[:16]
        finally:
            os.close(sealed)
    finally:
        sock.close()
    del memfd, incoming
    assert _no_streams_left()
    assert _open_fds() == opened


def test_an_object_cut_short_fails_its_reader_and_leaves_nothing_behind() -> None:
    opened = _open_fds()
    stream = pickle.dumps((_Mark(), os.urandom(4 * PART)), protocol=5)
    incoming, memfd = _first_part(stream)
    _out, fds, _sockets = handoff.blobs_for_run({OID: memfd})
    streamed = handoff.Streamed(fds[0], OID, len(stream))
    _began.clear()
    thread, got = _read_in_thread(streamed)
    assert _began.wait(10)
    with pytest.raises(StreamError, match="ended at 1048576 of its"):
        incoming.take(OID, b"")  # the answer ended before the object: it fails
    thread.join(10)
    error = got.get("error")
    assert isinstance(error, StreamError), got
    assert f"object {OID.hex()} of its arguments did not arrive whole" in str(error)
    assert memfd.failed
    del streamed, memfd, incoming, thread, got, error
    gc.collect()  # the tracebacks' frames hold the reader and the memfd in cycles
    assert _no_streams_left()
    assert _open_fds() == opened


def test_a_processor_that_hangs_up_ends_its_stream_and_the_object_still_comes_whole() -> None:
    opened = _open_fds()
    stream = pickle.dumps(os.urandom(4 * PART), protocol=5)
    incoming, memfd = _first_part(stream)
    _out, fds, _sockets = handoff.blobs_for_run({OID: memfd})
    handoff.Streamed(fds[0], OID, len(stream)).close()  # e.g. its task was recalled or killed
    _rest(incoming, stream)
    whole = incoming.take(OID, b"")
    assert bytes(whole) == stream
    assert _no_streams_left()
    del whole, memfd, incoming
    assert _open_fds() == opened


def test_an_object_needed_whole_first_waits_for_its_sealed_memfd() -> None:
    stream = pickle.dumps(os.urandom(2 * PART), protocol=5)
    incoming, memfd = _first_part(stream)
    _out, fds, _sockets = handoff.blobs_for_run({OID: memfd})
    streamed = handoff.Streamed(fds[0], OID, len(stream))
    joined: list[memoryview] = []

    def join() -> None:
        joined.append(streamed.join())

    thread = threading.Thread(target=join)
    thread.start()
    _rest(incoming, stream)
    thread.join(10)
    assert bytes(joined[0]) == stream and bytes(streamed.reader()) == stream
    # Sealed since: a RUN made now gives the memfd itself, as for any object fetched whole.
    out, fds, streams = handoff.blobs_for_run({OID: memfd})
    assert out == {OID: len(stream)} and streams == [] and fds == [handoff.fd_of(memfd.whole)]
    joined.clear()
    del incoming, memfd
    streamed.close()
    assert _no_streams_left()
