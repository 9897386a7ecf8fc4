"""Objects fetched from the daemon in parts: the daemon's pure window of parts per peer
(scheduler/object_stream.py), the core's commands for it, and the receiver's assembly
(protocol/chunks.py). Function calls only: no socket, no store."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from core_testing import joining

from scaler_executor.config import ClusterConfig
from scaler_executor.objstore.payload import Fetched, stream_in_store_header, unpack
from scaler_executor.protocol import codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.chunks import Incoming, Parts, StreamError
from scaler_executor.scheduler.core import PeerUnreachable, Received, Scheduler, SendObjects, Tick
from scaler_executor.scheduler.object_stream import (
    CreditObjects,
    EndObjectSends,
    Finish,
    Outbound,
    Part,
)

A, B, C = b"\x0a" * 16, b"\x0b" * 16, b"\x0c" * 16
CHUNK = 10


def _bytes(n: int, seed: int = 0) -> bytes:
    return bytes((seed + i) % 251 for i in range(n))


def _drive(out: Outbound, incoming: Incoming, peer: bytes = b"p", steps: list | None = None) -> dict[bytes, bytes]:
    """Deliver every step (``steps`` first, if given) to a receiver, crediting each part at
    once, as a peer does; returns what the answers' ObjectData gave."""
    got: dict[bytes, bytes] = {}
    while True:
        if steps is None:
            steps = out.due()
        out.validate()
        if not steps:
            return got
        for step in steps:
            assert step.peer == peer
            if isinstance(step, Part):
                frame = step.view[step.offset : step.offset + step.length]
                incoming.part(m.ObjectPart(step.object_id, step.offset, step.total), frame)
                out.taken(peer, 1)
            else:
                frames = iter(step.frames)
                for oid, ok in zip(step.object_ids, step.found, strict=True):
                    if ok:
                        got[oid] = bytes(incoming.take(oid, next(frames)))
        steps = None


@pytest.mark.parametrize("size", [0, 1, CHUNK, CHUNK + 1, 7 * CHUNK + 3])
def test_every_size_arrives_whole_and_only_large_ones_in_parts(size: int) -> None:
    out, incoming = Outbound(chunk=CHUNK, window=2), Incoming()
    data = _bytes(size)
    out.request(b"p", [A], [size], [memoryview(data)])
    first = out.due()
    parts = [s for s in first if isinstance(s, Part)]
    if size <= CHUNK:  # one frame either way: the whole one, in the ObjectData
        assert parts == [] and [type(s) for s in first] == [Finish]
        assert bytes(first[0].frames[0]) == data
        return
    assert len(parts) == 2 and [p.offset for p in parts] == [0, CHUNK]  # the window
    assert _drive(out, incoming, steps=first) == {A: data}
    assert not out.peers and not incoming.ready and incoming.current is None


def test_parts_stop_at_the_window_until_the_peer_takes_them() -> None:
    out = Outbound(chunk=CHUNK, window=3)
    data = _bytes(10 * CHUNK)
    out.request(b"p", [A], [len(data)], [memoryview(data)])
    first = out.due()
    assert [type(s) for s in first] == [Part] * 3 and [s.offset for s in first] == [0, 10, 20]
    assert out.due() == []  # held: nothing taken yet
    out.taken(b"p", 1)
    assert [s.offset for s in out.due()] == [30]
    out.taken(b"p", 100)  # more credit than parts sent does not widen the window
    assert [s.offset for s in out.due()] == [40, 50, 60]
    out.validate()


def test_answers_go_in_order_small_ones_waiting_behind_a_stream() -> None:
    out = Outbound(chunk=CHUNK, window=1)
    big, small = _bytes(2 * CHUNK + 1), _bytes(3)
    out.request(b"p", [A], [len(big)], [memoryview(big)])
    out.request(b"p", [B, C], [len(small), None], [memoryview(small)])
    steps = out.due()
    assert [type(s) for s in steps] == [Part]
    out.taken(b"p", 1)
    out.taken(b"p", 1)
    assert [type(s) for s in out.due()] == [Part]
    out.taken(b"p", 1)
    steps = out.due()  # the last part, then both answers' ends (behind it on the wire)
    assert [type(s) for s in steps] == [Part, Finish, Finish]
    first, second = steps[1:]
    assert isinstance(first, Finish) and isinstance(second, Finish)
    assert first.object_ids == [A] and first.frames == [b""] and first.streamed == 1
    assert second.object_ids == [B, C] and second.found == [True, False] and bytes(second.frames[0]) == small
    assert second.inline_bytes == 3
    assert out.streaming(b"p")  # until its last part is taken
    out.taken(b"p", 1)
    assert out.due() == [] and not out.peers


def test_another_peer_is_not_held_up_by_a_stream() -> None:
    out = Outbound(chunk=CHUNK, window=1)
    big = _bytes(5 * CHUNK)
    out.request(b"p", [A], [len(big)], [memoryview(big)])
    out.request(b"q", [B], [1], [memoryview(b"x")])
    steps = out.due()
    assert {(s.peer, type(s)) for s in steps} == {(b"p", Part), (b"q", Finish)}


def test_a_lost_peer_drops_its_answers_and_their_views() -> None:
    out = Outbound(chunk=CHUNK, window=1)
    big = bytearray(3 * CHUNK)
    view = memoryview(big)
    out.request(b"p", [A], [len(big)], [view])
    out.request(b"p", [B], [1], [memoryview(b"x")])
    steps = out.due()
    del steps
    assert out.drop(b"p") == 2 and not out.peers
    view.release()
    big.append(0)  # no other export of the buffer is left (it could not resize otherwise)
    assert out.drop(b"p") == 0


def test_an_answer_needs_a_view_per_found_object() -> None:
    with pytest.raises(ValueError, match="one view per found object"):
        Outbound().request(b"p", [A, B], [1, None], [])
    with pytest.raises(ValueError, match="at least 1"):
        Outbound(chunk=0)


# --------------------------------------------------------------------- the receiver


def test_parts_out_of_order_fail_the_object_with_the_reason() -> None:
    incoming = Incoming()
    data = _bytes(30)
    incoming.part(m.ObjectPart(A, 0, 30), data[:10])
    incoming.part(m.ObjectPart(A, 20, 30), data[20:])  # skips 10..20
    assert incoming.current is None  # its buffer is freed
    with pytest.raises(StreamError, match="does not follow 10 bytes"):
        incoming.take(A, b"")
    assert not incoming.failed


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ([(5, 30, 5)], "before the part at offset 0"),
        ([(0, 30, 10), (10, 31, 10)], "does not follow"),  # the total changed
        ([(0, 10, 20)], "does not follow"),  # beyond the total
        ([(0, 0, 0)], "of 0 bytes"),
    ],
)
def test_parts_that_do_not_make_the_object_are_refused(parts: list[tuple[int, int, int]], reason: str) -> None:
    incoming = Incoming()
    for offset, total, size in parts:
        incoming.part(m.ObjectPart(A, offset, total), bytes(size))
    with pytest.raises(StreamError, match=reason):
        incoming.take(A, b"")


def test_an_answer_that_ends_before_its_parts_do_is_an_error() -> None:
    incoming = Incoming()
    incoming.part(m.ObjectPart(A, 0, 30), bytes(10))
    with pytest.raises(StreamError, match="ended at 10 of its 30 bytes"):
        incoming.take(A, b"")
    assert incoming.holding() == 0


def test_a_new_object_cuts_short_the_one_before() -> None:
    incoming = Incoming()
    incoming.part(m.ObjectPart(A, 0, 30), bytes(10))
    incoming.part(m.ObjectPart(B, 0, 2), b"ab")
    with pytest.raises(StreamError, match="cut short at 10 of 30"):
        incoming.take(A, b"")
    assert bytes(incoming.take(B, b"")) == b"ab"


def test_clear_frees_whole_and_partial_objects() -> None:
    incoming = Incoming()
    incoming.part(m.ObjectPart(A, 0, 4), b"abcd")
    incoming.part(m.ObjectPart(B, 0, 40), bytes(10))
    assert incoming.holding() == 44
    incoming.clear()
    assert incoming.holding() == 0 and incoming.take(A, b"frame") == b"frame"


def test_an_object_put_together_is_read_only() -> None:
    incoming = Incoming()
    incoming.part(m.ObjectPart(A, 0, 2), b"ab")
    whole = incoming.take(A, b"")
    assert isinstance(whole, memoryview) and whole.readonly


# --------------------------------------------------------------------- the core's commands


def _step(core: Scheduler, *events: object) -> list[object]:
    rounded = []
    for event in events:
        if isinstance(event, Received):  # through the codec, as on the wire
            event = Received(event.peer, codec.decode(codec.encode(event.messages))[0], event.now)
        rounded.append(event)
    commands = core.handle(*rounded)
    core.validate()
    return commands


def test_the_core_turns_credit_into_a_command_and_ends_sends_to_a_lost_peer() -> None:
    core = Scheduler(ClusterConfig())
    _step(core, *joining())
    for peer in (b"c", b"w"):
        commands = _step(core, Received(peer, [m.ObjectRequest([A]), m.ObjectPartsTaken(2)], 2.0))
        assert SendObjects(peer, (A,)) in commands and CreditObjects(peer, 2) in commands
    commands = _step(core, Received(b"m", [m.ObjectPartsTaken(2)], 3.0))
    assert not [c for c in commands if isinstance(c, CreditObjects)]
    assert core.statistics()["refused"] == 1  # not a monitor's message
    assert EndObjectSends(b"w") in _step(core, PeerUnreachable(b"w", 4.0))
    assert EndObjectSends(b"c") in _step(core, Received(b"c", [m.Goodbye("done")], 5.0))
    assert core.statistics()["object_sends_dropped"] == 0  # (the loop counts them)
    _step(core, Tick(6.0))


def test_a_peer_that_asks_beyond_its_queue_is_refused_and_the_rest_stays() -> None:
    out = Outbound(chunk=CHUNK, window=1, max_objects=3)
    big = _bytes(5 * CHUNK)
    assert out.request(b"p", [A, B], [len(big), None], [memoryview(big)])
    assert not out.request(b"p", [B, C], [None, None], [])  # 4 > 3: nothing queued
    assert out.request(b"p", [C], [None], [])  # 3: still fits
    out.validate()
    assert not out.request(b"q", [A, B, C, A], [None] * 4, [])  # too many at once
    assert not out.streaming(b"q")  # a refused peer with nothing queued leaves no record
    steps = out.due()
    out.validate()
    assert [type(s) for s in steps] == [Part]


# --------------------------------------------------------------------- parts kept as they came (a client)


@pytest.mark.parametrize("size", [CHUNK + 1, 7 * CHUNK + 3])
def test_a_client_keeps_the_parts_as_they_came_and_joins_them_only_when_asked(size: int) -> None:
    out, incoming = Outbound(chunk=CHUNK, window=2), Incoming(keep_parts=True)
    data = _bytes(size)
    out.request(b"p", [A], [size], [memoryview(data)])
    frames: list[memoryview] = []
    whole = None
    while (steps := out.due()):
        for step in steps:
            if isinstance(step, Part):
                frame = step.view[step.offset : step.offset + step.length]
                frames.append(frame)
                incoming.part(m.ObjectPart(step.object_id, step.offset, step.total), frame)
                out.taken(b"p", 1)
            else:
                whole = incoming.take(A, step.frames[0])
    assert isinstance(whole, Parts) and whole.nbytes == size and incoming.holding() == 0
    # No copy made: each part is a view of the frame it came in.
    assert len(whole.views) == len(frames) and all(v.obj is f.obj for v, f in zip(whole.views, frames, strict=True))
    joined = whole.join()
    assert joined.readonly and bytes(joined) == data
    assert whole.reader().read() == data
    with pytest.raises(StreamError, match="read already"):  # a reader takes the parts
        whole.join()


def test_a_pickle_stream_in_parts_unpickles_from_them_without_joining() -> None:
    value = (_bytes(5 * CHUNK), "tail")
    stream = pickle.dumps(value, protocol=5)
    parts = incoming_parts(stream, A)
    assert unpack(stream_in_store_header(), [A], Fetched({A: parts})) == value
    assert parts.views == []  # read from the parts, which the reader let go as it went
    assert not isinstance(Fetched({A: incoming_parts(stream)}).stream(A), memoryview)  # a reader
    # A store object that is no stream (an out-of-band buffer) is joined: one copy.
    assert bytes(Fetched({A: incoming_parts(stream)}).get(A)) == stream


def incoming_parts(data: bytes, oid: bytes = B) -> Parts:
    """``data`` as a client keeps it: received in CHUNK-sized parts, not joined."""
    incoming = Incoming(keep_parts=True)
    for offset in range(0, len(data), CHUNK):
        incoming.part(m.ObjectPart(oid, offset, len(data)), data[offset : offset + CHUNK])
    parts = incoming.take(oid, b"")
    assert isinstance(parts, Parts)
    return parts


def test_a_put_in_parts_is_cut_into_chunks_without_joining_a_large_part() -> None:
    from scaler_executor.client import remote_store

    big = _bytes(2 * remote_store.CHUNK_BYTES + 7)
    parts = [memoryview(b"abc"), memoryview(big), memoryview(b"xy")]
    chunks = remote_store._chunks(parts, sum(p.nbytes for p in parts))
    assert [offset for offset, _ in chunks] == [0, remote_store.CHUNK_BYTES, 2 * remote_store.CHUNK_BYTES]
    assert b"".join(bytes(c) for _, c in chunks) == b"abc" + big + b"xy"
    # The middle chunk lies within the large part: a view of it, not a copy.
    assert isinstance(chunks[1][1], memoryview) and chunks[1][1].obj is big
    assert remote_store._chunks([], 0) == [(0, b"")]


def test_a_part_that_cannot_be_written_fails_its_object_with_the_reason() -> None:
    def no_memory(buffer: object, offset: int, part: memoryview) -> None:
        raise OSError(28, "No space left on device")

    incoming = Incoming(write=no_memory)
    incoming.part(m.ObjectPart(A, 0, 30), bytes(10))
    incoming.part(m.ObjectPart(A, 10, 30), bytes(20))  # dropped: its object failed already
    assert incoming.holding() == 0
    with pytest.raises(StreamError, match="could not keep it on this host"):
        incoming.take(A, b"")


# --------------------------------------------------------------------- read while the parts come


def _reading(parts: Parts) -> tuple[threading.Thread, list[object]]:
    """``pickle.load`` over ``parts`` on a thread: its value or the exception it raised."""
    out: list[object] = []

    def read() -> None:
        try:
            out.append(pickle.load(parts.reader()))
        except StreamError as exc:
            out.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, out


def _taken(parts: Parts) -> None:
    """Wait until the reader has taken every part added so far (it reads as they come)."""
    deadline = time.monotonic() + 10
    while parts.views:
        assert time.monotonic() < deadline, "the reader did not take the parts that came"
        time.sleep(0.001)


def test_a_reader_begun_at_the_first_part_reads_each_as_it_comes() -> None:
    value = (_bytes(5 * CHUNK), "tail")
    stream = pickle.dumps(value, protocol=5)
    begun: list[tuple[bytes, Parts]] = []
    incoming = Incoming(keep_parts=True, started=lambda oid, parts: begun.append((oid, parts)))
    incoming.part(m.ObjectPart(A, 0, len(stream)), stream[:CHUNK])
    [(oid, parts)] = begun
    assert oid == A
    thread, out = _reading(parts)
    for offset in range(CHUNK, len(stream), CHUNK):
        _taken(parts)  # the parts before this one were read before it came
        incoming.part(m.ObjectPart(A, offset, len(stream)), stream[offset : offset + CHUNK])
    thread.join(10)
    assert out == [value]
    assert incoming.take(A, b"") is parts  # the answer's ObjectData finds the same parts
    with pytest.raises(StreamError, match="read already"):
        parts.reader()


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (lambda incoming, n: incoming.clear(), "connection to the daemon was lost"),
        (lambda incoming, n: incoming.part(m.ObjectPart(A, 3 * CHUNK, n), b"x"), "do not fit"),
        (lambda incoming, n: incoming.take(A, b""), "ended at 10 of its"),
    ],
)
def test_a_reader_of_an_object_that_does_not_come_whole_raises_the_reason(cut, reason: str) -> None:
    stream = pickle.dumps(_bytes(5 * CHUNK), protocol=5)
    begun: list[Parts] = []
    incoming = Incoming(keep_parts=True, started=lambda oid, parts: begun.append(parts))
    incoming.part(m.ObjectPart(A, 0, len(stream)), stream[:CHUNK])
    thread, out = _reading(begun[0])
    _taken(begun[0])
    try:
        cut(incoming, len(stream))
    except StreamError:
        pass  # take raises it too
    thread.join(10)
    assert len(out) == 1 and isinstance(out[0], StreamError) and reason in str(out[0])
