"""The run's report (issue 24): ``ex.report(path)`` on an embedded cluster, opened offline in a
real headless Chromium after the cluster is gone; ``scaler-daemon --report FILE`` written when
the daemon is stopped with SIGTERM or its lifeline closes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import COMMANDS, chromium
from scaler_testing import child_env, fast_config, wait_until

from scaler_executor import ScalerExecutor
from scaler_executor.monitor import Monitor

WAIT = 60.0  # bound on any single wait on a loaded machine; never a timing assertion

pytestmark = pytest.mark.timeout(300)


def cube(x: int) -> int:
    return x * x * x


def fails_in_report(x: int) -> int:
    raise ValueError(f"report-visible <{x}> failure")


def _run_some(ex: ScalerExecutor) -> None:
    assert list(ex.map(cube, range(30))) == [x**3 for x in range(30)]
    for x in (1, 2):
        with pytest.raises(ValueError):
            ex.submit(fails_in_report, x).result(timeout=WAIT)


@pytest.mark.requires_system(commands=COMMANDS)
def test_the_report_opens_offline_after_the_cluster_is_gone(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    path = tmp_path / "run.html"
    with ScalerExecutor(2, config=fast_config()) as ex:
        _run_some(ex)
        # The worker's results reach the daemon just after the client's: the report shows
        # what the daemon knows (its history has a run per task once they are counted).
        assert wait_until(lambda: ex.statistics()["finished"] == 30 and ex.statistics()["failed"] == 2, timeout=WAIT)
        # Their runs come from the workers in bulk, within a heartbeat (docs/monitoring.rst).
        assert wait_until(lambda: ex.report(path) == str(path) and path.read_text().count('<rect class="run"') == 32, timeout=WAIT)
        assert ex.report(path) == str(path)
    assert path.stat().st_size > 0
    driver = chromium()
    try:
        driver.get(path.as_uri())
        bars = driver.find_elements(By.CSS_SELECTOR, "#stream rect.run")
        assert len(bars) == 32  # a bar per task run, the failures included
        failures = driver.find_element(By.ID, "failures").text
        assert "report-visible <1> failure" in failures and "report-visible <2> failure" in failures
        tracebacks = [pre.text for pre in driver.find_elements(By.CSS_SELECTOR, "#failures pre")]
        assert any("fails_in_report" in t and "ValueError" in t for t in tracebacks), tracebacks
        for section in ("summary", "throughput", "memory", "store", "configuration"):
            assert driver.find_element(By.ID, section).text
        assert "max_workers" in driver.find_element(By.ID, "configuration").text  # the client's
        # Self-contained: the page loaded nothing (no script, style sheet, image or font).
        resources: list[Any] = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        assert [r for r in resources if not r.startswith("data:")] == []
        assert driver.execute_script("return document.scripts.length") == 0
    finally:
        driver.quit()


def _daemon(tmp_path: Path, report: Path, *extra: str, stdin: Any = None) -> tuple[subprocess.Popen[bytes], str]:
    address = f"ipc://{tmp_path}/d.sock"
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed with the test's tmp_path
    proc = subprocess.Popen(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address, "--workers", "1",
         "--heartbeat-interval", "0.1", "--heartbeat-liveness", "50", "--report", str(report), *extra],
        env=child_env(), stdout=log, stderr=subprocess.STDOUT, stdin=stdin,
    )  # fmt: skip
    log.close()
    return proc, address


def _stop(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.mark.parametrize("how", ["sigterm", "lifeline"])
def test_the_daemon_writes_its_report_when_it_stops(tmp_path: Path, how: str) -> None:
    report = tmp_path / "daemon-report.html"
    lifeline = how == "lifeline"
    proc, address = _daemon(tmp_path, report, *(["--lifeline"] if lifeline else []), stdin=subprocess.PIPE if lifeline else None)
    try:
        with ScalerExecutor(address=address, config=fast_config()) as ex:
            _run_some(ex)
            assert wait_until(lambda: ex.statistics()["failed"] == 2, timeout=WAIT)
            # The runs reach the daemon from the worker in bulk, within a heartbeat: a report
            # written at a stop holds those the daemon had (docs/monitoring.rst).
            with Monitor(address) as monitor:
                assert wait_until(lambda: monitor.history().runs_seen == 32, timeout=WAIT)
        assert not report.exists()  # written when the daemon stops, not before
        if lifeline:
            assert proc.stdin is not None
            proc.stdin.close()  # as the embedded cluster's client does when it ends
        else:
            proc.send_signal(signal.SIGTERM)
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    page = report.read_text()
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    assert "Traceback" not in log, log
    assert page.count('<rect class="run"') == 32
    assert "report-visible &lt;1&gt; failure" in page and "fails_in_report" in page
    assert "none (written by the daemon)" in page  # no client's configuration
    assert not list(tmp_path.glob("*.tmp"))
