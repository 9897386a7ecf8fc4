"""Channels: how the daemon, its clients and its workers move transmissions.

A transmission is a list of frames (``bytes`` or any contiguous buffer), delivered whole
and in order. Two transports carry them, behind one small interface:

* ``tcp://host:port`` — ZeroMQ (a ROUTER in the daemon, a DEALER in each peer), as
  before: reconnection, many hosts, and whatever ZeroMQ adds later.
* ``ipc:///path`` — a Unix stream socket speaking a framing of our own. On one host
  this is the hop every task crosses four times, and ZeroMQ's I/O threads cost three
  thread wake-ups per hop where a socket costs one: a ZeroMQ ipc ping-pong between two
  processes takes ~120 us on a 2-core VM, a Unix socket ~25 us. Here the sending thread
  writes to the socket itself (``sendmsg`` gathers the frames, no copy) and the
  receiving thread reads it itself.

Semantics kept from the ZeroMQ sockets the rest of the code was written against:

* ``send`` never blocks. A peer whose queue holds ``hwm`` transmissions not yet taken
  by its socket raises ``Again`` (the caller keeps a backlog, as with SNDHWM); ``recv``
  with nothing to read raises ``Again`` too.
* The daemon's side (``bind``) prefixes every received transmission with the peer's
  identity and routes ``send([identity, *frames])``; an unknown or departed identity
  raises ``Unreachable`` (ZeroMQ's EHOSTUNREACH under ROUTER_MANDATORY).
* A peer's side (``connect``) may start before the daemon binds: it retries every
  ``RECONNECT_SECONDS`` (ZeroMQ's RECONNECT_IVL) and queues what is sent meanwhile, and
  reconnects the same way if the daemon goes away. What was in flight to a dead peer is
  lost, as with ZeroMQ; heartbeats notice the loss.

Differences the callers handle: a stream channel may hold complete transmissions in
user space, which no poller can see, so callers poll with ``poll_timeout`` (0 while
``buffered``) and read while ``buffered`` even if the poller did not report the channel.
Register ``pollable`` with a ``Poller`` (this module's), which reports each target as it
was registered: a ZeroMQ socket as itself, a stream channel by its epoll descriptor.

ZeroMQ is imported only when a ``tcp://`` channel is made: the embedded cluster, all
``ipc://``, never loads it (~20 ms of each process's start on a 2-core VM).

Stream framing, after an 8-byte greeting each way (``GREETING``): per transmission a
little-endian u32 frame count, one u64 length per frame, then the frames back to back.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from typing import Any

log = logging.getLogger("scaler_executor.transport")

GREETING = b"SCLRIPC1"  # the stream protocol's name and version: a ZeroMQ peer fails it
RECONNECT_SECONDS = 0.01
# An ipc peer's *first* connection retries every millisecond for up to FIRST_CONNECT_WINDOW:
# the embedded cluster's worker is ready before its daemon has bound (the daemon's imports
# are the longest step of a cold start), and a 10 ms retry then added ~5-10 ms to the time to
# the first result. A retry is one failed connect() (~30 us); later reconnects keep 10 ms.
FIRST_CONNECT_SECONDS = 0.001
FIRST_CONNECT_WINDOW = 1.0
WATCH_SECONDS = 0.1  # how often a ZeroMQ dealer reads its monitor (one non-blocking recv)
MAX_FRAMES = 1 << 20  # per transmission: a garbage count closes the connection, not memory
READ_SIZE = 1 << 18
READS_PER_PUMP = 8  # per connection and turn, so one busy peer cannot starve the others
IOV_MAX = 512  # iovecs per sendmsg (the kernel's limit is 1024)

_COUNT = struct.Struct("<I")
# The frame-length tables of transmissions of 1..15 frames (nearly all of them), compiled once.
_LENGTHS = [struct.Struct(f"<{n}Q") for n in range(16)]
_HEADERS = [struct.Struct(f"<I{n}Q") for n in range(16)]  # count and lengths, to write
_local = threading.local()  # one read buffer per thread: executors' agents may read at once
_EPOLLIN = select.EPOLLIN
_EPOLLOUT = select.EPOLLOUT
_GONE = select.EPOLLHUP | select.EPOLLERR


class ChannelError(Exception):
    """The bytes on a stream connection are not this protocol (the connection is closed)."""


class SendError(Exception):
    """A transmission could not be handed to the channel (a ZeroMQ error other than these)."""


class Again(SendError):
    """Not now: the peer's queue is full (``send``), or nothing waits (``recv``)."""


class Unreachable(SendError):
    """The daemon's side does not know that peer identity, or the peer has left."""


class Poller:
    """Waits on channels' ``pollable``s and plain file descriptors, for reading.

    ``poll`` returns the ready targets as they were registered. An epoll set serves plain
    descriptors (every ``ipc://`` channel is one); a ZeroMQ socket among the targets (a
    ``tcp://`` channel) switches to ``zmq.Poller``, which can wait on both.
    """

    def __init__(self) -> None:
        self._targets: dict[int, Any] = {}  # fd -> target, while on the epoll set
        self._epoll: select.epoll | None = select.epoll()
        self._zpoller: Any = None

    def register(self, target: Any) -> None:
        if self._zpoller is None and type(target) is not int:
            self._switch_to_zmq()
        if self._zpoller is not None:
            self._zpoller.register(target, _zmq().POLLIN)
            return
        assert self._epoll is not None
        try:
            self._epoll.register(target, _EPOLLIN)
        except FileExistsError:  # the number of a descriptor closed while registered
            self._epoll.modify(target, _EPOLLIN)
        self._targets[target] = target

    def unregister(self, target: Any) -> None:
        if self._zpoller is not None:
            self._zpoller.unregister(target)
            return
        assert self._epoll is not None
        if self._targets.pop(target, None) is not None:
            try:
                self._epoll.unregister(target)
            except (OSError, ValueError):
                pass  # closed already: the kernel dropped it from the set

    def poll(self, timeout_ms: float | None) -> list[Any]:
        """Targets ready to read, waiting at most ``timeout_ms`` (None: no limit)."""
        if self._zpoller is not None:
            return [target for target, _ in self._zpoller.poll(timeout_ms)]
        assert self._epoll is not None
        timeout = -1 if timeout_ms is None else timeout_ms / 1000  # epoll rounds up
        targets = self._targets
        return [targets.get(fd, fd) for fd, _ in self._epoll.poll(timeout)]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()

    def _switch_to_zmq(self) -> None:
        zmq = _zmq()
        self._zpoller = zmq.Poller()
        for target in self._targets.values():
            self._zpoller.register(target, zmq.POLLIN)
        self._targets.clear()
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None


def _zmq() -> Any:
    import zmq  # only for tcp:// channels

    return zmq


def bind(address: str, *, hwm: int, security: Any = None, max_message_size: int = -1) -> Any:
    """The daemon's channel at ``address`` (a RouterChannel or a StreamRouter).

    ``max_message_size`` (tcp:// only; -1: none) is ZMQ_MAXMSGSIZE: libzmq disconnects a peer
    that sends a larger frame instead of allocating it.

    ``security`` (tcp:// only: security.server.ServerSecurity) gets ``configure_server(context,
    socket)`` before the socket binds: its ZAP handler and CURVE keys are in place before any
    peer can connect."""
    if address.startswith("ipc://"):
        return StreamRouter(address[len("ipc://") :], hwm=hwm)
    return RouterChannel(address, hwm=hwm, security=security, max_message_size=max_message_size)


def connect(address: str, *, hwm: int, linger: float, security: Any = None) -> Any:
    """A client's or worker's channel to the daemon at ``address``.

    ``security`` (tcp:// only: security.client.ClientSecurity) gets ``configure_client(context,
    socket)`` before the socket connects, and its ``verdict()`` — why the daemon will not take
    this connection — arrives as a received ``Refused`` (SecureDealerChannel)."""
    if address.startswith("ipc://"):
        return StreamDealer(address[len("ipc://") :], hwm=hwm, linger=linger)
    if security is not None:
        return SecureDealerChannel(address, hwm=hwm, linger=linger, security=security)
    return DealerChannel(address, hwm=hwm, linger=linger)


# ---------------------------------------------------------------------------- ZeroMQ


class _ZmqChannel:
    # A ZeroMQ socket is not thread-safe: no send from one thread while another polls it.
    send_beside_poll = False

    buffered = False  # ZeroMQ keeps what it received; its poller sees it

    def __init__(self, kind: str, hwm: int, linger: float) -> None:
        zmq = _zmq()
        from scaler_executor.protocol import wire

        self._wire = wire
        self._zmq_again = zmq.Again
        self._zmq_error = zmq.ZMQError
        self.context = zmq.Context()
        self.sock = self.context.socket(getattr(zmq, kind))
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.linger = linger
        self.pollable: Any = self.sock

    def send(self, frames: list[Any]) -> None:
        try:
            self._wire.send(self.sock, frames)
        except self._zmq_again:
            raise Again() from None
        except self._zmq_error as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise Unreachable() from None
            raise SendError(str(exc)) from exc

    def readable(self) -> bool:
        return self._wire.readable(self.sock)

    def recv(self) -> list[bytes]:
        try:
            return self._wire.recv(self.sock)
        except self._zmq_again:
            raise Again() from None

    def poll_timeout(self, timeout_ms: float) -> float:
        return timeout_ms

    def close(self, linger: float | None = None) -> None:
        self.sock.close(linger=round(1000 * (self.linger if linger is None else linger)))
        self.context.term()


class RouterChannel(_ZmqChannel):
    def __init__(self, address: str, *, hwm: int, security: Any = None, max_message_size: int = -1) -> None:
        super().__init__("ROUTER", hwm, 0.0)
        self.sock.setsockopt(_zmq().ROUTER_MANDATORY, 1)
        self.sock.setsockopt(_zmq().MAXMSGSIZE, max_message_size)
        if security is not None:
            security.configure_server(self.context, self.sock)
        self.sock.bind(address)

    def recv_authenticated(self) -> tuple[list[bytes], str, Any]:
        """``recv``, plus the ZAP User-Id the transmission carries and its first body frame
        (whose other metadata, such as Peer-Address, is read only when needed)."""
        try:
            received: tuple[list[bytes], str, Any] = self._wire.recv_with_user(self.sock)
        except self._zmq_again:
            raise Again() from None
        return received


class DealerChannel(_ZmqChannel):
    """The connecting side over ZeroMQ. ``connections`` counts the connections to the
    address whose handshake completed, as the channels of every transport do: a count that
    grows past 1 tells the peer that ZeroMQ reconnected, perhaps to a restarted daemon that
    does not know it (the worker then says at once that it lives: protocol/rejoin.py).
    Read from the socket's monitor in ``poll_timeout``, at most every WATCH_SECONDS."""

    def __init__(self, address: str, *, hwm: int, linger: float, security: Any = None) -> None:
        super().__init__("DEALER", hwm, linger)
        zmq = _zmq()
        self.sock.setsockopt(zmq.RECONNECT_IVL, round(RECONNECT_SECONDS * 1000))
        self._watch: Any = None
        self._next_watch = 0.0
        self._connections = 0
        if security is not None:
            security.configure_client(self.context, self.sock)  # its monitor counts them
        else:
            self._watch = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sock.connect(address)

    @property
    def connections(self) -> int:
        return self._connections

    def poll_timeout(self, timeout_ms: float) -> float:
        if self._watch is not None and (now := time.monotonic()) >= self._next_watch:
            self._next_watch = now + WATCH_SECONDS
            while True:
                try:
                    self._watch.recv_multipart(_zmq().NOBLOCK)
                except self._zmq_again:
                    break
                self._connections += 1  # the only event it watches
        return timeout_ms

    def close(self, linger: float | None = None) -> None:
        if self._watch is not None:
            self._watch.close(linger=0)
            self._watch = None
        super().close(linger)


class SecureDealerChannel(DealerChannel):
    """A DealerChannel with CURVE whose failed handshakes become a received ``Refused``.

    The verdict is held in user space like a stream channel's parsed transmissions, so the
    callers' ``buffered``/``poll_timeout`` protocol delivers it without a poller event.
    """

    def __init__(self, address: str, *, hwm: int, linger: float, security: Any) -> None:
        super().__init__(address, hwm=hwm, linger=linger, security=security)
        self.security = security
        self.refusal: list[bytes] | None = None
        self.refused = False  # delivered already: one verdict per channel

    @property
    def connections(self) -> int:
        return int(self.security.handshakes)  # counted by its monitor (security/client.py)

    def poll_timeout(self, timeout_ms: float) -> float:
        if self.refusal is None and not self.refused:
            reason = self.security.verdict()
            if reason is not None:
                from scaler_executor.protocol import codec
                from scaler_executor.protocol import messages as m

                log.error("%s", reason)
                self.refusal = codec.encode([m.Refused(reason)])
                self.buffered = True
        return 0 if self.refusal is not None else timeout_ms

    def readable(self) -> bool:
        return self.refusal is not None or super().readable()

    def recv(self) -> list[bytes]:
        refusal = self.refusal
        if refusal is not None:
            self.refusal, self.refused, self.buffered = None, True, False
            return refusal
        return super().recv()

    def close(self, linger: float | None = None) -> None:
        self.security.close()
        super().close(linger)


# ---------------------------------------------------------------------------- streams


def owner_only_bind(sock: socket.socket, path: str) -> None:
    """Bind a Unix socket at ``path`` with mode 0600 whatever the umask.

    Linux creates the socket's file with the socket inode's mode masked by the umask
    (``unix_bind``: ``S_IFSOCK | (SOCK_INODE(sock)->i_mode & ~current_umask())``), so an
    ``fchmod`` before ``bind`` leaves no moment at which another user could connect; a
    ``chmod`` after would. The mode is checked after, and a socket left open refused.
    """
    os.fchmod(sock.fileno(), 0o600)
    sock.bind(path)
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:  # a kernel that ignores the inode's mode: close the gap now, say so
        os.chmod(path, 0o600)
        log.warning("ipc socket %s was created with mode %o; set to 0600", path, mode)


def _header(frames: list[Any]) -> bytes:
    n = len(frames)
    table = _HEADERS[n] if n < 16 else struct.Struct(f"<I{n}Q")
    return table.pack(n, *[len(f) if type(f) is bytes else memoryview(f).nbytes for f in frames])


class _Connection:
    """One stream socket: its read buffer and the bytes it still has to write."""

    __slots__ = ("greeted", "identity", "inbuf", "out", "out_messages", "sock", "writing")

    def __init__(self, sock: socket.socket, identity: bytes) -> None:
        self.sock = sock
        self.identity = identity
        self.inbuf = bytearray()
        self.greeted = False  # the peer's greeting has been read and checked
        self.out: deque[memoryview] = deque()  # unsent pieces, in order
        self.out_messages = 0  # transmissions not yet wholly written
        self.writing = False  # registered for EPOLLOUT

    def write(self, pieces: list[Any], messages: int) -> None:
        """Queue ``pieces`` (``messages`` whole transmissions) and write what the socket takes."""
        if self.out:
            self.out.extend(memoryview(p).cast("B") for p in pieces)
            self.out_messages += messages
            return
        total = 0
        for p in pieces:
            total += len(p) if type(p) is bytes else memoryview(p).nbytes
        try:
            sent = self.sock.sendmsg(pieces) if len(pieces) <= IOV_MAX else 0
        except BlockingIOError:
            sent = 0
        if sent == total:
            return
        for p in pieces:
            view = memoryview(p).cast("B")
            if sent >= len(view):
                sent -= len(view)
                continue
            self.out.append(view[sent:] if sent else view)
            sent = 0
        self.out_messages += messages
        self.flush()

    def flush(self) -> None:
        """Write queued bytes until the socket is full (raises OSError if the peer left)."""
        out = self.out
        while out:
            batch = [out[i] for i in range(min(len(out), IOV_MAX))]
            try:
                sent = self.sock.sendmsg(batch)
            except BlockingIOError:
                return
            for view in batch:
                if sent >= len(view):
                    sent -= len(view)
                    out.popleft()
                else:
                    out[0] = view[sent:]
                    return
        self.out_messages = 0

    def read(self) -> bool:
        """Read what is there (bounded); False at end of stream."""
        # Into one reused buffer: a fresh 256 KiB bytes per recv would be above malloc's
        # mmap threshold, an mmap and munmap (page faults, TLB shootdowns) per read.
        chunk = getattr(_local, "buffer", None)
        if chunk is None:
            chunk = _local.buffer = memoryview(bytearray(READ_SIZE))
        for _ in range(READS_PER_PUMP):
            try:
                n = self.sock.recv_into(chunk)
            except BlockingIOError:
                return True
            if not n:
                return False
            self.inbuf += chunk[:n]
            if n < READ_SIZE:
                return True
        return True

    def parse(self, ready: deque[list[Any]]) -> None:
        """Append every complete transmission in the read buffer to ``ready``: its frames,
        after the connection's identity on the daemon's side (``identity`` not empty)."""
        buf = self.inbuf
        size = len(buf)
        pos = 0
        if not self.greeted:
            if size < len(GREETING):
                return
            if bytes(buf[: len(GREETING)]) != GREETING:
                raise ChannelError(
                    f"the peer did not greet with {GREETING!r} (got {bytes(buf[:len(GREETING)])!r}): "
                    "it is not scaler-executor's ipc transport (a ZeroMQ socket, or another "
                    "version); connect with scaler-executor of the same version, or use tcp://"
                )
            self.greeted = True
            pos = len(GREETING)
        with memoryview(buf) as view:
            while size - pos >= 4:
                (count,) = _COUNT.unpack_from(buf, pos)
                if not 0 < count <= MAX_FRAMES:
                    raise ChannelError(f"a transmission of {count} frames (1 to {MAX_FRAMES} allowed)")
                start = pos + 4 + 8 * count
                if size < start:
                    break
                table = _LENGTHS[count] if count < 16 else struct.Struct(f"<{count}Q")
                lengths = table.unpack_from(buf, pos + 4)
                end = start + sum(lengths)
                if size < end:
                    break
                frames = [self.identity] if self.identity else []
                for n in lengths:
                    frames.append(bytes(view[start : start + n]))
                    start += n
                pos = end
                ready.append(frames)
        if pos:
            del buf[:pos]



class _StreamEndpoint:
    """What both ends of the ipc transport share: an epoll set and the queue of parsed messages.

    ``pollable`` is the epoll descriptor, which the caller's ``Poller`` watches; ``_pump``
    (per side) moves whatever the sockets hold into ``ready``.
    """

    # One thread may send (holding the caller's lock) while another waits in Poller.poll
    # on ``pollable``: the waiter touches no state of ours, only the kernel's epoll set.
    send_beside_poll = True

    def __init__(self, path: str, hwm: int) -> None:
        self.path = path
        self.hwm = hwm
        self.epoll = select.epoll()
        self.ready: deque[list[Any]] = deque()
        self.pollable: Any = self.epoll.fileno()  # what the caller's Poller reports

    @property
    def buffered(self) -> bool:
        return bool(self.ready)

    def fileno(self) -> int:
        return self.epoll.fileno()

    def readable(self) -> bool:
        if not self.ready:
            self._pump()
        return bool(self.ready)

    def recv(self) -> list[Any]:
        if not self.ready:
            self._pump()
            if not self.ready:
                raise Again()
        return self.ready.popleft()

    def _pump(self) -> None:
        raise NotImplementedError


class StreamRouter(_StreamEndpoint):
    """The daemon's side of the ipc transport: a listening socket and its connections."""

    def __init__(self, path: str, *, hwm: int) -> None:
        super().__init__(path, hwm)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.setblocking(False)
        owner_only_bind(self.listener, path)
        self.listener.listen(128)
        self.epoll.register(self.listener.fileno(), _EPOLLIN)
        self.by_fd: dict[int, _Connection] = {}
        self.by_identity: dict[bytes, _Connection] = {}
        self._next_identity = 1

    def poll_timeout(self, timeout_ms: float) -> float:
        return 0 if self.ready else timeout_ms

    def send(self, frames: list[Any]) -> None:
        conn = self.by_identity.get(frames[0])
        if conn is None:
            raise Unreachable()
        if conn.out_messages >= self.hwm:
            raise Again()
        body = frames[1:]
        try:
            conn.write([_header(body), *body], 1)
        except OSError:  # the peer left: like a departed ROUTER peer
            self._drop(conn, None)
            raise Unreachable() from None
        self._want_write(conn)

    def close(self, linger: float | None = None) -> None:
        for conn in list(self.by_fd.values()):
            conn.sock.close()
        self.by_fd.clear()
        self.by_identity.clear()
        self.epoll.close()
        self.listener.close()

    # ------------------------------------------------------------------ inside

    def _pump(self) -> None:
        for fd, events in self.epoll.poll(0):
            if fd == self.listener.fileno():
                self._accept()
                continue
            conn = self.by_fd.get(fd)
            if conn is not None:
                self._service(conn, events)

    def _service(self, conn: _Connection, events: int) -> None:
        try:
            if events & _EPOLLOUT:
                conn.flush()
                self._want_write(conn)
            if events & (_EPOLLIN | _GONE):
                alive = conn.read()
                conn.parse(self.ready)
                if not alive:
                    self._drop(conn, None)
        except ChannelError as exc:
            self._drop(conn, exc)
        except OSError as exc:
            self._drop(conn, None if exc.errno in (errno.ECONNRESET, errno.EPIPE) else exc)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: the peer retries
                log.warning("ipc transport: cannot accept a connection on %s: %s", self.path, exc)
                return
            sock.setblocking(False)
            identity = b"\x00" + self._next_identity.to_bytes(4, "big")
            self._next_identity += 1
            conn = _Connection(sock, identity)
            self.by_fd[sock.fileno()] = conn
            self.by_identity[identity] = conn
            self.epoll.register(sock.fileno(), _EPOLLIN)
            try:
                conn.write([GREETING], 0)
            except OSError:
                self._drop(conn, None)
                continue
            self._service(conn, _EPOLLIN)  # a peer that connected and sent: read it now

    def _want_write(self, conn: _Connection) -> None:
        if bool(conn.out) != conn.writing and conn.sock.fileno() >= 0:
            conn.writing = bool(conn.out)
            self.epoll.modify(conn.sock.fileno(), _EPOLLIN | (_EPOLLOUT if conn.writing else 0))

    def _drop(self, conn: _Connection, why: BaseException | None) -> None:
        if why is not None:
            log.warning("ipc transport: closed a connection to %s: %s", self.path, why)
        fd = conn.sock.fileno()
        if self.by_fd.pop(fd, None) is not None:
            self.epoll.unregister(fd)
        self.by_identity.pop(conn.identity, None)
        conn.sock.close()


class StreamDealer(_StreamEndpoint):
    """A client's or worker's side of the ipc transport: one connection, re-made if lost."""

    def __init__(self, path: str, *, hwm: int, linger: float) -> None:
        super().__init__(path, hwm)
        self.linger = linger
        self.connections = 0  # made so far; past 1, a reconnection (see DealerChannel)
        self.conn: _Connection | None = None
        self.pending: deque[list[Any]] = deque()  # sent while not connected
        self.next_attempt = 0.0
        self.fast_retry_until = time.monotonic() + FIRST_CONNECT_WINDOW  # until connected once
        self._connect()

    def poll_timeout(self, timeout_ms: float) -> float:
        if self.ready:
            return 0
        if self.conn is None:
            now = time.monotonic()
            if now >= self.next_attempt:
                self._connect()
            if self.conn is None:
                return min(timeout_ms, math.ceil(max(0.0, self.next_attempt - now) * 1000))
        return timeout_ms

    def send(self, frames: list[Any]) -> None:
        conn = self.conn
        if conn is None:
            if time.monotonic() >= self.next_attempt:
                self._connect()
            conn = self.conn
            if conn is None:
                if len(self.pending) >= self.hwm:
                    raise Again()
                self.pending.append(frames)
                return
        if conn.out_messages >= self.hwm:
            raise Again()
        try:
            conn.write([_header(frames), *frames], 1)
        except OSError:
            self._lost(None)
            return  # in flight to a daemon that left: lost, as with ZeroMQ
        self._want_write()

    def close(self, linger: float | None = None) -> None:
        conn = self.conn
        wait = self.linger if linger is None else linger
        if conn is not None and conn.out and wait > 0:
            deadline = time.monotonic() + wait
            try:
                while conn.out and time.monotonic() < deadline:
                    conn.flush()
                    if conn.out:
                        select.select([], [conn.sock], [], max(0.0, deadline - time.monotonic()))
            except OSError:
                pass
        if conn is not None:
            conn.sock.close()
            self.conn = None
        self.epoll.close()

    # ------------------------------------------------------------------ inside

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError, InterruptedError):
            sock.close()  # not bound yet (or its backlog is full): try again shortly
            now = time.monotonic()
            self.next_attempt = now + (FIRST_CONNECT_SECONDS if now < self.fast_retry_until else RECONNECT_SECONDS)
            return
        except OSError:
            sock.close()
            self.next_attempt = time.monotonic() + RECONNECT_SECONDS
            raise
        conn = _Connection(sock, b"")
        self.conn = conn
        self.connections += 1
        self.fast_retry_until = 0.0  # connected once: a reconnect waits RECONNECT_SECONDS
        self.epoll.register(sock.fileno(), _EPOLLIN)
        try:
            pieces: list[Any] = [GREETING]
            for frames in self.pending:
                pieces += [_header(frames), *frames]
            conn.write(pieces, len(self.pending))
            self.pending.clear()
        except OSError:
            self._lost(None)
            return
        self._want_write()

    def _pump(self) -> None:
        conn = self.conn
        if conn is None:
            if time.monotonic() >= self.next_attempt:
                self._connect()
            return
        for _fd, events in self.epoll.poll(0):
            try:
                if events & _EPOLLOUT:
                    conn.flush()
                    self._want_write()
                if events & (_EPOLLIN | _GONE):
                    alive = conn.read()
                    conn.parse(self.ready)
                    if not alive:
                        self._lost(None)
                        return
            except ChannelError as exc:
                self._lost(exc)
                return
            except OSError as exc:
                self._lost(None if exc.errno in (errno.ECONNRESET, errno.EPIPE) else exc)
                return

    def _want_write(self) -> None:
        conn = self.conn
        if conn is not None and bool(conn.out) != conn.writing:
            conn.writing = bool(conn.out)
            self.epoll.modify(conn.sock.fileno(), _EPOLLIN | (_EPOLLOUT if conn.writing else 0))

    def _lost(self, why: BaseException | None) -> None:
        conn = self.conn
        if conn is None:
            return
        if why is not None:
            log.warning("ipc transport: closed the connection to %s: %s", self.path, why)
        try:
            self.epoll.unregister(conn.sock.fileno())
        except (OSError, ValueError):
            pass
        conn.sock.close()
        self.conn = None
        self.next_attempt = time.monotonic() + RECONNECT_SECONDS
