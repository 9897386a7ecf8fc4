"""The codec: round trips of every message, batches, buffers, and refusal of untrusted input.

Everything here is a plain function call on bytes: no sockets.  The fuzz tests at the end
hold the codec to its contract that *anything* a peer can send either decodes to valid
messages or raises :class:`DecodeError` — never another exception, which would escape the
daemon loop's ``except DecodeError`` and cost more than one transmission.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import ProtocolError
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.codec import (
    MAX_BATCH_MESSAGES,
    SEND_BATCH_MESSAGES,
    VERSION_FRAME,
    DecodeError,
    Limits,
    VersionMismatch,
    check_version,
    decode,
    encode,
    encode_one,
)
from scaler_executor.protocol.messages import MESSAGE_TAGS
from scaler_executor.scheduler.loop import daemon_limits

FACTS = m.TaskFacts("worker-1", 1700000000.25, 1700000001.5, 123_456_789)
SPEC = m.TaskSpec(
    task_id=(7 << m.TASK_ID_BITS) | 42,
    fn_id=(7 << m.TASK_ID_BITS) | 3,
    options_id=2,
    flags=m.TaskFlags.CHUNK,
    payload=b"\x80\x05pickled\x00args",
    deps=[(7 << m.TASK_ID_BITS) | 41],
    objects=[b"\x01" * 20],
    parent=0,
)
OPTIONS = m.TaskOptions({"cpu": 2.0, "gpu": 1.0}, ["fast", "big-mem"], -3, 12.5, 4)

# One sample of every message, with every field set to something non-trivial.
SAMPLES: dict[type, Any] = {
    m.Hello: m.Hello(
        "worker",
        m.PROTOCOL_VERSION,
        "3.11",
        "3.1.3",
        "0.1.0",
        "w-1",
        4242,
        "node-7",
        8,
        {"cpu": 8.0},
        ["gpu"],
    ),
    m.Welcome: m.Welcome(17, 0.5, 6, "scaler-1-store"),
    m.Refused: m.Refused("version mismatch: Python 3.12 (daemon: 3.11) — ünïcode"),
    m.Heartbeat: m.Heartbeat(12, 3),
    m.Goodbye: m.Goodbye("worker stopping", [m.TaskAttempt(2**40 + 7, 2)]),
    m.WorkerDraining: m.WorkerDraining([m.TaskAttempt(2**40 + 8, 0), m.TaskAttempt(2**41 + 1, 3)]),
    m.RegisterFunction: m.RegisterFunction(99, b"\x80\x05fn"),
    m.ReleaseFunctions: m.ReleaseFunctions([1, 2, 2**63 - 1]),
    m.RegisterOptions: m.RegisterOptions(2, OPTIONS),
    m.SubmitTasks: m.SubmitTasks(
        [SPEC, SPEC._replace(task_id=SPEC.task_id + 1, deps=[], objects=[])]
    ),
    m.SubmitAck: m.SubmitAck(2),
    m.TasksRunning: m.TasksRunning([SPEC.task_id, SPEC.task_id + 1]),
    m.DispatchTasks: m.DispatchTasks(
        [m.FunctionBlob(SPEC.fn_id, b"\x80\x05fn")],
        [
            m.TaskDispatch(SPEC.task_id, 1, SPEC.fn_id, 0, b"args", [b"obj"], 30.0, [m.DepValue(7, b"dep", [b"o"])]),
            m.TaskDispatch(SPEC.task_id + 1, 0, 0, m.TaskFlags.INLINE_FN, b"fnargs", [], None, []),
        ],
    ),
    m.CancelTasks: m.CancelTasks([SPEC.task_id], True),
    m.TasksCancelled: m.TasksCancelled([SPEC.task_id, 7], [2**40 + 3]),
    m.TaskResults: m.TaskResults(
        [
            m.TaskResult(SPEC.task_id, 0, m.Status.OK, b"\x80\x05result", FACTS, [b"o1", b"o2"]),
            m.TaskResult(SPEC.task_id + 1, 2, m.Status.WORKER_LOST, b"", m.NO_FACTS, []),
        ]
    ),
    m.ReleaseObjects: m.ReleaseObjects([b"\x00" * 20, b"\xff" * 20]),
    m.ClusterBroken: m.ClusterBroken("initializer failed on worker w-1", b"\x80\x05exc"),
    m.Seceded: m.Seceded([SPEC.task_id]),
    m.LaneDone: m.LaneDone(3, 1, 1, 2, 0.125, [SPEC.task_id], [], [m.LaneEnds(7, 12)]),
    m.LaneFlush: m.LaneFlush(),
    m.LaneStarted: m.LaneStarted([SPEC.task_id]),
    m.TaskRuns: m.TaskRuns(1, 3, b"\x00" * 17),
    m.PinObjects: m.PinObjects([b"\x01" * 16]),
    m.ObjectRequest: m.ObjectRequest([b"\x01" * 16, b"\x02" * 16]),
    m.ObjectData: m.ObjectData([b"\x01" * 16, b"\x02" * 16], [True, False]),
    m.ObjectChunk: m.ObjectChunk(b"\x01" * 16, 4 << 20, 100_000_000, (3 << 40) | 7, 1),
    m.ResultPart: m.ResultPart((3 << 40) | 7, b"\x01" * 16, 4 << 20, 100_000_000),
    m.ResultPartsTaken: m.ResultPartsTaken(2),
    m.ResultStreamEnded: m.ResultStreamEnded(b"\x01" * 16, "the worker was lost while it sent the result"),
    m.ObjectStored: m.ObjectStored(b"\x01" * 16, ""),
    m.ObjectPart: m.ObjectPart(b"\x01" * 16, 4 << 20, 100_000_000),
    m.ObjectPartsTaken: m.ObjectPartsTaken(3),
    m.StatsRequest: m.StatsRequest({"w1": 3}),
    m.Stats: m.Stats({"tasks": 3, "mean_seconds": 0.25, "state": "ok"}),
    m.HistoryRequest: m.HistoryRequest(),
    m.Resume: m.Resume(7, b"token-bytes"),
    m.ClientReport: m.ClientReport(
        [2**40 + 1], [m.FunctionBlob(2**40 + 2, b"fn")],
        [m.RegisterOptions(1, m.TaskOptions({"gpu": 1.0}, ["a"], 2, 3.5, 0))],
        [m.TaskSpec(2**40 + 3, 0, 1, 0, b"p", [2**40 + 1], [], 0)],
        [b"o" * 16, b"o" * 16],
        [2**40 + 1],
        [],
    ),
    m.WorkerReport: m.WorkerReport([m.TaskAttempt(2**40 + 8, 0)], [m.TaskAttempt(2**40 + 9, 1)]),
    m.ResultsAck: m.ResultsAck(12),
    m.ResultsJournaled: m.ResultsJournaled(3),
    m.History: m.History(
        [m.TaskRun("w1", 1.5, 2.0, 0)], 7, 10.0, [m.SeriesBucket(0.0, 3, 1, 1 << 30, 2)], {"workers": "2"}, 12.5
    ),
    m.TasksWithoutWorker: m.TasksWithoutWorker(12, 10.5, "10 need gpu=1, which no connected worker has"),
    m.ManagerOffer: m.ManagerOffer("slurm", 8, 1, 4, {"gpu": 1.0}, ["cuda"], 30.0, "partition gpu", ["m-1"]),
    m.WorkerStates: m.WorkerStates([m.WorkerChange("m-1", "pending", "4711", "", "Resources", "", 0.0, False)]),
    m.WorkerKeys: m.WorkerKeys([m.WorkerKey("m-1", "x" * 40)]),
    m.KeysAdmitted: m.KeysAdmitted(["m-1"]),
    m.ScaleWorkers: m.ScaleWorkers(2, ["m-0"]),
}


def body(*items: Any) -> list[bytes]:
    """Frames whose body is exactly ``items`` (raw msgpack: anything a peer could send)."""
    return [VERSION_FRAME, msgpack.packb(list(items), use_bin_type=True)]


def raw(cls: type, fields: Any) -> list[bytes]:
    """Frames carrying one message of type ``cls`` with raw ``fields``."""
    return body([MESSAGE_TAGS[cls], fields])


def as_wire(message: Any) -> list[Any]:
    """A message's fields as plain msgpack data (nested records become lists)."""
    return msgpack.unpackb(msgpack.packb(message, use_bin_type=True), raw=False)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- round trips


def test_every_message_type_has_a_sample() -> None:
    assert set(SAMPLES) == set(MESSAGE_TAGS), "add a sample for each new message type"
    assert len(set(MESSAGE_TAGS.values())) == len(MESSAGE_TAGS), "tags must be unique"


@pytest.mark.parametrize("cls", list(MESSAGE_TAGS), ids=lambda c: c.__name__)
def test_round_trip_of_every_message(cls: type) -> None:
    message = SAMPLES[cls]
    frames = encode([message])
    assert frames[0] == VERSION_FRAME
    assert len(frames) == 2
    messages, buffers = decode(frames)
    assert messages == [message]
    assert buffers == []
    (decoded,) = messages
    assert type(decoded) is cls
    assert isinstance(decoded, tuple)
    # Nested records come back as their own types, not as lists.
    for got, want in zip(decoded, message):
        assert type(got) is type(want) or (isinstance(want, float) and isinstance(got, int))
        if isinstance(want, list):
            assert [type(x) for x in got] == [type(x) for x in want]


def test_nested_records_are_typed() -> None:
    (submit,), _ = decode(encode([SAMPLES[m.SubmitTasks]]))
    assert all(type(t) is m.TaskSpec for t in submit.tasks)
    (dispatch,), _ = decode(encode([SAMPLES[m.DispatchTasks]]))
    assert type(dispatch.functions[0]) is m.FunctionBlob
    assert all(type(t) is m.TaskDispatch for t in dispatch.tasks)
    (results,), _ = decode(encode([SAMPLES[m.TaskResults]]))
    assert all(type(r) is m.TaskResult and type(r.facts) is m.TaskFacts for r in results.results)
    (options,), _ = decode(encode([SAMPLES[m.RegisterOptions]]))
    assert type(options.options) is m.TaskOptions


def test_encode_one_is_a_batch_of_one() -> None:
    message = SAMPLES[m.Heartbeat]
    assert encode_one(message) == encode([message])
    assert decode(encode_one(message)) == ([message], [])


def test_batch_keeps_order_and_types() -> None:
    batch = [SAMPLES[cls] for cls in MESSAGE_TAGS] + [m.SubmitAck(n) for n in range(500)]
    frames = encode(batch)
    assert len(frames) == 2, "a batch is one body frame"
    messages, _ = decode(frames)
    assert messages == batch
    assert [type(x) for x in messages] == [type(x) for x in batch]


def test_empty_batch() -> None:
    assert decode(encode([])) == ([], [])


def test_out_of_band_buffers_travel_as_their_own_frames() -> None:
    big = bytes(range(256)) * 4096
    view = memoryview(bytearray(b"zero-copy"))
    frames = encode([SAMPLES[m.ReleaseObjects]], buffers=[big, view, b""])
    assert len(frames) == 5
    assert frames[2] is big and frames[3] is view, "buffers are passed through, never copied"
    assert big not in frames[1], "buffers are never copied into the body"
    messages, buffers = decode(frames)
    assert messages == [SAMPLES[m.ReleaseObjects]]
    assert [bytes(b) for b in buffers] == [big, b"zero-copy", b""]


def test_decode_accepts_buffer_protocol_frames() -> None:
    frames = encode([SAMPLES[m.TaskResults]])
    messages, buffers = decode([memoryview(frames[0]), memoryview(frames[1]), bytearray(b"buf")])
    assert messages == [SAMPLES[m.TaskResults]]
    assert [bytes(b) for b in buffers] == [b"buf"]


def test_decode_errors_are_protocol_errors() -> None:
    assert issubclass(VersionMismatch, DecodeError)
    assert issubclass(DecodeError, ProtocolError)


# ---------------------------------------------------------------------- framing refusals


def test_wrong_version_names_both_versions() -> None:
    other = b"SCX/%d" % (m.PROTOCOL_VERSION + 1)
    frames = [other, encode([SAMPLES[m.Hello]])[1]]
    with pytest.raises(VersionMismatch) as info:
        decode(frames)
    text = str(info.value)
    assert other.decode() in text and VERSION_FRAME.decode() in text
    assert "same scaler-executor version" in text, "the refusal tells the fix"


@pytest.mark.parametrize(
    "first", [b"", b"SCX", b"HTTP/1.1 200 OK", b"\x00\x01", b"scx/1", b"SCX/1 "]
)
def test_non_scaler_first_frame(first: bytes) -> None:
    with pytest.raises(VersionMismatch):
        decode([first, encode([SAMPLES[m.Heartbeat]])[1]])
    with pytest.raises(VersionMismatch):
        check_version(first)


def test_check_version_accepts_ours() -> None:
    check_version(VERSION_FRAME)


@pytest.mark.parametrize("frames", [[], [VERSION_FRAME]], ids=["none", "version-only"])
def test_too_few_frames(frames: list[bytes]) -> None:
    with pytest.raises(DecodeError, match="at least 2 frames"):
        decode(frames)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"\x92\x01",
        b"\x91\x92\x01\x91",
        b"\xdb\xff\xff\xff\xff",
        b"\x90\x90",
        b"\xd9\x02\xff\xfe",
    ],
    ids=[
        "empty",
        "never-used-byte",
        "truncated-array",
        "truncated-nested",
        "huge-str-len",
        "trailing-data",
        "bad-utf8",
    ],
)
def test_non_msgpack_body(payload: bytes) -> None:
    with pytest.raises(DecodeError, match="not msgpack"):
        decode([VERSION_FRAME, payload])


def test_map_with_non_string_keys_is_refused() -> None:
    # strict_map_key: integer (or nested) map keys could be unhashable or confuse handlers
    with pytest.raises(DecodeError):
        decode([VERSION_FRAME, msgpack.packb({1: 2})])


@pytest.mark.parametrize("value", [5, "batch", b"batch", None, True, 1.5, {"a": 1}], ids=repr)
def test_body_not_a_list(value: Any) -> None:
    with pytest.raises(DecodeError, match="not a batch"):
        decode([VERSION_FRAME, msgpack.packb(value, use_bin_type=True)])


@pytest.mark.parametrize(
    "item",
    [[], [4], [4, [1, 2], 3], 4, "Heartbeat", None, {"4": [1, 2]}],
    ids=repr,
)
def test_message_not_tag_and_fields(item: Any) -> None:
    with pytest.raises(DecodeError, match=r"not \[tag, fields\]"):
        decode(body(item))


NEXT_TAG = max(MESSAGE_TAGS.values()) + 1  # not yet assigned


@pytest.mark.parametrize(
    "tag", [0, NEXT_TAG, 999, -1, 2**64 - 1, "4", b"\x04", 4.0, True, None, [4]], ids=repr
)
def test_unknown_tag(tag: Any) -> None:
    with pytest.raises(DecodeError, match="unknown message tag"):
        decode(body([tag, [0, 0]]))


def test_worker_draining_round_trip_and_validation() -> None:
    message = m.WorkerDraining([m.TaskAttempt(2**40 + 8, 0), m.TaskAttempt(5, 1)])
    (decoded,), _ = decode(encode([message]))
    assert decoded == message and type(decoded) is m.WorkerDraining
    assert all(type(u) is m.TaskAttempt for u in decoded.unstarted)
    assert decode(encode([m.WorkerDraining([])]))[0] == [m.WorkerDraining([])]
    assert m.WorkerDraining in m.ACCEPTED_FROM[m.Role.WORKER]
    assert m.WorkerDraining not in m.ACCEPTED_FROM[m.Role.CLIENT]
    for bad in ([[1]], [[1, "x"]], ["x"], [None], [[1, 2, 3]]):
        with pytest.raises(DecodeError):
            decode(raw(m.WorkerDraining, [bad]))


def test_one_bad_message_fails_the_whole_transmission() -> None:
    good = as_wire(SAMPLES[m.Heartbeat])
    with pytest.raises(DecodeError):
        decode(body([MESSAGE_TAGS[m.Heartbeat], good], [MESSAGE_TAGS[m.Heartbeat], [1]]))


# ---------------------------------------------------------------------- field validation


@pytest.mark.parametrize("cls", list(MESSAGE_TAGS), ids=lambda c: c.__name__)
def test_wrong_arity(cls: type) -> None:
    fields = as_wire(SAMPLES[cls])
    with pytest.raises(DecodeError, match="expected"):
        decode(raw(cls, fields + [0]))
    if fields:
        with pytest.raises(DecodeError, match="expected"):
            decode(raw(cls, fields[:-1]))


@pytest.mark.parametrize("fields", [{"reason": "x"}, "x", 5, None], ids=repr)
def test_fields_not_a_list(fields: Any) -> None:
    with pytest.raises(DecodeError):
        decode(raw(m.Goodbye, fields))


def test_stats_request_names_lane_results_by_worker() -> None:
    assert decode(raw(m.StatsRequest, [{}])) == ([m.StatsRequest()], [])
    assert decode(raw(m.StatsRequest, [{"w": 2}])) == ([m.StatsRequest({"w": 2})], [])
    for bad in ([], [None], [{"w": "2"}], [{2: 2}], [{}, {}]):
        with pytest.raises(DecodeError):
            decode(raw(m.StatsRequest, bad))


def _with(cls: type, **changes: Any) -> list[Any]:
    """The sample's wire fields with some replaced (by field name)."""
    fields = as_wire(SAMPLES[cls])
    for name, value in changes.items():
        fields[cls._fields.index(name)] = value  # type: ignore[attr-defined]
    return fields


def _spec_fields(**changes: Any) -> list[Any]:
    fields = as_wire(SPEC)
    for name, value in changes.items():
        fields[m.TaskSpec._fields.index(name)] = value
    return fields


BAD_FIELDS = [
    # int where bytes expected
    ("int-for-bytes", m.RegisterFunction, _with(m.RegisterFunction, payload=5)),
    # str where bytes expected (msgpack str and bin are distinct types)
    ("str-for-bytes", m.RegisterFunction, _with(m.RegisterFunction, payload="abc")),
    ("bytes-for-str", m.Goodbye, [b"reason", []]),
    # str where int expected
    ("str-for-int", m.SubmitAck, ["3"]),
    ("float-for-int", m.SubmitAck, [3.0]),
    ("str-for-int-in-hello", m.Hello, _with(m.Hello, pid="4242")),
    # None where a value is required
    ("none-for-str", m.Goodbye, [None, []]),
    ("goodbye-unstarted-not-records", m.Goodbye, ["bye", [7]]),
    ("goodbye-attempt-str", m.Goodbye, ["bye", [[7, "1"]]]),
    ("none-for-int", m.SubmitAck, [None]),
    ("none-for-bytes", m.RegisterFunction, _with(m.RegisterFunction, payload=None)),
    ("none-for-list", m.TasksRunning, [None]),
    ("none-for-dict", m.Hello, _with(m.Hello, resources=None)),
    ("none-for-record", m.RegisterOptions, [2, None]),
    ("none-for-bool", m.CancelTasks, [[1], None]),
    # nested TaskSpec with a bad field
    ("spec-payload-str", m.SubmitTasks, [[_spec_fields(payload="args")]]),
    ("spec-task-id-str", m.SubmitTasks, [[_spec_fields(task_id="1")]]),
    ("spec-deps-str", m.SubmitTasks, [[_spec_fields(deps=[1, "2"])]]),
    ("spec-objects-int", m.SubmitTasks, [[_spec_fields(objects=[b"ok", 3])]]),
    ("spec-short", m.SubmitTasks, [[_spec_fields()[:-1]]]),
    ("spec-not-list", m.SubmitTasks, [[b"spec"]]),
    ("second-spec-bad", m.SubmitTasks, [[_spec_fields(), _spec_fields(parent=None)]]),
    ("tasks-not-list", m.SubmitTasks, [_spec_fields()]),
    # deeper nesting: TaskResult.facts, TaskDispatch.task_timeout, TaskOptions
    ("facts-bad", m.TaskResults, [[[1, 0, 0, b"", ["w", "start", 0.0, 0]]]]),
    ("facts-none", m.TaskResults, [[[1, 0, 0, b"", None]]]),
    ("timeout-str", m.DispatchTasks, [[], [[1, 0, 0, 0, b"", [], "30"]]]),
    ("blob-payload-str", m.DispatchTasks, [[[1, "fn"]], []]),
    ("options-priority-none", m.RegisterOptions, [2, [{}, [], None, None, None]]),
    ("options-retries-float", m.RegisterOptions, [2, [{}, [], 0, None, 1.5]]),
    ("options-tags-int", m.RegisterOptions, [2, [{}, [1], 0, None, None]]),
    # list of ints containing a str
    ("ints-with-str", m.TasksRunning, [[1, 2, "3"]]),
    ("fn-ids-with-str", m.ReleaseFunctions, [["1"]]),
    ("ints-with-none", m.CancelTasks, [[1, None], False]),
    ("object-ids-with-str", m.ReleaseObjects, [[b"a", "b"]]),
    # dicts: key and value types
    ("resources-str-value", m.Hello, _with(m.Hello, resources={"cpu": "8"})),
    ("resources-bytes-key", m.Hello, _with(m.Hello, resources={b"cpu": 8.0})),
    ("resources-list", m.Hello, _with(m.Hello, resources=[["cpu", 8.0]])),
    ("stats-bytes-value", m.Stats, [{"a": b"x"}]),
    ("stats-none-value", m.Stats, [{"a": None}]),
    ("stats-list-value", m.Stats, [{"a": [1]}]),
    # bool fields: msgpack has a real boolean; 0/1 are not booleans
    ("int-for-bool", m.CancelTasks, [[1], 1]),
    ("str-for-bool", m.CancelTasks, [[1], "true"]),
    # floats: a str is not a number
    ("str-for-float", m.Welcome, [1, "0.5", 6]),
    ("none-for-float", m.Welcome, [1, None, 6]),
]


@pytest.mark.parametrize(
    "cls, fields", [(c, f) for _, c, f in BAD_FIELDS], ids=[n for n, _, _ in BAD_FIELDS]
)
def test_wrong_field_types(cls: type, fields: list[Any]) -> None:
    with pytest.raises(DecodeError):
        decode(raw(cls, fields))


def test_error_names_the_field() -> None:
    with pytest.raises(DecodeError, match="Goodbye.reason"):
        decode(raw(m.Goodbye, [5, []]))
    with pytest.raises(DecodeError, match="TaskSpec.payload"):
        decode(raw(m.SubmitTasks, [[_spec_fields(payload="args")]]))


# Bools are a distinct msgpack type.  Python's bool is a subclass of int, so a validator
# written as isinstance(value, int) lets True through as a task id, a capacity or a count.
BOOL_AS_NUMBER = [
    ("bool-for-int", m.SubmitAck, [True]),
    ("bool-for-int-in-list", m.TasksRunning, [[1, False]]),
    ("bool-for-capacity", m.Hello, _with(m.Hello, capacity=True)),
    ("bool-for-spec-task-id", m.SubmitTasks, [[_spec_fields(task_id=True)]]),
    ("bool-for-float", m.Welcome, [1, True, 6]),
    ("bool-for-optional-float", m.DispatchTasks, [[], [[1, 0, 0, 0, b"", [], False]]]),
    ("bool-for-float-in-dict", m.Hello, _with(m.Hello, resources={"cpu": True})),
]


@pytest.mark.parametrize(
    "cls, fields", [(c, f) for _, c, f in BOOL_AS_NUMBER], ids=[n for n, _, _ in BOOL_AS_NUMBER]
)
def test_bool_is_not_a_number(cls: type, fields: list[Any]) -> None:
    with pytest.raises(DecodeError):
        decode(raw(cls, fields))


def test_bool_fields_accept_bools() -> None:
    for force in (True, False):
        assert decode(raw(m.CancelTasks, [[1], force])) == ([m.CancelTasks([1], force)], [])


def test_float_fields_accept_ints() -> None:
    (welcome,), _ = decode(raw(m.Welcome, [1, 2, 6, "", True, 30, b"", 0]))
    assert welcome == m.Welcome(1, 2, 6, "", True, 30, b"", 0) and welcome.heartbeat_interval == 2.0
    assert welcome.grace == 30.0
    (dispatch,), _ = decode(raw(m.DispatchTasks, [[], [[1, 0, 0, 0, b"", [], 30, [], "", ""]]]))
    assert dispatch.tasks[0].task_timeout == 30
    (hello,), _ = decode(raw(m.Hello, _with(m.Hello, resources={"cpu": 8})))
    assert hello.resources == {"cpu": 8}
    (results,), _ = decode(raw(m.TaskResults, [[[1, 0, 0, b"", ["w", 1, 2, 0], [], False, b""]]]))
    assert results.results[0].facts.finished == 2


def test_optional_fields_accept_none() -> None:
    (dispatch,), _ = decode(raw(m.DispatchTasks, [[], [[1, 0, 0, 0, b"", [], None, [], "", ""]]]))
    assert dispatch.tasks[0].task_timeout is None
    (options,), _ = decode(raw(m.RegisterOptions, [0, [{}, [], 0, None, None]]))
    assert options.options == m.DEFAULT_OPTIONS


def test_stats_union_values() -> None:
    snapshot: dict[str, int | float | str] = {"i": 1, "f": 0.5, "s": "x", "big": 2**63}
    assert decode(raw(m.Stats, [snapshot, 0.0, [], [], [], [], {}, [], 0.0, "", []])) == ([m.Stats(snapshot)], [])


def test_large_integers() -> None:
    ids = [0, 2**64 - 1, -(2**63)]
    assert decode(raw(m.TasksRunning, [ids])) == ([m.TasksRunning(ids)], [])


# ---------------------------------------------------------------------- fuzz

# No example database: it would write .hypothesis/ into the checkout; failures print their example.
FUZZ = settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
structures = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
tags = st.sampled_from(sorted(MESSAGE_TAGS.values())) | st.integers(min_value=-2, max_value=25)


def _decodes_or_refuses(frames: list[Any]) -> None:
    """The codec's contract: valid messages, or DecodeError — nothing else."""
    try:
        decode(frames, TINY)  # the caps too refuse only with DecodeError
    except DecodeError:
        pass
    try:
        messages, _buffers = decode(frames)
    except DecodeError:
        return
    for message in messages:
        assert type(message) in MESSAGE_TAGS
    # Whatever was accepted is valid: it re-encodes and decodes to the same encoding.
    again = encode(messages)
    assert encode(decode(again)[0]) == again


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_body_bytes(data: bytes) -> None:
    _decodes_or_refuses([VERSION_FRAME, data])


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=4))
def test_fuzz_random_frames(frames: list[bytes]) -> None:
    _decodes_or_refuses(frames)


@FUZZ
@given(structures)
def test_fuzz_random_msgpack_body(value: Any) -> None:
    _decodes_or_refuses([VERSION_FRAME, msgpack.packb(value, use_bin_type=True)])


@FUZZ
@given(st.lists(st.tuples(tags, structures), min_size=1, max_size=2))
def test_fuzz_random_messages(items: list[tuple[int, Any]]) -> None:
    _decodes_or_refuses(body(*[[tag, fields] for tag, fields in items]))


def _mutate(data: st.DataObject, value: Any, depth: int = 0) -> Any:
    """Replace one random subtree of a wire value with a random structure."""
    if isinstance(value, list) and value and depth < 6 and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(value) - 1))
        return value[:i] + [_mutate(data, value[i], depth + 1)] + value[i + 1 :]
    if isinstance(value, dict) and value and depth < 6 and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate(data, value[key], depth + 1)}
    return data.draw(structures)


@FUZZ
@given(st.sampled_from(list(MESSAGE_TAGS)), st.data())
def test_fuzz_mutated_valid_messages(cls: type, data: st.DataObject) -> None:
    # Start from a valid message and break one part of it, so the fuzz reaches the
    # validators of nested records rather than failing at the outer shape.
    fields = _mutate(data, as_wire(SAMPLES[cls]))
    _decodes_or_refuses(raw(cls, fields))


# ---------------------------------------------------------------------- caps (codec.Limits)

DAEMON = daemon_limits(ClusterConfig(), "tcp://127.0.0.1:1")
TINY = Limits(messages=3, array=5, map=2, string=8, binary=8)


def heartbeats(n: int) -> list[bytes]:
    """A batch of ``n`` heartbeats, written directly (as a peer would, without building it)."""
    header = bytes([0x90 | n]) if n < 16 else (b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))
    return [VERSION_FRAME, header + msgpack.packb([4, list(m.Heartbeat(0, 0))]) * n]


@pytest.mark.parametrize("n", [3, 15, 16, 65535, 65536])
def test_the_batch_header_is_read_for_every_array_form(n: int) -> None:
    limits = TINY._replace(messages=n, array=1 << 20)
    assert len(decode(heartbeats(n), limits)[0]) == n
    with pytest.raises(DecodeError, match=f"a batch of {n} messages"):
        decode(heartbeats(n), limits._replace(messages=n - 1))


def test_a_flood_of_small_messages_is_refused_from_its_header() -> None:
    # The audit's batch (2 M heartbeats in 10 MB) grew the daemon by ~500 MB as it decoded.
    frames = heartbeats(2_000_000)
    with pytest.raises(DecodeError, match=r"a batch of 2000000 messages \(at most 100000"):
        decode(frames, DAEMON)
    # Refused before decoding: even an undecodable rest of the body does not matter.
    with pytest.raises(DecodeError, match="a batch of 2000000"):
        decode([VERSION_FRAME, frames[1][:5] + b"\xc1"], DAEMON)
    assert len(decode(heartbeats(MAX_BATCH_MESSAGES), DAEMON)[0]) == MAX_BATCH_MESSAGES


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        (raw(m.ReleaseFunctions, [[1, 2, 3, 4, 5, 6]]), "max_array_len"),
        (raw(m.CancelTasks, [list(range(6)), False]), "max_array_len"),
        (raw(m.RegisterOptions, [1, [{"a": 1.0, "b": 1.0, "c": 1.0}, [], 0, None, None]]), "max_map_len"),
        (raw(m.Goodbye, ["x" * 9, []]), "max_str_len"),
        (raw(m.RegisterFunction, [1, b"x" * 9]), "max_bin_len"),
        ([VERSION_FRAME, msgpack.packb([[4, [msgpack.ExtType(1, b"x"), 0]]])], "max_ext_len"),
    ],
)
def test_each_cap_refuses_what_exceeds_it(frames: list[bytes], reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode(frames, TINY)
    if reason != "max_ext_len":  # (no message has an extension type: refused uncapped too)
        decode(frames)  # uncapped: a valid message


@pytest.mark.parametrize("depth", [900, 1000, 1023, 1024, 1025, 100_000])
@pytest.mark.parametrize("limits", [None, DAEMON])
def test_deep_nesting_is_a_decode_error(depth: int, limits: Limits | None) -> None:
    # msgpack nests at most 1024 levels (StackError beyond); a little less used to reach
    # the error text's repr, which raised RecursionError: out of the daemon's except.
    for frames in (
        [VERSION_FRAME, b"\x91" * depth + b"\x00"],  # the batch itself
        [VERSION_FRAME, b"\x91\x91" + b"\x91" * depth + b"\x00"],  # a message
        [VERSION_FRAME, b"\x91\x92\x04" + b"\x91" * depth + b"\x00"],  # a message's fields
        [VERSION_FRAME, b"\x91\x92" + b"\x91" * depth + b"\x00" + b"\x90"],  # its tag
    ):
        with pytest.raises(DecodeError):
            decode(frames, limits)


def test_error_text_of_a_huge_value_stays_short() -> None:
    # A peer's values appear in the error (which is logged): abbreviated, not repr'd whole.
    for frames in (
        body(list(range(1_000_000))),
        raw(m.Heartbeat, list(range(1_000_000))),
        body([[[[[[[[1] * 1000] * 10]]]]], 1]),
        [b"SCX/9" + b"x" * 10_000_000, msgpack.packb([])],
    ):
        with pytest.raises(DecodeError) as info:
            decode(frames, DAEMON)
        assert len(str(info.value)) < 300, str(info.value)[:300]


def test_the_daemons_caps_pass_the_largest_legitimate_messages() -> None:
    # A graph of 10^5 nodes is one SubmitTasks (client/state.py _graph), whose last node
    # depends on every other; a cancel of every pending task is one CancelTasks; the ids
    # are full-width (client id in the high bits).
    base = 5 << m.TASK_ID_BITS
    nodes = [m.TaskSpec(base | i, base | 1, 0, 0, b"\x80\x05args", [base | (i - 1)] if i else [], [], 0) for i in range(100_000)]
    nodes.append(m.TaskSpec(base | 100_000, base | 1, 0, 0, b"", [n.task_id for n in nodes], [], 0))
    cancel = m.CancelTasks([base | i for i in range(1_000_000)], False)
    big = m.RegisterFunction(base | 2, b"\x00" * (64 << 20))  # a large pickled callable
    assert decode(encode([m.SubmitTasks(nodes), cancel, big]), DAEMON)[0] == [m.SubmitTasks(nodes), cancel, big]
    # The senders split at SEND_BATCH_MESSAGES, well under the cap.
    assert DAEMON.messages >= SEND_BATCH_MESSAGES * 10


def test_the_daemons_array_cap_follows_max_pending_tasks() -> None:
    limits = daemon_limits(ClusterConfig(max_pending_tasks=5_000_000), "tcp://127.0.0.1:1")
    assert limits.array == 5_000_000
    assert daemon_limits(ClusterConfig(max_message_size=64 << 20), "tcp://h:1").binary == 64 << 20
    # ipc:// has no frame cap (ZMQ_MAXMSGSIZE is tcp only): payloads only msgpack's own.
    assert daemon_limits(ClusterConfig(), "ipc:///tmp/x").binary == 2**32 - 1
