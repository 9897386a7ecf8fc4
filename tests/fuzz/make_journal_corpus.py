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

from scaler_executor.scheduler.journal import JOURNAL_FORMAT, JournalCorrupt, JournalVersionMismatch, open_journal, read_journal

V = "0.1.0"
OUT = Path(__file__).resolve().parent / "journal_corpus"

BATCHES = [
    [(b"task-1", b"payload-1"), (b"task-2", b"payload-2"), (b"client-A", b"id")],
    [(b"task-1", b"payload-1'")],
    [(b"task-2", None), (b"task-3", b"payload-3" * 5)],
    [(b"task-2", b"payload-2'"), (b"obj-9", bytes(range(40)))],
]


def journal(path: Path, compact: bool = False) -> None:
    writer, _ = open_journal(str(path), package_version=V, policy="os")
    for i, batch in enumerate(BATCHES):
        if compact and i == 2:
            list(writer.compaction())
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

    def case(name: str, compact: bool = False) -> Path:
        path = OUT / name
        journal(path, compact)
        return path

    cases = []
    cases.append(case("valid"))
    cases.append(case("valid-base-and-segment", compact=True))
    p = case("torn-last-record")
    s = seg(p); s.write_bytes(s.read_bytes()[:-7]); cases.append(p)
    p = case("torn-header")
    s = seg(p); s.write_bytes(s.read_bytes()[:11]); cases.append(p)
    p = case("zero-tail")
    s = seg(p); s.write_bytes(s.read_bytes() + b"\0" * 300); cases.append(p)
    p = case("last-record-checksum")
    s = seg(p); b = bytearray(s.read_bytes()); b[-2] ^= 0x40; s.write_bytes(bytes(b)); cases.append(p)
    p = case("corrupt-middle-record")
    s = seg(p); b = bytearray(s.read_bytes()); b[60] ^= 0x01; s.write_bytes(bytes(b)); cases.append(p)
    p = case("corrupt-length")
    s = seg(p); b = bytearray(s.read_bytes()); b[28] ^= 0x80; s.write_bytes(bytes(b)); cases.append(p)
    p = case("garbage-after-last-record")
    s = seg(p); s.write_bytes(s.read_bytes() + b"this is not a record"); cases.append(p)
    p = case("flipped-version-length")
    s = seg(p); b = bytearray(s.read_bytes()); b[12] ^= 0x20; s.write_bytes(bytes(b)); cases.append(p)
    p = case("other-format")
    s = seg(p); b = s.read_bytes(); s.write_bytes(b[:8] + struct.pack("<I", JOURNAL_FORMAT + 1) + b[12:]); cases.append(p)
    p = case("torn-base", compact=True)
    s = next(p.glob("*.base")); s.write_bytes(s.read_bytes()[:-5]); cases.append(p)
    p = case("interrupted-compaction-tmp", compact=True)
    base = next(p.glob("*.base"))
    (p / (base.name.replace("1.base", "2.base") + ".tmp")).write_bytes(base.read_bytes()[:40])
    cases.append(p)
    for c in cases:
        record(c)
    print(f"{len(cases)} cases in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
