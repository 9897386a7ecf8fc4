"""The benchmarks still run: they are not part of the suite's timing, but they must not rot.

``bench/test_micro.py`` (pytest-benchmark) runs with timing disabled, so each hot path is
exercised once with its own assertions; ``bench/compare.py --quick`` runs two workloads for
ScalerExecutor alone and must print its table, and so must ``bench/graph_scale.py --quick``
(10^3-node graphs), and ``bench/monitoring_cost.py`` its verdicts.  Figures are never
asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.mark.timeout(180)
def test_micro_benchmarks_run() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "bench/test_micro.py", "-q", "-p", "no:cacheprovider", "--benchmark-disable"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


@pytest.mark.timeout(180)
def test_compare_quick_run_prints_its_table() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/compare.py", "--quick", "--only", "noop_submit,round_trip", "--contestants", "scaler"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("throughput (tasks/s)", "median (ms)"):
        assert row in proc.stdout, proc.stdout


@pytest.mark.timeout(180)
def test_graph_scale_quick_run_prints_its_table() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/graph_scale.py", "--quick"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("nodes/s of daemon CPU", "tree", "shuffle"):
        assert row in proc.stdout, proc.stdout


@pytest.mark.timeout(240)
def test_monitoring_cost_prints_a_verdict_per_goal() -> None:
    """Two short rounds of each goal's A/B (a verdict from two rounds means nothing: only
    that the bench runs, its daemons and pollers start and stop, and it says its verdicts)."""
    proc = subprocess.run(
        [sys.executable, "bench/monitoring_cost.py", "--rounds", "2", "--blocks", "1", "--seconds", "0.3"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=230,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("VERDICT ")]
    assert [line.split()[1] for line in verdicts] == ["recorder", "dashboards"], proc.stdout
    for line in verdicts:
        assert any(f": {word}" in line for word in ("met", "not met", "undecided")), line
