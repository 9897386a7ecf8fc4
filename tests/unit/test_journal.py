"""The journal's storage (scheduler/journal.py): order semantics, torn tails, corruption,
compaction and crashes during it, the lock, permissions, fsync policies.

The disk-full tests (a real tmpfs) are in test_journal_full.py, the fuzzing in test_journal_fuzz.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from journal_testing import HEADER_BYTES, Batch, V, boundaries, live_after, live_maps, load, write
from scaler_testing import child_env, wait_until

from scaler_executor.scheduler.journal import (
    JOURNAL_FORMAT,
    JournalCorrupt,
    JournalError,
    JournalLocked,
    JournalVersionMismatch,
    encode_record,
    header_bytes,
    open_journal,
)

pytestmark = pytest.mark.timeout(120)


def only_segment(path: Path) -> Path:
    (seg,) = [p for p in path.iterdir() if p.name.endswith(".seg")]
    return seg


BATCHES: list[Batch] = [
    [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")],
    [(b"a", b"1'")],                       # re-PUT of a live key keeps its place
    [(b"b", None)],                        # DELETE
    [(b"d", b"4"), (b"b", b"2'")],         # deleted and PUT again: moves to the end
    [(b"e", b"5" * 300), (b"c", None), (b"c", b"3'"), (b"f", b"")],
]


def test_round_trip_order(tmp_path: Path) -> None:
    write(tmp_path / "j", BATCHES)
    writer, live = open_journal(str(tmp_path / "j"), package_version=V)
    writer.close()
    assert list(live.items()) == [
        (b"a", b"1'"), (b"d", b"4"), (b"b", b"2'"), (b"e", b"5" * 300), (b"c", b"3'"), (b"f", b""),
    ]
    assert list(live.items()) == list(live_after(BATCHES).items())
    # a writer reopened goes on appending to the same journal
    write(tmp_path / "j", [[(b"a", None), (b"g", b"7")]])
    assert list(load(tmp_path / "j")) == [b"d", b"b", b"e", b"c", b"f", b"g"]


def test_stats(tmp_path: Path) -> None:
    writer, _ = open_journal(str(tmp_path / "j"), package_version=V, policy="os")
    writer.append([(b"k1", b"x" * 10), (b"k2", b"y" * 20)])
    writer.append([(b"k1", None)])
    s = writer.stats()
    writer.close()
    assert s["records"] == 2 and s["live_keys"] == 1 and s["live_bytes"] == 2 + 20
    assert s["bytes_written"] == len(encode_record([(b"k1", b"x" * 10), (b"k2", b"y" * 20)])) + len(encode_record([(b"k1", None)]))
    assert s["size_on_disk"] == s["bytes_written"] + HEADER_BYTES == os.path.getsize(only_segment(tmp_path / "j"))
    assert s["fsyncs"] == 0  # policy 'os'


def test_truncated_at_every_offset_of_last_record_and_every_boundary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "src"
    write(src, BATCHES)
    data = only_segment(src).read_bytes()
    ends = boundaries(BATCHES)
    assert ends[-1] == len(data)
    maps = live_maps(BATCHES)
    cuts = sorted(set(range(ends[-2], len(data) + 1)) | set(ends) | {0, 3, HEADER_BYTES - 1})
    for cut in cuts:
        j = tmp_path / f"cut{cut}"
        shutil.copytree(src, j)
        seg = only_segment(j)
        seg.write_bytes(data[:cut])
        complete = sum(1 for end in ends[1:] if end <= cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert load(j) == maps[complete], cut
        torn = cut not in ends and cut != len(data)
        assert (f"at offset {max(e for e in ends if e <= cut) if cut >= ends[0] else 0}" in caplog.text) == torn, (cut, caplog.text)
        # opening truncates the torn tail (or recreates a segment whose header is torn) and appends go on
        writer, live = open_journal(str(j), package_version=V)
        assert list(live.items()) == list(maps[complete].items())
        writer.append([(b"after", b"x")])
        writer.close()
        assert load(j) == {**maps[complete], b"after": b"x"}
        shutil.rmtree(j)


def test_zero_tail_is_torn(tmp_path: Path) -> None:
    write(tmp_path / "j", BATCHES)
    seg = only_segment(tmp_path / "j")
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\0" * 4096)  # what a file system may leave after a power loss
    assert load(tmp_path / "j") == live_after(BATCHES)
    writer, _ = open_journal(str(tmp_path / "j"), package_version=V)
    writer.close()
    assert seg.stat().st_size == size


@pytest.mark.parametrize("where", ["payload", "length", "payload-crc"])
def test_corrupt_middle_record_refused_with_offset(tmp_path: Path, where: str) -> None:
    j = tmp_path / "j"
    write(j, BATCHES)
    seg = only_segment(j)
    data = bytearray(seg.read_bytes())
    offset = boundaries(BATCHES)[2]  # the third record of five
    data[offset + {"payload": 13, "length": 1, "payload-crc": 9}[where]] ^= 0x10
    seg.write_bytes(bytes(data))
    for attempt in (lambda: load(j), lambda: open_journal(str(j), package_version=V)):
        with pytest.raises(JournalCorrupt) as info:
            attempt()
        assert info.value.offset == offset and info.value.path == str(seg)
        text = str(info.value)
        assert str(seg) in text and f"offset {offset}" in text and "move the journal directory away" in text
    assert seg.read_bytes() == bytes(data)  # refused, not "repaired"


def test_corrupt_last_record_checksum_is_torn_but_garbage_after_it_is_not(tmp_path: Path) -> None:
    j = tmp_path / "j"
    write(j, BATCHES)
    seg = only_segment(j)
    original = seg.read_bytes()
    data = bytearray(original)
    data[-1] ^= 1  # the very last record, reaching EOF: a torn write
    seg.write_bytes(bytes(data))
    assert load(j) == live_maps(BATCHES)[-2]
    # the same damaged record followed by a valid one is not a tail: refused
    seg.write_bytes(bytes(data) + encode_record([(b"z", b"z")]))
    with pytest.raises(JournalCorrupt) as info:
        load(j)
    assert info.value.offset == boundaries(BATCHES)[-2]
    # a full record header of garbage after the last record: refused (its length checksum fails)
    seg.write_bytes(original + b"garbage-garbage!")
    with pytest.raises(JournalCorrupt, match="record length checksum") as info:
        load(j)
    assert info.value.offset == len(original)


def test_not_a_journal_and_version_mismatch(tmp_path: Path) -> None:
    j = tmp_path / "j"
    write(j, BATCHES)
    with pytest.raises(JournalVersionMismatch, match=r"written by scaler-executor 0\.1\.0, this is 9\.9") as info:
        open_journal(str(j), package_version="9.9")
    assert str(j) in str(info.value) and "move the journal directory away" in str(info.value)
    seg = only_segment(j)
    data = seg.read_bytes()
    # another JOURNAL_FORMAT (the magic and format fields stay where they are in every format)
    other = data[:8] + struct.pack("<I", JOURNAL_FORMAT + 1) + data[12:]
    seg.write_bytes(other)
    with pytest.raises(JournalVersionMismatch, match=f"journal format {JOURNAL_FORMAT + 1}"):
        load(j)
    seg.write_bytes(b"NOTAJRNL" + data[8:])
    with pytest.raises(JournalCorrupt, match="bad magic"):
        load(j)
    head = bytearray(data)
    head[13] ^= 4  # the version's length: the header's checksum fails
    seg.write_bytes(bytes(head))
    with pytest.raises(JournalCorrupt):
        load(j)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="policy 'sometimes'"):
        open_journal(str(tmp_path / "j"), package_version=V, policy="sometimes")
    (tmp_path / "file").write_text("x")
    with pytest.raises(JournalError, match="cannot create the journal directory"):
        open_journal(str(tmp_path / "file"), package_version=V)
    writer, _ = open_journal(str(tmp_path / "j"), package_version=V)
    with pytest.raises(TypeError, match=r"\(key: bytes, value: bytes \| None\)"):
        writer.append([("str-key", b"v")])  # type: ignore[list-item]
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        writer.append([(b"k", b"v")])


def test_permissions(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        write(tmp_path / "j", BATCHES, min_compact_bytes=0)
    finally:
        os.umask(old)
    assert (tmp_path / "j").stat().st_mode & 0o777 == 0o700
    names = os.listdir(tmp_path / "j")
    assert "LOCK" in names and any(n.endswith(".seg") for n in names)
    for name in names:
        assert (tmp_path / "j" / name).stat().st_mode & 0o777 == 0o600, name
    # an existing directory with wider permissions is narrowed
    os.chmod(tmp_path / "j", 0o755)
    write(tmp_path / "j", [])
    assert (tmp_path / "j").stat().st_mode & 0o777 == 0o700


def test_lock_conflict_in_process_and_across_processes(tmp_path: Path) -> None:
    j = str(tmp_path / "j")
    writer, _ = open_journal(j, package_version=V)
    with pytest.raises(JournalLocked, match=f"pid {os.getpid()}") as info:
        open_journal(j, package_version=V)
    assert j in str(info.value) and "another --journal path" in str(info.value)
    writer.close()
    # another process holds it: refused, naming that process; free again once it exits
    code = textwrap.dedent(
        f"""
        import sys
        from scaler_executor.scheduler.journal import open_journal
        w, _ = open_journal({j!r}, package_version={V!r})
        print("locked", flush=True)
        sys.stdin.read()
        w.close()
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(), text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with pytest.raises(JournalLocked, match=f"pid {child.pid}"):
            open_journal(j, package_version=V)
    finally:
        child.kill()  # a daemon that died: the kernel releases its lock
        child.wait(timeout=60)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.stdout.close()
    writer, _ = open_journal(j, package_version=V)
    assert (tmp_path / "j" / "LOCK").read_text() == f"{os.getpid()}\n"
    writer.close()


def test_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    """A process forked (without exec) by the journal's holder outlives it: the journal opens again."""
    code = textwrap.dedent(
        f"""
        import os
        from scaler_executor.scheduler.journal import JournalLocked, open_journal
        w, _ = open_journal({str(tmp_path / "j")!r}, package_version={V!r})
        r, wr = os.pipe()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # (os.fork's at-fork handlers have run in the child by now)
            os.close(wr)
            os.write(ready_w, b"x")
            os.read(r, 1)  # lives until the parent is done
            os._exit(0)
        os.close(r)
        os.read(ready_r, 1)  # the child is past fork: under load it may not have run at all yet
        w.close()
        try:
            w2, _ = open_journal({str(tmp_path / "j")!r}, package_version={V!r})
            w2.close()
            print("reopened")
        except JournalLocked as exc:
            print("locked", exc)
        finally:
            os.close(wr)
            os.waitpid(pid, 0)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "reopened", run.stdout + run.stderr


@pytest.mark.parametrize("policy", ["turn", "interval", "os"])
def test_fsync_policies(tmp_path: Path, policy: str) -> None:
    writer, _ = open_journal(str(tmp_path / "j"), package_version=V, policy=policy, interval=0.001)
    try:
        for i in range(20):
            writer.append([(b"k%d" % i, b"v")])
            if policy == "turn":
                assert writer.stats()["fsyncs"] == i + 1  # synced before append returned
        if policy == "interval":
            wait_until(lambda: writer.stats()["fsyncs"] >= 1, timeout=30)
            assert 1 <= writer.stats()["fsyncs"] <= 20
        if policy == "os":
            assert writer.stats()["fsyncs"] == 0
    finally:
        writer.close()
    if policy != "turn":
        assert writer.stats()["fsyncs"] >= 1  # close() fsyncs
    assert writer.stats()["last_fsync_seconds"] > 0


def churn(n: int, keys: int = 20, size: int = 200) -> list[Batch]:
    """Many overwrites and deletes of a few keys: history much larger than the live state."""
    out: list[Batch] = []
    for i in range(n):
        batch: Batch = [(b"key%d" % (i % keys), bytes([i % 251]) * size)]
        if i % 7 == 0:
            batch.append((b"key%d" % ((i * 3) % keys), None))
        if i % 11 == 0:
            batch.append((b"gone%d" % i, b"x"))
            batch.append((b"gone%d" % i, None))
        out.append(batch)
    return out


def test_compaction_keeps_live_map_and_shrinks(tmp_path: Path) -> None:
    j = tmp_path / "j"
    batches = churn(500)
    writer, _ = open_journal(str(j), package_version=V)  # default threshold: no background compaction
    for batch in batches:
        writer.append(batch)
    before = writer.stats()["size_on_disk"]
    steps = list(writer.compaction())
    assert steps[0] == "sealed" and "renamed" in steps and steps[-1] == "deleted"
    after = writer.stats()
    assert after["compactions"] == 1 and after["size_on_disk"] < before / 10
    assert after["size_on_disk"] == sum(p.stat().st_size for p in j.iterdir() if p.name != "LOCK")
    writer.append([(b"late", b"1")])
    writer.close()
    expected = {**live_after(batches), b"late": b"1"}
    assert list(load(j).items()) == list(expected.items())
    assert sorted(p.suffix for p in j.iterdir()) == ["", ".base", ".seg"]


def test_background_compaction(tmp_path: Path) -> None:
    j = tmp_path / "j"
    batches = churn(3000)
    writer, _ = open_journal(str(j), package_version=V, min_compact_bytes=20_000)
    try:
        for batch in batches:
            writer.append(batch)
        # However far the appends outran the thread (a loaded machine), once it is idle an append
        # over the threshold starts another compaction, after which the files are back under it.
        for i in range(10):
            assert wait_until(lambda: writer.stats()["compacting"] == 0, timeout=60)
            if writer.stats()["size_on_disk"] <= 20_000:
                break
            trigger: Batch = [(b"trigger", b"%d" % i)]
            writer.append(trigger)
            batches.append(trigger)
        stats = writer.stats()
    finally:
        writer.close()
    assert stats["compactions"] >= 1 and stats["size_on_disk"] <= 20_000
    assert list(load(j).items()) == list(live_after(batches).items())


def test_crash_at_every_step_of_compaction(tmp_path: Path) -> None:
    """Stop the compaction after each step, copy the directory (what a crash leaves), then load
    the copy: the same live map, with the appends made meanwhile."""
    batches = churn(300, size=5000)  # ~1.5 MB of history, ~100 KB live
    n_steps = len(list(_compacted(tmp_path / "probe", batches, stop_after=None)))
    assert n_steps >= 6
    for stop in range(n_steps + 1):
        crash = tmp_path / f"crash{stop}"
        expected = None
        for copy in _compacted(tmp_path / f"live{stop}", batches, stop_after=stop, copy_to=crash):
            expected = copy
        assert expected is not None
        assert list(load(crash).items()) == list(expected.items()), stop
        # a partly written tmp (a crash in the middle of writing the base) changes nothing
        for tmp in crash.glob("*.tmp"):
            tmp.write_bytes(tmp.read_bytes()[: tmp.stat().st_size // 2])
            assert load(crash) == expected
        writer, live = open_journal(str(crash), package_version=V)
        assert list(live.items()) == list(expected.items())
        assert not list(crash.glob("*.tmp")) and len(list(crash.glob("*.base"))) <= 1
        writer.append([(b"after", b"crash")])
        steps = list(writer.compaction())  # the next compaction works on what the crash left
        writer.close()
        assert "renamed" in steps
        assert list(load(crash).items()) == list({**expected, b"after": b"crash"}.items())
        shutil.rmtree(crash)


def _compacted(j: Path, batches: list[Batch], stop_after: int | None, copy_to: Path | None = None):  # type: ignore[no-untyped-def]
    """Write ``batches`` and compact, appending between steps; yields each step's name, or (when
    ``stop_after`` is given) copies the directory after that many steps and yields the live map
    the copy must load to."""
    writer, _ = open_journal(str(j), package_version=V, policy="os")
    sent = list(batches)
    try:
        for batch in batches:
            writer.append(batch)
        steps = writer.compaction()
        done = 0
        while True:
            if stop_after is not None and done == stop_after:
                assert copy_to is not None
                shutil.copytree(j, copy_to)
                yield live_after(sent)
            try:
                step = next(steps)
            except StopIteration:
                break
            done += 1
            if stop_after is None:
                yield step
            extra: Batch = [(b"during%d" % done, b"x"), (b"key%d" % done, None)]
            writer.append(extra)  # appends go on during the compaction
            sent.append(extra)
    finally:
        writer.close()
    assert list(load(j).items()) == list(live_after(sent).items())
    shutil.rmtree(j)


def test_torn_tail_in_a_sealed_segment_is_corruption(tmp_path: Path) -> None:
    j = tmp_path / "j"
    writer, _ = open_journal(str(j), package_version=V)
    writer.append([(b"a", b"1")])
    steps = writer.compaction()
    assert next(steps) == "sealed"
    writer.append([(b"b", b"2")])
    steps.close()  # abandoned after the seal: two segments, no base
    writer.close()
    segs = sorted(j.glob("*.seg"))
    assert len(segs) == 2 and not list(j.glob("*.base*"))
    assert load(j) == {b"a": b"1", b"b": b"2"}
    data = segs[0].read_bytes()
    segs[0].write_bytes(data[:-3])
    with pytest.raises(JournalCorrupt, match="only the last segment may be torn") as info:
        load(j)
    assert info.value.path == str(segs[0])


def test_header_checksum(tmp_path: Path) -> None:
    head = header_bytes(V)
    assert head.startswith(b"SXJOURN\n") and struct.unpack("<I", head[-4:])[0] == zlib.crc32(head[:-4])
