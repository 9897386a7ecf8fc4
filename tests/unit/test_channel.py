"""The ipc stream transport (protocol/channel.py) against real Unix sockets: order and
integrity, the high-water mark, routing errors, connecting before the daemon binds,
reconnecting, bad peers, and flushing on close."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from scaler_executor.protocol import channel

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def address() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="chan-", dir="/tmp")  # short: sun_path is 108 bytes
    yield f"ipc://{directory}/d.sock"
    shutil.rmtree(directory)


def until(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Turn the channels (non-blocking calls) until ``predicate`` returns something true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.001)
    raise AssertionError("timed out")


def recv_one(chan: Any, *others: Any) -> list[Any]:
    """The next transmission on ``chan``, turning ``others`` meanwhile (as their loops
    would: ``poll_timeout`` lets a disconnected dealer retry, ``readable`` writes)."""

    def turn() -> Any:
        for other in others:
            other.poll_timeout(10)
            other.readable()
        chan.poll_timeout(10)
        return chan.readable() and chan.recv()

    return until(turn)


def test_round_trip_in_order_with_identities(address: str) -> None:
    router = channel.bind(address, hwm=1000)
    a = channel.connect(address, hwm=1000, linger=1)
    b = channel.connect(address, hwm=1000, linger=1)
    try:
        for i in range(100):
            a.send([b"a", str(i).encode()])
        b.send([b"b", b""])
        got: list[list[Any]] = []
        until(lambda: (router.readable() and got.append(router.recv())) or len(got) == 101)
        from_a = [f for f in got if f[1] == b"a"]
        assert [int(f[2]) for f in from_a] == list(range(100))
        (from_b,) = [f for f in got if f[1] == b"b"]
        assert from_b[2] == b""  # an empty frame survives
        id_a, id_b = from_a[0][0], from_b[0]
        assert id_a != id_b and all(f[0] == id_a for f in from_a)
        router.send([id_b, b"to", b"b"])
        router.send([id_a, b"to", b"a"])
        assert recv_one(b) == [b"to", b"b"]
        assert recv_one(a) == [b"to", b"a"]
    finally:
        a.close()
        b.close()
        router.close()


def test_large_transmissions_and_many_frames_arrive_whole(address: str) -> None:
    router = channel.bind(address, hwm=10)
    dealer = channel.connect(address, hwm=10, linger=1)
    try:
        big = os.urandom(8 << 20)  # far beyond a socket buffer: written in many parts
        many = [i.to_bytes(2, "big") for i in range(3000)]  # beyond one sendmsg's iovecs
        dealer.send([b"big", memoryview(big), b"tail"])
        dealer.send([b"many", *many])
        got: list[list[Any]] = []

        def turn() -> bool:
            dealer.readable()  # the dealer writes what its socket takes as it turns
            if router.readable():
                got.append(router.recv())
            return len(got) == 2

        until(turn)
        assert got[0][1:] == [b"big", big, b"tail"]
        assert got[1][1:] == [b"many", *many]
        identity = got[0][0]
        router.send([identity, big])
        assert until(lambda: (router.readable() or True) and dealer.readable() and dealer.recv()) == [big]
    finally:
        dealer.close()
        router.close()


def test_high_water_mark_raises_again_and_routing_errors(address: str) -> None:
    router = channel.bind(address, hwm=3)
    dealer = channel.connect(address, hwm=3, linger=0)
    try:
        dealer.send([b"hello"])
        identity = recv_one(router)[0]
        with pytest.raises(channel.Unreachable):
            router.send([b"\x00nobody", b"x"])
        # The dealer never reads: the kernel's buffer fills, then three queue, then Again.
        chunk = b"x" * (1 << 20)
        with pytest.raises(channel.Again):
            for _ in range(1000):
                router.send([identity, chunk])
        dealer.close()
        # Its departure is noticed on the next read; then its identity is unknown.
        until(lambda: not router.readable() and identity not in router.by_identity)
        with pytest.raises(channel.Unreachable):
            router.send([identity, b"x"])
    finally:
        router.close()


def test_connect_before_bind_and_reconnect_after_the_daemon_returns(address: str) -> None:
    dealer = channel.connect(address, hwm=100, linger=1)
    try:
        dealer.send([b"early", b"1"])  # nobody listens yet: held
        dealer.send([b"early", b"2"])
        assert dealer.poll_timeout(1000) <= 10  # a disconnected dealer wakes to retry
        router = channel.bind(address, hwm=100)
        assert [recv_one(router, dealer)[1:] for _ in range(2)] == [[b"early", b"1"], [b"early", b"2"]]
        router.close()
        os.unlink(address[len("ipc://") :])
        until(lambda: not dealer.readable() and dealer.conn is None)  # saw the end of stream
        router = channel.bind(address, hwm=100)
        dealer.send([b"again"])
        assert recv_one(router, dealer)[1:] == [b"again"]
        router.close()
    finally:
        dealer.close()


def test_a_peer_that_is_not_ours_is_dropped_and_others_are_served(address: str) -> None:
    router = channel.bind(address, hwm=10)
    path = address[len("ipc://") :]
    good = channel.connect(address, hwm=10, linger=1)
    try:
        with socket.socket(socket.AF_UNIX) as zmtp:
            zmtp.connect(path)
            zmtp.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")  # a ZMTP greeting
            with socket.socket(socket.AF_UNIX) as garbage:
                garbage.connect(path)
                garbage.sendall(channel.GREETING + (0xFFFFFFFF).to_bytes(4, "little"))
                good.send([b"ok"])
                assert recv_one(router)[1:] == [b"ok"]
                until(lambda: not router.readable() and len(router.by_fd) == 1)
                assert zmtp.recv(100) == channel.GREETING  # then end of stream
                assert zmtp.recv(100) == b""
    finally:
        good.close()
        router.close()


def test_close_with_linger_flushes_what_is_queued(address: str) -> None:
    router = channel.bind(address, hwm=100)
    dealer = channel.connect(address, hwm=100, linger=20)
    big = os.urandom(4 << 20)
    dealer.send([big])  # more than the socket holds: part waits in the dealer
    assert dealer.conn is not None and dealer.conn.out
    got: list[list[Any]] = []
    reader = threading.Thread(target=lambda: got.append(recv_one(router)))
    reader.start()  # the router reads (in its own thread) while close() writes the rest
    try:
        dealer.close()
        assert dealer.conn is None
    finally:
        reader.join(30)
        router.close()
    assert [frames[1:] for frames in got] == [[big]]


def test_tcp_addresses_keep_zeromq() -> None:
    router = channel.bind("tcp://127.0.0.1:*", hwm=10)
    try:
        assert isinstance(router, channel.RouterChannel)
        endpoint = router.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        dealer = channel.connect(endpoint, hwm=10, linger=0)
        try:
            dealer.send([b"over", b"tcp"])
            poller = channel.Poller()
            poller.register(router.pollable)
            assert poller.poll(10_000) == [router.pollable]
            assert router.recv()[1:] == [b"over", b"tcp"]
            with pytest.raises(channel.Again):
                router.recv()  # nothing more: ZeroMQ's Again, as the channel's own
            with pytest.raises(channel.Unreachable):
                router.send([b"\x00nobody", b"x"])
            poller.close()
        finally:
            dealer.close()
    finally:
        router.close()
