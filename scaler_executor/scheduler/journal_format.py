"""The journal's on-disk format and its reader (the writer is in :mod:`.journal`).

A journal is a directory::

    LOCK                      the flock'ed lock file; holds the pid of the daemon that holds it
    0000000000000007.base     a compacted base: every key live when segments <= 7 were sealed
    0000000000000008.seg      segments after the base, in order; the last one is appended to
    0000000000000009.seg
    0000000000000012.base.tmp a compaction a crash interrupted: ignored, removed at the next open

Every file starts with a header, then records::

    header: magic (8) | JOURNAL_FORMAT u32 | version length u16 | package version (utf-8) | crc32 u32
    record: payload length u32 | crc32 of the length u32 | crc32 of the payload u32 | payload
    seal:   a record whose payload is SEAL_MAGIC (8) | the file's number u64 | the seal's offset u64

(all little-endian).  The payload is one ``append()`` call's entries, msgpack'd as a list of
``[key, value]`` (``value`` nil for a delete); a seal's payload starts with ``SXSEAL``, which no
msgpack list does.  Every file but the last segment ends with its seal: a segment is sealed
(the seal written and fsynced) before its successor appears under its ``.seg`` name, and a base
is sealed before it is fsynced and renamed into place.  Without it, a sealed segment cut at a
record boundary (a lost write, a copy cut short) could not be told from a complete one, and the
segments after it would load onto a state that never existed.  The seal names its file's number
and its own offset (the length of the records before it), so a file renamed, or one whose
records were spliced, does not pass either.  The length has its own checksum so that a bit
flipped in a length in the middle of a file is reported as corruption instead of looking like a
record that runs past the end of the file (which would be read as a torn tail and silently drop
everything after it).

Reading (:func:`read_journal`): the newest base, then the segments numbered above it, in order.
Only the **last segment** may end in a torn record — the process was killed (or the machine
lost power) during a ``write()``: fewer than a record header's bytes, a length that runs past
the end of the file, a payload checksum that fails on the record that reaches the end of the
file, or a tail of zero bytes (what a file system may leave after a power loss).  That tail is
dropped (one log line naming the file and the offset).  Anything else that does not check out
is :class:`JournalCorrupt` — the journal is refused, never half loaded.  Sealed segments were
fsynced before the next one was created and bases are renamed into place only after an fsync,
so a torn tail in them is corruption, not a crash; so is a file before the last segment that
does not end with its seal, anything after a seal (in any file), and a segment number missing
between the base and the last segment.  The last segment may itself end with its seal (the
process died after sealing it, before its successor was renamed into place): the writer then
starts the next segment.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import zlib
from dataclasses import dataclass, field

import msgpack

__all__ = [
    "JOURNAL_FORMAT",
    "MAGIC",
    "POLICIES",
    "RECORD_HEADER",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalLocked",
    "JournalRecordInvalid",
    "JournalVersionMismatch",
    "Loaded",
    "encode_record",
    "encode_seal",
    "header_bytes",
    "read_journal",
]

JOURNAL_FORMAT = 2  # bumped on any on-disk change (2: the seal record at the end of every sealed file)
POLICIES = ("turn", "interval", "os")
MAGIC = b"SXJOURN\n"
RECORD_HEADER = 12  # length, crc32(length), crc32(payload)
MAX_RECORD = 1 << 31  # a length above this is corruption (a turn's batch is far smaller)

SEAL_MAGIC = b"SXSEAL\x00\x00"
_SEAL = struct.Struct("<8sQQ")  # SEAL_MAGIC, the file's number, the seal's offset
_FIXED = struct.Struct("<8sIH")  # magic, format, version length
_U32 = struct.Struct("<I")
_REC = struct.Struct("<III")
_SEG = re.compile(r"^(\d{16})\.seg$")
_BASE = re.compile(r"^(\d{16})\.base$")
_NUMBERED = re.compile(r"^(\d{16})\.(?:seg|base)$")
LOCK_NAME = "LOCK"

_MOVE_AWAY = "move the journal directory away (or delete it) to start the daemon with an empty journal"

Entries = list[tuple[bytes, bytes | None]]


class JournalError(Exception):
    """Base of the journal's errors; every message names the path and the fix."""


class JournalCorrupt(JournalError):
    """A journal file does not check out beyond a torn last record: refused, never half loaded."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"journal file {path} is corrupt at offset {offset}: {reason}. The journal was not "
            f"loaded (nothing of it is used); {_MOVE_AWAY}, or restore it from a copy"
        )


class JournalVersionMismatch(JournalError):
    """A journal file written by another JOURNAL_FORMAT or package version."""


class JournalFull(JournalError):
    """An append failed with ENOSPC/EDQUOT: nothing of that batch counts; the writer stays usable."""


class JournalLocked(JournalError):
    """Another live process holds the journal's lock."""


class JournalRecordInvalid(JournalError):
    """A record the files hold intact (checksums right) whose value does not make sense for
    its key (scheduler/durable.py's restore): refused, never half loaded.  ``path`` is the
    journal's directory once the daemon knows it."""

    def __init__(self, key: bytes, reason: str, path: str = "") -> None:
        self.key = key
        self.reason = reason
        self.path = path
        where = f"journal {path}" if path else "the journal"
        super().__init__(
            f"{where} holds a record that does not make sense: key {key[:64]!r}: {reason}. The journal was "
            f"not loaded (nothing of it is used); {_MOVE_AWAY}, or restore it from a copy"
        )


def header_bytes(package_version: str) -> bytes:
    """The header every journal file starts with."""
    version = package_version.encode()
    head = _FIXED.pack(MAGIC, JOURNAL_FORMAT, len(version)) + version
    return head + _U32.pack(zlib.crc32(head))


def encode_record(entries: Entries) -> bytes:
    """One record holding ``entries`` (length, checksums and payload), as ``append()`` writes it."""
    for entry in entries:
        # ``type() is`` first: the daemon's entries are exact tuples of bytes (a turn's 100
        # entries check in ~2 µs instead of ~5 µs with isinstance alone); subclasses still pass.
        if (type(entry) is tuple or isinstance(entry, tuple)) and len(entry) == 2:
            key, value = entry
            if (type(key) is bytes or isinstance(key, bytes)) and (
                value is None or type(value) is bytes or isinstance(value, bytes)
            ):
                continue
        raise TypeError(f"a journal entry is a (key: bytes, value: bytes | None) tuple, not {entry!r:.100}")
    payload = msgpack.packb(entries, use_bin_type=True)
    length = len(payload)
    return _REC.pack(length, zlib.crc32(_U32.pack(length)), zlib.crc32(payload)) + payload


def encode_seal(number: int, offset: int) -> bytes:
    """The seal record that ends file ``number`` (a segment's or a base's), written at ``offset``
    (the length of the file before it)."""
    payload = _SEAL.pack(SEAL_MAGIC, number, offset)
    return _REC.pack(len(payload), zlib.crc32(_U32.pack(len(payload))), zlib.crc32(payload)) + payload


@dataclass
class Loaded:
    """What reading a journal found (the writer continues from it)."""

    live: dict[bytes, bytes] = field(default_factory=dict)
    base: int = 0  # the base's number (0: none)
    segments: list[int] = field(default_factory=list)  # numbered above the base, in order
    sizes: dict[str, int] = field(default_factory=dict)  # file name -> valid length (after a torn tail)
    torn: tuple[str, int] | None = None  # (file name, offset) of a torn tail of the last segment
    torn_header: bool = False  # the last segment's header itself is torn (crash while creating it)
    last_sealed: bool = False  # the last segment ends with its seal: the writer starts the next one
    stale: list[str] = field(default_factory=list)  # leftovers of an interrupted compaction
    records: int = 0


def seg_name(number: int) -> str:
    return f"{number:016d}.seg"


def base_name(number: int) -> str:
    return f"{number:016d}.base"


def _apply(live: dict[bytes, bytes], payload: bytes, path: str, offset: int) -> None:
    try:
        entries = msgpack.unpackb(payload, use_list=True, raw=False)
    except Exception as exc:  # noqa: BLE001  (msgpack raises several types for bad input)
        raise JournalCorrupt(path, offset, f"record payload does not decode ({exc})") from None
    if not isinstance(entries, list):
        raise JournalCorrupt(path, offset, "record payload is not a list of entries")
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], bytes)):
            raise JournalCorrupt(path, offset, "record holds an entry that is not [key, value]")
        key, value = entry
        if value is None:
            live.pop(key, None)
        elif isinstance(value, bytes):
            live[key] = value
        else:
            raise JournalCorrupt(path, offset, "record holds a value that is neither bytes nor nil")


def _check_header(path: str, data: bytes, package_version: str, last: bool) -> int | None:
    """The header's length, or None for a torn header (only allowed in the last segment)."""
    ours = header_bytes(package_version)
    if last and len(data) < len(ours) and ours.startswith(data):
        # Torn while the segment was being created: a prefix of the very header we write (a
        # damaged header whose version length runs past the file's end is corruption, not this).
        return None
    if len(data) < _FIXED.size:
        raise JournalCorrupt(path, 0, f"file too short for a journal header ({len(data)} bytes)")
    magic, fmt, vlen = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise JournalCorrupt(path, 0, "not a scaler-executor journal file (bad magic)")
    if fmt != JOURNAL_FORMAT:
        raise JournalVersionMismatch(
            f"journal file {path} has journal format {fmt}, this scaler-executor {package_version} "
            f"reads format {JOURNAL_FORMAT}: start the daemon without this journal ({_MOVE_AWAY}), "
            "or use the version that wrote it to finish its work"
        )
    end: int = _FIXED.size + vlen + 4
    if len(data) < end:
        raise JournalCorrupt(path, 0, "file too short for its journal header")
    crc: int = _U32.unpack_from(data, end - 4)[0]
    if crc != zlib.crc32(data[: end - 4]):
        raise JournalCorrupt(path, 0, "journal header checksum mismatch")
    version = data[_FIXED.size : end - 4].decode("utf-8", "replace")
    if version != package_version:
        raise JournalVersionMismatch(
            f"journal file {path} was written by scaler-executor {version}, this is {package_version}: "
            f"the journal's format is not kept across versions; start the daemon without it ({_MOVE_AWAY}), "
            "or finish its work with the version that wrote it"
        )
    return end


def read_file(
    path: str, live: dict[bytes, bytes], package_version: str, last: bool
) -> tuple[int, int | None, int, bool]:
    """Apply one journal file's records to ``live``; ``path`` ends in a ``NNNN.seg`` or
    ``NNNN.base`` name (its number is checked against its seal's).

    Returns (valid length, offset of a torn tail or None, records, sealed).  A torn header
    gives (0, 0, 0, False).  A file that is not ``last`` must end with its seal.  Raises
    JournalCorrupt / JournalVersionMismatch.
    """
    named = _NUMBERED.match(os.path.basename(path))
    if named is None:
        raise JournalError(f"{path} is not a journal segment or base (NNNNNNNNNNNNNNNN.seg or .base)")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        # Mapped, not read: a large base is not held twice (its bytes and the map built from them).
        data: bytes | mmap.mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    try:
        start = _check_header(path, data[: _FIXED.size + 0xFFFF + 4], package_version, last)
        if start is None:
            return 0, 0, 0, False
        offset, records = start, 0
        while offset < size:
            end = _record_end(path, data, offset, last)
            if end is None:
                return offset, offset, records, False
            payload = data[offset + RECORD_HEADER : end]
            if payload.startswith(SEAL_MAGIC):
                _check_seal(path, payload, int(named.group(1)), offset, end, size)
                return end, None, records, True
            _apply(live, payload, path, offset)
            offset = end
            records += 1
        if not last:
            raise JournalCorrupt(
                path, offset, "the file ends without its seal record: a file before the last segment was cut "
                "short (what followed it, if anything, is lost)",
            )
        return offset, None, records, False
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _check_seal(path: str, payload: bytes, number: int, offset: int, end: int, size: int) -> None:
    if len(payload) != _SEAL.size:
        raise JournalCorrupt(path, offset, f"seal record of {len(payload)} bytes (a seal has {_SEAL.size})")
    _, sealed_number, sealed_offset = _SEAL.unpack(payload)
    if sealed_number != number:
        raise JournalCorrupt(path, offset, f"the seal is file {sealed_number:016d}'s, not this file's ({number:016d})")
    if sealed_offset != offset:
        raise JournalCorrupt(
            path, offset, f"the seal was written at offset {sealed_offset}, it is found at {offset} "
            "(records before it were lost or added)",
        )
    if end != size:
        raise JournalCorrupt(path, end, f"{size - end} bytes after the file's seal record (nothing follows a seal)")


def _record_end(path: str, data: bytes | mmap.mmap, offset: int, last: bool) -> int | None:
    """The end of the record at ``offset``, or None when it is a torn tail (last segment only)."""
    size = len(data)

    def torn(reason: str) -> int | None:
        if not last:
            raise JournalCorrupt(path, offset, reason + " (in a sealed file: only the last segment may be torn)")
        return None

    if size - offset < RECORD_HEADER:
        return torn("truncated record header")
    length: int
    length_crc: int
    payload_crc: int
    length, length_crc, payload_crc = _REC.unpack_from(data, offset)
    end = offset + RECORD_HEADER + length
    bad = length_crc != zlib.crc32(data[offset : offset + 4]) or length > MAX_RECORD or end > size
    # Counted only for a bad header (for every record it would be quadratic): a power loss may
    # leave the file extended by zero bytes after its last complete record.
    if bad and data[offset:].count(0) == size - offset:
        return torn("a tail of zero bytes")
    if length_crc != zlib.crc32(data[offset : offset + 4]):
        raise JournalCorrupt(path, offset, "record length checksum mismatch")
    if length > MAX_RECORD:
        raise JournalCorrupt(path, offset, f"record length {length} is impossible")
    if end > size:
        return torn(f"record of {length} bytes runs past the end of the file")
    if payload_crc != zlib.crc32(data[offset + RECORD_HEADER : end]):
        if end == size:
            return torn("checksum mismatch in the last record")
        raise JournalCorrupt(path, offset, "record checksum mismatch (not the last record)")
    return end


def list_files(path: str) -> tuple[list[int], list[int], list[str]]:
    """(base numbers, segment numbers, tmp names) in the journal directory, sorted."""
    bases, segs, tmps = [], [], []
    for name in os.listdir(path):
        if m := _SEG.match(name):
            segs.append(int(m.group(1)))
        elif m := _BASE.match(name):
            bases.append(int(m.group(1)))
        elif name.endswith(".tmp"):
            tmps.append(name)
    return sorted(bases), sorted(segs), sorted(tmps)


def read_journal(path: str, *, package_version: str, log: logging.Logger | None = None) -> Loaded:
    """Read the journal directory at ``path`` without changing it (no lock, no truncation).

    Returns what it found, the live map in ``.live`` (first-insertion order).  A torn tail of the
    last segment is reported in ``.torn`` and logged once.  Raises JournalCorrupt,
    JournalVersionMismatch, or JournalError for a path that is not a journal directory.
    """
    if not os.path.isdir(path):
        raise JournalError(f"journal path {path} is not a directory: give a directory (it is created if missing)")
    bases, segs, tmps = list_files(path)
    out = Loaded()
    out.base = bases[-1] if bases else 0
    out.stale = [base_name(b) for b in bases[:-1]] + [seg_name(s) for s in segs if s <= out.base] + tmps
    out.segments = [s for s in segs if s > out.base]
    expected = out.base + 1
    for number in out.segments:
        if number != expected:
            raise JournalCorrupt(
                os.path.join(path, seg_name(expected)), 0,
                f"the file is missing: the journal's segments after {base_name(out.base) if out.base else 'its start'} "
                f"must be numbered on from {out.base + 1}, and {seg_name(number)} follows",
            )
        expected += 1
    files = ([base_name(out.base)] if bases else []) + [seg_name(s) for s in out.segments]
    for i, name in enumerate(files):
        last = i == len(files) - 1 and name.endswith(".seg")
        full = os.path.join(path, name)
        valid, torn, records, sealed = read_file(full, out.live, package_version, last)
        out.sizes[name] = valid
        out.records += records
        out.last_sealed = last and sealed
        if torn is not None:
            out.torn = (name, torn)
            out.torn_header = valid == 0
            (log or logging.getLogger(__name__)).warning(
                "journal: dropped a torn %s in %s at offset %d (%d bytes: the process writing it "
                "died mid-write; the file is truncated there when the journal is opened)",
                "header" if valid == 0 else "last record", full, torn, os.path.getsize(full) - torn,
            )
    return out
