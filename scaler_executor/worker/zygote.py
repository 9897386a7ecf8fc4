"""The zygote: a pre-imported, single-threaded process that forks processors.

Why a zygote rather than ``spawn`` or forking the agent:

* ``spawn`` pays an interpreter start and every import per processor (~100 ms
  and more with NumPy); a replacement after a crash or a timeout should take a
  few milliseconds.
* The agent cannot fork safely: it runs ZeroMQ's I/O threads, and a fork of a
  multi-threaded process may copy a lock that some other thread holds.
* So the agent forks *once*, at start, before it creates any ZeroMQ context:
  that child (the zygote) keeps the imports and stays single-threaded, and
  forks each processor on request (~1-3 ms).

Control channel (a ``SOCK_SEQPACKET`` socketpair, so messages keep their
boundaries; msgpack bodies)::

    agent  ──[SPAWN]──────────────────────────────►  zygote
    agent  ◄──[SPAWNED, pid] + the processor's socket, the read end of its
              stderr pipe and the write end of its recall pipe (SCM_RIGHTS)──  zygote
    agent  ◄──[EXITED, pid, wait status]──  zygote (it reaps its children)
    agent  ──[WARM]──►  zygote: import what tasks often need, once (the worker is idle)

The zygote exits when the agent's end closes.
"""

from __future__ import annotations

import errno
import importlib
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass

import msgpack

SPAWN, SPAWNED, EXITED, WARM = 1, 2, 3, 4

# What WARM imports: get_executor's client (~13 ms of CPU), which nested tasks need: the
# executor, and what its constructor and map import when first used (client/executor.py).
# Named, not imported here: the worker does not import the client (see tests/unit/test_layers.py).
WARM_MODULES = ("scaler_executor.client.executor", "scaler_executor.client.agent", "scaler_executor.client.mapping")


@dataclass
class ZygoteHandle:
    pid: int
    control: socket.socket

    def request(self) -> None:
        self.control.send(msgpack.packb([SPAWN]))

    def warm(self) -> None:
        try:
            self.control.send(msgpack.packb([WARM]))
        except OSError:  # the zygote is gone: the agent hears it on the control socket
            pass

    def close(self) -> None:
        try:
            self.control.close()
        except OSError:
            pass


def start_zygote(initializer: bytes | None, max_tasks: int | None, arrays_in_store: int = 0) -> ZygoteHandle:
    """Fork the zygote.  Call before creating any thread or ZeroMQ context.

    ``arrays_in_store``: the processors' NumPy arrays of at least this many bytes are
    allocated in the object store (0: never); see :mod:`scaler_executor.objstore.numpy_alloc`."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the zygote
        try:
            parent_end.close()
            _zygote_main(child_end, initializer, max_tasks, arrays_in_store)
        finally:
            os._exit(0)
    child_end.close()
    return ZygoteHandle(pid, parent_end)


def _zygote_main(
    control: socket.socket, initializer: bytes | None, max_tasks: int | None, arrays_in_store: int
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent decides when processes stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    children: set[int] = set()
    while True:
        try:
            ready = poller.poll()
        except InterruptedError:
            continue
        for fd, _events in ready:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                _reap(control, children)
            else:
                try:
                    data = control.recv(4096)
                except InterruptedError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    _kill_all(children)  # the agent is gone: so are its processors
                    return
                kind = msgpack.unpackb(data)[0]
                if kind == SPAWN:
                    children.add(_spawn(control, wake_r, wake_w, initializer, max_tasks, arrays_in_store))
                elif kind == WARM:
                    # Import what tasks often need (get_executor's client, ~13 ms of CPU) once,
                    # so every later processor starts with it.  The agent asks only once its
                    # worker has been idle: on a busy 2-core host these milliseconds delayed
                    # a few dozen tasks in a row.
                    for module in WARM_MODULES:
                        try:
                            importlib.import_module(module)
                        except Exception:  # noqa: BLE001 - warming is an optimisation: a module that fails is the task's to report
                            pass


def _kill_all(children: set[int]) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _spawn(
    control: socket.socket,
    wake_r: int,
    wake_w: int,
    initializer: bytes | None,
    max_tasks: int | None,
    arrays_in_store: int,
) -> int:
    agent_end, processor_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The processor's stderr goes through the agent, which forwards it and keeps the last
    # lines to explain a crash ("Fatal Python error: ...", a C library's complaint).
    err_r, err_w = os.pipe()
    # The agent asks for the tasks queued behind a long-running one back by writing a byte
    # here; the processor's watchdog thread answers while its main thread runs the task.
    recall_r, recall_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the processor
        code = 0
        try:
            os.close(err_r)
            os.close(recall_w)
            sys.stderr.flush()
            os.dup2(err_w, 2)
            os.close(err_w)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.close(wake_r)
            os.close(wake_w)
            control.close()
            agent_end.close()
            from scaler_executor.worker.processor import processor_main

            processor_main(processor_end.detach(), initializer, max_tasks, arrays_in_store, recall_r)
        except BaseException:  # noqa: BLE001 - the forked child must reach os._exit, whatever happened
            import traceback

            traceback.print_exc()
            code = 70
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    processor_end.close()
    os.close(err_w)
    os.close(recall_r)
    try:
        socket.send_fds(control, [msgpack.packb([SPAWNED, pid])], [agent_end.fileno(), err_r, recall_w])
    finally:
        agent_end.close()
        os.close(err_r)
        os.close(recall_w)
    return pid


def _reap(control: socket.socket, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return
        children.discard(pid)
        try:
            control.send(msgpack.packb([EXITED, pid, status]))
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                return
            raise
