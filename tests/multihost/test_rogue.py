"""The fifth host: a peer of no cluster's, on the same network as the daemon. Until the
daemon has keys (issue 22's CURVE work) it can reach the port; what this checks is the
harness's rogue host and the daemon's answer to a peer that skips the handshake."""

from __future__ import annotations

import sys

import multihost_net as net
import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

ROGUE = r"""
import sys, zmq
from scaler_executor.protocol import codec, messages as m
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(sys.argv[1])
sock.send_multipart([b"not a transmission"])
sock.send_multipart(codec.encode([m.StatsRequest()]))
if sock.poll(30000):
    messages, _ = codec.decode(sock.recv_multipart())
    print("answer", type(messages[0]).__name__, messages[0].reason, flush=True)
"""


def test_a_peer_that_skips_hello_is_told_it_is_unknown_and_gets_nothing(make_cluster) -> None:
    cluster = make_cluster(workers=("w1",))
    client = cluster.client()
    net.poll(lambda: client.call("stats")["stats"]["workers"] >= 1, 60, "the worker joined")
    rogue = cluster.hosts.spawn("rogue", [sys.executable, "-c", ROGUE, cluster.address])
    assert rogue.popen.wait(60) == 0, rogue.log()
    assert "answer Refused unknown peer" in rogue.log(), rogue.log()
    stats = client.call("stats")["stats"]
    assert stats["dropped_messages"] >= 2 and stats["clients"] == 1, stats  # garbage, and the request
    batch = client.call("submit", fn="where", args=[[1]])["batch"]
    assert client.call("wait", batch=batch, timeout=60)["errors"] == [None]  # still serving
