"""The wire form of captured output and the note a failure gets (protocol/output.py),
and the processor's bounded read of a capture file (worker/capture.py), on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scaler_executor.protocol import output
from scaler_executor.worker import capture


def test_round_trip() -> None:
    logs = [[1.5, "WARNING", "a.b", "message"]]
    assert output.decode(output.encode("out", "err", logs)) == ("out", "err", ((1.5, "WARNING", "a.b", "message"),))


def test_tail_note_names_the_streams_and_keeps_the_last_lines() -> None:
    text = "".join(f"l{i}\n" for i in range(30))
    note = output.tail_note(text, "")
    assert note.startswith("the task's stdout ended with:\n")
    assert "    l29" in note and "    l10" in note and "l9\n" not in note
    assert "stderr" not in note
    assert output.tail_note("", " \n") == ""


def test_read_files_bounds_and_removes(tmp_path: Path) -> None:
    pid = 424242
    (tmp_path / f"{pid}.1").write_bytes(b"a" * 60 + b"b" * 60)
    (tmp_path / f"{pid}.2").write_bytes(b"\xff tail")  # not UTF-8: replaced, not an error
    stdout, stderr, logs = output.decode(capture.read_files(str(tmp_path), pid, 40))
    assert stdout == "a" * 20 + "\n[scaler-executor: 80 bytes of output left out here; capture_output_limit is 40 bytes]\n" + "b" * 20
    assert stderr.startswith("\ufffd tail") and "died" in stderr
    assert logs == ()
    assert os.listdir(tmp_path) == []
    assert capture.read_files(str(tmp_path), pid, 40) == b""  # none (any more): nothing


def test_forwarder_prefixes_lines_and_bounds_their_rate(capsys: pytest.CaptureFixture[str]) -> None:
    from scaler_executor.client.forward import Forwarder

    now = [100.0]
    fwd = Forwarder(rate=100.0, clock=lambda: now[0])
    fwd.forward("host:1", 0x10, "a\nb\n", "e\n")
    out, err = capsys.readouterr()
    assert out == "[worker host:1 task 0x10] a\n[worker host:1 task 0x10] b\n"
    assert err == "[worker host:1 task 0x10] e\n"
    # 28 bytes a line: the 100-byte bucket has 16 left, so all five lines are dropped ...
    fwd.forward("host:1", 0x11, "x\n" * 5, "")
    assert capsys.readouterr() == ("", "")
    now[0] += 1.0  # ... and a second refills it: one line says so, then the next fit
    fwd.forward("host:1", 0x12, "y\ny\n", "")
    out, _ = capsys.readouterr()
    assert out.splitlines() == [
        "[scaler-executor: 5 lines of forwarded task output dropped (forward_output_rate)]",
        "[worker host:1 task 0x12] y",
        "[worker host:1 task 0x12] y",
    ]
