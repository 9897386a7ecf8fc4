"""The connecting side of security: CURVE on a peer's socket, and handshakes that say what failed.

A CURVE client with a wrong or revoked key, or the wrong daemon key, just retries forever,
exactly like one whose daemon is down (libzmq#2227, #990, pyzmq#1706). So every secured
socket has a monitor, read without waiting by the channel each turn (at most every
``CHECK_SECONDS``), and a handshake bounded by ``HANDSHAKE_SECONDS``. What the monitor tells:

=====================================  ==================================================
event                                  verdict
=====================================  ==================================================
HANDSHAKE_SUCCEEDED                    fine (forget earlier failed attempts)
HANDSHAKE_FAILED_AUTH                  the daemon's ZAP handler refused this key: not in
                                       its allow-list (revoked, or another cluster's)
HANDSHAKE_FAILED_PROTOCOL, mechanism   the daemon does not speak CURVE (runs --insecure)
HANDSHAKE_FAILED_PROTOCOL, other       CURVE failed: likely the wrong daemon key
HANDSHAKE_FAILED_NO_DETAIL             the same, without detail
CONNECTED then DISCONNECTED, no        the daemon closed the connection mid-handshake:
handshake event, WRONG_KEY_ATTEMPTS    with a wrong daemon key, the daemon cannot open our
times in a row                         HELLO and hangs up; this side sees nothing else, so
                                       the message says "likely"
=====================================  ==================================================

A verdict reaches the peer's code as a ``Refused`` from the daemon would (the channel holds it
as a received transmission): clients fail their futures with it, workers exit with it.
"""

from __future__ import annotations

import time
from typing import Any

from scaler_executor.security.keys import Credential, fingerprint

HANDSHAKE_SECONDS = 5.0  # libzmq's default is 30 s; a daemon answers in milliseconds
CHECK_SECONDS = 0.1  # how often the monitor is read (costs one non-blocking recv)
WRONG_KEY_ATTEMPTS = 3  # connections the daemon closed mid-handshake before saying so


class ClientSecurity:
    """A credential applied to one connecting socket, and the watch on its handshakes."""

    def __init__(self, credential: Credential, address: str) -> None:
        self.credential = credential
        self.address = address
        self.monitor: Any = None
        self.next_check = 0.0
        self.connected = False  # a TCP connection is up, its handshake not done
        self.hangups = 0  # connections closed mid-handshake, in a row
        self.succeeded = False
        self.handshakes = 0  # completed so far; past 1, ZeroMQ reconnected (protocol/channel.py)

    def configure_client(self, context: Any, sock: Any) -> None:
        """Called by the channel before it connects."""
        import zmq

        c = self.credential
        sock.setsockopt(zmq.CURVE_SERVERKEY, c.daemon_public_key.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, c.public_key.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, c.secret_key.encode("ascii"))
        sock.setsockopt(zmq.HANDSHAKE_IVL, round(HANDSHAKE_SECONDS * 1000))
        events = (
            zmq.EVENT_CONNECTED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        )
        self.monitor = sock.get_monitor_socket(events)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close(linger=0)
            self.monitor = None

    def verdict(self) -> str | None:
        """Why the daemon will not take this connection, once one is known; else None."""
        now = time.monotonic()
        if now < self.next_check or self.monitor is None:
            return None
        self.next_check = now + CHECK_SECONDS
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return None
            event = parse_monitor_message(frames)
            reason = self._on_event(int(event["event"]), int(event["value"]))
            if reason is not None:
                return reason

    def _on_event(self, event: int, value: int) -> str | None:
        import zmq

        c = self.credential
        who = f"credential {c.name!r} ({c.role}, key {c.fingerprint}{', ' + c.path if c.path else ''})"
        if event == zmq.EVENT_CONNECTED:
            self.connected = True
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected, self.hangups, self.succeeded = False, 0, True
            self.handshakes += 1
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (
                f"{who} was refused at the handshake with {self.address}: its key is not in the "
                "daemon's allow-list (revoked, or issued from another security directory); ask for a "
                "new credential (scaler-keys issue)"
            )
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == getattr(zmq, "PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", 0x11000002):
                return (
                    f"{self.address} does not use CURVE (a daemon started with --insecure?): connect "
                    "without a credential and with --insecure, or restart the daemon with --security DIR"
                )
            return self._wrong_key(who, f"the CURVE handshake failed (protocol error {value:#x})")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            return self._wrong_key(who, "the CURVE handshake failed")
        elif event == zmq.EVENT_DISCONNECTED and self.connected:
            self.connected = False
            self.hangups += 1
            if self.hangups >= WRONG_KEY_ATTEMPTS:
                return self._wrong_key(
                    who, f"the daemon closed the connection during the CURVE handshake {self.hangups} times in a row"
                )
        return None

    def _wrong_key(self, who: str, what: str) -> str:
        daemon = fingerprint(self.credential.daemon_public_key)
        return (
            f"no CURVE handshake with {self.address} completed ({what}): likely the wrong daemon key "
            f"({who} expects daemon key {daemon}): use a credential issued from this daemon's "
            "security directory (or the daemon runs --insecure)"
        )
