"""``scaler_executor.progress.progress``: both uses, both backends, no cluster.

Futures are plain ``concurrent.futures.Future`` objects completed by a helper thread;
the order of events is forced with ``threading.Event`` (the thread starts completing
futures only once the bar has been drawn), never with sleeps.  The text fallback is
forced by hiding ``tqdm`` from imports; its rate limit is tested with a stepped clock.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, as_completed
from typing import Any

import pytest

from scaler_executor.progress import MIN_INTERVAL, TextBar, progress


class Recorder(io.StringIO):
    """A text file that signals its first write (the bar's first drawing)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        self.written.set()
        return n


@pytest.fixture(params=["text", "tqdm"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "text":
        monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
        monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    else:
        pytest.importorskip("tqdm")
    return str(request.param)


def complete_after(
    file: Recorder, futures: list[Future[int]], fail_at: int | None = None
) -> threading.Thread:
    """A thread that completes ``futures`` in reverse order once the bar has been drawn."""

    def run() -> None:
        assert file.written.wait(10)
        for i in reversed(range(len(futures))):
            if i == fail_at:
                futures[i].set_exception(ValueError(f"task {i}"))
            else:
                futures[i].set_result(i * i)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def final_line(output: str) -> str:
    """The bar's last state: text after the last carriage return, without the newline."""
    assert output.endswith("\n"), repr(output)
    return output.rstrip("\n").rsplit("\r", 1)[-1].strip()


# --------------------------------------------------------------------------- waiting on futures


@pytest.mark.timeout(20)
def test_waits_for_futures_and_returns_them_in_order(backend: str) -> None:
    file = Recorder()
    futures: list[Future[int]] = [Future() for _ in range(20)]
    thread = complete_after(file, futures)
    returned = progress(futures, desc="squares", file=file)
    thread.join()
    assert returned == futures  # the same futures, in the order given
    assert all(f.done() for f in returned)
    assert [f.result() for f in returned] == [i * i for i in range(20)]
    assert "squares" in file.getvalue() and "20/20" in file.getvalue()
    assert file.getvalue().endswith("\n")


@pytest.mark.timeout(20)
def test_waiting_does_not_raise_the_futures_exceptions(backend: str) -> None:
    file = Recorder()
    futures: list[Future[int]] = [Future() for _ in range(5)]
    thread = complete_after(file, futures, fail_at=2)
    returned = progress(tuple(futures), file=file)
    thread.join()
    assert all(f.done() for f in returned)
    with pytest.raises(ValueError, match="task 2"):
        returned[2].result()
    assert "5/5" in file.getvalue()


@pytest.mark.timeout(20)
def test_futures_already_done(backend: str) -> None:
    file = Recorder()
    futures: list[Future[int]] = [Future() for _ in range(3)]
    for i, f in enumerate(futures):
        f.set_result(i)
    assert progress(set(futures), file=file) and "3/3" in file.getvalue()
    assert progress([], file=io.StringIO()) == []


@pytest.mark.timeout(20)
def test_as_completed_yields_futures_as_they_finish(backend: str) -> None:
    file = Recorder()
    futures: list[Future[int]] = [Future() for _ in range(6)]
    thread = complete_after(file, futures)
    file.written.set()  # as_completed draws nothing before its first item: let the thread go
    seen = [f.result() for f in progress(as_completed(futures), total=len(futures), file=file)]
    thread.join()
    assert sorted(seen) == [i * i for i in range(6)]
    assert "6/6" in file.getvalue()


# --------------------------------------------------------------------------- wrapping an iterator


@pytest.mark.timeout(20)
def test_wraps_an_iterator_lazily_and_in_order(backend: str) -> None:
    file = Recorder()
    pulled: list[int] = []

    def source() -> Iterator[int]:
        for i in range(10):
            pulled.append(i)
            yield i

    it = progress(source(), total=10, desc="map", file=file)
    assert pulled == []  # nothing is consumed before the caller asks
    assert next(it) == 0 and pulled == [0]
    assert list(it) == list(range(1, 10))
    assert "map" in file.getvalue() and "10/10" in file.getvalue()
    assert file.getvalue().endswith("\n")


@pytest.mark.timeout(20)
def test_total_defaults_to_len(backend: str) -> None:
    file = Recorder()
    assert list(progress([1, 2, 3], file=file)) == [1, 2, 3]  # a list of non-futures is an iterable
    assert "3/3" in file.getvalue()


@pytest.mark.timeout(20)
def test_unknown_total_shows_a_count(backend: str) -> None:
    file = Recorder()
    assert sum(progress((i for i in range(7)), file=file)) == 21
    assert "7" in final_line(file.getvalue())
    assert "/7" not in file.getvalue()


@pytest.mark.timeout(20)
def test_exception_from_the_iterator_propagates_and_closes_the_bar(backend: str) -> None:
    file = Recorder()

    def source() -> Iterator[int]:
        yield 1
        raise KeyError("bad item")

    it = progress(source(), total=5, file=file)
    assert next(it) == 1
    with pytest.raises(KeyError, match="bad item"):
        next(it)
    assert file.getvalue().endswith("\n")


@pytest.mark.timeout(20)
def test_closing_early_closes_the_wrapped_iterator(backend: str) -> None:
    file = Recorder()
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            closed.set()  # Executor.map cancels its pending futures here

    it = progress(source(), total=100, file=file)
    for value in it:
        if value == 3:
            break
    it.close()  # type: ignore[attr-defined]  # a generator; the for loop above left it suspended
    assert closed.is_set()
    assert file.getvalue().endswith("\n")


# --------------------------------------------------------------------------- the text fallback


@pytest.mark.timeout(20)
def test_text_fallback_is_one_line_on_stderr(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert list(progress(range(50), desc="work")) == list(range(50))
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n")  # a single line, ended
    assert final_line(err).startswith("work: 50/50 (100%)")


@pytest.mark.timeout(20)
def test_text_bar_is_rate_limited() -> None:
    now = [100.0]
    file = io.StringIO()
    bar = TextBar(total=1000, desc="x", file=file, clock=lambda: now[0])
    assert file.getvalue().count("\r") == 1  # drawn once at the start
    for _ in range(500):
        bar.update()  # no time passes: no redraw
    assert file.getvalue().count("\r") == 1
    now[0] += MIN_INTERVAL
    bar.update()
    assert file.getvalue().count("\r") == 2
    assert "501/1000 (50%)" in file.getvalue()
    now[0] += MIN_INTERVAL / 2
    bar.update(10)
    assert file.getvalue().count("\r") == 2
    bar.close()
    bar.close()  # idempotent
    text = file.getvalue()
    assert text.count("\r") == 3 and text.count("\n") == 1
    assert final_line(text) == "x: 511/1000 (51%) 0.3 s, 1703.3/s"


@pytest.mark.timeout(20)
def test_text_bar_pads_over_a_longer_previous_text() -> None:
    now = [0.0]
    file = io.StringIO()
    bar = TextBar(total=None, desc=None, file=file, min_interval=0.0, clock=lambda: now[0])
    now[0] = 1.0
    bar.update(123456)  # "123456 1.0 s, 123456.0/s"
    bar.desc = ""
    bar.n = 0
    now[0] = 2.0
    bar.update(1)  # "1 2.0 s, 0.5/s": shorter, padded with spaces over the old text
    last = file.getvalue().rsplit("\r", 1)[-1]
    assert last.startswith("1 2.0 s, 0.5/s") and len(last) == len("123456 1.0 s, 123456.0/s")


@pytest.mark.timeout(20)
def test_tqdm_is_used_when_installed() -> None:
    tqdm = pytest.importorskip("tqdm")
    file = io.StringIO()
    list(progress(range(4), desc="tq", file=file))
    assert "tq" in file.getvalue() and "4/4" in file.getvalue()
    assert "it/s" in file.getvalue() or "it]" in file.getvalue()  # tqdm's own format
    assert tqdm is not None
