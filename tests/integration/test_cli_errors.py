"""User errors end ``scaler-daemon`` and ``scaler-worker`` with one line naming the fix, and
unrelated ``SCALER_*`` variables never stop them: the commands run as real subprocesses
(their installed console scripts), a real socket holds the port they are refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from scaler_testing import child_env, wait_until

from scaler_executor import ClusterConfig, ScalerExecutor

BIN = os.path.dirname(sys.executable)
DAEMON = os.path.join(BIN, "scaler-daemon")
WORKER = os.path.join(BIN, "scaler-worker")
TOLERANT = ClusterConfig(heartbeat_interval=0.1, heartbeat_liveness=50, daemon_loss_timeout=10.0)

pytestmark = pytest.mark.timeout(120)


def run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), env={**child_env(), **(env or {})}, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def one_line_failure(proc: subprocess.CompletedProcess[str], status: int, prog: str) -> str:
    """The single stderr line of a command that failed with ``status``, checked for shape."""
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    return lines[0]


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sxcli-"))
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


# ---------------------------------------------------------------------- addresses


def test_worker_address_without_scheme() -> None:
    line = one_line_failure(run(WORKER, "localhost:8786"), 2, "scaler-worker")
    assert "invalid daemon address 'localhost:8786': it has no scheme: write tcp://localhost:8786" in line


def test_daemon_address_without_scheme() -> None:
    line = one_line_failure(run(DAEMON, "--address", "localhost:8786"), 2, "scaler-daemon")
    assert "invalid address='localhost:8786' (from CLI flag --address): it has no scheme: write tcp://localhost:8786" in line
    line = one_line_failure(run(DAEMON, env={"SCALER_ADDRESS": "localhost:8786"}), 2, "scaler-daemon")
    assert "(from environment variable SCALER_ADDRESS)" in line


def test_daemon_without_an_address() -> None:
    line = one_line_failure(run(DAEMON), 2, "scaler-daemon")
    assert "an address is required: --address tcp://HOST:PORT or ipc:///PATH" in line


# ---------------------------------------------------------------------- the port is taken


def test_daemon_on_a_tcp_port_in_use() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = run(DAEMON, "--address", f"tcp://127.0.0.1:{port}", "--insecure", "--log-level", "ERROR", "--workers", "1")
    line = one_line_failure(proc, 1, "scaler-daemon")
    assert f"cannot listen on tcp://127.0.0.1:{port}: the address is already in use;" in line
    assert "choose another port in --address" in line


def test_daemon_on_an_ipc_path_in_use(workdir: Path) -> None:
    path = str(workdir / "d.sock")
    with socket.socket(socket.AF_UNIX) as holder:
        holder.bind(path)
        holder.listen()
        proc = run(DAEMON, "--address", f"ipc://{path}")
    line = one_line_failure(proc, 1, "scaler-daemon")
    assert f"cannot listen on ipc://{path}: the address is already in use;" in line
    assert f"remove {path} if none runs" in line


def test_daemon_in_a_directory_that_does_not_exist(workdir: Path) -> None:
    path = str(workdir / "missing" / "d.sock")
    line = one_line_failure(run(DAEMON, "--address", f"ipc://{path}"), 1, "scaler-daemon")
    assert f"cannot listen on ipc://{path}: No such file or directory;" in line


# ---------------------------------------------------------------------- unreadable configuration


@pytest.mark.parametrize("prog", [DAEMON, WORKER])
def test_unreadable_config_files(workdir: Path, prog: str) -> None:
    name = os.path.basename(prog)
    address = ["--address", f"ipc://{workdir}/d.sock"] if prog == DAEMON else [f"ipc://{workdir}/d.sock"]
    binary = workdir / "binary.toml"
    binary.write_bytes(b"\x00\xff\xfe\x89PNG")
    line = one_line_failure(run(prog, *address, "--config", str(binary)), 2, name)
    assert f"config file {binary} is not a text file" in line
    line = one_line_failure(run(prog, *address, env={"SCALER_CONFIG": str(binary)}), 2, name)
    assert f"config file {binary} (named by SCALER_CONFIG) is not a text file" in line

    broken = workdir / "broken.toml"
    broken.write_text("workers = 1\nlog_level = \n")
    line = one_line_failure(run(prog, *address, "--config", str(broken)), 2, name)
    assert f"config file {broken} is not valid TOML:" in line and "line 2" in line

    missing = workdir / "missing.toml"
    line = one_line_failure(run(prog, *address, "--config", str(missing)), 2, name)
    assert f"config file {missing} does not exist" in line


@pytest.mark.parametrize("prog", [DAEMON, WORKER])
def test_bad_values_from_the_environment_and_flags(workdir: Path, prog: str) -> None:
    name = os.path.basename(prog)
    address = ["--address", f"ipc://{workdir}/d.sock"] if prog == DAEMON else [f"ipc://{workdir}/d.sock"]
    line = one_line_failure(run(prog, *address, env={"SCALER_HEARTBEAT_LIVENESS": str(10**30)}), 2, name)
    assert "invalid heartbeat_liveness=1000000000000000000000000000000 (from environment variable SCALER_HEARTBEAT_LIVENESS)" in line
    assert "<= 9223372036854775807" in line
    line = one_line_failure(run(prog, *address, "--send-hwm", str(2**31)), 2, name)
    assert line == (
        f"{name}: error: argument --send-hwm: invalid send_hwm=2147483648 (from CLI flag --send-hwm):"
        " must be an integer >= 1 and <= 2147483647 (--help lists every flag)"
    )


def test_worker_bad_resources_and_initializer(workdir: Path) -> None:
    address = f"ipc://{workdir}/d.sock"
    line = one_line_failure(run(WORKER, address, "--resources", "gpu=lots"), 2, "scaler-worker")
    assert "invalid resource 'gpu=lots' in --resources" in line
    line = one_line_failure(run(WORKER, address, "--initializer", str(workdir / "nope.pkl")), 2, "scaler-worker")
    assert f"cannot read --initializer {workdir / 'nope.pkl'}: No such file or directory" in line


def test_daemon_missing_initializer(workdir: Path) -> None:
    proc = run(DAEMON, "--address", f"ipc://{workdir}/d.sock", "--initializer", str(workdir / "nope.pkl"))
    line = one_line_failure(proc, 2, "scaler-daemon")
    assert f"cannot read --initializer {workdir / 'nope.pkl'}" in line


# ---------------------------------------------------------------------- one spelling per flag


@pytest.mark.parametrize("flag", ["--worker-resources", "--worker-tags", "--res", "--tag"])
def test_worker_has_one_spelling_per_flag(flag: str) -> None:
    line = one_line_failure(run(WORKER, "ipc:///nonexistent/d.sock", flag, "x"), 2, "scaler-worker")
    assert line == f"scaler-worker: error: unrecognized arguments: {flag} x (--help lists every flag)"


def test_no_command_has_two_flags_for_one_setting() -> None:
    from scaler_executor.cli import daemon, worker

    for name, parser in (("scaler-daemon", daemon._parser()), ("scaler-worker", worker._parser())):
        flags_of: dict[str, list[str]] = {}
        for action in parser._actions:
            flags_of.setdefault(action.dest, []).extend(f for f in action.option_strings if not f.startswith("--no-"))
        doubles = {dest: flags for dest, flags in flags_of.items() if len(flags) > 1 and dest != "help"}
        assert not doubles, (name, doubles)
    text = worker._parser().format_help()
    assert "--resources" in text and "--tags" in text
    assert "--worker-resources" not in text and "--worker-tags" not in text


# ---------------------------------------------------------------------- the environment


NOISE = {"SCALER_HOME": "/x", "SCALER_VERSION": "2", "SCALER_MAX_RETRY": "9"}
NEAR_MISS = "ignoring environment variable SCALER_MAX_RETRY: it names no config key; did you mean SCALER_MAX_RETRIES?"


def test_daemon_and_worker_start_among_unrelated_variables(workdir: Path) -> None:
    """Both commands start with SCALER_HOME & co. set, warn once each about the near-miss (the
    workers each starts do not repeat it), and run tasks."""
    sock = workdir / "d.sock"
    address = f"ipc://{sock}"
    flags = ["--heartbeat-interval", "0.1", "--heartbeat-liveness", "50"]
    env = {**child_env(), **NOISE}
    logs = {name: open(workdir / f"{name}.err", "w+") for name in ("daemon", "worker")}  # noqa: SIM115 - closed below
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            subprocess.Popen([DAEMON, "--address", address, "--workers", "1", *flags], env=env, stderr=logs["daemon"])
        )
        assert wait_until(lambda: sock.exists() or procs[0].poll() is not None, timeout=60)
        assert procs[0].poll() is None, "the daemon exited"
        procs.append(  # two agents: the children of a scaler-worker do not repeat its warning either
            subprocess.Popen([WORKER, address, "--workers", "2", "--tags", "extra", *flags], env=env, stderr=logs["worker"])
        )
        with ScalerExecutor(address=address, config=TOLERANT) as ex:
            assert ex.options(tags={"extra"}).submit(pow, 2, 5).result(timeout=60) == 32  # the scaler-worker's
            assert ex.submit(pow, 3, 2).result(timeout=60) == 9
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        texts = {}
        for name, handle in logs.items():
            handle.seek(0)
            texts[name] = handle.read()
            handle.close()
    for name, prog in (("daemon", "scaler-daemon"), ("worker", "scaler-worker")):
        text = texts[name]
        assert text.count(NEAR_MISS) == 1, text
        assert f"{prog}: warning: {NEAR_MISS}" in text
        assert "SCALER_HOME" not in text and "SCALER_VERSION" not in text and "Traceback" not in text, text


EXECUTOR_SCRIPT = """
from scaler_executor import ScalerExecutor
with ScalerExecutor(max_workers=1) as ex:
    print(ex.submit(pow, 2, 5).result(timeout=60))
try:
    ScalerExecutor(address="localhost:8786")
except ValueError as exc:
    print(type(exc).__name__, exc)
"""


def test_executor_starts_among_unrelated_variables(workdir: Path) -> None:
    proc = run(sys.executable, "-c", EXECUTOR_SCRIPT, env=NOISE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "32",
        ("ConfigError invalid address 'localhost:8786': it has no scheme: write tcp://localhost:8786"
        " (or ipc:///PATH for a Unix socket)"),
    ]
    assert proc.stderr.count(NEAR_MISS) == 1, proc.stderr  # a warning, once, from the client alone
    assert "ConfigWarning" in proc.stderr and "SCALER_HOME" not in proc.stderr


CONFIG_SCRIPT = """
from scaler_executor import ScalerExecutor
try:
    ScalerExecutor(max_workers=1)
except ValueError as exc:
    print(type(exc).__name__, exc)
"""


def test_executor_with_an_unreadable_config_file(workdir: Path) -> None:
    binary = workdir / "scaler.toml"
    binary.write_bytes(b"\x00\xff\xfe")
    proc = run(sys.executable, "-c", CONFIG_SCRIPT, env={"SCALER_CONFIG": str(binary)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        (f"ConfigError config file {binary} (named by SCALER_CONFIG) is not a text file (byte 1 is not UTF-8):"
        " a config file is UTF-8 TOML text such as 'workers = 4'; name that file instead")
    ]
    assert proc.stderr == ""
