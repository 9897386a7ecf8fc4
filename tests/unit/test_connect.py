"""client/connect.py against real local sockets: the causes a failing first handshake
names, and the probe that tells a dead daemon (nothing listens) from a quiet one."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scaler_executor.client.connect import PROBE_EVERY, ListenerProbe, likely_cause, no_welcome


@pytest.fixture
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def stale_socket_file(path: Path) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the file stays: what a SIGKILLed daemon leaves
    return str(path)


def probe_until_answer(probe: ListenerProbe, now: float = 0.0) -> str | None:
    """Check until the probe decided (a tcp connect may be in flight for a moment)."""
    deadline = time.monotonic() + 10
    while True:
        verdict = probe.check(now)
        if verdict is not None or not probe.asking or time.monotonic() > deadline:
            return verdict


def test_the_message_names_the_address_the_cause_and_the_setting(free_port: int) -> None:
    text = no_welcome(f"tcp://127.0.0.1:{free_port}", 5.0)
    assert text.startswith(f"no scaler-daemon answered at tcp://127.0.0.1:{free_port} within 5.0 s (connect_timeout): ")
    assert f"nothing listens on 127.0.0.1 port {free_port}" in text


def test_causes(tmp_path: Path, listener: socket.socket) -> None:
    assert "there is no socket file" in likely_cause(f"ipc://{tmp_path}/nothing.sock")
    assert "nothing accepts connections" in likely_cause(f"ipc://{stale_socket_file(tmp_path / 's.sock')}")
    port = listener.getsockname()[1]
    assert "something listens on 127.0.0.1 port" in likely_cause(f"tcp://127.0.0.1:{port}")
    assert "does not resolve" in likely_cause("tcp://no-such-host.invalid:1")
    assert "is not tcp://HOST:PORT" in likely_cause("tcp://127.0.0.1")
    assert "no tcp:// or ipc:// scheme" in likely_cause("127.0.0.1:8786")


def test_the_probe_finds_a_refused_tcp_port_and_a_gone_or_dead_ipc_socket(tmp_path: Path, free_port: int) -> None:
    assert "connection refused" in (probe_until_answer(ListenerProbe(f"tcp://127.0.0.1:{free_port}")) or "")
    assert "socket file" in (ListenerProbe(f"ipc://{tmp_path}/gone.sock").check(0.0) or "")
    stale = stale_socket_file(tmp_path / "dead.sock")
    assert "connection refused" in (ListenerProbe(f"ipc://{stale}").check(0.0) or "")


def test_the_probe_says_nothing_while_something_listens(tmp_path: Path, listener: socket.socket) -> None:
    probe = ListenerProbe(f"tcp://127.0.0.1:{listener.getsockname()[1]}")
    assert probe_until_answer(probe) is None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.bind(str(tmp_path / "live.sock"))
        unix.listen()
        assert ListenerProbe(f"ipc://{tmp_path}/live.sock").check(0.0) is None


def test_the_probe_asks_at_most_once_per_interval(tmp_path: Path) -> None:
    probe = ListenerProbe(f"ipc://{tmp_path}/gone.sock")
    assert probe.check(100.0) is not None
    assert probe.check(100.0 + PROBE_EVERY / 2) is None  # not asked again yet
    assert probe.check(100.0 + PROBE_EVERY) is not None


def test_silence_threshold_comes_from_the_welcome() -> None:
    probe = ListenerProbe("tcp://127.0.0.1:1")
    assert probe.silent_after == float("inf")  # before a Welcome the probe never runs
    probe.welcomed(0.5)
    assert probe.silent_after == 1.0
