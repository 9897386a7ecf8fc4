"""The embedded local cluster that ``ScalerExecutor()`` starts when given no address.

One ``scaler-daemon`` process with one local worker of ``max_workers``
processors (with ``min_workers``, autoscaling: between ``min_workers`` and
``max_workers`` one-processor workers, started by the daemon as tasks queue),
over ``ipc://`` sockets in a fresh directory only this user can
enter (0700): file permissions are the authentication.

* The daemon runs in its own session (so its own process group): a Ctrl-C in
  the terminal interrupts the user's code, not the cluster.
* Its standard input is a pipe whose write end only this process holds (the
  lifeline).  When this process exits — cleanly, or by SIGKILL or the OOM
  killer — the pipe closes, the daemon stops its workers, and the worker's
  processors follow their agent.  The socket directory goes with them.
* Workers inherit this process's environment, working directory and
  ``sys.path`` (as PYTHONPATH, run with ``-P`` so that nothing is put in front
  of it), so what imports here imports there, and only that.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from scaler_executor._compat import describe_wait_status, exited_within
from scaler_executor.config import ClusterConfig

STOP_TIMEOUT = 5.0  # seconds for the daemon to stop its workers before the group is killed
# A daemon with a journal that dies is started again, but not more than MAX_RESTARTS times in
# RESTART_WINDOW seconds: one that keeps dying fails the futures with the reason instead.
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0


class EmbeddedCluster:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        processors: int,
        minimum: int | None = None,
        initializer: bytes | None = None,
        max_tasks_per_child: int | None = None,
        dashboard: str | None = None,
    ) -> None:
        """``dashboard``: HOST:PORT for ``scaler-daemon --dashboard`` (it prints the URL on stderr)."""
        _remove_stale_directories()
        self.directory = tempfile.mkdtemp(prefix=f"scaler-{os.getpid()}-")  # mode 0700; pid names the owner
        self.address = f"ipc://{self.directory}/daemon.sock"
        if minimum is None or minimum == processors:
            shape = {"workers": 1, "processors_per_worker": processors, "min_workers": None}
        else:  # autoscaling: one-processor workers, started and stopped by the daemon
            shape = {"workers": processors, "processors_per_worker": 1, "min_workers": minimum}
        self.config = config.replace(
            address=self.address,
            **shape,
            max_tasks_per_child=max_tasks_per_child,
            # A private cluster gains no workers later: a task none can satisfy fails at once.
            unsatisfiable_timeout=0.0 if config.unsatisfiable_timeout is None else config.unsatisfiable_timeout,
            security=None,  # a tcp:// daemon's key directory: this one serves an owner-only ipc socket
        )
        config_file = os.path.join(self.directory, "config.toml")
        with open(config_file, "w") as f:
            f.write(self.config.to_toml())
        command = [
            sys.executable,
            # -P: no working directory in front of sys.path. PYTHONPATH already carries this
            # process's sys.path; with the directory first, a scaler_executor folder there
            # (a source checkout of another version) would be imported instead of ours.
            "-P",
            "-m",
            "scaler_executor.cli.daemon",
            "--config",
            config_file,
            "--lifeline",
            "--workdir",
            self.directory,
        ]
        initializer_file = None
        if initializer is not None:
            initializer_file = os.path.join(self.directory, "initializer.pickle")
            with open(initializer_file, "wb") as f:
                f.write(initializer)
            command += ["--initializer", initializer_file]
        command += ["--early-workers", self._write_early_workers(initializer_file)]
        if dashboard is not None:
            command += ["--dashboard", dashboard]
        self.restarts: list[float] = []  # when the daemon was started again on its journal
        self._restart_command = list(command)
        if "--early-workers" in command:  # its workers outlive it: started once
            at = command.index("--early-workers")
            del self._restart_command[at : at + 2]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, env=_worker_environment(), start_new_session=True)
        self._stopped = False

    def restart(self, now: float) -> str | None:
        """Start the daemon again on its journal (it died); its workers wait for it and it
        keeps them.  Returns why it will not (it keeps dying), or None."""
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW]
        if len(self.restarts) >= MAX_RESTARTS:
            return (
                f"it died {len(self.restarts) + 1} times within {RESTART_WINDOW:.0f} s, each time restarted on its "
                f"journal {self.config.journal}; not restarting it again (look for the cause in its output above)"
            )
        self.restarts.append(now)
        self.process.wait()
        socket_path = self.address[len("ipc://") :]
        try:
            os.unlink(socket_path)  # left by the dead daemon: the new one binds afresh
        except FileNotFoundError:
            pass
        self.process = subprocess.Popen(
            self._restart_command, stdin=subprocess.PIPE, env=_worker_environment(), start_new_session=True
        )
        return None

    def _write_early_workers(self, initializer_file: str | None) -> str:
        """The file that lets the daemon start its first workers before its own imports.

        The command is the one the daemon's LocalWorkerManager builds from the same
        configuration (with -P, as the daemon runs); see cli/daemon.py."""
        from scaler_executor.config.schema import quoted
        from scaler_executor.worker_command import worker_command

        c = self.config
        command = worker_command(
            c,
            self.address,
            processors=c.processors_per_worker,
            workers_on_host=c.workers,
            initializer_file=initializer_file,
            max_tasks_per_child=c.max_tasks_per_child,
            safe_path=True,
        )
        count = c.workers if c.min_workers is None else c.min_workers  # LocalWorkerManager.initial_count
        path = os.path.join(self.directory, "workers.json")
        with open(path, "w", encoding="utf-8") as f:  # JSON (ASCII), written without importing json
            f.write(f'{{"command": [{", ".join(quoted(arg) for arg in command)}], "count": {int(count)}}}')
        return path

    def exit_status(self) -> str | None:
        """How the daemon ended, or None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        return describe_wait_status(-code if code < 0 else code << 8)

    def stop(self) -> None:
        """Stop the daemon and its workers; idempotent.  Kills the group if it does not stop in time."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()  # the lifeline: the daemon stops when it closes
            except OSError:
                pass
        try:
            # Not Popen.wait(timeout), which sleeps in steps of up to 50 ms: see exited_within.
            # poll() first: once reaped, its pid may be another process's.
            if self.process.poll() is None and not exited_within(
                self.process.pid, STOP_TIMEOUT, lambda: self.process.poll() is not None
            ):
                raise subprocess.TimeoutExpired(self.process.args, STOP_TIMEOUT)
            self.process.wait()
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _remove_stale_directories() -> None:
    """Remove the directories of embedded clusters whose client and daemon both died."""
    directory = tempfile.gettempdir()
    try:  # the names glob's "scaler-*-*" matches (without importing glob: the constructor runs this)
        names = [e.name for e in os.scandir(directory) if e.name.startswith("scaler-") and "-" in e.name[7:]]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        pid_text = name.split("-")[1]
        try:
            owner = os.stat(path).st_uid
        except OSError:  # removed meanwhile by its own client (or another sweep)
            continue
        if not pid_text.isdigit() or owner != os.getuid():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # its client still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        socket_path = os.path.join(path, "daemon.sock")
        if os.path.exists(socket_path) and _daemon_answers(socket_path):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _daemon_answers(socket_path: str) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(socket_path)
        except OSError:
            return False
    return True


def _worker_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}  # folded into the config file
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    return env
