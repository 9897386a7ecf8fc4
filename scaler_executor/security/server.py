"""The daemon's side of security: a ZAP handler on its own poller, and a role gate per message.

::

    peer ──CURVE handshake──► ROUTER ──ZAP request──► ZapHandler (this loop, same thread)
                                 │                      allow-list: public key → name, role
                                 │ ◄── 200 + User-Id ───┘ (or 400: refused, logged, counted)
                                 ▼
    every transmission: User-Id (frame metadata) ──► Gate.admit: still allowed? (revocation)
                        decode ──► Gate.within_role: each message allowed for the key's role?
                        ──► core (which checks again by the role the peer declared in Hello)

Why a ZAP handler of our own rather than ``zmq.auth.ThreadAuthenticator``: the daemon is one
thread around one poller, and the allow-list changes under it (revocations, the ephemeral keys
of the workers it starts). pyzmq's authenticators answer on another thread (or an asyncio loop)
from their own key table, log at debug level without the peer's address and without a rate
limit, and map a key to a User-Id only through ``curve_user_id``. The ZAP protocol (ZeroMQ
RFC 27) is six request frames and six reply frames; answering it here, from the same table
the per-message check reads, keeps one source of truth and no lock.

The User-Id is the key's Z85 public key, not its name: a name revoked and issued again gets a
new key, and a connection that authenticated with the old one must not come back to life.
The ZAP handler is bound before the ROUTER binds: libzmq lets every CURVE client in when no
handler is bound (``ZAP_ENFORCE_DOMAIN`` is set too, so a missing handler refuses instead).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from scaler_executor.protocol import messages as m
from scaler_executor.scheduler.loop import RateLimitedLog
from scaler_executor.security.keys import KeyEntry, SecurityDir, fingerprint

log = logging.getLogger("scaler_executor.security")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # RFC 27's fixed address, per context
ZAP_DOMAIN = b"scaler"
HANDSHAKE_SECONDS = 5.0  # a peer that has not finished CURVE by then is disconnected
REFUSAL_LOG_SECONDS = 60.0  # one log line per peer (key and address) and kind of refusal
RELOAD_SECONDS = 1.0  # how often the allow-list file's signature is checked

# What each key's role may send (the role in its Hello must be the key's).
_BASE = frozenset({m.Heartbeat, m.Goodbye})
ALLOWED: dict[str, frozenset[type]] = {
    role: m.ACCEPTED_FROM.get(role, _BASE) | {m.Hello} for role in ("client", "worker", "manager", "monitor")
}
# A journaled daemon's clients and workers resume it after its restart (scheduler/durable.py).
ALLOWED["client"] = ALLOWED["client"] | {m.Resume}
ALLOWED["worker"] = ALLOWED["worker"] | {m.Resume}


@dataclass(frozen=True, slots=True)
class Allowed:
    """A key the daemon lets in, as the gate reads it."""

    name: str
    role: str
    public_key: str
    fingerprint: str
    messages: frozenset[type]


def _allowed(entry: KeyEntry) -> Allowed:
    return Allowed(entry.name, entry.role, entry.public_key, entry.fingerprint, ALLOWED[entry.role])


class ServerSecurity:
    """The daemon's keys, its allow-list (file and in-memory), the ZAP handler and the gate.

    ``ephemeral`` maps Z85 public keys to entries for workers the daemon starts itself; its
    owner (the local worker manager) adds and removes them. ``counters`` is the core's, so
    refusals show in statistics.
    """

    def __init__(self, directory: SecurityDir, ephemeral: MutableMapping[str, KeyEntry] | None = None) -> None:
        self.directory = directory
        self.public_key, self.secret_key = directory.daemon_keys()
        self.ephemeral: MutableMapping[str, KeyEntry] = {} if ephemeral is None else ephemeral
        self.by_user: dict[str, Allowed] = {}
        self._signature: tuple[int, int, int] | None = None
        self._next_reload = 0.0
        self._load()
        self.peers: dict[bytes, str] = {}  # peer identity -> User-Id, from its first transmission
        self.expelled: dict[bytes, str] = {}  # peers refused for a revoked key -> that key
        self.replies: list[tuple[bytes, m.Refused]] = []  # for the loop to send
        self.lost: list[bytes] = []  # expelled peers the core must forget (PeerUnreachable)
        self.counters: dict[str, int] = {}
        self.refusals = RateLimitedLog(log, REFUSAL_LOG_SECONDS)
        self.zap: Any = None
        self.monitor: Any = None

    # ------------------------------------------------------------------ set-up

    def configure_server(self, context: Any, sock: Any) -> None:
        """Called by the channel before it binds: the ZAP handler first, then CURVE."""
        import zmq

        self.zap = context.socket(zmq.REP)
        self.zap.linger = 0
        self.zap.bind(ZAP_ENDPOINT)
        # Handshakes that fail before ZAP (a client with another daemon's key: this side cannot
        # open its HELLO) are seen only here; libzmq names the bound endpoint, not the peer.
        self.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key.encode("ascii"))
        sock.setsockopt(zmq.HANDSHAKE_IVL, round(HANDSHAKE_SECONDS * 1000))

    def close(self) -> None:
        for sock in self.pollables():
            sock.close(linger=0)
        self.zap = self.monitor = None

    def pollables(self) -> list[Any]:
        """What the daemon's poller watches for this module (on_ready reads them)."""
        return [s for s in (self.zap, self.monitor) if s is not None]

    def on_ready(self, ready: list[Any]) -> None:
        if self.zap is not None and self.zap in ready:
            self.on_zap()
        if self.monitor is not None and self.monitor in ready:
            self._on_failed_handshakes()

    def _on_failed_handshakes(self) -> None:
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._count("security_refused_handshakes")
            self.refusals.warning(
                "handshake", "daemon: a peer failed the CURVE handshake on %s (error %#x): likely a "
                "credential issued from another security directory, or a peer without CURVE",
                event["endpoint"].decode("ascii", "replace"), event["value"],
            )

    def use_counters(self, counters: dict[str, int]) -> None:
        for key in ("security_refused_handshakes", "security_refused_revoked", "security_refused_role"):
            counters.setdefault(key, 0)
        self.counters = counters

    # ------------------------------------------------------------------ the allow-list

    def _load(self) -> None:
        signature = self.directory.signature()
        entries = self.directory.entries()
        self.by_user = {e.public_key: _allowed(e) for e in entries if not e.revoked}
        self._signature = signature

    def lookup(self, user: str) -> Allowed | None:
        allowed = self.by_user.get(user)
        if allowed is None:
            entry = self.ephemeral.get(user)
            if entry is not None:
                allowed = _allowed(entry)
        return allowed

    def refresh(self, now: float) -> bool:
        """Re-read the allow-list if its file changed; expel the peers whose key went.

        Called every turn; stats the file at most every RELOAD_SECONDS (True when it did).
        A file that cannot be read keeps the last good list (and says why, once a minute).
        """
        if now < self._next_reload:
            return False
        self._next_reload = now + RELOAD_SECONDS
        if self.directory.signature() != self._signature:
            from scaler_executor.exceptions import ConfigError

            try:
                self._load()
            except ConfigError as exc:
                self.refusals.warning("reload", "daemon: keeping the last allow-list: %s", exc)
                return True
            log.info("daemon: re-read the allow-list %s (%d keys allowed)", self.directory.allow_path, len(self.by_user))
        gone = [peer for peer, user in self.peers.items() if self.lookup(user) is None]
        for peer in gone:
            self._expel(peer, self.peers.pop(peer), "")
        return True

    def forget(self, known: Any) -> None:
        """Drop peers the core no longer knows (``known(peer)`` false), so the table stays bounded."""
        for peer in [p for p in self.peers if not known(p)]:
            del self.peers[peer]
        for peer in [p for p in self.expelled if not known(p)]:
            del self.expelled[peer]

    # ------------------------------------------------------------------ ZAP (RFC 27)

    def on_zap(self) -> None:
        """Answer every waiting ZAP request (the handshakes of new connections)."""
        import zmq

        while True:
            try:
                request = self.zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.zap.send_multipart(self._zap_reply(request))

    def _zap_reply(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6 or request[0] != b"1.0":
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"malformed ZAP request", b"", b""]
        request_id, domain, address, mechanism = request[1], request[2], request[3], request[5]
        where = address.decode("ascii", "replace")
        if domain != ZAP_DOMAIN or mechanism != b"CURVE" or len(request) != 7:
            self._count("security_refused_handshakes")
            self.refusals.warning(
                f"zap {where}", "daemon: refused a %s connection from %s: only CURVE with a key is accepted",
                mechanism.decode("ascii", "replace")[:16], where,
            )
            return [b"1.0", request_id, b"400", b"CURVE required", b"", b""]
        from zmq.utils import z85

        user = z85.encode(request[6]).decode("ascii")
        allowed = self.lookup(user)
        if allowed is None:
            self._count("security_refused_handshakes")
            self.refusals.warning(
                f"zap {where} {user}",
                "daemon: refused a connection from %s: key %s is not in the allow-list (revoked, or "
                "issued from another security directory)", where, fingerprint(user),
            )
            return [b"1.0", request_id, b"400", b"key not allowed", b"", b""]
        return [b"1.0", request_id, b"200", b"OK", user.encode("ascii"), b""]

    # ------------------------------------------------------------------ every transmission

    def admit(self, peer: bytes, user: str, frame: Any) -> Allowed | None:
        """The key behind a transmission if it is still allowed; else None (drop it undecoded)."""
        allowed = self.lookup(user)
        if allowed is not None:
            if peer not in self.peers:
                self.peers[peer] = user
            return allowed
        self._count("security_refused_revoked")
        if peer not in self.expelled:
            self.peers.pop(peer, None)
            self._expel(peer, user, _address(frame))
        else:
            self.refusals.warning(
                f"revoked {peer!r}", "daemon: dropped a transmission from %s with revoked key %s",
                _address(frame), fingerprint(user),
            )
        return None

    def within_role(self, peer: bytes, allowed: Allowed, messages: list[Any], frame: Any) -> list[Any]:
        """``messages`` the key's role may send; the others are dropped, logged and counted."""
        kinds = allowed.messages
        refused = None
        for message in messages:
            kind = type(message)
            if kind not in kinds or (kind is m.Hello and message.role != allowed.role):
                refused = message
                break
        if refused is None:
            return messages  # the common case: one pass, no copy
        kept = []
        for message in messages:
            kind = type(message)
            if kind is m.Hello and message.role != allowed.role:
                self.replies.append((peer, m.Refused(
                    f"this key ({allowed.name!r}, {allowed.fingerprint}) has role {allowed.role}: it cannot "
                    f"join as a {message.role}; issue a {message.role} credential with "
                    f"scaler-keys issue DIR NAME --role {message.role}"
                )))
            elif kind not in kinds:
                pass
            else:
                kept.append(message)
                continue
            self._count("security_refused_role")
            what = f"Hello as {message.role}" if kind is m.Hello else kind.__name__
            self.refusals.warning(
                f"role {peer!r}", "daemon: refused %s from %s key %r (%s) at %s: not allowed for that role",
                what, allowed.role, allowed.name, allowed.fingerprint, _address(frame),
            )
        return kept

    def _expel(self, peer: bytes, user: str, where: str) -> None:
        self.expelled[peer] = user
        self.lost.append(peer)
        self.replies.append((peer, m.Refused(
            f"this key ({fingerprint(user)}) was revoked or removed from the daemon's allow-list: "
            "ask the cluster's operator for a new credential"
        )))
        self.refusals.warning(
            f"expel {peer!r}", "daemon: expelled peer %s%s: its key %s was revoked",
            peer.hex(), f" at {where}" if where else "", fingerprint(user),
        )

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1


def _address(frame: Any) -> str:
    try:
        return str(frame.get("Peer-Address"))
    except Exception:  # noqa: BLE001 - an older libzmq without the property: say so, never fail
        return "unknown address"


def ephemeral_entry(name: str, public_key: str) -> KeyEntry:
    """The allow-list entry of a worker the daemon starts itself (in memory only)."""
    return KeyEntry(name, "worker", public_key, f"ephemeral, pid {os.getpid()}")
