"""The journal on a full disk: a real 256 KiB tmpfs (mounted as root), not a simulated error.

Without permission to mount the test is skipped naming why, and under CI=true that skip is a
failure (scaler_testing.requires_system): CI runs as root, so a missing mount is a broken image.
"""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from journal_testing import V
from scaler_testing import requires_system

from scaler_executor.scheduler.journal import JournalFull, open_journal, read_journal

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tiny_disk() -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted (and its mount point removed) on every exit path."""
    where = Path(tempfile.mkdtemp(prefix="scaler-journal-tmpfs-"))
    try:
        if os.geteuid() != 0:
            requires_system("needs root to mount a tmpfs (a real full disk for the journal)")
        run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(where)],
                             capture_output=True, text=True, timeout=30)
        if run.returncode != 0:
            requires_system(f"mount -t tmpfs is not permitted here ({run.stderr.strip()})")
        try:
            yield where
        finally:
            subprocess.run(["umount", str(where)], check=True, timeout=30)
    finally:
        os.rmdir(where)


def test_full_disk_then_recovery(tiny_disk: Path) -> None:
    filler = tiny_disk / "filler"
    filler.write_bytes(b"f" * 96 * 1024)  # frees room later
    j = tiny_disk / "j"
    writer, _ = open_journal(str(j), package_version=V, policy="turn")
    done: dict[bytes, bytes] = {}
    try:
        i = 0
        with pytest.raises(JournalFull) as info:
            while True:
                batch = [(b"key%d" % i, bytes([i % 256]) * 7000), (b"key%d" % (i - 5), None)]
                writer.append(batch)
                done[b"key%d" % i] = batch[0][1]
                done.pop(b"key%d" % (i - 5), None)
                i += 1
                assert i < 100, "a 256 KiB disk never filled"
        assert str(j) in str(info.value) and "free space" in str(info.value)
        # nothing of the failed batch counts: the file ends at the last complete record
        seg = next(p for p in j.iterdir() if p.name.endswith(".seg"))
        assert writer.stats()["size_on_disk"] == seg.stat().st_size
        assert read_journal(str(j), package_version=V).torn is None
        assert read_journal(str(j), package_version=V).live == done
        # still full: refused again, still consistent; a small batch may still fit
        with pytest.raises(JournalFull):
            writer.append([(b"big", b"b" * 100_000)])
        assert read_journal(str(j), package_version=V).live == done
        # space freed: the same writer goes on
        filler.unlink()
        writer.append([(b"after", b"a" * 7000)])
        done[b"after"] = b"a" * 7000
    finally:
        writer.close()
    writer, live = open_journal(str(j), package_version=V)
    writer.close()
    assert list(live.items()) == list(done.items())


def test_compaction_on_a_full_disk_is_abandoned_cleanly(tiny_disk: Path) -> None:
    """A compaction that cannot write its base leaves no tmp file and the journal as it was."""
    j = tiny_disk / "j"
    writer, _ = open_journal(str(j), package_version=V, policy="os")
    value = b"v" * 5000
    expected = {b"key%d" % i: value for i in range(3)}
    try:
        for i in range(30):
            writer.append([(b"key%d" % (i % 3), value)])  # 150 KB of history, 15 KB live
        filler = tiny_disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # fill the disk, then free two pages: room for the seal's new segment, not for the base
            while True:
                os.write(fd, b"f" * 4096)
        except OSError:
            pass
        os.ftruncate(fd, os.fstat(fd).st_size - 8192)
        os.close(fd)
        with pytest.raises(OSError) as info:
            list(writer.compaction())
        assert info.value.errno == errno.ENOSPC
        assert not [p for p in j.iterdir() if p.name.endswith(".tmp")]
        assert read_journal(str(j), package_version=V).live == expected
        filler.unlink()
        steps = list(writer.compaction())  # and a later one works
        assert "renamed" in steps
        writer.append([(b"x", b"y")])
    finally:
        writer.close()
    assert list(read_journal(str(j), package_version=V).live.items()) == list((expected | {b"x": b"y"}).items())
