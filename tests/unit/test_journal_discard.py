"""``scaler-daemon --journal PATH --discard`` (scheduler/journal_discard.py): a journal given
up, with the store region it keeps for a restart, whatever state the journal is in."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from scaler_executor.objstore import ObjectStore
from scaler_executor.scheduler.journal import JournalError, JournalLocked, open_journal
from scaler_executor.scheduler.journal_discard import STORE_FILE, discard_journal, note_region
from scaler_executor.scheduler.loop import journal_version


@pytest.fixture
def region() -> Iterator[str]:
    """A real journaled-daemon-style region in /dev/shm; removed on every exit path."""
    name = f"scalerj-{os.getpid()}-{os.urandom(8).hex()}"
    store = ObjectStore.create(name, 1 << 20, fallback_dir=tempfile.gettempdir())
    store.close()
    try:
        yield name
    finally:
        ObjectStore.unlink_name(name, tempfile.gettempdir())


def _exists(name: str) -> bool:
    try:
        ObjectStore.attach(name, fallback_dir=tempfile.gettempdir()).close()
    except Exception:  # noqa: BLE001 - gone
        return False
    return True


def _journal(path: str, version: str, region: str, *, note: bool = True) -> None:
    writer, _ = open_journal(path, package_version=version)
    writer.append([(b"n", (2).to_bytes(8, "big")), (b"s", region.encode())])
    writer.close()
    if note:
        note_region(path, region)


def test_discard_removes_the_journal_and_its_region(tmp_path, region: str) -> None:
    path = str(tmp_path / "journal")
    _journal(path, journal_version(), region)
    there = _exists(region)  # (another test session's leak check on this host may remove it meanwhile)
    removed = discard_journal(path, package_version=journal_version())
    assert not _exists(region)
    assert not os.path.exists(path)
    assert removed == [f"the object store region {region}"] * there + [f"the journal {path} (2 files)"]


def test_a_journal_of_another_version_or_without_its_note_is_discarded_too(tmp_path, region: str) -> None:
    other = str(tmp_path / "other")
    _journal(other, "0.0.0-elsewhere", region)  # refused at start: its note still names the region
    discard_journal(other, package_version=journal_version())
    assert not _exists(region) and not os.path.exists(other)


def test_the_journals_own_record_names_the_region_when_the_note_is_missing(tmp_path, region: str) -> None:
    path = str(tmp_path / "journal")
    _journal(path, journal_version(), region, note=False)
    discard_journal(path, package_version=journal_version())
    assert not _exists(region)


def test_a_journal_in_use_is_refused_and_nothing_is_removed(tmp_path, region: str) -> None:
    path = str(tmp_path / "journal")
    writer, _ = open_journal(path, package_version=journal_version())
    note_region(path, region)
    try:
        there = _exists(region)
        with pytest.raises(JournalLocked, match=f"pid {os.getpid()}"):
            discard_journal(path, package_version=journal_version())
        assert _exists(region) == there and os.path.exists(os.path.join(path, STORE_FILE))
    finally:
        writer.close()


def test_only_a_journal_directory_and_only_journaled_regions(tmp_path, region: str) -> None:
    with pytest.raises(JournalError, match="not a journal directory"):
        discard_journal(str(tmp_path), package_version=journal_version())
    path = str(tmp_path / "journal")
    _journal(path, journal_version(), region)
    with open(os.path.join(path, STORE_FILE), "w") as f:
        f.write("scaler-1-0123456789abcdef\n")  # not a journaled daemon's name: never removed on its say-so
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write("mine")
    discard_journal(path, package_version=journal_version())
    assert not _exists(region)  # (named by the journal's own record)
    assert sorted(os.listdir(path)) == ["notes.txt"]  # a file not the journal's stays, and so does its directory


def _daemon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scaler_executor.cli.daemon", *args], capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SCALER_")},
    )


def test_the_command_line(tmp_path, region: str) -> None:
    path = str(tmp_path / "journal")
    _journal(path, journal_version(), region)
    done = _daemon("--journal", path, "--discard")
    assert done.returncode == 0, done.stderr
    assert f"removed the journal {path}" in done.stdout, done.stdout  # (the region's line: the test above)
    assert not _exists(region) and not os.path.exists(path)
    again = _daemon("--journal", path, "--discard")
    assert again.returncode == 2 and "not a journal directory" in again.stderr, again.stderr
    bare = _daemon("--discard")
    assert bare.returncode == 2 and "--discard needs the journal" in bare.stderr, bare.stderr


def test_a_refused_journal_names_the_way_out(tmp_path, region: str) -> None:
    path = str(tmp_path / "journal")
    _journal(path, "0.0.0-elsewhere", region)
    refused = _daemon("--address", f"ipc://{tmp_path}/d.sock", "--journal", path)
    assert refused.returncode == 2
    assert f"scaler-daemon --journal {path} --discard" in refused.stderr, refused.stderr
