"""``scaler-worker-manager``'s bad input: one clear line naming the problem and the fix."""

from __future__ import annotations

import pytest
from scaler_testing import wait_until

from scaler_executor.cli.manager import main
from scaler_executor.manager.adapter import (
    ADAPTERS,
    AdapterSetup,
    CapacityAdapter,
    WorkerTemplate,
    is_worker_of,
    new_boot,
    worker_name,
)
from scaler_executor.manager.local_adapter import LocalAdapter


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--max-workers", "0"], "--max-workers 0 --min-workers 0: need 0 <= min <= max and max >= 1"),
        (["--max-workers", "2", "--min-workers", "3"], "need 0 <= min <= max"),
        (["--max-workers", "2", "--processors", "0"], "--processors 0: a worker needs at least 1"),
        (["--max-workers", "2", "--resources", "gpu"], "--resources"),
        (["--max-workers", "2", "--name", "two words"], "give a short name without spaces"),
        (["--max-workers", "2", "--local-startup-seconds", "-1"], "--local-startup-seconds -1 is negative"),
    ],
)
def test_bad_options_are_named(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tcp://127.0.0.1:1", "--adapter", "local", "--insecure", *argv])
    assert expected in str(exc.value.code) + capsys.readouterr().err


def test_tcp_without_a_credential_says_how_to_get_a_manager_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tcp://127.0.0.1:1", "--adapter", "local", "--max-workers", "1"])
    assert exc.value.code == 2  # a user error: one line on stderr (cli/common.py's fail)
    assert "--role manager" in capsys.readouterr().err


def test_the_local_adapter_follows_the_contract() -> None:
    adapter = LocalAdapter(AdapterSetup("m-", 2, WorkerTemplate(1)))
    assert isinstance(adapter, CapacityAdapter)
    assert adapter.info().kind == "local" and adapter.info().max_workers == 2
    assert adapter.poll() == [] and adapter.adopt() == []
    adapter.shutdown()
    assert set(ADAPTERS) >= {"local", "slurm"}


def test_is_worker_of_matches_whole_names_only() -> None:
    boot = new_boot()
    assert is_worker_of("pool-", worker_name("pool-", boot, 7))
    assert not is_worker_of("pool-", worker_name("pool-gpu-", boot, 7))
    assert not is_worker_of("pool-", "pool-" + boot)
    assert not is_worker_of("pool-", worker_name("pool-", boot, 7) + "x")


def test_a_restarted_local_manager_stops_only_its_own_leftover_workers() -> None:
    """Workers a previous run left (found by their command line) are stopped only when their
    whole name is this manager's: ``pool``'s restart must not stop ``pool-gpu``'s worker."""
    import subprocess
    import sys

    def fake_worker(name: str) -> subprocess.Popen[bytes]:  # a command line like a worker's
        return subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)", "scaler_executor.cli.worker", "--name", name]
        )

    boot = new_boot()
    ours, neighbour = fake_worker(worker_name("pool-", boot, 1)), fake_worker(worker_name("pool-gpu-", boot, 1))
    try:
        import psutil

        def started(p: subprocess.Popen[bytes]) -> bool:
            try:
                return "--name" in psutil.Process(p.pid).cmdline()
            except psutil.Error:
                return False

        assert wait_until(lambda: started(ours) and started(neighbour), timeout=30)
        adapter = LocalAdapter(AdapterSetup("pool-", 2, WorkerTemplate(1)))
        reports = adapter.adopt()
        assert [r.name for r in reports] == [worker_name("pool-", boot, 1)]
        assert ours.wait(30) is not None
        assert neighbour.poll() is None, "the neighbour manager's worker was stopped"
    finally:
        for p in (ours, neighbour):
            p.kill()
            p.wait()
