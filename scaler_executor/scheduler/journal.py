"""The daemon's write-ahead journal: a key-value log on disk, storage only (records are opaque).

The daemon's core emits, per loop turn, a list of entries ``(key, value)`` — a value PUTs the
key, ``None`` DELETEs it.  :func:`open_journal` loads the live map (first-insertion order: a
later PUT of a live key keeps its position, a key deleted and put again moves to the end) and
returns a :class:`JournalWriter` that appends one record per turn.  The format and the reader
are in :mod:`.journal_format`; the contract with the daemon is ``docs/durability.rst`` ("The
journal's storage").

Threads and locks.  ``_lock`` guards the writer's state and the active segment's descriptor
(held briefly by ``append``, by the seal of a compaction, by ``stats``).  ``_fsync_lock``
serialises fsyncs with the closing of a sealed segment's descriptor, so the interval thread may
fsync outside ``_lock`` (appends go on during an fsync) without racing a close.  Order:
``_fsync_lock`` before ``_lock``.  Two threads: the group-commit fsync (policy ``interval``) and
compaction; both stop in :meth:`JournalWriter.close`.

Compaction (``compaction()``, drained by the thread; public so tests can stop it at any step
and copy the directory as a crash would leave it): the active segment is sealed (a new segment
is created as ``N.seg.tmp`` and fsynced outside the lock; under it, the old one gets its seal
record and is fsynced, the new one is renamed into place, the directory fsynced, and the new
one swapped in), then the newest base and the sealed segments are read into
a map (memory: the live state once, for the time of the compaction) and written as
``N.base.tmp`` in records of about 1 MiB and its seal, fsynced, renamed to ``N.base``, the directory fsynced,
then the old files deleted.  A crash at any step leaves a journal that loads to the same map: a
``.tmp`` is ignored, and once ``N.base`` exists the files numbered up to N are ignored (and
removed at the next open).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Generator

from scaler_executor.scheduler import journal_format as jf
from scaler_executor.scheduler.journal_format import (
    JOURNAL_FORMAT,
    POLICIES,
    Entries,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalLocked,
    JournalRecordInvalid,
    JournalVersionMismatch,
    encode_record,
    header_bytes,
    read_journal,
)

__all__ = [
    "JOURNAL_FORMAT",
    "POLICIES",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalLocked",
    "JournalRecordInvalid",
    "JournalVersionMismatch",
    "JournalWriter",
    "encode_record",
    "header_bytes",
    "open_journal",
    "read_journal",
]

log_default = logging.getLogger(__name__)

MIN_COMPACT_BYTES = 64 << 20  # below this the files are never compacted: rewriting them costs more than it saves
COMPACT_RATIO = 2.0  # compact when the files exceed this many times the live bytes
BASE_RECORD_BYTES = 1 << 20  # a compacted base is written in records of about this size
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """One write() for the whole record; a short write (a signal, a nearly full disk) goes on."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# The lock files' descriptors this process holds.  A flock belongs to the open file, which a
# fork() shares: a child forked without exec (O_CLOEXEC does not apply) would otherwise hold the
# journal locked after the daemon died, and the restarted daemon would be refused.
_LOCK_FDS: set[int] = set()


def _close_locks_in_child() -> None:
    for fd in _LOCK_FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _LOCK_FDS.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


def _lock(path: str) -> int:
    lock_path = os.path.join(path, jf.LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise JournalError(f"cannot open the journal's lock file {lock_path}: {exc.strerror}; check the path's permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise JournalLocked(
            f"journal {path} is in use by another process (pid {holder}, holding {lock_path}): "
            "two daemons must not share a journal; stop that daemon or give this one another --journal path"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _LOCK_FDS.add(fd)
    return fd


def _create_file(path: str, package_version: str) -> int:
    """A new journal file with its header, fsynced, mode 0600; its descriptor (O_APPEND)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, header_bytes(package_version))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd


def open_journal(
    path: str,
    *,
    package_version: str,
    policy: str = "interval",
    interval: float = 0.01,
    log: logging.Logger | None = None,
    min_compact_bytes: int = MIN_COMPACT_BYTES,
    compact_ratio: float = COMPACT_RATIO,
) -> tuple[JournalWriter, dict[bytes, bytes]]:
    """Create (directory mode 0700, files 0600) or open the journal at ``path`` (a directory),
    lock it, load it.  Returns the writer and the live map (first-insertion order).

    A torn last record is dropped with one log line naming the file and offset, and the file is
    truncated there before appending continues; leftovers of an interrupted compaction are
    removed.  ``min_compact_bytes`` and ``compact_ratio``: compaction starts when the files
    exceed max(min_compact_bytes, compact_ratio x live bytes).  Raises JournalLocked,
    JournalCorrupt, JournalVersionMismatch, JournalError (bad arguments or path), JournalFull.
    """
    if policy not in POLICIES:
        raise JournalError(f"journal fsync policy {policy!r} is not one of {', '.join(POLICIES)}")
    if not interval > 0:
        raise JournalError(f"journal fsync interval must be > 0 seconds, not {interval!r}")
    if min_compact_bytes < 0 or not compact_ratio > 1:
        raise JournalError("journal compaction needs min_compact_bytes >= 0 and compact_ratio > 1")
    log = log or log_default
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # the values hold pickles: the journal is its owner's alone
    except OSError as exc:
        raise JournalError(f"cannot create the journal directory {path}: {exc.strerror}; give a writable --journal path") from None
    lock_fd = _lock(path)
    try:
        loaded = read_journal(path, package_version=package_version, log=log)
        for name in loaded.stale:
            os.unlink(os.path.join(path, name))
        if loaded.torn is not None:
            name, offset = loaded.torn
            if loaded.torn_header:  # the crash came while the segment was being created: make it afresh
                os.unlink(os.path.join(path, name))
                loaded.segments.pop()
                del loaded.sizes[name]
                loaded.last_sealed = True  # (the segment before it, read as not the last, has its seal)
            else:
                os.truncate(os.path.join(path, name), offset)
        writer = JournalWriter(
            path, loaded, lock_fd, package_version=package_version, policy=policy, interval=interval,
            log=log, min_compact_bytes=min_compact_bytes, compact_ratio=compact_ratio,
        )
    except OSError as exc:
        _unlock(lock_fd)
        if exc.errno in _FULL:
            raise JournalFull(f"journal {path}: the disk is full ({exc.strerror}); free space and start again") from None
        raise JournalError(f"journal {path}: {exc}; check the path's permissions and disk") from None
    except BaseException:
        _unlock(lock_fd)
        raise
    return writer, loaded.live


def _unlock(fd: int) -> None:
    _LOCK_FDS.discard(fd)
    os.close(fd)  # releases the flock


class JournalWriter:
    """Appends one record per turn to the journal's active segment; see :func:`open_journal`."""

    def __init__(
        self, path: str, loaded: jf.Loaded, lock_fd: int, *, package_version: str, policy: str,
        interval: float, log: logging.Logger, min_compact_bytes: int, compact_ratio: float,
    ) -> None:
        self.path = path
        self.policy = policy
        self.interval = interval
        self._version = package_version
        self._log = log
        self._min_compact = min_compact_bytes
        self._ratio = compact_ratio
        self._lock_fd: int | None = lock_fd
        self._lock = threading.Lock()
        self._fsync_lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._dirty = False
        # Sizes of the files that make up the journal now (name -> bytes), for size_on_disk.
        self._sizes = dict(loaded.sizes)
        self._base = loaded.base
        # key -> bytes it holds (key + value): live_bytes and live_keys without keeping the values.
        self._live = {k: len(k) + len(v) for k, v in loaded.live.items()}
        self._live_bytes = sum(self._live.values())
        self._bytes_written = 0
        self._records = 0
        self._fsyncs = 0
        self._compactions = 0
        self._last_fsync = 0.0
        self._fsync_errors = 0
        self._compacting = False
        self._compact_floor = 0  # after a failed compaction: wait until the files exceed this
        self._cut_at: int | None = None  # a failed write's partial record not yet cut off
        if loaded.segments and not loaded.last_sealed:
            self._seg = loaded.segments[-1]
            name = jf.seg_name(self._seg)
            self._fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        else:  # nothing yet, a base alone, or the last segment sealed (a crash before its successor was in place)
            self._seg = (loaded.segments[-1] if loaded.segments else self._base) + 1
            name = jf.seg_name(self._seg)
            self._fd = _create_file(os.path.join(path, name), package_version)
            self._sizes[name] = len(header_bytes(package_version))
            _fsync_dir(path)
        self._name = name  # the active segment's file name (seg_name(self._seg))
        self._want_compact = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        if policy == "interval":
            self._threads.append(threading.Thread(target=self._fsync_loop, name="journal-fsync", daemon=True))
        self._threads.append(threading.Thread(target=self._compact_loop, name="journal-compact", daemon=True))
        for thread in self._threads:
            thread.start()

    def __repr__(self) -> str:
        return f"<JournalWriter {self.path} policy={self.policy} segment={self._seg} live_keys={len(self._live)}>"

    # -- appending -------------------------------------------------------------------------

    def append(self, entries: Entries) -> None:
        """One turn's entries, in ONE write() before returning (so a SIGKILLed daemon never
        announced what it did not write).  Policy 'turn': fsynced before returning; 'interval':
        the fsync thread syncs at most every ``interval`` s while dirty; 'os': never fsynced.

        Raises JournalFull (ENOSPC/EDQUOT: nothing of the batch counts, the file is truncated
        back, the writer stays usable), JournalError (closed writer, other I/O error), TypeError
        (an entry is not ``(bytes, bytes | None)``).
        """
        record = encode_record(entries)
        with self._lock:
            if self._closed:
                raise JournalError(f"journal {self.path} is closed")
            name = self._name
            start = self._sizes[name]
            if self._cut_at is not None:
                self._undo(name, start)
                if self._cut_at is not None:
                    raise JournalError(
                        f"journal {self.path}: {name} still ends in a partial record that cannot be cut off; "
                        "this batch was not journaled (check the disk; restarting the daemon repairs the file)"
                    )
            try:
                _write_all(self._fd, record)
                if self.policy == "turn":
                    self._fsync_fd(self._fd)
            except BaseException as exc:
                # Cut the partial record off whatever stopped the write (a full disk, or an
                # exception raised by a signal handler between two parts of a short write):
                # records after it would otherwise follow garbage, which the reader refuses.
                self._undo(name, start)
                if not isinstance(exc, OSError):
                    raise
                if exc.errno in _FULL:
                    raise JournalFull(
                        f"journal {self.path} is full ({exc.strerror}) writing {name}: this batch was not "
                        "journaled; free space on that disk (the journal goes on once there is room)"
                    ) from None
                raise JournalError(f"journal {self.path}: writing {name} failed ({exc}); this batch was not journaled") from None
            self._sizes[name] = start + len(record)
            self._bytes_written += len(record)
            self._records += 1
            live, live_bytes = self._live, self._live_bytes
            for key, value in entries:
                if value is None:
                    live_bytes -= live.pop(key, 0)
                else:
                    size = len(key) + len(value)
                    live_bytes += size - live.get(key, 0)
                    live[key] = size
            self._live_bytes = live_bytes
            if self.policy == "interval" and not self._dirty:
                self._dirty = True
                self._wake.notify()  # (already dirty: the fsync thread has it in hand)
            size = sum(self._sizes.values())
            if (
                not self._compacting and size > self._compact_floor
                and size > max(self._min_compact, self._ratio * self._live_bytes)
            ):
                self._compacting = True
                self._want_compact.set()

    def _undo(self, name: str, start: int) -> None:
        """Cut a partly written record off the end of the file (under ``_lock``)."""
        try:
            os.ftruncate(self._fd, start)
            self._cut_at = None
        except OSError as exc:
            # Nothing may follow the partial record (the reader would refuse the garbage in the
            # middle): every append tries the cut again first, and fails until it succeeds.
            self._cut_at = start
            self._log.error("journal: could not truncate %s back to %d after a failed write: %s", name, start, exc)

    def _fsync_fd(self, fd: int) -> None:
        began = time.perf_counter()
        os.fsync(fd)
        self._last_fsync = time.perf_counter() - began
        self._fsyncs += 1

    def _fsync_loop(self) -> None:
        """Group commit: fsync at most every ``interval`` s while appends made the file dirty."""
        while True:
            with self._lock:
                while not self._dirty and not self._stop.is_set():
                    self._wake.wait()
                if not self._dirty:
                    return
            self._sync_active()
            if self._stop.wait(self.interval):
                return

    def _sync_active(self) -> None:
        with self._fsync_lock:
            with self._lock:
                fd, self._dirty = self._fd, False
            try:
                self._fsync_fd(fd)
            except OSError as exc:
                # What was written stays in the page cache and is read back as long as the machine
                # stays up; only a power loss could lose it.  Counted (stats) and logged each time.
                self._fsync_errors += 1
                self._log.error("journal: fsync of %s failed: %s", jf.seg_name(self._seg), exc)

    # -- compaction ------------------------------------------------------------------------

    def _compact_loop(self) -> None:
        while True:
            self._want_compact.wait()
            if self._stop.is_set():
                return
            self._want_compact.clear()
            steps = self._compaction(claim=False)
            try:
                for _ in steps:
                    if self._stop.is_set():
                        steps.close()  # abandons it: the tmp file is removed
                        return
            except (OSError, JournalError) as exc:
                if self._stop.is_set():
                    return
                with self._lock:
                    self._compact_floor = sum(self._sizes.values()) + max(self._min_compact, 1 << 20)
                self._log.error("journal: compaction of %s failed (it is tried again once the files grow): %s", self.path, exc)

    def compaction(self) -> Generator[str, None, None]:
        """The steps of one compaction; each ``next()`` does one step and says which:
        ``"sealed"`` (appends go on into a new segment; the old one is fsynced), ``"record"``
        (one more record of ``N.base.tmp`` written), ``"synced"`` (tmp complete and fsynced),
        ``"renamed"`` (``N.base`` in place), ``"dir-synced"``, ``"deleted"`` (one old file
        removed).  The background thread drains the same steps; a test may stop after any step
        and copy the directory, which is what a crash at that point leaves.  Nothing happens
        before the first ``next()``; closing the generator part way abandons the compaction
        (the tmp file is removed).  Raises JournalError (closed, or a compaction already
        running), JournalCorrupt (a sealed file rotted), OSError (e.g. ENOSPC).
        """
        return self._compaction(claim=True)

    def _compaction(self, *, claim: bool) -> Generator[str, None, None]:
        with self._lock:
            if self._closed:
                raise JournalError(f"journal {self.path} is closed")
            if claim:
                if self._compacting:
                    raise JournalError(f"journal {self.path}: a compaction is already running")
                self._compacting = True
        try:
            sealed = self._seal()
            yield "sealed"
            yield from self._compact(sealed)
        finally:
            with self._lock:
                self._compacting = False

    def _seal(self) -> int:
        """Seal the active segment and start the next one.  Its number.

        The new segment is created as ``N.seg.tmp`` (header written and fsynced) outside the
        lock, appends going on meanwhile; then, under the lock, the old segment gets its seal
        record and is fsynced, the new one is renamed into place and the directory fsynced,
        and appends go to the new one.  So a segment with a successor always ends with its seal
        (a crash before the rename leaves a ``.tmp``, removed at the next open, and a last
        segment that may be sealed: the next open starts its successor), and no record reaches
        the new segment before its name is durable.  Two fsyncs and a rename under the lock,
        once per compaction.
        """
        with self._lock:
            sealed, new = self._seg, self._seg + 1
        final = os.path.join(self.path, jf.seg_name(new))
        tmp = final + ".tmp"
        fd = _create_file(tmp, self._version)
        with self._fsync_lock:  # (the old descriptor is closed under it: the fsync thread may hold it)
            try:
                with self._lock:
                    old_fd = self._seal_active(sealed, tmp, final)
                    self._fd, self._seg, self._name = fd, new, jf.seg_name(new)
                    self._sizes[self._name] = len(header_bytes(self._version))
                    self._dirty = False
            except BaseException:
                os.close(fd)
                try:
                    os.unlink(tmp)
                except FileNotFoundError:  # (renamed, and removed again by _seal_active)
                    pass
                raise
            os.close(old_fd)
        return sealed

    def _seal_active(self, sealed: int, tmp: str, final: str) -> int:
        """(Under both locks) write the active segment's seal, fsync it, rename ``tmp`` to
        ``final`` and fsync the directory; the old descriptor.  On failure the seal is cut off
        again (the segment stays the active one) and the exception raised."""
        name = self._name
        start = self._sizes[name]
        if self._cut_at is not None:
            self._undo(name, start)
            if self._cut_at is not None:
                raise JournalError(f"journal {self.path}: {name} ends in a partial record that cannot be cut off; not sealed")
        seal = jf.encode_seal(sealed, start)
        renamed = False
        try:
            _write_all(self._fd, seal)
            self._fsync_fd(self._fd)
            os.rename(tmp, final)
            renamed = True
            _fsync_dir(self.path)
        except BaseException as exc:
            if renamed:  # the new name goes before the seal does: a .seg after an unsealed one is refused
                try:
                    os.unlink(final)
                except OSError as again:  # cannot take it back: go on with the new segment (sealed, in place)
                    self._log.error("journal: %s sealed but the directory's fsync failed (%s), and %s "
                                    "could not be removed (%s): going on with it", name, exc, final, again)
                    self._sizes[name] = start + len(seal)
                    return self._fd
            self._undo(name, start)
            try:
                os.fsync(self._fd)  # the cut is durable too: no power loss brings the seal back
            except OSError:
                pass
            raise
        self._sizes[name] = start + len(seal)
        return self._fd

    def _compact(self, sealed: int) -> Generator[str, None, None]:
        base = self._base
        tmp = os.path.join(self.path, jf.base_name(sealed) + ".tmp")
        old = ([jf.base_name(base)] if base else []) + [
            jf.seg_name(s) for s in range(base + 1, sealed + 1)
            if os.path.exists(os.path.join(self.path, jf.seg_name(s)))
        ]
        renamed = False
        try:
            live: dict[bytes, bytes] = {}
            for name in old:
                jf.read_file(os.path.join(self.path, name), live, self._version, last=False)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            size = 0
            try:
                head = header_bytes(self._version)
                _write_all(fd, head)
                size += len(head)
                batch: Entries = []
                batch_bytes = 0
                for key, value in live.items():
                    batch.append((key, value))
                    batch_bytes += len(key) + len(value)
                    if batch_bytes >= BASE_RECORD_BYTES:
                        record = encode_record(batch)
                        _write_all(fd, record)
                        size += len(record)
                        batch, batch_bytes = [], 0
                        yield "record"
                if batch:
                    record = encode_record(batch)
                    _write_all(fd, record)
                    size += len(record)
                    yield "record"
                del live, batch
                seal = jf.encode_seal(sealed, size)  # a base ends with its seal, like a sealed segment
                _write_all(fd, seal)
                size += len(seal)
                os.fsync(fd)
            finally:
                os.close(fd)
            yield "synced"
            os.rename(tmp, os.path.join(self.path, jf.base_name(sealed)))
            renamed = True
            with self._lock:
                self._base = sealed
                for name in old:
                    self._sizes.pop(name, None)
                self._sizes[jf.base_name(sealed)] = size
            yield "renamed"
            _fsync_dir(self.path)
            yield "dir-synced"
            while old:
                os.unlink(os.path.join(self.path, old.pop(0)))
                yield "deleted"
            with self._lock:
                self._compactions += 1
        finally:
            if not renamed:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
            for name in old if renamed else ():
                try:  # abandoned after the rename: the old files are dead either way
                    os.unlink(os.path.join(self.path, name))
                except FileNotFoundError:
                    pass

    # -- the rest --------------------------------------------------------------------------

    def close(self) -> None:
        """Final fsync, stop the threads, release the lock.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            self._wake.notify_all()
        self._want_compact.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._fsync_lock:
            try:
                self._fsync_fd(self._fd)
            except OSError as exc:
                self._log.error("journal: final fsync of %s failed: %s", jf.seg_name(self._seg), exc)
            os.close(self._fd)
        if self._lock_fd is not None:
            _unlock(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int | float]:
        """Counters since the writer opened: bytes_written, records, fsyncs, compactions,
        size_on_disk, live_bytes (keys + values), live_keys, last_fsync_seconds, fsync_errors
        (failed fsyncs of the interval thread, which are logged; policy 'turn' raises instead),
        and compacting (1 while a compaction is due or running)."""
        with self._lock:
            return {
                "bytes_written": self._bytes_written,
                "records": self._records,
                "fsyncs": self._fsyncs,
                "compactions": self._compactions,
                "size_on_disk": sum(self._sizes.values()),
                "live_bytes": self._live_bytes,
                "live_keys": len(self._live),
                "last_fsync_seconds": self._last_fsync,
                "fsync_errors": self._fsync_errors,
                "compacting": int(self._compacting),
            }
