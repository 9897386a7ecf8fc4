"""What a real client (``ScalerExecutor(address=...)``) does with daemon transmissions that
are odd but decodable: an empty batch, a message meant for someone else, and results whose
status or payload cannot be read.  None may stop the client, and no future may be left
pending: an unreadable result fails its future with ``ResultUnreadable``.

The daemon here is the test: it binds the ipc socket (``channel.bind``, the daemon's own
transport), answers the client's Hello and speaks the wire protocol through ``codec``.
"""

from __future__ import annotations

import concurrent.futures
import pickle
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scaler_executor import ClusterConfig, ResultUnreadable, ScalerExecutor
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.messages import Status

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0


class FakeDaemon:
    def __init__(self, directory: str) -> None:
        self.address = f"ipc://{directory}/d.sock"
        self.router = channel.bind(self.address, hwm=1000)
        self.peer: bytes | None = None

    def next_batch(self, timeout: float = WAIT) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.router.poll_timeout(10)
            if self.router.readable():
                identity, *frames = self.router.recv()
                self.peer = identity
                messages, _ = codec.decode(frames)
                return messages
            time.sleep(0.002)
        raise AssertionError(f"the client sent nothing for {timeout} s")

    def wait_for(self, kind: type, timeout: float = WAIT) -> list[Any]:
        """Messages of ``kind`` from the next transmission that has any."""
        deadline = time.monotonic() + timeout
        while True:
            found = [x for x in self.next_batch(max(0.0, deadline - time.monotonic())) if type(x) is kind]
            if found:
                return found

    def send(self, batch: list[Any]) -> None:
        assert self.peer is not None
        self.router.send([self.peer, *codec.encode(batch)])

    def close(self) -> None:
        self.router.close()


@pytest.fixture
def daemon(tmp_path: Any) -> Iterator[FakeDaemon]:
    fake = FakeDaemon(str(tmp_path))
    yield fake
    fake.close()


@pytest.fixture
def client(daemon: FakeDaemon) -> Iterator[ScalerExecutor]:
    # The constructor returns once the daemon welcomed it: made on a thread while we answer.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        made = pool.submit(ScalerExecutor, address=daemon.address, config=ClusterConfig(daemon_loss_timeout=30.0))
        (hello,) = daemon.wait_for(m.Hello)
        assert hello.role == m.Role.CLIENT
        daemon.send([m.Welcome(3, 0.5, 10, "")])
        ex = made.result(timeout=WAIT)
    try:
        yield ex
    finally:
        ex.shutdown(wait=False, cancel_futures=False)
        deadline = time.monotonic() + WAIT
        while not ex._agent.finished.is_set() and time.monotonic() < deadline:
            try:
                daemon.next_batch(0.05)
            except AssertionError:
                pass
        assert ex._agent.finished.is_set(), "the client did not stop"


def submitted(daemon: FakeDaemon, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        for message in daemon.wait_for(m.SubmitTasks):
            ids.extend(spec.task_id for spec in message.tasks)
    return ids


def result(task_id: int, status: int, payload: bytes) -> m.TaskResult:
    return m.TaskResult(task_id, 0, status, payload, m.TaskFacts("w", 1.0, 2.0, 0), [])


def test_an_empty_batch_and_messages_for_others_are_dropped_and_the_client_carries_on(
    client: ScalerExecutor, daemon: FakeDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    future = client.submit(pow, 2, 5)
    (task_id,) = submitted(daemon, 1)
    daemon.send([])  # the codec accepts an empty batch
    daemon.send([m.DispatchTasks([], []), m.LaneDone(0, 0, 0, 0, 0.0, [])])  # a worker's and the daemon's
    daemon.send([m.SubmitAck(1), m.TaskResults([result(task_id, Status.OK, pickle.dumps(32))])])
    assert future.result(timeout=WAIT) == 32
    assert "dropped a DispatchTasks from the daemon" in caplog.text
    assert "dropped a LaneDone from the daemon" in caplog.text


@pytest.mark.parametrize(
    ("status", "payload", "says"),
    [
        (Status.WORKER_LOST, b"\xc1 not msgpack", "could not read the result"),
        (Status.DEP_FAILED, b"\x93\x01", "could not read the result"),
        (Status.ERROR, b"not an exception record", ""),
        (Status.OK, b"\x80\x05N", "while unpickling the result"),
        (250, b"", "unknown status 250"),
    ],
)
def test_a_result_the_client_cannot_read_fails_its_future_and_others_complete(
    client: ScalerExecutor, daemon: FakeDaemon, status: int, payload: bytes, says: str
) -> None:
    bad, good = client.submit(pow, 2, 1), client.submit(pow, 2, 2)
    bad_id, good_id = submitted(daemon, 2)
    daemon.send([m.SubmitAck(2), m.TaskResults([result(bad_id, status, payload), result(good_id, Status.OK, pickle.dumps(4))])])
    exc = bad.exception(timeout=WAIT)
    assert exc is not None, "an unreadable result must fail its future"
    assert isinstance(exc, Exception), "never a raw BaseException into the caller"
    text = f"{exc!r} {getattr(exc, '__notes__', '')}"
    assert says in text, text
    if says == "could not read the result":
        assert isinstance(exc, ResultUnreadable)
    assert good.result(timeout=WAIT) == 4
    after = client.submit(pow, 3, 2)
    (after_id,) = submitted(daemon, 1)
    daemon.send([m.SubmitAck(1), m.TaskResults([result(after_id, Status.OK, pickle.dumps(9))])])
    assert after.result(timeout=WAIT) == 9, "the client goes on after an unreadable result"
