"""The rogue host's peer (test_rogue.py): run by ``Hosts.spawn`` on the fifth host.

Modes (the first argument), each printing one line per finding on stdout:

``keyless ADDRESS MARKER``
    plain pyzmq without CURVE, then the project's own codec on that socket: garbage, a Hello
    as a client and as a worker, a registered function and a task whose code would create
    MARKER, a statistics request; then ``answers N`` (what came back within the wait).
``flood ADDRESS COUNT``
    before any handshake: COUNT connections of plain pyzmq each queueing one transmission of
    8 M heartbeats (40 MB) and raw TCP writing 40 MB of bytes that are no ZMTP greeting;
    ``flooded``.
``intruder ADDRESS CREDENTIAL MARKER``
    a client credential speaking the codec over CURVE: joins as a client, then registers,
    releases and cancels ids under every other client id up to 64 (another client's
    functions and tasks), and registers over a function id of its own prefix a callable
    that would create MARKER; ``welcome ID``, ``cancel-refused N``.
``garbage ADDRESS CREDENTIAL SIZE``
    a client credential over CURVE: joins, then sends frames no codec decodes, a batch that
    is not one, and one frame of SIZE bytes (over the daemon's max_message_size); ``sent``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

import cloudpickle
import zmq

from scaler_executor import __version__
from scaler_executor._compat import python_version
from scaler_executor.protocol import channel, codec
from scaler_executor.protocol import messages as m

WAIT = 5.0  # how long a keyless peer listens for an answer (none is expected)


def hello(role: str, name: str, capacity: int = 0) -> m.Hello:
    return m.Hello(role, m.PROTOCOL_VERSION, python_version(), cloudpickle.__version__, __version__,
                   name, os.getpid(), socket.gethostname(), capacity, {}, [])  # fmt: skip


def writer(marker: str) -> Any:
    def plant() -> None:
        with open(marker, "w") as f:
            f.write(f"ran on {socket.gethostname()}\n")

    return plant


def task(task_id: int, marker: str) -> m.TaskSpec:
    payload = cloudpickle.dumps((writer(marker), (), {}))
    return m.TaskSpec(task_id, 0, 0, m.TaskFlags.INLINE_FN, payload, [], [], 0)


def keyless(address: str, marker: str) -> None:
    sock = zmq.Context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    plant = cloudpickle.dumps(writer(marker))
    transmissions = [[b"not a transmission"]] + [codec.encode(batch) for batch in (
        [hello("client", "rogue-client")],
        [m.RegisterFunction(1 << m.TASK_ID_BITS | 1, plant), m.SubmitTasks([task(1 << m.TASK_ID_BITS | 2, marker)])],
        [hello("worker", "rogue-worker", 4)],
        [m.StatsRequest()],
    )]  # fmt: skip
    queued = 0
    for frames in transmissions:  # a DEALER whose handshake failed has no pipe: sends would block
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
            queued += 1
        except zmq.Again:
            pass
    print("queued", queued, flush=True)
    answers = 0
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if sock.poll(100):
            sock.recv_multipart()
            answers += 1
    sock.close()
    print("answers", answers, flush=True)


def flood(address: str, count: int) -> None:
    host, port = address[len("tcp://") :].rsplit(":", 1)
    beats = codec.encode([m.Heartbeat(0, 0)] * (8 << 20))
    print("transmission bytes", sum(len(f) for f in beats), flush=True)
    sockets: list[Any] = []
    for _ in range(count):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(address)
        sock.send_multipart(beats, copy=False)
        sockets.append(sock)
    junk = os.urandom(1 << 20)
    raw = socket.create_connection((host, int(port)), timeout=30)
    sent = 0
    try:
        while sent < 40 << 20:
            raw.sendall(junk)
            sent += len(junk)
    except OSError as exc:  # the daemon closed it: what a peer without a greeting gets
        print("raw tcp closed by the daemon after", sent, "bytes:", exc.__class__.__name__, flush=True)
    raw.close()
    for sock in sockets:  # linger: libzmq tries to deliver what it queued (it cannot: no CURVE handshake)
        sock.close()
    print("flooded", flush=True)


class Authenticated:
    def __init__(self, address: str, credential: str) -> None:
        from scaler_executor.security.client import ClientSecurity
        from scaler_executor.security.keys import load_credential

        self.security = ClientSecurity(load_credential(credential), address)
        self.sock = channel.connect(address, hwm=1000, linger=2, security=self.security)
        self.poller = channel.Poller()
        self.poller.register(self.sock.pollable)

    def send(self, batch: list[Any]) -> None:
        self.sock.send(codec.encode(batch))

    def receive(self, kind: type, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poller.poll(self.sock.poll_timeout(100))
            while self.sock.readable():
                messages, _ = codec.decode(self.sock.recv())
                for message in messages:
                    if type(message) is kind:
                        return message
                    if type(message) is m.Refused:
                        raise SystemExit(f"refused: {message.reason}")
        raise SystemExit(f"no {kind.__name__} within {timeout} s")


def intruder(address: str, credential: str, marker: str) -> None:
    peer = Authenticated(address, credential)
    peer.send([hello("client", "intruder")])
    welcome = peer.receive(m.Welcome)
    mine = welcome.peer_id
    print("welcome", mine, flush=True)
    plant = cloudpickle.dumps(writer(marker))
    others = [cid for cid in range(1, 65) if cid != mine]
    ids = [cid << m.TASK_ID_BITS | n for cid in others for n in range(1, 65)]
    peer.send([m.RegisterFunction(i, plant) for i in ids[:512]])  # another client's function ids
    peer.send([m.ReleaseFunctions(ids)])
    peer.send([m.CancelTasks(ids, False)])
    cancelled = peer.receive(m.TasksCancelled)
    peer.send([m.CancelTasks(ids, True)])
    print("cancelled", len(cancelled.cancelled), flush=True)
    peer.send([m.StatsRequest()])
    stats = peer.receive(m.Stats)
    print("refused", stats.snapshot["refused"], flush=True)
    peer.sock.close()


def garbage(address: str, credential: str, size: int) -> None:
    """Garbage the daemon decodes and drops (it answers statistics after it), then one frame
    over its max_message_size: libzmq disconnects this peer (its socket monitor says so)."""
    from zmq.utils.monitor import recv_monitor_message

    peer = Authenticated(address, credential)
    peer.send([hello("client", "garbage")])
    peer.receive(m.Welcome)
    peer.sock.send([b"\x00garbage"])
    peer.sock.send([codec.VERSION_FRAME, b"\xc1\xc1 not msgpack"])
    peer.sock.send([codec.VERSION_FRAME, b"\x93\x01\x02\x03"])  # a msgpack array of ints: no batch
    peer.sock.send([codec.VERSION_FRAME, b"\x91\x92\x7f\x80"])  # an unknown tag
    peer.send([m.StatsRequest()])
    print("dropped", peer.receive(m.Stats).snapshot["dropped_messages"], flush=True)
    monitor = peer.security.monitor
    while monitor.poll(0):  # what the handshake left
        recv_monitor_message(monitor)
    peer.sock.send([codec.VERSION_FRAME, bytes(size)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if monitor.poll(100) and recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
            print("disconnected after the oversized frame", flush=True)
            break
    peer.sock.close(linger=0)


def main() -> int:
    mode, address, *rest = sys.argv[1:]
    if mode == "keyless":
        keyless(address, rest[0])
    elif mode == "flood":
        flood(address, int(rest[0]))
    elif mode == "intruder":
        intruder(address, rest[0], rest[1])
    elif mode == "garbage":
        garbage(address, rest[0], int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
