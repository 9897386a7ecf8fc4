"""The seal record at the end of every file before the last segment (journal format 2): a
sealed segment or a base cut anywhere — at every record boundary too, which no checksum sees —
is refused naming the file and the offset; the last segment's torn tail is still dropped; a last
segment that ends with its seal (a crash before its successor was in place) is continued in a
new segment; a missing or renamed segment is refused; a journal of format 1 is refused."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from journal_testing import HEADER_BYTES, Batch, V, boundaries, live_after
from journal_testing import load as read_live

from scaler_executor.scheduler.journal import (
    JOURNAL_FORMAT,
    JournalCorrupt,
    JournalVersionMismatch,
    encode_record,
    open_journal,
    read_journal,
)

pytestmark = pytest.mark.timeout(120)

FIRST: list[Batch] = [[(b"a", b"1")], [(b"b", b"2"), (b"c", None)], [(b"c", b"3" * 50)]]
SECOND: list[Batch] = [[(b"d", b"4")], [(b"a", None)]]


def load(path: Path) -> list[tuple[bytes, bytes]]:
    """The live map read, as a list: the tests compare its order too."""
    return list(read_live(path).items())


def two_segments(j: Path, compact: bool = False) -> None:
    """FIRST in segment 1, SECOND in segment 2 (with ``compact``: FIRST in base 1 instead)."""
    writer, _ = open_journal(str(j), package_version=V, policy="os")
    for batch in FIRST:
        writer.append(batch)
    steps = writer.compaction()
    assert next(steps) == "sealed"
    if compact:
        list(steps)
    else:
        steps.close()  # abandoned after the seal: two segments, no base
    for batch in SECOND:
        writer.append(batch)
    writer.close()
    os.unlink(j / "LOCK")


def expected(batches: list[Batch]) -> list[tuple[bytes, bytes]]:
    return list(live_after(batches).items())


@pytest.mark.parametrize("compact", [False, True], ids=["sealed-segment", "base"])
def test_every_cut_of_a_sealed_file_is_refused_naming_file_and_offset(tmp_path: Path, compact: bool) -> None:
    j = tmp_path / "j"
    two_segments(j, compact)
    assert load(j) == expected(FIRST + SECOND)
    sealed = j / ("0000000000000001.base" if compact else "0000000000000001.seg")
    data = sealed.read_bytes()
    if not compact:  # the records, then the seal (36 bytes)
        assert boundaries(FIRST)[-1] == len(data) - 36
    ends = set(boundaries(FIRST)) if not compact else {HEADER_BYTES, len(data) - 36}  # (a base: one record)
    for cut in range(len(data)):
        sealed.write_bytes(data[:cut])
        with pytest.raises(JournalCorrupt) as info:
            load(j)
        assert info.value.path == str(sealed), cut
        text = str(info.value)
        assert str(sealed) in text and f"offset {info.value.offset}" in text and "move the journal directory away" in text
        if cut in ends:  # a record boundary (the last one: just the seal cut off): only the seal tells
            assert info.value.offset == cut and "without its seal record" in info.value.reason, cut
    sealed.write_bytes(data)
    assert load(j) == expected(FIRST + SECOND)


def test_the_last_segments_torn_tail_is_still_dropped_after_a_sealed_one(tmp_path: Path) -> None:
    j = tmp_path / "j"
    two_segments(j)
    last = j / "0000000000000002.seg"
    data = last.read_bytes()
    ends = boundaries(SECOND)
    assert ends[-1] == len(data)
    for cut in range(HEADER_BYTES, len(data) + 1):
        last.write_bytes(data[:cut])
        complete = sum(1 for end in ends[1:] if end <= cut)
        assert load(j) == expected(FIRST + SECOND[:complete]), cut
    # and opening repairs it and goes on
    last.write_bytes(data[:-3])
    writer, live = open_journal(str(j), package_version=V)
    writer.append([(b"e", b"5")])
    writer.close()
    assert list(live.items()) == expected(FIRST + SECOND[:1])
    assert load(j) == expected([*FIRST, *SECOND[:1], [(b"e", b"5")]])


def test_a_last_segment_ending_with_its_seal_is_continued_in_a_new_one(tmp_path: Path) -> None:
    """What a crash between the seal and the rename of the next segment leaves."""
    j = tmp_path / "j"
    two_segments(j)
    second = j / "0000000000000002.seg"
    tmp = j / "0000000000000002.seg.tmp"
    os.rename(second, tmp)  # the successor, not yet in place (its records never written)
    assert load(j) == expected(FIRST)
    loaded = read_journal(str(j), package_version=V)
    assert loaded.last_sealed and loaded.torn is None and "0000000000000002.seg.tmp" in loaded.stale
    writer, live = open_journal(str(j), package_version=V)
    assert list(live.items()) == expected(FIRST)
    writer.append([(b"e", b"5")])
    writer.close()
    assert sorted(p.name for p in j.iterdir()) == ["0000000000000001.seg", "0000000000000002.seg", "LOCK"]
    assert load(j) == expected([*FIRST, [(b"e", b"5")]])


def test_a_seal_that_cannot_be_completed_is_taken_back(tmp_path: Path) -> None:
    """The next segment's name is taken (a directory): the seal fails, is cut off again, and the
    writer goes on in the old segment; a later compaction works."""
    j = tmp_path / "j"
    writer, _ = open_journal(str(j), package_version=V, policy="turn")
    try:
        writer.append(FIRST[0])
        (j / "0000000000000002.seg").mkdir()
        with pytest.raises(OSError):
            next(writer.compaction())
        assert not list(j.glob("*.tmp"))
        writer.append(FIRST[1])
        (j / "0000000000000002.seg").rmdir()
        assert load(j) == expected(FIRST[:2])  # one segment, unsealed, nothing after a seal
        assert writer.stats()["size_on_disk"] == (j / "0000000000000001.seg").stat().st_size
        list(writer.compaction())
        writer.append(FIRST[2])
    finally:
        writer.close()
    assert load(j) == expected(FIRST)


def test_a_missing_or_swapped_segment_is_refused(tmp_path: Path) -> None:
    j = tmp_path / "j"
    writer, _ = open_journal(str(j), package_version=V, policy="os")
    for i in range(3):
        writer.append([(b"k%d" % i, b"v")])
        steps = writer.compaction()
        next(steps)
        steps.close()
    writer.close()
    segs = sorted(j.glob("*.seg"))
    assert [p.name for p in segs] == [f"{n:016d}.seg" for n in range(1, 5)]
    one, two = segs[0].read_bytes(), segs[1].read_bytes()
    segs[0].write_bytes(two)
    segs[1].write_bytes(one)
    with pytest.raises(JournalCorrupt, match="the seal is file 0000000000000002's") as info:
        load(j)
    assert info.value.path == str(segs[0])
    segs[0].write_bytes(one)
    segs[1].unlink()
    with pytest.raises(JournalCorrupt, match="the file is missing") as info:
        load(j)
    assert info.value.path == str(segs[1]) and info.value.offset == 0
    segs[0].unlink()
    segs[1].write_bytes(two)
    with pytest.raises(JournalCorrupt, match="the file is missing") as info:
        load(j)
    assert info.value.path == str(segs[0])


def test_anything_after_a_seal_is_refused(tmp_path: Path) -> None:
    j = tmp_path / "j"
    two_segments(j)
    sealed = j / "0000000000000001.seg"
    data = sealed.read_bytes()
    sealed.write_bytes(data + encode_record([(b"z", b"z")]))
    with pytest.raises(JournalCorrupt, match="after the file's seal record") as info:
        load(j)
    assert info.value.offset == len(data)


def test_a_journal_of_format_1_is_refused_with_the_version_message(tmp_path: Path) -> None:
    assert JOURNAL_FORMAT == 2
    j = tmp_path / "j"
    two_segments(j)
    for seg in j.glob("*.seg"):
        data = seg.read_bytes()
        seg.write_bytes(data[:8] + struct.pack("<I", 1) + data[12:])
    with pytest.raises(JournalVersionMismatch, match="has journal format 1, this scaler-executor 0.1.0 reads format 2"):
        open_journal(str(j), package_version=V)


def test_a_torn_seal_of_the_last_segment_is_a_torn_tail(tmp_path: Path) -> None:
    """What a crash in the middle of writing the seal leaves: dropped, and appends go on there."""
    j = tmp_path / "j"
    two_segments(j)
    (j / "0000000000000002.seg").unlink()  # (the successor was still a .tmp, removed at the next open)
    first = j / "0000000000000001.seg"
    data = first.read_bytes()
    for cut in range(len(data) - 36 + 1, len(data)):
        first.write_bytes(data[:cut])
        loaded = read_journal(str(j), package_version=V)
        assert loaded.torn == (first.name, len(data) - 36) and not loaded.last_sealed, cut
        assert list(loaded.live.items()) == expected(FIRST)
    writer, _ = open_journal(str(j), package_version=V)
    writer.append([(b"e", b"5")])
    writer.close()
    assert sorted(p.name for p in j.glob("*.seg")) == [first.name]
    assert load(j) == expected([*FIRST, [(b"e", b"5")]])
