"""The daemon host's object store: created at start, served to peers, cleaned at stop.

The core decides *when* an object goes (``DeleteObjects``) and who gets which bytes
(``SendObjects``); this module does the store calls for the loop, so the core stays pure.

Region names are ``scaler-<daemon pid>-<random>``: a region whose daemon is gone (killed
before it could remove it) is found by that pid and removed at the next start.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from scaler_executor.config import ClusterConfig
from scaler_executor.sizes import parse_size, total_memory

log = logging.getLogger("scaler_executor.daemon")

SHM_DIR = "/dev/shm"
DEFAULT_SHARE = 0.25  # of RAM, for object_store_size = auto


def store_size(config: ClusterConfig) -> int | None:
    setting = config.object_store_size.strip().lower()
    if setting == "none":
        return None
    if setting == "auto":
        return int(total_memory() * DEFAULT_SHARE)
    return parse_size(setting)


def remove_stale_regions(keep: str = "") -> int:
    """Remove object-store regions left by daemons that died without cleaning up (but ``keep``)."""
    from scaler_executor.objstore import ObjectStore

    removed = 0
    for directory in (SHM_DIR, tempfile.gettempdir()):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            parts = name.split("-")
            if len(parts) != 3 or parts[0] != "scaler" or not parts[1].isdigit() or len(parts[2]) != 16:
                continue
            if name == keep:
                continue
            try:
                os.kill(int(parts[1]), 0)
                continue  # its daemon still runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            try:
                if ObjectStore.unlink_name(name, tempfile.gettempdir()):
                    removed += 1
                    log.info("removed the object store %s of a daemon that is gone", name)
            except Exception as exc:  # noqa: BLE001 - best effort: another user's region, a race with its owner...
                log.debug("could not remove stale region %s: %s", name, exc)
    return removed


MIN_OBJECT_BYTES = 8192  # the index's floor: one entry per 8 KiB (the store's own default)


def index_size(size: int, config: ClusterConfig) -> int:
    """Entries of the store's object index: one per ``object_store_threshold`` bytes.

    Only buffers of at least the threshold become objects, so no more fit at once. The
    index (about 150 bytes per entry with its references) is committed when the store is
    made, and was written in full then: sized for 8 KiB objects, a 6 GiB store spent
    ~110 MiB and ~150 ms of a cold start on it; sized for the 64 KiB default, 14 MiB and
    ~15 ms. Since its records start fresh (native/, format 3), only its hash buckets are
    written (~2.5 MiB for the default). A client with a
    lower threshold than its daemon may fill the index first: its large values then
    travel inline (``ObjectTableFull`` is an ``ObjectStoreFull``).
    """
    return max(256, size // max(config.object_store_threshold, MIN_OBJECT_BYTES))


class HostStore:
    """The daemon's handle on its host's store."""

    def __init__(self, config: ClusterConfig, adopt: str = "", journaled: bool = False) -> None:
        """``adopt``: the region of this daemon's previous run, named by its journal: kept
        (with the objects in it) if it is still there, and removed by this daemon in turn.

        ``journaled``: the region outlives this daemon when it dies, for its restart, so it
        is named ``scalerj-<pid>-<random>``, which no other daemon's sweep of dead daemons'
        regions (``scaler-<pid>-...``) touches; its own daemon removes it when it stops with
        nothing left to resume (``close``)."""
        from scaler_executor.objstore import ObjectStore

        self.store: Any = None
        self.name = ""
        self.partial: dict[bytes, list[Any]] = {}  # puts being streamed: [peer, view, bytes so far]
        self.adopted: list[bytes] = []  # the objects an adopted region held when it was taken
        size = store_size(config)
        if size is None:
            return
        if adopt:
            try:
                self.store = ObjectStore.attach(adopt, fallback_dir=tempfile.gettempdir())
                self.name = adopt
                self.adopted = self.store.list_ids()
                log.info("kept the object store %s of this daemon's previous run (%d objects)", adopt, len(self.adopted))
            except Exception as exc:  # noqa: BLE001 - gone or unusable: a new region, objects in the old one are lost
                log.warning("cannot keep the object store %s of the previous run (%s); making a new one", adopt, exc)
        remove_stale_regions(keep=self.name)
        if self.store is not None:
            return
        name = f"{'scalerj' if journaled else 'scaler'}-{os.getpid()}-{os.urandom(8).hex()}"
        try:
            self.store = ObjectStore.create(
                name, size, max_objects=index_size(size, config), fallback_dir=tempfile.gettempdir()
            )
        except Exception as exc:  # noqa: BLE001 - without a store the daemon runs, values go inline
            log.warning(
                "no object store (%s): large arguments and results will travel inline; set "
                "object_store_size smaller, or give the machine more /dev/shm",
                exc,
            )
            return
        self.name = name
        if journaled:  # it outlives a killed daemon: name it where an operator will look
            log.info("object store %s (kept for a restart on the journal while tasks remain)", name)

    def figures(self) -> dict[str, int]:
        """The store's figures for a statistics snapshot (ObjectStoreStats), {} without a store."""
        if self.store is None:
            return {}
        from dataclasses import asdict

        return {k: int(v) for k, v in asdict(self.store.stats()).items()}

    def sweep(self, held: dict[bytes, int]) -> int:
        """Delete the objects an adopted region held when this daemon took it that nobody
        holds now (every peer the journal knew has reported, or is gone); returns how many.
        Objects made since are not touched: their holds may still be on their way."""
        orphans = tuple(object_id for object_id in self.adopted if object_id not in held)
        self.adopted = []
        self.delete(orphans)
        return len(orphans)

    def delete(self, object_ids: tuple[bytes, ...]) -> None:
        if self.store is None:
            return
        for object_id in object_ids:
            try:
                self.store.delete(object_id)  # deferred by the store while readers hold views
            except Exception as exc:  # noqa: BLE001 - already gone (a reader's crash reaped it)...: log, carry on
                log.debug("delete of object %s: %s", object_id.hex(), exc)

    def read(self, object_ids: tuple[bytes, ...]) -> tuple[list[bool], list[Any]]:
        """Views of the objects (for sending); missing ones are reported, not raised."""
        found: list[bool] = []
        buffers: list[Any] = []
        for object_id in object_ids:
            try:
                view = self.store.get(object_id) if self.store is not None else None
            except Exception:  # noqa: BLE001 - the asker hears "missing"; the daemon carries on
                view = None
            found.append(view is not None)
            if view is not None:
                buffers.append(view)
        return found, buffers

    def write_chunk(self, peer: bytes, object_id: bytes, offset: int, total: int, data: Any) -> str | None:
        """Write one chunk of a put streamed by a peer that cannot map the store.

        Chunks of one object come in order on one connection (ZeroMQ keeps a peer's order):
        the one at offset 0 creates the object, the one that reaches ``total`` seals it.
        Returns None while the object is incomplete, "" once it is sealed, or why it failed
        (the partial object is aborted and the peer told; later chunks of it are refused).
        """
        if self.store is None:
            return "the daemon has no object store (object_store_size = none)"
        size = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        partial = self.partial.get(object_id)
        if offset == 0 and partial is None:
            if total < 0 or size > total:
                return f"chunk of {size} bytes larger than its object's {total}"
            try:
                view = self.store.create_buffer(object_id, total)
            except Exception as exc:  # noqa: BLE001 - full, exists...: the putter hears why
                return f"cannot create the object in the daemon's store: {exc}"
            partial = self.partial[object_id] = [peer, view, 0]
        if partial is None or partial[0] != peer or partial[2] != offset or offset + size > total:
            self._abort(object_id)
            return f"chunk at offset {offset} out of order or beyond {total} bytes"
        view = partial[1]
        view[offset : offset + size] = data
        partial[2] = offset + size
        if partial[2] < total:
            return None
        del self.partial[object_id]
        self.store.seal(object_id)  # releases the view
        return ""

    def read_range(self, object_id: bytes, offset: int, length: int) -> Any:
        """Bytes [offset, offset + length) of an object, or None if it does not have them: a
        copy from one still being written (its writable view goes when it is sealed), a
        zero-copy view of a sealed one (holding a reader reference while it is used)."""
        if self.store is None or offset < 0 or length < 1:
            return None
        partial = self.partial.get(object_id)
        if partial is not None:
            return bytes(partial[1][offset : offset + length]) if offset + length <= partial[2] else None
        try:
            view = self.store.get(object_id)
        except Exception:  # noqa: BLE001 - gone (its readers let it go): the client hears of it
            return None
        if view is None or offset + length > view.nbytes:
            return None
        return view[offset : offset + length]

    def abort_partial(self, peer: bytes, object_id: bytes) -> bool:
        """``peer`` is gone: abort ``object_id`` if it is an object ``peer`` was still
        streaming (a put or result cut short); True if one was aborted."""
        partial = self.partial.get(object_id)
        if partial is None or partial[0] != peer:
            return False
        self._abort(object_id)
        return True

    def abort_peer(self, peer: bytes) -> int:
        """``peer`` is gone: abort every object it was still streaming; how many."""
        mine = [object_id for object_id, partial in self.partial.items() if partial[0] == peer]
        for object_id in mine:
            self._abort(object_id)
        return len(mine)

    def _abort(self, object_id: bytes) -> None:
        partial = self.partial.pop(object_id, None)
        if partial is not None:
            try:
                self.store.abort(object_id)
            except Exception as exc:  # noqa: BLE001 - already gone: nothing to free
                log.debug("abort of partial object %s: %s", object_id.hex(), exc)

    def close(self, keep: bool = False) -> None:
        """Close the region; ``keep``: leave it (and its objects) for a restart on the journal."""
        for object_id in list(self.partial):
            self._abort(object_id)
        if self.store is not None:
            try:
                if not keep:
                    self.store.unlink()
                self.store.close()
            except Exception as exc:  # noqa: BLE001 - shutdown goes on; the log names the region
                log.warning("closing the object store %s: %s", self.name, exc)
            self.store = None
