"""requires_system: a missing system part skips outside CI and fails under CI=true."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from scaler_testing import TESTS, child_env, missing_system

BODY = textwrap.dedent(
    """
    import pytest

    @pytest.mark.requires_system(commands=("scaler-no-such-command",))
    def test_needs_it():
        pass
    """
)


def _run(tmp_path, ci: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_needs.py"
    test.write_text(BODY)
    env = child_env()
    env["CI"] = ci
    # The suite's own conftest (which defines the marker) through -p and rootdir: the test file
    # lives in a temporary directory so that only it runs.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--confcutdir", TESTS,
         "--rootdir", TESTS, "-c", "/dev/null", "-p", "conftest", str(test)],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=60,
    )


def test_missing_command_named() -> None:
    assert missing_system(("scaler-no-such-command",)) == (
        "needs scaler-no-such-command on PATH (install the packages .ci/system-deps lists)"
    )
    assert missing_system(("sh",)) is None


def test_skips_outside_ci(tmp_path) -> None:
    run = _run(tmp_path, "")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 skipped" in run.stdout and "scaler-no-such-command" in run.stdout, run.stdout


def test_fails_under_ci(tmp_path) -> None:
    run = _run(tmp_path, "true")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 error" in run.stdout and "CI=true and a system part is missing" in run.stdout, run.stdout
