"""A progress bar for futures and ``map`` results: ``tqdm`` when installed, plain text otherwise.

Two uses, told apart by the argument::

    from scaler_executor.progress import progress

    # 1. Wrap an iterator (ex.map, as_completed, any iterable): yields its items unchanged.
    for result in progress(ex.map(f, xs), total=len(xs), desc="f"):
        ...

    # 2. A collection of futures (list, tuple, set): waits until all are done, showing
    #    each as it finishes, and returns them in the order given.
    fs = progress([ex.submit(f, x) for x in xs])
    results = [fut.result() for fut in fs]

``ex.map`` yields in submission order, so its bar advances when the *next* result in
order arrives; for completion order wrap ``as_completed(fs)`` (``progress`` then yields
futures, as ``as_completed`` does).  Waiting on futures never raises their exceptions:
as with ``concurrent.futures.wait``, ask each future.

The bar is ``tqdm`` when it can be imported (``pip install tqdm``).  Otherwise one
line on ``sys.stderr`` is rewritten in place (``desc: 40/100 (40%) 2.1 s, 19.0/s``) at
most every :data:`MIN_INTERVAL` seconds, and ended with a newline when the iteration
ends, however it ends.  Like ``tqdm`` and ``as_completed`` this is a thin layer: it
runs no thread and touches no executor internals, so it works with any
``concurrent.futures`` executor.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sized
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import IO, Any, Protocol, TypeVar, overload

__all__ = ["MIN_INTERVAL", "progress"]

T = TypeVar("T")

# Seconds between redraws of the text bar: readable, and cheap even for 100,000 tiny tasks.
MIN_INTERVAL = 0.2


class _Bar(Protocol):
    def update(self, n: int = 1) -> Any: ...

    def close(self) -> Any: ...


class TextBar:
    """The fallback bar: one line, rewritten in place with ``\\r``, rate-limited.

    ``clock`` is an input (``time.monotonic`` by default) so that tests can step it.
    """

    def __init__(
        self,
        total: int | None,
        desc: str | None,
        file: IO[str] | None = None,
        min_interval: float = MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.desc = desc
        self.file = file if file is not None else sys.stderr
        self.min_interval = min_interval
        self.clock = clock
        self.n = 0
        self.closed = False
        self._start = clock()
        self._last_draw: float | None = None
        self._width = 0
        self._draw(self._start)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self._last_draw is None or now - self._last_draw >= self.min_interval:
            self._draw(now)

    def close(self) -> None:
        """Draw the final state and end the line (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._draw(self.clock())
        self.file.write("\n")
        self.file.flush()

    def format(self, now: float) -> str:
        elapsed = now - self._start
        head = f"{self.desc}: " if self.desc else ""
        if self.total is not None:
            percent = 100.0 * self.n / self.total if self.total else 100.0
            count = f"{self.n}/{self.total} ({percent:.0f}%)"
        else:
            count = f"{self.n}"
        rate = f", {self.n / elapsed:.1f}/s" if elapsed > 0 and self.n else ""
        return f"{head}{count} {elapsed:.1f} s{rate}"

    def _draw(self, now: float) -> None:
        text = self.format(now)
        # Pad over the previous, possibly longer, text: \r does not clear the line.
        padding = " " * max(0, self._width - len(text))
        self._width = len(text)
        self.file.write(f"\r{text}{padding}")
        self.file.flush()
        self._last_draw = now


def _make_bar(total: int | None, desc: str | None, file: IO[str] | None) -> _Bar:
    # Imported per call, so that tqdm installed (or hidden, in tests) after import is seen;
    # through importlib because tqdm ships no type stubs.
    try:
        tqdm = importlib.import_module("tqdm.auto").tqdm
    except ImportError:
        return TextBar(total, desc, file)
    bar: _Bar = tqdm(total=total, desc=desc, file=file)
    return bar


def _is_future_collection(items: object) -> bool:
    return (
        isinstance(items, Collection)
        and not isinstance(items, (str, bytes, dict))
        and not isinstance(items, Iterator)
        and all(isinstance(item, Future) for item in items)
    )


# A collection of futures is also an iterable: the first overload wins, which is the design.
@overload
def progress(  # type: ignore[overload-overlap]
    items: Collection[Future[T]],
    total: int | None = None,
    desc: str | None = None,
    *,
    file: IO[str] | None = None,
) -> list[Future[T]]: ...


@overload
def progress(
    items: Iterable[T],
    total: int | None = None,
    desc: str | None = None,
    *,
    file: IO[str] | None = None,
) -> Iterator[T]: ...


def progress(
    items: Iterable[Any],
    total: int | None = None,
    desc: str | None = None,
    *,
    file: IO[str] | None = None,
) -> list[Future[Any]] | Iterator[Any]:
    """Show progress over an iterator of results, or while a collection of futures completes.

    Args:
        items: either a collection (list, tuple, set…) whose elements are all
            ``concurrent.futures.Future`` objects — ``progress`` then *waits* until every
            one is done and returns them — or any other iterable (the iterator of
            ``ex.map``, ``as_completed(fs)``, a generator…), which ``progress`` wraps
            lazily, yielding its items unchanged.
        total: the number of items expected, for the percentage (default: ``len(items)``
            when it has one; unknown otherwise, and then only a count is shown).
        desc: a label shown before the count.
        file: where the bar is written (default: ``sys.stderr``, as tqdm).

    Returns:
        For futures: a list of the same futures, in the order given, all done.  For an
        iterable: an iterator over its items.  Closing it (or leaving a ``for`` loop early
        and dropping it) closes the wrapped iterator, so ``ex.map``'s unfinished tasks are
        cancelled as they would be without the bar.

    Raises:
        Whatever iterating ``items`` raises (e.g. a task's exception from ``ex.map``); the
        bar is closed first.  Waiting on futures raises nothing of theirs.
    """
    if total is None and isinstance(items, Sized):
        total = len(items)
    if _is_future_collection(items):
        return _wait_all(list(items), total, desc, file)
    return _iterate(iter(items), total, desc, file)


def _wait_all(
    futures: list[Future[Any]], total: int | None, desc: str | None, file: IO[str] | None
) -> list[Future[Any]]:
    pending = set(futures)
    bar = _make_bar(len(pending) if total is None else total, desc, file)
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            bar.update(len(done))
    finally:
        bar.close()
    return futures


def _iterate(
    source: Iterator[T], total: int | None, desc: str | None, file: IO[str] | None
) -> Iterator[T]:
    bar = _make_bar(total, desc, file)
    try:
        for item in source:
            bar.update(1)
            yield item
            del item  # hold no result while suspended (as Executor.map does)
    finally:
        bar.close()
        close = getattr(source, "close", None)
        if close is not None:
            close()
