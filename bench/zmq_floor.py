"""ZeroMQ's own memory per connected peer: the floor under the daemon's memory per tcp worker.

A script, not a test (its figures are measured, never asserted)::

    python bench/zmq_floor.py --peers 1000 --rounds 3

A bare ``zmq.ROUTER`` (no project code) is bound in a child process, as the daemon's is;
this process connects ``--peers`` DEALERs to it, one ZeroMQ context for all (as
``bench/scale.py`` does), and each peer exchanges ``--rounds`` small messages with it (200
bytes in, 64 out: heartbeat-sized).  The server's RSS (``VmRSS``) is read after it bound
and again after every peer's last reply: the growth over the peers is what ZeroMQ keeps for
each connection (its engine, the encoder's and decoder's batch buffers, the pipes' chunks,
the session), with nothing of the project's in it.  Rows for tcp and ipc, and for tcp with
CURVE, without a ZAP handler (every key accepted unchecked) and with one (pyzmq's
``ThreadAuthenticator`` allowing any key, as the daemon's allow-list does for its keys).

libzmq's knobs for the per-connection buffers (``ZMQ_IN_BATCH_SIZE``,
``ZMQ_OUT_BATCH_SIZE``) are DRAFT API: the pyzmq wheels' libzmq is built without it, so
setting them fails with EINVAL; the script says whether they were accepted here.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import shutil
import tempfile
from typing import Any

import zmq


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def serve(address: str, count: int, server_secret: bytes | None, zap: bool, out: Any, ready: Any) -> None:
    context = zmq.Context()
    context.setsockopt(zmq.MAX_SOCKETS, 64)
    authenticator = None
    if zap:
        from zmq.auth.thread import ThreadAuthenticator

        authenticator = ThreadAuthenticator(context)
        authenticator.start()
        authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_secret is not None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
    sock.bind(address)
    ready.put((sock.getsockopt_string(zmq.LAST_ENDPOINT), rss_kb(os.getpid())))
    reply = b"x" * 64
    for _ in range(count):
        frames = sock.recv_multipart()
        sock.send_multipart([frames[0], reply])
    out.get()  # the client has every reply: measure now
    ready.put(rss_kb(os.getpid()))
    out.get()
    sock.close()
    if authenticator is not None:
        authenticator.stop()
    context.term()


def measure(address: str, peers: int, rounds: int, curve: bool, zap: bool) -> float:
    server_public = server_secret = None
    if curve:
        server_public, server_secret = zmq.curve_keypair()
    ready: Any = mp.Queue()
    out: Any = mp.Queue()
    child = mp.Process(target=serve, args=(address, peers * rounds, server_secret, zap, out, ready))
    child.start()
    context = zmq.Context()
    context.setsockopt(zmq.MAX_SOCKETS, peers + 64)
    socks = []
    try:
        address, before = ready.get(timeout=30)
        for _ in range(peers):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if curve:
                public, secret = zmq.curve_keypair()
                sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
                sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
            sock.connect(address)
            socks.append(sock)
        message = b"y" * 200
        for _ in range(rounds):
            for sock in socks:
                sock.send(message)
            for sock in socks:
                sock.recv()
        out.put(None)
        after = ready.get(timeout=60)
        out.put(None)
        return (after - before) / peers
    finally:
        for sock in socks:
            sock.close()
        context.term()
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()


def batch_size_options() -> str:
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    try:
        sock.setsockopt(zmq.IN_BATCH_SIZE, 1024)
        return "accepted"
    except zmq.ZMQError as error:
        return f"refused ({error})"
    finally:
        sock.close()
        context.term()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"libzmq {zmq.zmq_version()}, pyzmq {zmq.pyzmq_version()}, draft API: {zmq.has('draft')}, "
          f"ZMQ_IN_BATCH_SIZE: {batch_size_options()}, RLIMIT_NOFILE {hard}")
    scratch = tempfile.mkdtemp(prefix="zmq-floor-")
    try:
        rows = [
            ("tcp", "tcp://127.0.0.1:*", False, False),
            ("tcp + CURVE", "tcp://127.0.0.1:*", True, False),
            ("tcp + CURVE + ZAP", "tcp://127.0.0.1:*", True, True),
            ("ipc", f"ipc://{scratch}/router", False, False),
        ]
        print(f"{'transport':<18} {'peers':>6} {'rounds':>6} {'KB/peer (server RSS growth)':>28}")
        for name, address, curve, zap in rows:
            kb = measure(address, args.peers, args.rounds, curve, zap)
            print(f"{name:<18} {args.peers:>6} {args.rounds:>6} {kb:>28.1f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
