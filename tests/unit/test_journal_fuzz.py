"""The journal's reader under hypothesis: arbitrary truncations, bit flips and garbage in valid
journals (one segment, or a base and segments).  Whatever the damage, reading either refuses the
journal (JournalCorrupt / JournalVersionMismatch) or returns the live map of a prefix of the
batches written, in the right order — never a wrong map, never another exception.  Pure
truncations of the last segment give exactly the prefix of the records that are complete.

``SCALER_JOURNAL_FUZZ_EXAMPLES=5000`` makes a longer pass.  Also replays the committed corpus (tests/fuzz/journal_corpus/, made by
tests/fuzz/make_journal_corpus.py): each case's expected outcome is in its expect.json.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_testing import HEADER_BYTES, Batch, V, boundaries, live_maps

from scaler_executor.scheduler.journal import (
    JournalCorrupt,
    JournalVersionMismatch,
    open_journal,
    read_journal,
)

pytestmark = pytest.mark.timeout(300)

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "journal_corpus"

keys = st.sampled_from([b"a", b"b", b"c", b"d", b"key-e", b""])
values = st.one_of(st.none(), st.binary(max_size=40))
batches_st = st.lists(st.lists(st.tuples(keys, values), max_size=5), min_size=1, max_size=8)
# SCALER_JOURNAL_FUZZ_EXAMPLES raises the examples per test for a longer fuzz pass (300: ~10 s each).
FUZZ = settings(max_examples=int(os.environ.get("SCALER_JOURNAL_FUZZ_EXAMPLES", "300")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def prefixes(batches: list[Batch]) -> list[list[tuple[bytes, bytes]]]:
    """The live map after each prefix, as lists: the tests compare its order too."""
    return [list(live.items()) for live in live_maps(batches)]


def build(path: Path, batches: list[Batch], compact_after: int | None = None) -> None:
    """A journal of ``batches``; with ``compact_after``, a compaction (a base) after that many,
    and a second seal later so that there are sealed segments too."""
    writer, _ = open_journal(str(path), package_version=V, policy="os")
    try:
        for i, batch in enumerate(batches):
            if compact_after is not None and i == compact_after:
                list(writer.compaction())
            if compact_after is not None and i == compact_after + 1:
                steps = writer.compaction()
                next(steps)  # sealed only: the base stays, two segments follow it
                steps.close()
            writer.append(batch)
    finally:
        writer.close()
    os.unlink(path / "LOCK")


def outcome(path: Path) -> list[tuple[bytes, bytes]] | None:
    """The map read, or None when the journal is refused."""
    try:
        return list(read_journal(str(path), package_version=V).live.items())
    except (JournalCorrupt, JournalVersionMismatch):
        return None


def files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir())


@FUZZ
@given(batches=batches_st, compact=st.one_of(st.none(), st.integers(0, 7)), data=st.data())
def test_damage_gives_a_prefix_or_a_refusal(batches: list[Batch], compact: int | None, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        j = Path(tmp) / "j"
        build(j, batches, compact if compact is not None and compact < len(batches) else None)
        target = data.draw(st.sampled_from(files(j)))
        raw = bytearray(target.read_bytes())
        kind = data.draw(st.sampled_from(["flip", "truncate", "garbage", "flips+truncate"]))
        if kind in ("flip", "flips+truncate") and raw:
            for _ in range(data.draw(st.integers(1, 4))):
                raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        if kind in ("truncate", "flips+truncate"):
            del raw[data.draw(st.integers(0, len(raw))):]
        if kind == "garbage":
            at = data.draw(st.integers(0, len(raw)))
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=64))
        target.write_bytes(bytes(raw))
        allowed = prefixes(batches)
        got = outcome(j)
        assert got is None or got in allowed
        if got is not None:
            # opening repairs a torn tail only: the same map, and appends go on
            writer, live = open_journal(str(j), package_version=V)
            writer.append([(b"new", b"1")])
            writer.close()
            assert list(live.items()) == got
            assert outcome(j) == [*got, (b"new", b"1")]


def test_found_by_the_fuzz_a_sealed_segment_cut_at_a_record_boundary_is_refused(tmp_path: Path) -> None:
    """test_damage_gives_a_prefix_or_a_refusal's example (st.data() takes no @example): batches
    [[], [a], [b]], a compaction after the first, and the sealed segment holding [a] cut to its
    header.  Journal format 1 loaded {b} without a (a state that never existed); now the seal
    that segment lacks refuses it."""
    j = tmp_path / "j"
    build(j, [[], [(b"a", b"")], [(b"b", b"")]], compact_after=1)
    sealed = j / "0000000000000002.seg"
    assert sorted(p.name for p in files(j)) == ["0000000000000001.base", sealed.name, "0000000000000003.seg"]
    assert outcome(j) == [(b"a", b""), (b"b", b"")]
    sealed.write_bytes(sealed.read_bytes()[: HEADER_BYTES])
    with pytest.raises(JournalCorrupt, match="ends without its seal record") as info:
        read_journal(str(j), package_version=V)
    assert (info.value.path, info.value.offset) == (str(sealed), 23)  # the header's length, where the seal was due
    assert outcome(j) is None


@FUZZ
@given(batches=batches_st, data=st.data())
def test_truncation_of_the_last_segment_is_an_exact_prefix(batches: list[Batch], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        j = Path(tmp) / "j"
        build(j, batches)
        (seg,) = [p for p in files(j) if p.suffix == ".seg"]
        raw = seg.read_bytes()
        cut = data.draw(st.integers(0, len(raw)))
        seg.write_bytes(raw[:cut])
        ends = boundaries(batches)
        complete = sum(1 for end in ends[1:] if end <= cut)
        assert outcome(j) == prefixes(batches)[complete]


def corpus_cases() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.is_dir())


def test_corpus_is_small_and_present() -> None:
    cases = corpus_cases()
    assert len(cases) >= 8
    assert sum(f.stat().st_size for c in cases for f in c.iterdir()) < 64 * 1024


@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: p.name)
def test_corpus_replay(case: Path, tmp_path: Path) -> None:
    expect = json.loads((case / "expect.json").read_text())
    j = tmp_path / "j"
    shutil.copytree(case, j, ignore=shutil.ignore_patterns("expect.json"))
    if "error" in expect:
        error = {"JournalCorrupt": JournalCorrupt, "JournalVersionMismatch": JournalVersionMismatch}[expect["error"]]
        with pytest.raises(error) as info:
            read_journal(str(j), package_version=expect["version"])
        if "offset" in expect:
            assert isinstance(info.value, JournalCorrupt)
            assert (info.value.offset, os.path.basename(info.value.path)) == (expect["offset"], expect["file"])
        return
    wanted = [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in expect["live"]]
    loaded = read_journal(str(j), package_version=expect["version"])
    assert list(loaded.live.items()) == wanted
    assert (list(loaded.torn) if loaded.torn else None) == expect.get("torn")
    writer, live = open_journal(str(j), package_version=expect["version"])
    writer.close()
    assert list(live.items()) == wanted
    assert read_journal(str(j), package_version=expect["version"]).torn is None  # the open repaired it
