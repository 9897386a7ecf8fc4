"""Helpers shared by the journal's tests (test_journal*.py, test_core_journal.py,
test_durable_fuzz.py and the tests that import from them), in a module with a unique name
(see tests/scaler_testing.py for why not conftest.py).

The live map is what ``read_journal`` returns: each batch applied in turn, a ``None`` value
deleting its key; a live key keeps its place, a deleted and re-set one goes to the end
(first-insertion order, as the reader builds it).
"""

from __future__ import annotations

from pathlib import Path

from scaler_executor.scheduler.journal import (
    encode_record,
    header_bytes,
    open_journal,
    read_journal,
)

#: The package version the tests write their journals with.
V = "0.1.0"
#: One append: (key, value) pairs, a None value deleting the key.
Batch = list[tuple[bytes, bytes | None]]
#: The length of a file's header (every segment and base starts with one).
HEADER_BYTES = len(header_bytes(V))


def _apply(live: dict[bytes, bytes], batch: Batch) -> None:
    for key, value in batch:
        if value is None:
            live.pop(key, None)
        else:
            live[key] = value


def live_after(batches: list[Batch]) -> dict[bytes, bytes]:
    """The live map after every batch of ``batches``."""
    live: dict[bytes, bytes] = {}
    for batch in batches:
        _apply(live, batch)
    return live


def live_maps(batches: list[Batch]) -> list[dict[bytes, bytes]]:
    """The live map after each prefix of ``batches`` (index i: after i batches)."""
    live: dict[bytes, bytes] = {}
    maps = [dict(live)]
    for batch in batches:
        _apply(live, batch)
        maps.append(dict(live))
    return maps


def boundaries(batches: list[Batch]) -> list[int]:
    """Offsets where each record of a one-segment journal of ``batches`` starts, and the file's end."""
    out = [HEADER_BYTES]
    for batch in batches:
        out.append(out[-1] + len(encode_record(batch)))
    return out


def write(path: Path, batches: list[Batch], **kw: object) -> None:
    """A journal of ``batches`` at ``path`` (``kw``: ``open_journal``'s options), closed."""
    writer, _ = open_journal(str(path), package_version=V, **kw)  # type: ignore[arg-type]
    try:
        for batch in batches:
            writer.append(batch)
    finally:
        writer.close()


def load(path: Path, version: str = V) -> dict[bytes, bytes]:
    """The live map of the journal at ``path``."""
    return read_journal(str(path), package_version=version).live
