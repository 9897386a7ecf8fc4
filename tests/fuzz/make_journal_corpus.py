"""Make the journal reader's corpus (tests/fuzz/journal_corpus/), replayed by
tests/unit/test_journal_fuzz.py::test_corpus_replay.

Each case is a journal directory (without its LOCK) and an ``expect.json``: the live map
(hex pairs, in order) and the torn tail reported, or the error and where.  Run it again
after a change of the on-disk format (JOURNAL_FORMAT) and commit the result:

    python tests/fuzz/make_journal_corpus.py
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path

from scaler_executor.scheduler.journal import (
    JOURNAL_FORMAT,
    JournalCorrupt,
    JournalVersionMismatch,
    open_journal,
    read_journal,
)

V = "0.1.0"
OUT = Path(__file__).resolve().parent / "journal_corpus"

BATCHES = [
    [(b"task-1", b"payload-1"), (b"task-2", b"payload-2"), (b"client-A", b"id")],
    [(b"task-1", b"payload-1'")],
    [(b"task-2", None), (b"task-3", b"payload-3" * 5)],
    [(b"task-2", b"payload-2'"), (b"obj-9", bytes(range(40)))],
]


def journal(path: Path, compact: bool = False, sealed: bool = False) -> None:
    """BATCHES in one segment; ``compact``: a base after the second; ``sealed``: the first two
    in segment 1 (sealed), the rest in segment 2."""
    writer, _ = open_journal(str(path), package_version=V, policy="os")
    for i, batch in enumerate(BATCHES):
        if compact and i == 2:
            list(writer.compaction())
        if sealed and i == 2:
            steps = writer.compaction()
            next(steps)
            steps.close()
        writer.append(batch)
    writer.close()
    os.unlink(path / "LOCK")


def seg(path: Path, index: int = -1) -> Path:
    return sorted(path.glob("*.seg"))[index]


def record(case: Path) -> None:
    try:
        loaded = read_journal(str(case), package_version=V)
        expect: dict[str, object] = {
            "version": V,
            "live": [[k.hex(), v.hex()] for k, v in loaded.live.items()],
            "torn": list(loaded.torn) if loaded.torn else None,
        }
    except JournalCorrupt as exc:
        expect = {"version": V, "error": "JournalCorrupt", "offset": exc.offset, "file": os.path.basename(exc.path)}
    except JournalVersionMismatch:
        expect = {"version": V, "error": "JournalVersionMismatch"}
    (case / "expect.json").write_text(json.dumps(expect, indent=1) + "\n")


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()

    def case(name: str, compact: bool = False, sealed: bool = False) -> Path:
        path = OUT / name
        journal(path, compact, sealed)
        return path

    def damaged(name: str, change, compact: bool = False, file: str = "*.seg") -> Path:  # type: ignore[no-untyped-def]
        path = case(name, compact)
        target = sorted(path.glob(file))[-1]
        target.write_bytes(bytes(change(bytearray(target.read_bytes()))))
        return path

    def flip(at: int, bit: int):  # type: ignore[no-untyped-def]
        def change(b: bytearray) -> bytearray:
            b[at] ^= bit
            return b
        return change

    cases = [
        case("valid"),
        case("valid-base-and-segment", compact=True),
        damaged("torn-last-record", lambda b: b[:-7]),
        damaged("torn-header", lambda b: b[:11]),
        damaged("zero-tail", lambda b: b + b"\0" * 300),
        damaged("last-record-checksum", flip(-2, 0x40)),
        damaged("corrupt-middle-record", flip(60, 0x01)),
        damaged("corrupt-length", flip(28, 0x80)),
        damaged("garbage-after-last-record", lambda b: b + b"this is not a record"),
        damaged("flipped-version-length", flip(12, 0x20)),
        damaged("other-format", lambda b: b[:8] + struct.pack("<I", JOURNAL_FORMAT + 1) + b[12:]),
        damaged("torn-base", lambda b: b[:-5], compact=True, file="*.base"),
    ]
    # Journal format 2: every file before the last segment ends with its seal record.
    cases.append(damaged("format-1", lambda b: b[:8] + struct.pack("<I", 1) + b[12:]))
    cases.append(damaged("base-cut-at-its-seal", lambda b: b[:-36], compact=True, file="*.base"))
    p = case("sealed-segment-cut-at-a-record-boundary", sealed=True)
    first = seg(p, 0)
    first.write_bytes(first.read_bytes()[:-36])  # just the seal cut off: the records before it check out
    cases.append(p)
    p = case("last-segment-sealed", sealed=True)  # a crash before its successor was renamed into place
    last = seg(p)
    last.rename(last.with_name(last.name + ".tmp"))
    cases.append(p)
    p = case("missing-segment", sealed=True)
    seg(p, 0).unlink()
    cases.append(p)
    p = case("interrupted-compaction-tmp", compact=True)
    base = next(p.glob("*.base"))
    (p / (base.name.replace("1.base", "2.base") + ".tmp")).write_bytes(base.read_bytes()[:40])
    cases.append(p)
    for c in cases:
        record(c)
    print(f"{len(cases)} cases in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
