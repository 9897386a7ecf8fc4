"""``examples/gridsearch_joblib.py`` runs end to end in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("joblib")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gridsearch_joblib.py"


@pytest.mark.timeout(240)
def test_gridsearch_example() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^27 fits on scaler-executor in [\d.]+ s$", proc.stdout, re.MULTILINE), (
        proc.stdout
    )
    params = re.search(
        r"^best params: \{'C': ([\d.]+), 'gamma': ([\d.e-]+)\}$", proc.stdout, re.MULTILINE
    )
    assert params, proc.stdout
    score = re.search(r"^best score: (0\.\d{3})$", proc.stdout, re.MULTILINE)
    assert score and float(score.group(1)) > 0.9, proc.stdout
