"""Large results forwarded to their clients while the daemon stores them
(scheduler/result_stream.py), as pure state and through the core; and the client's side
(client/pushed.py): parts read as they come, dropped streams read from the store."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
from core_testing import CommandsCluster
from core_testing import DEADLINE, spec, tid

from scaler_executor.client.pushed import NOT_PUSHED, PushedResults
from scaler_executor.config import ClusterConfig
from scaler_executor.objstore import payload as packing
from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.core import DeleteObjects, StoreChunk
from scaler_executor.scheduler.objects import HostStore
from scaler_executor.scheduler.result_stream import (
    AbortPartial,
    Ended,
    ForwardStored,
    ResultStreams,
)

C = 4  # the chunk of the pure tests
OID = b"\x05" * 16
W, CL = b"w1", b"c1"


def chunk(offset: int, total: int, task: int = 7, attempt: int = 0, oid: bytes = OID) -> m.ObjectChunk:
    return m.ObjectChunk(oid, offset, total, task, attempt)


def streams(window: int = 3) -> ResultStreams:
    return ResultStreams(window=window, chunk_bytes=C)


def check(state: ResultStreams, workers: tuple[bytes, ...] = (W,), clients: tuple[bytes, ...] = (CL,)) -> None:
    state.validate(set(workers), set(clients))


# ====================================================================== pure state


def test_chunks_are_forwarded_in_order_while_the_window_has_room() -> None:
    state = streams(window=8)
    for offset in range(0, 20, C):
        verdict = state.chunk(W, chunk(offset, 20), CL)
        assert verdict == (CL, [])
        check(state)
    assert state.in_flight[CL] == 5
    assert state.ended(W, 7, {OID}) == []
    assert not state.streams and state.forwarded == 1
    state.taken(CL, 5)
    assert state.in_flight[CL] == 0
    check(state)


def test_a_slow_client_falls_behind_and_is_served_the_rest_from_the_store_in_order() -> None:
    state = streams(window=2)
    verdicts = [state.chunk(W, chunk(offset, 18), CL) for offset in range(0, 18, C)]
    check(state)
    # Two parts as they came; the other three only stored (no part out of turn).
    assert [v.forward for v in verdicts] == [CL, CL, b"", b"", b""]
    assert state.pump(CL) == []  # no credit yet: the daemon holds no more for it
    state.taken(CL, 1)
    assert state.pump(CL) == [ForwardStored(CL, 7, OID, 8, C, 18)]
    check(state)
    # The result comes while it is behind: the stream goes on from the sealed object.
    assert state.ended(W, 7, {OID}) == []
    assert OID in state.streams and not state.by_task and not state.by_worker
    check(state, workers=())  # the worker may go now: the stream no longer needs it
    assert state.worker_lost(W) == ([], [])
    state.taken(CL, 2)
    assert state.pump(CL) == [ForwardStored(CL, 7, OID, 12, C, 18), ForwardStored(CL, 7, OID, 16, 2, 18)]
    assert not state.streams and state.forwarded == 1
    check(state, workers=())


def test_a_stream_in_step_again_after_catching_up_forwards_chunks_as_they_come() -> None:
    state = streams(window=1)
    assert state.chunk(W, chunk(0, 16), CL).forward == CL
    assert state.chunk(W, chunk(4, 16), CL).forward == b""  # behind
    state.taken(CL, 1)
    assert state.pump(CL) == [ForwardStored(CL, 7, OID, 4, C, 16)]
    state.taken(CL, 1)
    assert state.pump(CL) == []  # nothing it missed: the next chunk goes as it comes
    assert state.chunk(W, chunk(8, 16), CL).forward == CL
    check(state)


def test_a_worker_lost_mid_upload_ends_its_stream_and_names_the_object_to_abort() -> None:
    state = streams()
    state.chunk(W, chunk(0, 40), CL)
    state.chunk(W, chunk(4, 40), CL)
    aborted, told = state.worker_lost(W)
    assert aborted == [OID]
    assert told == [Ended(CL, OID, "the worker was lost while it sent the result")]
    assert not state.streams and not state.by_worker and not state.by_task
    check(state, workers=())
    # The retry streams a new object, forwarded from its start.
    assert state.chunk(b"w2", chunk(0, 40, attempt=1, oid=b"\x06" * 16), CL).forward == CL
    check(state, workers=(b"w2",))


def test_a_client_lost_mid_stream_frees_its_window_and_the_rest_is_only_stored() -> None:
    state = streams()
    state.chunk(W, chunk(0, 40), CL)
    state.client_lost(CL)
    check(state, clients=())
    assert CL not in state.in_flight
    assert state.chunk(W, chunk(4, 40), b"").forward == b""
    assert state.ended(W, 7, {OID}) == [] and not state.streams
    check(state, clients=())


def test_a_client_lost_while_caught_up_from_the_store_drops_the_stream() -> None:
    state = streams(window=1)
    state.chunk(W, chunk(0, 8), CL)
    state.chunk(W, chunk(4, 8), CL)  # behind
    state.ended(W, 7, {OID})
    assert OID in state.streams
    state.client_lost(CL)
    assert not state.streams
    check(state, clients=())


def test_a_chunk_out_of_order_stops_the_forwarding_and_tells_the_client() -> None:
    state = streams()
    state.chunk(W, chunk(0, 40), CL)
    verdict = state.chunk(W, chunk(12, 40), CL)
    assert verdict.forward == b"" and verdict.ended[0].client == CL and "does not follow" in verdict.ended[0].reason
    assert state.chunk(W, chunk(16, 40), CL).forward == b""  # stopped for good
    check(state)


def test_a_result_that_does_not_name_the_streamed_object_ends_the_stream() -> None:
    state = streams()
    state.chunk(W, chunk(0, 8), CL)
    state.chunk(W, chunk(4, 8), CL)
    (told,) = state.ended(W, 7, {b"\x09" * 16})
    assert told.client == CL and told.object_id == OID
    assert not state.streams
    check(state)


def test_chunks_of_unknown_streams_or_other_workers_are_not_forwarded() -> None:
    state = streams()
    assert state.chunk(W, chunk(4, 40), CL) == (b"", [])  # no offset 0 came
    state.chunk(W, chunk(0, 40), CL)
    assert state.chunk(b"w2", chunk(4, 40), CL) == (b"", [])  # not the worker that began it
    assert state.ended(b"w2", 7, {OID}) == []  # another worker's late result: this one goes on
    check(state, workers=(W, b"w2"))


def test_credit_beyond_what_was_sent_does_not_widen_the_window() -> None:
    state = streams(window=2)
    state.chunk(W, chunk(0, 40), CL)
    state.taken(CL, 100)
    assert state.in_flight[CL] == 0
    forwarded = [state.chunk(W, chunk(offset, 40), CL).forward for offset in range(4, 40, C)]
    assert forwarded.count(CL) == 2
    check(state)


# ====================================================================== through the core


@pytest.fixture
def cluster() -> CommandsCluster:
    return CommandsCluster()


def _dispatched(cluster: CommandsCluster) -> int:
    cid = cluster.client(CL)
    cluster.worker(W)
    t = tid(cid, 1)
    (dispatch,) = cluster.send(CL, m.SubmitTasks([spec(t)])).dispatched(W)
    assert dispatch.task_id == t
    return t


def _result(t: int, attempt: int = 0, objects: list[bytes] | None = None) -> m.TaskResult:
    return m.TaskResult(t, attempt, m.Status.OK, packing.stream_in_store_header(), m.TaskFacts("w", 1.0, 2.0, 0), objects or [OID])


def test_core_forwards_a_results_chunks_to_its_client_and_then_the_result(cluster: CommandsCluster) -> None:
    t = _dispatched(cluster)
    big = m.OBJECT_CHUNK_BYTES
    total = 2 * big + 10
    for offset in (0, big, 2 * big):
        cluster.send(W, m.ObjectChunk(OID, offset, total, t, 0))
        assert cluster.others == [StoreChunk(W, OID, offset, total, CL, t)]
    cluster.send(CL, m.ResultPartsTaken(3))
    out = cluster.send(W, m.TaskResults([_result(t)]))
    (result,) = out.results(CL)
    assert result.objects == [OID]
    assert cluster.stat("result_streams_forwarded") == 1 and cluster.stat("result_streams_stopped") == 0
    assert not cluster.scheduler.result_streams.streams


def test_core_forwards_nothing_of_a_task_that_is_not_the_workers_attempt(cluster: CommandsCluster) -> None:
    t = _dispatched(cluster)
    cluster.send(W, m.ObjectChunk(OID, 0, 100, t, 5))  # another attempt
    assert cluster.others == [StoreChunk(W, OID, 0, 100, b"", t)]
    cluster.send(W, m.ObjectChunk(b"\x01" * 16, 0, 100, tid(9, 9), 0))  # no such task
    assert cluster.others[0].forward == b""


def test_core_refuses_a_result_chunk_from_a_client(cluster: CommandsCluster) -> None:
    t = _dispatched(cluster)
    cluster.send(CL, m.ObjectChunk(OID, 0, 100, t, 0))
    assert cluster.others == [] and cluster.stat("refused") == 1
    cluster.send(CL, m.ObjectChunk(OID, 0, 100))  # a put is still a client's to send
    assert cluster.others == [StoreChunk(CL, OID, 0, 100)]


def test_core_worker_lost_mid_upload_aborts_the_object_tells_the_client_and_retries(cluster: CommandsCluster) -> None:
    t = _dispatched(cluster)
    cluster.send(W, m.ObjectChunk(OID, 0, 3 * m.OBJECT_CHUNK_BYTES, t, 0))
    cluster.worker(b"w2")
    cluster.now += DEADLINE + 0.1
    cluster.keepalive(CL, b"w2")
    out = cluster.tick()
    assert cluster.stat("workers_lost") == 1
    assert AbortPartial(W, (OID,)) in cluster.others
    (ended,) = out.of(CL, m.ResultStreamEnded)
    assert ended.object_id == OID and "worker was lost" in ended.reason
    assert not out.results(CL), "no result: the task runs again"
    (retry,) = out.dispatched(b"w2")
    assert (retry.task_id, retry.attempt) == (t, 1)
    # The retry's stream is forwarded from its start, the lost attempt's chunks are not.
    cluster.send(W, m.ObjectChunk(OID, m.OBJECT_CHUNK_BYTES, 3 * m.OBJECT_CHUNK_BYTES, t, 0))
    assert cluster.others == []  # (from a worker the daemon no longer knows: dropped)
    cluster.send(b"w2", m.ObjectChunk(b"\x06" * 16, 0, 100, t, 1))
    assert cluster.others == [StoreChunk(b"w2", b"\x06" * 16, 0, 100, CL, t)]


def test_core_worker_lost_after_its_last_chunk_but_before_its_result_deletes_the_whole_object(
    cluster: CommandsCluster,
) -> None:
    """Sealed in the store, named by no result (the task runs again and streams a new
    object): it would stay until the daemon stopped. Only the whole one goes; a partial one
    of the same worker is aborted as before."""
    t = _dispatched(cluster)
    cluster.send(W, m.ObjectChunk(OID, 0, 100, t, 0))  # one chunk: the whole object
    assert cluster.scheduler.result_streams.unclaimed(W) == [OID]
    cluster.worker(b"w2")
    cluster.now += DEADLINE + 0.1
    cluster.keepalive(CL, b"w2")
    cluster.tick()
    assert cluster.stat("workers_lost") == 1
    assert DeleteObjects((OID,)) in cluster.others and AbortPartial(W, (OID,)) in cluster.others
    assert not cluster.scheduler.result_streams.streams


def test_an_object_whose_result_came_is_not_unclaimed() -> None:
    state = streams()
    state.chunk(W, chunk(0, 6), CL)
    assert state.unclaimed(W) == [], "not whole yet"
    state.chunk(W, chunk(4, 6), CL)
    assert state.unclaimed(W) == [OID]
    state.ended(W, 7, {OID})
    check(state)
    assert state.unclaimed(W) == [] and state.worker_lost(W) == ([], [])


def test_core_client_lost_mid_stream_stops_forwarding_and_frees_its_window(cluster: CommandsCluster) -> None:
    t = _dispatched(cluster)
    big = m.OBJECT_CHUNK_BYTES
    cluster.send(W, m.ObjectChunk(OID, 0, 3 * big, t, 0))
    cluster.send(CL, m.Goodbye("bye", []))
    assert CL not in cluster.scheduler.result_streams.in_flight
    cluster.send(W, m.ObjectChunk(OID, big, 3 * big, t, 0))
    assert cluster.others == [StoreChunk(W, OID, big, 3 * big, b"", t)]


def test_core_slow_client_gets_the_rest_from_the_store_as_its_credit_comes() -> None:
    cluster = CommandsCluster(ClusterConfig(heartbeat_interval=1.0, heartbeat_liveness=3, client_timeout=3.0))
    cluster.scheduler.result_streams.window = 2
    t = _dispatched(cluster)
    big = m.OBJECT_CHUNK_BYTES
    total = 4 * big
    forwards = []
    for offset in range(0, total, big):
        cluster.send(W, m.ObjectChunk(OID, offset, total, t, 0))
        forwards.append(cluster.others[0].forward)
    assert forwards == [CL, CL, b"", b""]
    cluster.send(W, m.TaskResults([_result(t)]))
    cluster.send(CL, m.ResultPartsTaken(1))
    assert cluster.others == [ForwardStored(CL, t, OID, 2 * big, big, total)]
    cluster.send(CL, m.ResultPartsTaken(2))
    assert cluster.others == [ForwardStored(CL, t, OID, 3 * big, big, total)]
    assert cluster.stat("result_streams_forwarded") == 1 and cluster.stat("result_streams_stopped") == 0
    assert not cluster.scheduler.result_streams.streams


# ====================================================================== the daemon's store


def test_parts_are_read_from_an_object_being_written_and_once_sealed(host_store: HostStore) -> None:
    data = bytes(range(256)) * 40
    host_store.write_chunk(W, OID, 0, len(data), data[:4096])
    assert bytes(host_store.read_range(OID, 0, 4096)) == data[:4096]
    assert host_store.read_range(OID, 4096, 4096) is None  # not written yet
    host_store.write_chunk(W, OID, 4096, len(data), data[4096:])
    assert bytes(host_store.read_range(OID, 4096, 4096)) == data[4096:8192]
    assert host_store.read_range(b"\x00" * 16, 0, 1) is None


def test_a_lost_workers_partial_object_is_aborted_and_no_other_peers(host_store: HostStore) -> None:
    host_store.write_chunk(W, OID, 0, 100, b"x" * 10)
    assert not host_store.abort_partial(b"w2", OID)
    assert host_store.abort_partial(W, OID)
    assert not host_store.partial and host_store.read((OID,))[0] == [False]


# ====================================================================== the client's side


def _parts(value: Any, size: int) -> tuple[bytes, list[bytes]]:
    stream = pickle.dumps(value, protocol=5)
    return stream, [stream[i : i + size] for i in range(0, len(stream), size)]


def _feed(pushed: PushedResults, parts: list[bytes], total: int, oid: bytes = OID, task: int = 7) -> None:
    offset = 0
    for part in parts:
        pushed.part(m.ResultPart(task, oid, offset, total), part)
        offset += len(part)


HEADER = packing.stream_in_store_header()


@pytest.mark.parametrize("early", [2, 0], ids=["read-as-they-come", "read-at-the-result"])
def test_a_pushed_result_is_read_from_its_parts(early: int) -> None:
    value = {"a": b"x" * 100_000, "b": list(range(1000))}
    stream, parts = _parts(value, 4096)
    pushed = PushedResults(early_decodes=early)
    _feed(pushed, parts, len(stream))
    assert pushed.load(HEADER, [OID]) == value
    assert not pushed.streams


def test_a_pushed_result_waits_for_parts_that_come_after_its_result() -> None:
    value = list(range(50_000))
    stream, parts = _parts(value, 8192)
    pushed = PushedResults()
    _feed(pushed, parts[:2], len(stream))
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(pushed.load(HEADER, [OID])))
    reader.start()
    offset = sum(len(p) for p in parts[:2])
    for part in parts[2:]:
        pushed.part(m.ResultPart(7, OID, offset, len(stream)), part)
        offset += len(part)
    reader.join(10)
    assert got == [value]


@pytest.mark.parametrize("how", ["ended", "out-of-order", "connection-lost"])
def test_a_dropped_stream_is_never_a_value_and_its_result_is_read_from_the_store(how: str) -> None:
    value = b"y" * 50_000
    stream, parts = _parts(value, 4096)
    pushed = PushedResults()
    _feed(pushed, parts[:3], len(stream))
    if how == "ended":
        pushed.drop(OID, "the worker was lost while it sent the result")
    elif how == "out-of-order":
        pushed.part(m.ResultPart(7, OID, 3 * 4096 + 1, len(stream)), parts[3])
    else:
        pushed.clear()
    assert not pushed.streams
    assert pushed.load(HEADER, [OID]) is NOT_PUSHED
    pushed.part(m.ResultPart(7, OID, 3 * 4096, len(stream)), parts[3])  # (later parts of it are dropped)
    assert not pushed.streams


def test_a_pushed_result_let_go_unread_is_forgotten() -> None:
    stream, parts = _parts(b"z" * 30_000, 4096)
    pushed = PushedResults(early_decodes=0)
    _feed(pushed, parts, len(stream))
    pushed.forget([OID])
    assert not pushed.streams and pushed.load(HEADER, [OID]) is NOT_PUSHED


def test_an_early_reader_of_a_stream_read_from_the_store_instead_stops() -> None:
    """A result whose header is not a bare pickle stream is read from the store; the thread
    that began reading its parts must not wait for parts that no longer come."""
    stream, parts = _parts(b"q" * 40_000, 4096)
    pushed = PushedResults(early_decodes=1)
    _feed(pushed, parts[:2], len(stream))
    early = pushed.streams[OID].early
    assert early is not None
    assert pushed.load(b"not the stream header", [OID]) is NOT_PUSHED
    with pytest.raises(Exception, match="read from the store instead"):
        early.result(timeout=10)
