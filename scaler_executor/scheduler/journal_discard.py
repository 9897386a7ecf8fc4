"""Discarding a journal, and the store region it keeps (``scaler-daemon --journal PATH --discard``).

A journaled daemon's store region (``scalerj-<pid>-<random>``, scheduler/objects.py)
outlives the daemon while its journal holds tasks, so that a restart on the journal finds
its objects; no other daemon's sweep touches it.  A journal abandoned while its daemon is
down (work not wanted any more; a journal refused at start as corrupt or of another
version) would leave that region in ``/dev/shm`` for good.  So the region's name is kept
in the journal's directory twice: in the journal (``s``) and in a plain file, ``STORE``,
written when the daemon takes the region (readable whatever the journal's state), and
``discard_journal`` removes the region(s) named there and the journal's files.  A journal
in use (its ``LOCK`` held by a live daemon) is refused; nothing else is removed (a
directory with other files in it is left, naming them).
"""

from __future__ import annotations

import logging
import os
import tempfile

from scaler_executor.scheduler import journal_format as jf
from scaler_executor.scheduler.journal import _lock, _unlock
from scaler_executor.scheduler.journal_format import JournalError

log = logging.getLogger("scaler_executor.daemon")

STORE_FILE = "STORE"  # the name of the store region the journal's daemon uses, one line


def note_region(path: str, name: str) -> None:
    """(The daemon, at start) record its store region's name in journal directory ``path``."""
    tmp = os.path.join(path, STORE_FILE + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(path, STORE_FILE))


def forget_region(path: str) -> None:
    """(The daemon, stopping with nothing to resume) its region is gone: so is the note."""
    try:
        os.unlink(os.path.join(path, STORE_FILE))
    except FileNotFoundError:
        pass


def _regions(path: str, package_version: str) -> list[str]:
    names: list[str] = []
    try:
        with open(os.path.join(path, STORE_FILE), encoding="utf-8", errors="replace") as f:
            names.append(f.read().strip())
    except FileNotFoundError:
        pass
    try:  # the journal's own record, if it can be read (a journal of this version, intact)
        loaded = jf.read_journal(path, package_version=package_version)
        names.append(loaded.live.get(b"s", b"").decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001 - refused, corrupt, unreadable: the STORE file is what is left
        pass
    # Only names a journaled daemon makes: nothing else is removed on a file's say-so.
    return [n for n in dict.fromkeys(names) if n.startswith("scalerj-") and "/" not in n and len(n) < 256]


def discard_journal(path: str, *, package_version: str) -> list[str]:
    """Remove the journal at ``path`` and the store region(s) it names; returns what was
    removed, one line each.  Raises JournalLocked while a daemon uses it, JournalError if
    ``path`` is not a journal directory."""
    from scaler_executor.objstore import ObjectStore

    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, jf.LOCK_NAME)):
        raise JournalError(f"{path} is not a journal directory (no {jf.LOCK_NAME} file in it): nothing discarded")
    lock_fd = _lock(path)  # raises JournalLocked, naming the daemon that uses it
    removed: list[str] = []
    try:
        for name in _regions(path, package_version):
            try:
                if ObjectStore.unlink_name(name, tempfile.gettempdir()):
                    removed.append(f"the object store region {name}")
            except Exception as exc:  # noqa: BLE001 - another user's, say: named, and the journal still goes
                log.warning("could not remove the object store region %s: %s", name, exc)
        bases, segs, tmps = jf.list_files(path)
        files = [jf.base_name(b) for b in bases] + [jf.seg_name(s) for s in segs] + tmps
        files += [f for f in (STORE_FILE, STORE_FILE + ".new") if os.path.exists(os.path.join(path, f))]
        for name in files:
            os.unlink(os.path.join(path, name))
        os.unlink(os.path.join(path, jf.LOCK_NAME))  # (held: nobody takes it meanwhile)
        removed.append(f"the journal {path} ({len(files)} files)")
    finally:
        _unlock(lock_fd)
    left = sorted(os.listdir(path))
    if left:
        log.warning("left the directory %s: it holds files that are not the journal's: %s", path, ", ".join(left[:10]))
    else:
        os.rmdir(path)
    return removed
