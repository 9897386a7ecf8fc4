"""The reconnection policy: libzmq reconnects the socket; joining again is ours.

ZeroMQ re-establishes a dropped TCP connection by itself (``ZMQ_RECONNECT_IVL``), so a
peer never reconnects by hand. What the application decides is whether the daemon still
knows the peer, and what the peer does when it does not:

(a) A link drop shorter than the liveness limit (``heartbeat_interval * heartbeat_liveness``)
    resumes as if nothing happened: messages queued meanwhile flow again, no task is retried,
    no future fails.
(b) After a longer drop the daemon has declared the peer lost and retried its tasks
    elsewhere. A worker that hears nothing for its silence limit, or is told it is unknown,
    discards what it held and joins again empty. A client's record outlives a worker's
    (``client_timeout``), so a client back within it resubmits nothing and gets its results.
(d) A daemon restarted on its journal (docs/durability.rst) refuses the peer the same way,
    but a peer welcomed by a journaled daemon (its Welcome says ``journal``) answers with
    ``Resume(peer_id, token)``, is welcomed again under its old id and reports what it holds
    (worker: what it queues, runs and finished unacknowledged; client: the futures it awaits
    and the submissions never acknowledged), and everything goes on: no future fails, no
    finished task runs again.  Such a peer waits for its daemon through silence and refused
    connections for the Welcome's ``grace`` (``restart_grace``) plus a liveness limit; a
    Resume the daemon cannot honour is refused as ``UNKNOWN_PEER: not resumable`` and the
    peer goes on as in (c).  Connections are the transport's (the ipc router numbers them,
    ZeroMQ draws a new routing id per reconnection): the token, not the connection,
    identifies a resuming peer.
(c) A daemon restarted without a journal does not know the peer: it answers anything but a
    Hello with ``Refused`` whose reason starts with ``UNKNOWN_PEER``. A worker joins again
    empty; a client fails its pending futures with ``DaemonLost`` at once (its tasks are gone).
    A client whose daemon stays silent fails them after ``daemon_loss_timeout``; a worker that
    finds no daemon for ``worker_daemon_loss_timeout`` exits with its processors.

A worker whose transport connects again (the channels count their connections) beats at
once, so that a restarted daemon's refusal, and the worker's new Hello, come then and not at
its next idle heartbeat, up to a quarter of the liveness limit later.
A worker says Hello again on a ``Backoff`` (capped exponential, jittered) until a Welcome:
many workers of a restarted daemon then do not all knock at the same instant, and a Hello
is not repeated faster than a round trip on a slow link (the daemon treats a second Hello on
a known connection as joining again). The lost link is logged once per loss, not per retry.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# The one phrase the daemon's refusal of a peer it does not know starts with; peers act on it.
UNKNOWN_PEER = "unknown peer"
# ... and what follows it when the peer asked to resume (case d) and cannot: the daemon has
# no journal, or its journal no longer knows the peer.
NOT_RESUMABLE = "not resumable"


# How a journaled daemon's refusal of a submission starts when its journal cannot be written
# (a full disk): the task was never written nor acknowledged, and will not be sent again.
JOURNAL_FULL = "journal full"


# Heartbeats a side may let pass within the other's liveness limit when it has nothing new
# to say: an idle worker to the daemon, the daemon to a worker (idle_heartbeat).
IDLE_BEATS_PER_LIMIT = 4


def idle_heartbeat(interval: float, liveness: int) -> float:
    """How long a worker and its daemon may stay silent toward each other when there is
    nothing new to say: a quarter of the daemon's liveness limit (``interval * liveness``),
    never less than the interval. Both sides judge the other's silence by at least that
    limit (a worker takes the daemon's from its Welcome), so four heartbeats still fall
    within it; with the defaults (0.5 s, 10) that is one every 1.25 s instead of 0.5 s,
    which is what 1,000 idle workers cost the daemon (docs/scaling.rst)."""
    return max(interval, interval * liveness / IDLE_BEATS_PER_LIMIT)


def is_unknown_peer(reason: str) -> bool:
    return reason.startswith(UNKNOWN_PEER)


def is_not_resumable(reason: str) -> bool:
    return reason.startswith(f"{UNKNOWN_PEER}: {NOT_RESUMABLE}")


class Backoff:
    """Delays between attempts: ``base * 2^n`` capped at ``cap``, each scaled by a factor in
    [0.5, 1) ("equal jitter": spread out, yet never less than half the nominal delay).

    ``rng`` returns floats in [0, 1); a test passes a fixed one.
    """

    def __init__(self, base: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        if not 0 < base <= cap:
            raise ValueError(f"Backoff needs 0 < base <= cap, got base={base!r}, cap={cap!r}")
        self.base = base
        self.cap = cap
        self.rng = rng
        self.attempts = 0

    def next_delay(self) -> float:
        nominal = min(self.cap, self.base * 2.0 ** min(self.attempts, 62))
        self.attempts += 1
        return nominal * (0.5 + 0.5 * self.rng())

    def reset(self) -> None:
        self.attempts = 0
