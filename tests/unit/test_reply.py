"""Reply datagrams (protocol/reply.py): a result from a processor straight to its client.

The layout is fixed (not the codec's msgpack), so it gets its own round trips and its
own refusals: anything but a datagram this version wrote raises DecodeError, never
another exception, and a result the layout cannot carry raises ValueError at the
sender, which then takes the daemon's path.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler_executor.protocol import messages as m
from scaler_executor.protocol import reply
from scaler_executor.protocol.codec import VERSION_FRAME, DecodeError

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def result(**changes: object) -> m.TaskResult:
    base = m.TaskResult(
        (3 << m.TASK_ID_BITS) | 17, 2, m.Status.ERROR, pickle.dumps(("x", 1), 5), m.TaskFacts("worker-é-1", 1.5, 2.25, 4096), []
    )
    return base._replace(**changes)


def test_a_result_round_trips_with_its_lane() -> None:
    sent = result()
    assert reply.decode(reply.encode(sent)) == (sent, "")
    assert reply.decode(reply.encode(sent, "/tmp/scaler-1-x/lane-42.sock")) == (sent, "/tmp/scaler-1-x/lane-42.sock")


@FUZZ
@given(
    task_id=st.integers(0, 2**64 - 1),
    attempt=st.integers(0, 2**32 - 1),
    status=st.integers(0, 255),
    started=st.floats(allow_nan=False),
    finished=st.floats(allow_nan=False),
    peak=st.integers(0, 2**64 - 1),
    worker=st.text(max_size=40),
    lane=st.text(max_size=40),
    payload=st.binary(max_size=200),
)
def test_any_representable_result_round_trips(
    task_id: int, attempt: int, status: int, started: float, finished: float, peak: int, worker: str, lane: str, payload: bytes
) -> None:
    sent = m.TaskResult(task_id, attempt, status, payload, m.TaskFacts(worker, started, finished, peak), [])
    assert reply.decode(reply.encode(sent, lane)) == (sent, lane)


def test_the_largest_payload_fits_the_clients_read() -> None:
    datagram = reply.encode(result(payload=b"p" * reply.MAX_PAYLOAD, facts=m.TaskFacts("w" * 1000, 0.0, 0.0, 0)), "/l" * 1000)
    assert len(datagram) <= reply.DATAGRAM_LIMIT


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"objects": [b"\x01" * 20]}, "store objects"),
        ({"task_id": 2**64}, "does not fit"),
        ({"attempt": -1}, "does not fit"),
        ({"facts": m.TaskFacts("w" * 5000, 0.0, 0.0, 0)}, "worker name and lane path"),
    ],
)
def test_a_result_the_layout_cannot_carry_is_refused_at_the_sender(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        reply.encode(result(**changes))


def test_another_protocol_version_is_refused_by_name() -> None:
    datagram = reply.encode(result())
    other = b"SCX/99".ljust(8, b"\0") + datagram[8:]
    with pytest.raises(DecodeError, match=r"SCX/99.*same scaler-executor version"):
        reply.decode(other)
    assert VERSION_FRAME != b"SCX/99"


@pytest.mark.parametrize(
    ("mangle", "words"),
    [
        (lambda d: d[:10], "shorter than"),
        (lambda d: d[:49] + b"wor", "run past its end"),
        (lambda d: d[:49] + b"\xff" * 10 + d[59:], "not UTF-8"),
    ],
)
def test_a_mangled_datagram_is_refused(mangle: object, words: str) -> None:
    datagram = reply.encode(result(facts=m.TaskFacts("w" * 10, 0.0, 0.0, 0)))
    with pytest.raises(DecodeError, match=words):
        reply.decode(mangle(datagram))  # type: ignore[operator]


@FUZZ
@given(st.binary(max_size=120))
def test_any_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        decoded, lane = reply.decode(data)
    except DecodeError:
        return
    assert isinstance(decoded, m.TaskResult) and isinstance(lane, str)
