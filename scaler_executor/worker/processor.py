"""A processor: the child process that runs user code, one task at a time.

It speaks to its worker agent over one stream socket (framed by
``multiprocessing.connection.Connection``), never over ZeroMQ::

    agent ──[RUN, task, attempt, fn_id, fn_payload|None, flags, payload, deps, objects,
             store name, threshold, fetched objects|None, [reply socket, worker name, lane]|None,
             client's authkey file|"", [capture dir, limit]|None]──► processor
                                              (worker/mpkey.py; worker/capture.py)
    agent ◄──[DONE, task, attempt, status, payload, started, finished, peak, objects, delivered,
              captured output|b""]── processor
    client ◄──result datagram── processor        (REPLY_DIRECT tasks: protocol/reply.py; then
                                                  DONE says delivered)
    agent ──[FORGET, [fn_id, ...]]──► processor        (drop cached callables)
    agent ◄──[INIT_FAILED, exception payload]── processor (then it exits)
    agent ◄──[SECEDE, task, [task ids handed back]]── processor (the task waits on sub-tasks)
    agent ──one byte on the recall pipe──► processor's watchdog thread
    agent ◄──[RECALLED, [task ids handed back]]── processor (tasks queued behind the running
                                                   one, unstarted; [] between tasks)

Tasks are run in the order received; the agent therefore knows that the first
task it sent and has not had back is the one running — which is what it blames
if this process dies.

A watchdog thread waits for the agent's end of the socket to hang up
(``POLLRDHUP``) and exits at once, so a processor busy in user code never
outlives its agent. It also answers recalls: the agent gave this processor short
tasks to queue behind the running one, the running one turned out long, and another
processor is idle; the watchdog takes the queued tasks out of the socket (under the
lock that the main thread holds whenever it reads or writes the socket during a task)
and hands them back.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle  # type: ignore[import-untyped]  # no stubs or py.typed
import msgpack

from scaler_executor import _compat
from scaler_executor.protocol import reply as direct
from scaler_executor.protocol.messages import Status, TaskFacts, TaskFlags, TaskResult, make
from scaler_executor.protocol.refs import install as install_deps
from scaler_executor.worker import handoff
from scaler_executor.worker.capture import Capture
from scaler_executor.worker.framing import FrameReader, send_with_fds
from scaler_executor.worker.memory import private_memory
from scaler_executor.worker.mpkey import ClientKeys

RUN, DONE, FORGET, INIT_FAILED, SECEDE, RECALLED = 1, 2, 3, 4, 5, 6



def dump_value(value: Any) -> bytes:
    """Pickle a value for the wire: plain pickle when it can, cloudpickle otherwise."""
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - pickle fails in many ways (PicklingError, TypeError, ...): cloudpickle next
        return cloudpickle.dumps(value, protocol=5)  # type: ignore[no-any-return]  # untyped: it returns bytes


def dump_exception(exc: BaseException) -> bytes:
    """The wire form of a task's exception: msgpack [pickled exc | b"", type, message,
    traceback text, tb dict, rebuild | b""].

    ``rebuild``, when the exception itself cannot be pickled: ``(type, args, attributes)``
    pickled, from which the client builds an exception of the same type (``_rebuildable``);
    only when neither travels does the client get a ``RemoteError``."""
    tb_text = _format(exc)
    type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the error
        message = f"<unprintable {type_name}>"
    rebuild = b""
    try:
        pickled = dump_value(exc)
    except BaseException as pickling_error:  # noqa: BLE001 - whatever pickling raises (RecursionError too), the error still travels
        pickled = b""
        rebuild = _rebuildable(exc, message)
        lost = "it arrives rebuilt from its arguments, without what did not pickle" if rebuild else "it arrives as RemoteError"
        tb_text += f"\n(the exception could not be pickled: {pickling_error!r}; {lost})"
    tb_dict = None
    try:
        from tblib import Traceback  # type: ignore[import-untyped]  # no stubs or py.typed

        if exc.__traceback__ is not None:
            tb_dict = Traceback(exc.__traceback__).to_dict()
    except BaseException:  # noqa: BLE001 - the tb dict is a debugging extra (deep: RecursionError): the text travels anyway
        tb_dict = None
    try:
        return msgpack.packb([pickled, type_name, message, tb_text, tb_dict, rebuild], use_bin_type=True)
    except Exception:  # noqa: BLE001 - tb dict with odd values, or nested deeper than msgpack allows
        return msgpack.packb([pickled, type_name, message, tb_text, None, rebuild], use_bin_type=True)


def _format(exc: BaseException) -> str:
    """The traceback text, from the first frame of the user's (this module's own frames,
    which run every task, are left out, as they are noise in every remote traceback)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException as formatting_error:  # noqa: BLE001 - e.g. RecursionError in a deep cause chain
        return f"{type(exc).__qualname__}: (its traceback could not be formatted: {formatting_error!r})\n"


def _rebuildable(exc: BaseException, message: str) -> bytes:
    """``(type, args, attributes)`` pickled when an exception of ``exc``'s type can be built
    from them here (so, most likely, in the client), else b"".

    The arguments are ``exc.args`` (an ``OSError``'s errno, strerror, filename and filename2),
    or the message alone; the attributes are those of ``exc.__dict__`` that pickle one by one.
    """
    cls = type(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        candidates: list[tuple[Any, ...]] = [(exc.errno, exc.strerror, exc.filename, None, exc.filename2)]
    else:
        candidates = [exc.args]
    candidates.append((message,))
    attributes = {}
    for key, value in getattr(exc, "__dict__", {}).items():
        try:
            dump_value(value)
        except BaseException:  # noqa: BLE001 - this attribute stays behind
            continue
        attributes[key] = value
    for args in candidates:
        try:
            if type(cls(*args)) is not cls:
                continue
            return dump_value((cls, args, attributes))
        except BaseException:  # noqa: BLE001 - the type cannot be built from these (or they do not pickle): next
            continue
    return b""


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _note_read_only(exc: BaseException) -> None:
    """Name the fix on a write into a read-only view (NumPy's ValueError "assignment
    destination is read-only" or "output array is read-only", a memoryview's TypeError
    "cannot modify read-only memory"); called when the task's arguments had some."""
    if isinstance(exc, (ValueError, TypeError)) and "read-only" in str(exc):
        exc.add_note(
            "this task's arguments included large values (object_store_threshold, 64 KiB by "
            "default), which arrive as read-only zero-copy views of shared memory: write into "
            "a private copy (np.array(x), bytearray(x)), or submit through "
            "ex.options(writable=True) to get writable copies"
        )


def _run(
    fn: Callable[..., Any],
    flags: int,
    payload: bytes,
    objects: list[bytes],
    state: _ProcessorState,
    readonly: bool = False,
) -> tuple[int, bytes, list[bytes], Any]:
    """Unpickle and run the call; ``readonly``: its arguments include read-only views.

    The fourth item holds the call's arguments and its value: the caller drops it only once
    DONE is sent, so freeing a large argument or value (about 7 ms for 100 MB here: the
    pages go back to the kernel) does not hold the reply back."""
    try:
        if flags & TaskFlags.PACKED:
            call = state.load(payload, objects, writable=bool(flags & TaskFlags.WRITABLE))
        else:
            call = pickle.loads(payload)
        if flags & TaskFlags.INLINE_FN:
            fn, args, kwargs = call
        elif flags & TaskFlags.CHUNK:
            chunk = call
        else:
            args, kwargs = call
    except BaseException as exc:  # noqa: BLE001 - whatever unpickling the arguments raises is the task's error
        error = state.keys.explain(exc, state.key_file, "the task's arguments")
        error.add_note("while unpickling the task's arguments in the worker")
        return Status.ERROR, dump_exception(error), NO_OBJECTS, None
    try:
        if flags & TaskFlags.CHUNK:
            # (results, None), or (results before the failing call, its exception): map
            # yields those, then raises at the failing item's position.
            values: list[Any] = []
            failure = None
            for item in chunk:
                try:
                    values.append(fn(*item))
                except BaseException as exc:  # noqa: BLE001 - the failing item's error, whatever it is, ends the chunk
                    if readonly:
                        _note_read_only(exc)
                    failure = dump_exception(exc)
                    break
            value: Any = (values, failure)
        else:
            value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the task's own error, whatever it is, goes back to the caller
        if readonly:
            _note_read_only(exc)
        return Status.ERROR, dump_exception(exc), NO_OBJECTS, call
    try:
        payload, result_objects = state.dump_result(value)
        return Status.OK, payload, result_objects, (call, value)
    except BaseException as exc:  # noqa: BLE001 - whatever pickling the value raises is the task's error
        exc.add_note(
            f"while pickling the return value ({type(value).__module__}.{type(value).__qualname__}) "
            f"of {_describe(fn)}: return something picklable"
        )
        return Status.ERROR, dump_exception(exc), NO_OBJECTS, (call, value)


def _watch_agent(fd: int, recall_fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLRDHUP)
    if recall_fd >= 0:
        poller.register(recall_fd, select.POLLIN)
    while True:
        for ready, events in poller.poll():
            if ready == fd:
                if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                    os._exit(0)
                continue
            try:
                asked = os.read(recall_fd, 64)
            except OSError:
                asked = b""
            if not asked:  # the agent closed its end: it is going (the socket says so too)
                poller.unregister(recall_fd)
            elif _compat.PROCESSOR is not None:
                try:
                    _compat.PROCESSOR.recall()
                except Exception:  # noqa: BLE001 - (the agent went away meanwhile) this thread must keep watching
                    pass


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream must not stop the processor
            pass


class _ProcessorState:
    """What code running inside a task may ask of its processor (``get_executor``, secede)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # The agent's messages, read in bulk, with the memfds of large objects beside them
        # (a socket of its own over a duplicate of the descriptor: recvmsg).
        self.sock = socket.socket(fileno=os.dup(conn.fileno()))
        self.reader = FrameReader(conn.fileno(), self.sock)
        self.store: Any = None  # the host's object store, attached on first use
        self.store_name = ""
        self.blobs: dict[bytes, bytes] | None = None  # objects fetched over the network, this task
        self.threshold = 65536
        self.task_id = 0  # the running task, 0 between tasks
        self.seceded = False
        self.lock = threading.Lock()
        self.functions: dict[int, Any] = {}
        self.fn_payloads: dict[int, bytes] = {}  # pickled callables, unpickled on first use
        self.arrays_in_store = 0  # NumPy arrays this large go to the store (0: never)
        self.arrays_pending = False  # install the handler once NumPy is imported
        self.arrays: Any = None  # the installed numpy_alloc handler
        self.reply_sock: socket.socket | None = None  # sends REPLY_DIRECT results to clients
        self.keys = ClientKeys()  # clients' multiprocessing authkeys (worker/mpkey.py)
        self.key_file = ""  # the running task's client's key file ("": none given)
        self.capture: Capture | None = None  # made by the first CAPTURE task

    def use_store(self, name: str, threshold: int) -> None:
        self.threshold = threshold
        if name and name != self.store_name:
            from scaler_executor.objstore import ObjectStore

            self.store = ObjectStore.attach(name, fallback_dir=tempfile.gettempdir())
            self.store_name = name
            self.arrays_pending = self.arrays_in_store > 0  # (again) for this store
        self.put_arrays_in_store()

    def put_arrays_in_store(self) -> None:
        """Allocate this process's large NumPy arrays in the store (see numpy_alloc), once
        NumPy is imported; called when a task starts and after it ends."""
        if not self.arrays_pending or "numpy" not in sys.modules:
            return
        self.arrays_pending = False
        from scaler_executor.objstore import numpy_alloc

        try:
            self.arrays = numpy_alloc.install(self.store, self.arrays_in_store)
        except Exception as exc:  # noqa: BLE001 - e.g. a NumPy whose C API moved: arrays stay private
            print(f"scaler-executor: NumPy arrays stay in private memory ({exc!r})", file=sys.stderr)

    def load(self, header: bytes, objects: list[bytes], writable: bool = False) -> Any:
        """A value from a store header: from this host's store, or from fetched bytes."""
        from scaler_executor.objstore import payload as packing

        if not objects:
            return packing.unpack(header, objects, None)
        objects = list(packing.own_ids(header, objects))  # not those of ObjectRef arguments
        if self.blobs is not None:
            return packing.unpack(header, objects, packing.Fetched(self.blobs), writable=writable)
        return packing.unpack(header, objects, self.store, writable=writable)

    def dump_result(self, value: Any) -> tuple[bytes, list[bytes]]:
        """The result's wire form: inline pickle, or a store header when it is large."""
        if type(value) in _SCALARS and (type(value) not in _SIZED or len(value) < self.threshold):
            return pickle.dumps(value, protocol=5), NO_OBJECTS  # 1 us instead of the store's 30
        if self.store is None or self.blobs is not None:
            # No store here: the agent streams a large result to the daemon's (agent._offload),
            # handed to it in a memfd, not inside DONE (worker/handoff.py).
            large = max(self.threshold, handoff.LARGE)
            if handoff.is_large(value) and len(value) >= large:
                return handoff.pickle_large(value, cloudpickle), NO_OBJECTS  # type: ignore[return-value]
            pickled = dump_value(value)
            if len(pickled) >= large:
                return handoff.to_memfd(pickled), NO_OBJECTS  # type: ignore[return-value]
            return pickled, NO_OBJECTS
        from scaler_executor.objstore import ObjectStoreFull
        from scaler_executor.objstore import payload as packing

        try:
            packed = packing.pack(value, self.store, threshold=self.threshold)
        except ObjectStoreFull:
            return dump_value(value), NO_OBJECTS  # does not fit: it goes inline instead
        if not packed.object_ids:
            stream = packing.inline_stream(packed.header)  # no objects: the bare pickle stream
            assert stream is not None
            return stream, NO_OBJECTS
        return packed.header, packed.object_ids

    def reply(self, reply: list[str], result: TaskResult) -> bool:
        """Send ``result`` to the client's reply socket; False (nothing sent) on any failure."""
        sock = self.reply_sock
        if sock is None:
            sock = self.reply_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            datagram = direct.encode(result, reply[2])
        except ValueError:  # e.g. a worker name too long for the datagram's header
            return False
        if len(datagram) > direct.DATAGRAM_LIMIT:
            return False
        try:
            sock.sendto(datagram, socket.MSG_DONTWAIT, reply[0])
        except OSError:  # the client gone, its queue full, a socket not ours: the agent's path
            return False
        return True

    def function(self, fn_id: int) -> Any:
        fn = self.functions.get(fn_id)
        if fn is None:
            fn = self.functions[fn_id] = pickle.loads(self.fn_payloads[fn_id])
        return fn

    def take(self, message: list[Any]) -> list[Any] | None:
        """Apply FORGET, record a RUN's callable; returns the RUN message (or None)."""
        if message[0] == FORGET:
            for fn_id in message[1]:
                self.functions.pop(fn_id, None)
                self.fn_payloads.pop(fn_id, None)
            return None
        fn_id, fn_payload = message[3], message[4]
        if fn_payload is not None:
            self.fn_payloads[fn_id] = fn_payload
        blobs = message[11]
        if blobs:
            # Large fetched objects came as memfds beside this message, in order (handoff.py);
            # one still arriving (minus its size) as a socket it streams through.
            for object_id, blob in blobs.items():
                if type(blob) is int:
                    fd = self.reader.take_fd()
                    blobs[object_id] = handoff.attach(fd, blob) if blob >= 0 else handoff.Streamed(fd, object_id, -blob)
        return message

    def _take_queued(self) -> list[int]:
        """The ids of the RUNs waiting in the socket, taken out of it (FORGETs applied).
        Only while a task runs, under ``lock``: the main thread is not reading then."""
        returned = []
        for raw in self.reader.available():
            message = self.take(msgpack.unpackb(raw))
            if message is not None:
                returned.append(message[1])
        return returned

    def recall(self) -> None:
        """Hand the agent back the tasks queued behind the running one (none between tasks:
        then the main thread may be reading the socket, and runs them itself)."""
        with self.lock:
            returned = self._take_queued() if self.task_id else []
            self.conn.send_bytes(msgpack.packb([RECALLED, returned]))

    def secede(self) -> None:
        """Release this task's slot: the agent starts another processor while it waits.

        Tasks the agent queued behind this one are handed back first (they would wait
        for it otherwise — a deadlock if they are its own sub-tasks).
        """
        with self.lock:
            if self.seceded or not self.task_id:
                return
            returned = self._take_queued()
            self.seceded = True
            self.conn.send_bytes(msgpack.packb([SECEDE, self.task_id, returned]))


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_SIZED = frozenset({str, bytes})
NO_OBJECTS: list[bytes] = []


def processor_main(
    fd: int, initializer: bytes | None, max_tasks: int | None, arrays_in_store: int = 0, recall_fd: int = -1
) -> None:
    """Run tasks from the agent on socket ``fd`` until it hangs up; never returns.

    ``recall_fd``: the read end of the agent's recall pipe (-1: none).

    ``arrays_in_store``: NumPy arrays of at least this many bytes that tasks create live
    in the host's object store (0: never), from the first task that starts with NumPy
    imported."""
    conn = Connection(fd)
    state = _compat.PROCESSOR = _ProcessorState(conn)
    state.arrays_in_store = arrays_in_store
    threading.Thread(target=_watch_agent, args=(fd, recall_fd), name="scaler-agent-watchdog", daemon=True).start()
    if initializer:
        try:
            init, initargs = pickle.loads(initializer)
            init(*initargs)
        except BaseException as exc:  # noqa: BLE001 - the initializer's error, whatever it is, goes to the agent
            exc.add_note("while running the executor's initializer in a worker process")
            with state.lock:  # the watchdog may be answering a recall on this socket
                conn.send_bytes(msgpack.packb([INIT_FAILED, dump_exception(exc)], use_bin_type=True))
            _flush_streams()
            os._exit(1)
    import gc

    gc.freeze()  # what was imported so far is long-lived: keep the collector off it
    packb, unpackb = msgpack.packb, msgpack.unpackb
    reader = state.reader
    done = 0
    while True:
        try:
            raw = reader.next()
        except (EOFError, OSError):
            os._exit(0)
        message = state.take(unpackb(raw))
        if message is None:
            continue
        (_, task_id, attempt, fn_id, _fn_payload, flags, payload, deps, objects, store_name, threshold, blobs, reply, key_file,
         capturing) = message
        # The client's authkey, from before its function is unpickled (a by-value function's
        # globals may hold manager proxies) on, switched only when the client changes (worker/mpkey.py).
        state.key_file = key_file
        state.keys.use(key_file)
        fn: Any = None
        if fn_id:
            try:
                fn = state.function(fn_id)
            except BaseException as exc:  # noqa: BLE001 - whatever unpickling the function raises is the task's error
                exc = state.keys.explain(exc, key_file, "the task's function (its globals or defaults)")
                exc.add_note("while unpickling the task's function in the worker")
                started = time.time()
                with state.lock:  # the watchdog may be answering a recall on this socket
                    conn.send_bytes(packb([DONE, task_id, attempt, Status.ERROR, dump_exception(exc), started, started, 0, [], False, b""]))
                continue
        state.task_id = task_id
        started = time.time()
        try:
            state.use_store(store_name, threshold)
        except Exception as exc:  # noqa: BLE001 - the agent saw it attach; this should not happen
            exc.add_note("while attaching the object store in the worker")
            with state.lock:
                state.task_id = 0
                conn.send_bytes(packb([DONE, task_id, attempt, Status.ERROR, dump_exception(exc), started, started, 0, [], False, b""]))
            continue
        state.blobs = blobs
        writable = bool(flags & TaskFlags.WRITABLE)
        install_deps(deps, (lambda h, o: state.load(h, o, writable=True)) if writable else state.load)
        readonly = not writable and (bool(objects) or (bool(deps) and any(dep[2] for dep in deps)))
        output = b""
        if capturing is not None:
            captured = state.capture
            if captured is None or captured.directory != capturing[0] or captured.limit != capturing[1]:
                captured = state.capture = Capture(capturing[0], capturing[1])
            captured.start()
            try:
                status, result, result_objects, held = _run(fn, flags, payload, objects, state, readonly)
            finally:
                output = captured.stop()
        else:
            status, result, result_objects, held = _run(fn, flags, payload, objects, state, readonly)
        finished = time.time()
        # Private memory at the end of tasks long enough for it to matter (the agent also
        # samples every 100 ms); 20 us is too much to spend on every no-op.
        peak = private_memory() if finished - started >= 0.01 else 0
        _flush_streams()
        delivered = (
            reply is not None
            and not result_objects
            and not output  # the reply datagram has no room for it: the agent's path carries it
            and finished - started < direct.DIRECT_SECONDS
            and len(result) <= direct.MAX_PAYLOAD
            and state.reply(reply, make(TaskResult, (task_id, attempt, status, result, make(TaskFacts, (reply[1], started, finished, 0)), NO_OBJECTS, False, b"")))
        )
        with state.lock:
            state.task_id = 0
            state.seceded = False
            in_memfd: Any = result
            if type(in_memfd) is handoff.InMemfd:  # a large result: its memfd goes beside DONE
                done_message = packb(
                    [DONE, task_id, attempt, status, in_memfd.size, started, finished, peak, result_objects, delivered, output],
                    use_bin_type=True,
                )
                try:
                    send_with_fds(state.sock, done_message, [in_memfd.fd])
                finally:
                    os.close(in_memfd.fd)
            else:
                conn.send_bytes(
                    packb(
                        [DONE, task_id, attempt, status, result, started, finished, peak, result_objects, delivered, output],
                        use_bin_type=True,
                    )
                )
        # The arguments, the value, the dependency values and the fetched objects (a large
        # one's mapping may be the last reference to its memfd: 13 ms to free 100 MB) go once
        # the reply is on its way (_run says why), not when the next RUN rebinds these names.
        del held, raw, message, payload, deps, objects, blobs, result, in_memfd
        install_deps(None)
        state.blobs = None
        state.put_arrays_in_store()  # if the task imported NumPy
        done += 1
        if max_tasks is not None and done >= max_tasks:
            os._exit(0)
