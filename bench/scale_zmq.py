"""bench/scale.py's tcp:// peers: one ZeroMQ DEALER per simulated peer, all in one context."""

from __future__ import annotations

from typing import Any

from scaler_executor.protocol import channel


class SharedZmqDealer:
    """A tcp:// peer's socket in the harness's one ZeroMQ context (a channel's interface)."""

    buffered = False

    def __init__(self, context: Any, address: str, hwm: int, credential: Any) -> None:
        import zmq

        from scaler_executor.protocol import wire

        self._wire = wire
        self._again = zmq.Again
        self.sock = context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        if credential is not None:
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, credential.daemon_public_key.encode("ascii"))
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, credential.public_key.encode("ascii"))
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, credential.secret_key.encode("ascii"))
        self.sock.connect(address)
        self.pollable = self.sock

    def send(self, frames: list[Any]) -> None:
        try:
            self._wire.send(self.sock, frames)
        except self._again:
            raise channel.Again() from None

    def readable(self) -> bool:
        return bool(self._wire.readable(self.sock))

    def recv(self) -> list[Any]:
        try:
            return list(self._wire.recv(self.sock))
        except self._again:
            raise channel.Again() from None

    def poll_timeout(self, timeout_ms: float) -> float:
        return timeout_ms

    def close(self, linger: float | None = None) -> None:
        self.sock.close(linger=0)
