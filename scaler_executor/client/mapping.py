"""``Executor.map`` for ``ScalerExecutor`` and its option views: the calls submitted as
the iterables are read (``buffersize`` bounds how many are outstanding), the results
yielded in order, and what is outstanding cancelled when the iterator is closed or
collected.  Imported at the first ``map`` (``executor.py``)."""

from __future__ import annotations

import collections
import itertools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from scaler_executor.client import serialization as ser
from scaler_executor.client.future import TaskFuture
from scaler_executor.client.pickling import MapCache, Pickled
from scaler_executor.protocol.messages import TaskFlags

if TYPE_CHECKING:
    from scaler_executor.client.agent import ClientAgent


class _MapOwner:
    """Lives as long as one ``map`` call's iterator: its callable stays registered until then."""

    __slots__ = ("__weakref__",)


def check_map_arguments(chunksize: Any, buffersize: Any) -> None:
    if not isinstance(chunksize, int) or chunksize < 1:
        raise ValueError("chunksize must be >= 1.")
    if buffersize is not None and not isinstance(buffersize, int):
        raise TypeError("buffersize must be an integer or None")
    if buffersize is not None and buffersize < 1:
        raise ValueError("buffersize must be None or > 0")


def _results(
    agent_ref: weakref.ref[ClientAgent],
    owner: object,
    fs: collections.deque[Future[Any]],
    zipped: Iterator[Any],
    submit_one: Callable[[Any], Future[Any]],
    buffersize: int | None,
    flags: int,
    end_time: float | None,
) -> Iterator[Any]:
    """``map``'s result iterator: results in order, topping the window up to ``buffersize``;
    closing it (or its collection) cancels what is still outstanding."""
    keep = owner  # the callable stays registered while this iterator lives
    try:
        fs.reverse()
        while fs:
            if buffersize and (a := agent_ref()) is not None and not a.shutdown_requested:
                item = next(zipped, None)
                if item is not None:
                    fs.appendleft(submit_one(item))
            # No local keeps the future or its value while suspended at yield: a result
            # the caller dropped is freed (CPython's map does the same, bpo-14406).
            if flags & TaskFlags.CHUNK:
                values, failure = _result_or_cancel(fs.pop(), end_time)
                yield from values
                del values
                if failure is not None:
                    raise ser.rebuild_exception(failure)
            else:
                yield _result_or_cancel(fs.pop(), end_time)
    finally:
        # All of them in one message to the daemon, from a pool thread: this may run
        # as the garbage collector finalizes the iterator, on a thread that holds the
        # agent's lock (a closing map iterator never waits for the daemon's answer).
        a = agent_ref()
        if a is not None:
            a.cancels.later(list(fs))
        else:
            for future in fs:
                future.cancel()
        del keep


def _result_or_cancel(future: Future[Any], end_time: float | None) -> Any:
    try:
        try:
            return future.result(None if end_time is None else end_time - time.monotonic())
        finally:
            future.cancel()
    finally:
        del future  # break the reference cycle through the exception's traceback


def run_map(
    agent: ClientAgent,
    options_id: int,
    fn: Callable[..., Any],
    iterables: tuple[Iterable[Any], ...],
    timeout: float | None,
    chunksize: int,
    buffersize: int | None,
    extra_flags: int = 0,
) -> Iterator[Any]:
    check_map_arguments(chunksize, buffersize)
    agent.check_usable()
    end_time = None if timeout is None else timeout + time.monotonic()
    owner = _MapOwner()
    # The same large argument given to many items (map(f, repeat(big))) is stored once:
    # the cache is keyed by the buffer's owner, and its objects are held until the map ends.
    shared = MapCache(agent)
    weakref.finalize(owner, shared.release_all).atexit = False
    try:
        fn_id = agent.register_function(fn, owner)
    except Exception as exc:
        exc.add_note(ser.pickling_note(fn, (), {}))
        raise
    zipped: Iterator[Any] = zip(*iterables, strict=False)  # map stops at the shortest
    if chunksize > 1:
        zipped = iter(lambda it=zipped: list(itertools.islice(it, chunksize)), [])  # type: ignore[misc]  # its default binds the items
        flags = TaskFlags.CHUNK | extra_flags
    else:
        flags = TaskFlags.CALL | extra_flags

    threshold = agent.packer.config.object_store_threshold
    no_kwargs: dict[str, Any] = {}

    def submit_one(item: Any) -> Future[Any]:
        if flags & TaskFlags.CHUNK:
            # A chunk of small builtin arguments (most chunked maps): as a single call's, below.
            plain = ser.dumps_plain_chunk(item, threshold)
            if plain is not None and len(plain) < threshold:
                return agent.submit_plain(TaskFuture(), fn_id, options_id, flags, plain)

            def pack() -> tuple[int, int, Pickled]:
                return fn_id, flags, agent.packer.pickle_obj(item, shared)

        else:
            # Small builtin arguments (most maps): pickled here, queued without a pack closure.
            plain = ser.dumps_plain_args(item, no_kwargs, threshold)
            if plain is not None and len(plain) < threshold:
                return agent.submit_plain(TaskFuture(), fn_id, options_id, flags, plain)

            def pack() -> tuple[int, int, Pickled]:
                return fn_id, flags, agent.packer.pickle_args(item, {}, shared)

        return agent.submit_with(
            TaskFuture(), pack, options_id, lambda: ser.pickling_note(fn, () if flags & TaskFlags.CHUNK else item, {})
        )

    if buffersize:
        fs: collections.deque[Future[Any]] = collections.deque(
            submit_one(item) for item in itertools.islice(zipped, buffersize)
        )
    else:
        fs = collections.deque(submit_one(item) for item in zipped)
    return _results(weakref.ref(agent), owner, fs, zipped, submit_one, buffersize, flags, end_time)
