"""FrameReader reads what multiprocessing.connection.Connection.send_bytes writes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from scaler_executor.worker.framing import LARGE, FrameReader


@pytest.fixture
def pair() -> Iterator[tuple[Connection, FrameReader, socket.socket]]:
    a, b = socket.socketpair()
    writer = Connection(a.detach())
    yield writer, FrameReader(b.fileno()), b
    writer.close()
    b.close()


def test_frames_sent_together_come_from_one_read(pair: tuple[Connection, FrameReader, socket.socket]) -> None:
    writer, reader, _ = pair
    for payload in (b"one", b"", b"three"):
        writer.send_bytes(payload)
    reader.fill()
    assert reader.frames() == [b"one", b"", b"three"]
    assert reader.frames() == []


def test_a_frame_split_across_reads_waits_for_its_rest(pair: tuple[Connection, FrameReader, socket.socket]) -> None:
    writer, reader, _ = pair
    raw = socket.socket(fileno=writer.fileno())
    try:
        raw.sendall(b"\x00\x00\x00\x05ab")  # the header and part of the body
        reader.fill()
        assert reader.frames() == []
        raw.sendall(b"cde\x00\x00\x00\x01z")
        reader.fill()
        assert reader.frames() == [b"abcde", b"z"]
    finally:
        raw.detach()


def test_large_frames_arrive_whole(pair: tuple[Connection, FrameReader, socket.socket]) -> None:
    writer, reader, _ = pair
    big = bytes(range(256)) * (3 * LARGE // 256 + 7)
    sender = threading.Thread(target=lambda: [writer.send_bytes(m) for m in (b"a", big, b"b")])
    sender.start()
    got = [reader.next() for _ in range(3)]
    sender.join()
    assert got[0] == b"a" and bytes(got[1]) == big and got[2] == b"b"


def test_available_never_blocks(pair: tuple[Connection, FrameReader, socket.socket]) -> None:
    writer, reader, _ = pair
    assert reader.available() == []
    writer.send_bytes(b"x")
    writer.send_bytes(b"y")
    assert reader.next() == b"x"
    assert reader.available() == [b"y"]


def test_end_of_stream(pair: tuple[Connection, FrameReader, socket.socket]) -> None:
    writer, reader, _ = pair
    writer.send_bytes(b"last")
    writer.close()
    assert reader.next() == b"last"
    with pytest.raises(EOFError):
        reader.next()
