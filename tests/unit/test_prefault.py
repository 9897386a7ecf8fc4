"""A large read's destination is faulted in a window ahead of the copy (protocol/prefault.py),
and the readers that use it still read every byte in order.

Counted, not timed: a page written for the first time takes a minor fault
(``ru_minflt``); one that ``objstore_populate_write`` faulted in takes none.
"""

from __future__ import annotations

import io
import mmap
import pickle
import resource
import socket
import threading

import pytest

from scaler_executor.protocol import messages as m
from scaler_executor.protocol import prefault
from scaler_executor.protocol.chunks import Incoming, Parts
from scaler_executor.worker import handoff

PAGE = mmap.PAGESIZE


def faults_writing(view: memoryview, start: int, end: int) -> int:
    """Minor faults taken by this process while writing one byte per page of view[start:end]."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for offset in range(start, end, PAGE):
        view[offset] = 1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_window_is_faulted_in_before_the_copy_reaches_it() -> None:
    size = 4 * prefault.WINDOW
    region = mmap.mmap(-1, size)  # fresh anonymous memory: no page of it is there yet
    view = memoryview(region)
    try:
        ahead = prefault.Ahead(view)
        limit = ahead.limit(0)
        del ahead  # (it holds a buffer of the mapping)
        assert limit == prefault.WINDOW
        populated = faults_writing(view, 0, limit)
        untouched = faults_writing(view, 3 * prefault.WINDOW, size)  # beyond what was faulted in
        pages = prefault.WINDOW // PAGE
        assert untouched >= pages // 2, f"the control took {untouched} faults for {pages} pages: no faults to count here"
        assert populated <= pages // 64, f"{populated} faults writing {pages} pages faulted in ahead"
    finally:
        view.release()
        region.close()


def test_the_limit_stays_a_slack_ahead_and_ends_at_the_size() -> None:
    size = 2 * prefault.WINDOW + 12345
    region = bytearray(size)
    ahead = prefault.Ahead(memoryview(region))
    filled, limits = 0, []
    while filled < size:
        limit = ahead.limit(filled)
        assert filled < limit <= size
        assert limit == size or limit - filled >= prefault.SLACK
        limits.append(limit)
        filled = min(limit, filled + prefault.SLACK // 2)
    assert limits == sorted(limits) and limits[-1] == size
    assert bytes(region) == bytes(size)  # faulting in writes nothing


def test_a_small_read_is_not_faulted_in_and_copies_to_its_end() -> None:
    ahead = prefault.Ahead(memoryview(bytearray(prefault.MIN_BYTES - 1)))
    assert ahead.limit(0) == prefault.MIN_BYTES - 1


def large_value() -> bytes:
    return bytes(range(251)) * ((3 * prefault.MIN_BYTES) // 251)  # no period of a window


def test_a_client_reads_a_large_object_in_parts_whole() -> None:
    value = large_value()
    stream = pickle.dumps(value, protocol=5)
    incoming = Incoming(keep_parts=True)
    part = 1 << 20
    for offset in range(0, len(stream), part):
        incoming.part(m.ObjectPart(b"o" * 16, offset, len(stream)), stream[offset : offset + part])
    parts = incoming.take(b"o" * 16, b"")
    assert isinstance(parts, Parts)
    assert pickle.load(io.BufferedReader(parts.reader(), 1 << 16)) == value


def test_a_processor_reads_a_large_streamed_object_whole() -> None:
    value = large_value()
    stream = pickle.dumps(value, protocol=5)
    ours, theirs = socket.socketpair()
    sender = threading.Thread(target=ours.sendall, args=(stream,))
    sender.start()
    try:
        streamed = handoff.Streamed(theirs.detach(), b"o" * 16, len(stream))
        assert pickle.load(streamed.reader()) == value
        streamed.close()
    finally:
        sender.join(30)
        ours.close()


@pytest.mark.parametrize("size", [0, 1, PAGE - 1, PAGE, 3 * PAGE + 7])
def test_populating_a_range_with_no_whole_page_or_none_at_all_is_a_no_op(size: int) -> None:
    from scaler_executor.objstore._objstore import ffi, lib

    region = bytearray(size + 1)
    assert lib.objstore_populate_write(ffi.from_buffer(region, require_writable=True) + 1, size) == 0
    assert lib.objstore_populate_write(ffi.NULL, size) == 0
    assert bytes(region) == bytes(size + 1)
