"""A journal whose writer is SIGKILLed: a real child process appends (and compacts in the
background, the threshold set tiny, so kills land in compactions too) until it is killed at an arbitrary point; the journal then
opens to the map of a prefix of its batches that includes every batch the child had reported
as appended — what the daemon relies on to never have announced what it did not write."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from journal_testing import V
from scaler_testing import child_env

from scaler_executor.scheduler.journal import open_journal

pytestmark = pytest.mark.timeout(180)

BATCH = textwrap.dedent(
    """
    def batch(i):
        out = [(b"key%d" % (i % 50), b"value-%d-" % i + b"x" * (i % 300))]
        if i % 3 == 0:
            out.append((b"key%d" % ((i * 7) % 50), None))
        return out
    """
)

CHILD = BATCH + textwrap.dedent(
    """
    import sys
    from scaler_executor.scheduler.journal import open_journal
    writer, _ = open_journal(sys.argv[1], package_version=sys.argv[2], policy=sys.argv[3], min_compact_bytes=8192)
    for i in range(10**7):
        writer.append(batch(i))
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
    """
)


def batches():  # type: ignore[no-untyped-def]
    scope: dict[str, object] = {}
    exec(BATCH, scope)
    return scope["batch"]


@pytest.mark.parametrize("policy", ["os", "interval", "turn"])
def test_sigkilled_writer_leaves_a_prefix_with_every_acknowledged_batch(tmp_path: Path, policy: str) -> None:
    batch = batches()
    rng = random.Random(policy)
    for run in range(3):
        j = tmp_path / f"j{run}"
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(j), V, policy],
                                 stdout=subprocess.PIPE, env=child_env(), text=True)
        try:
            assert child.stdout is not None
            stop_after = rng.randrange(50, 1500)
            acked = -1
            for line in child.stdout:
                acked = int(line)
                if acked >= stop_after:
                    break
            child.kill()
        finally:
            child.kill()
            child.wait(timeout=60)
            if child.stdout is not None:
                child.stdout.close()
        assert acked >= stop_after, "the child stopped early"
        writer, live = open_journal(str(j), package_version=V)
        stats = writer.stats()
        writer.close()
        # find the prefix: replay until the map matches (the child may have appended a few more
        # batches than the parent read before the kill)
        expected: dict[bytes, bytes] = {}
        got = list(live.items())
        found = None
        for i in range(acked + 100_000):
            for key, value in batch(i):
                if value is None:
                    expected.pop(key, None)
                else:
                    expected[key] = value
            if i >= acked and list(expected.items()) == got:
                found = i
                break
        assert found is not None, f"run {run}: the journal's map is no prefix reaching batch {acked}"
        # what an interrupted compaction left was removed by the open
        assert len(list(j.glob("*.base"))) <= 1 and not list(j.glob("*.tmp"))
        assert stats["live_keys"] == len(got)
