"""``scaler-worker-manager``'s bad input: one clear line naming the problem and the fix."""

from __future__ import annotations

import pytest

from scaler_executor.cli.manager import main
from scaler_executor.manager.adapter import ADAPTERS, AdapterSetup, CapacityAdapter, WorkerTemplate
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
