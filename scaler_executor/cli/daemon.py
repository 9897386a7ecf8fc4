"""``scaler-daemon``: the scheduler, and optionally workers on the same host.

    scaler-keys init ~/cluster-keys
    scaler-daemon --address tcp://0.0.0.0:8786 --security ~/cluster-keys --workers 4

On tcp:// it needs ``--security DIR`` (or, on a trusted network only, ``--insecure``).

Stops cleanly on SIGINT or SIGTERM (clients see their pending futures fail with
DaemonLost; local workers stop with it).
"""

from __future__ import annotations

import sys

# Nothing heavier at module level: the embedded cluster's first workers start before the
# daemon imports its own modules (see start_early_workers).  Not even typing (with re,
# ~5 ms): with it, the workers started that much later, and a worker (its imports are
# the longer ones) is the last to be ready.
from scaler_executor.manager.process import WorkerProcess

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from scaler_executor.config import ClusterConfig

EARLY_WORKERS_FLAG = "--early-workers"
MAX_EARLY_WORKERS = 1024


def start_early_workers(argv: list[str]) -> list[WorkerProcess]:
    """Start the workers named by ``--early-workers FILE``, before any other import.

    The embedded cluster (``client/cluster.py``) writes FILE in its private directory: a
    JSON object ``{"command": [...], "count": N}``, the worker command line its
    ``LocalWorkerManager`` would build.  Started here, the workers' interpreter start and
    imports run beside the daemon's own instead of after its argument parsing and
    configuration (see docs/architecture.rst, "Cold start"); they are this process's
    children with their lifelines held here, as the manager's own workers are, and the
    manager adopts them.  A bad file starts nothing here: ``parse_args`` reports it.
    """
    try:
        path = argv[argv.index(EARLY_WORKERS_FLAG) + 1]
    except (ValueError, IndexError):
        return []
    spec = read_early_workers(path)
    if isinstance(spec, str):
        return []
    command, count = spec
    return [WorkerProcess(command) for _ in range(count)]


def read_early_workers(path: str) -> tuple[list[str], int] | str:
    """The (command, count) of an ``--early-workers`` file, or what is wrong with it."""
    import json

    try:
        with open(path, "rb") as f:
            spec = json.loads(f.read())
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    except ValueError as exc:
        return f"{path} is not JSON ({exc})"
    if not isinstance(spec, dict) or set(spec) != {"command", "count"}:
        return f'{path} must hold {{"command": [...], "count": N}}'
    command, count = spec["command"], spec["count"]
    if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
        return f"{path}: command must be a non-empty list of strings"
    if not (type(count) is int and 0 <= count <= MAX_EARLY_WORKERS):
        return f"{path}: count must be an integer from 0 to {MAX_EARLY_WORKERS}"
    return command, count


def _parser() -> argparse.ArgumentParser:
    import argparse

    from scaler_executor.cli.common import Parser
    from scaler_executor.config import add_config_arguments

    parser = Parser(
        prog="scaler-daemon",
        description="Run the scaler-executor scheduler daemon (and, with --workers, local workers).",
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--initializer",
        metavar="FILE",
        help="a file holding cloudpickle.dumps((initializer, initargs)) run in every local processor",
    )
    parser.add_argument(
        "--dashboard", metavar="HOST:PORT",
        help="serve the web dashboard and Prometheus /metrics here (off by default; a separate "
        "read-only process; its URL with the access token is printed at start)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-without-token", action="store_true",
        help="with --dashboard: serve /metrics without the token (the page still needs it)",
    )  # fmt: skip
    parser.add_argument(
        "--report", metavar="FILE",
        help="write the run's report (one self-contained HTML file: task stream, throughput, memory, "
        "failures, configuration) to FILE when the daemon stops, on SIGINT/SIGTERM or its lifeline "
        "closing; a SIGKILLed daemon writes none",
    )  # fmt: skip
    parser.add_argument(
        "--discard", action="store_true",
        help="with --journal PATH: remove that journal and the object store region it keeps for a "
        "restart (its daemon must be stopped), then exit; its pending work is given up",
    )  # fmt: skip
    parser.add_argument("--lifeline", action="store_true", help=argparse.SUPPRESS)  # stop when stdin closes
    parser.add_argument("--workdir", help=argparse.SUPPRESS)  # the embedded cluster's private directory
    # The embedded cluster's first workers, started before the daemon's imports: see start_early_workers.
    parser.add_argument(EARLY_WORKERS_FLAG, metavar="FILE", help=argparse.SUPPRESS)
    return parser


def _discard(path: str) -> int:
    """``--journal PATH --discard``: the journal and its store region go (journal_discard.py)."""
    import os

    from scaler_executor.cli.common import fail
    from scaler_executor.scheduler.journal import JournalError
    from scaler_executor.scheduler.journal_discard import discard_journal
    from scaler_executor.scheduler.loop import journal_version

    try:
        removed = discard_journal(os.path.abspath(path), package_version=journal_version())
    except JournalError as exc:
        fail("scaler-daemon", f"cannot discard the journal: {exc}")
    for line in removed:
        sys.stdout.write(f"scaler-daemon: removed {line}\n")
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, ClusterConfig]:
    from scaler_executor.cli.common import fail, load_config

    parser = _parser()
    args = parser.parse_args(argv)
    config = load_config(parser, args)
    if args.discard:
        if not config.journal:
            fail(parser.prog, "--discard needs the journal to discard: --journal PATH")
        return args, config
    if not config.address:
        fail(parser.prog, "an address is required: --address tcp://HOST:PORT or ipc:///PATH")
    if args.initializer:
        try:
            with open(args.initializer, "rb"):
                pass
        except OSError as exc:
            fail(parser.prog, f"cannot read --initializer {args.initializer}: {exc.strerror or exc}; fix the path")
    if args.dashboard is not None:
        from scaler_executor.config import parse_listen

        try:
            parse_listen(args.dashboard)
        except ValueError as exc:
            fail(parser.prog, str(exc))
    elif args.metrics_without_token:
        fail(parser.prog, "--metrics-without-token needs --dashboard HOST:PORT")
    if args.report is not None:
        import os

        args.report = os.path.abspath(args.report)
        if not os.path.isdir(os.path.dirname(args.report)):
            fail(parser.prog, f"--report {args.report}: its directory does not exist")
    if args.early_workers is not None:
        if not config.workers:
            fail(parser.prog, f"{EARLY_WORKERS_FLAG} needs local workers (--workers N)")
        spec = read_early_workers(args.early_workers)
        if isinstance(spec, str):
            fail(parser.prog, f"{EARLY_WORKERS_FLAG}: {spec}")
    return args, config


def main(argv: list[str] | None = None) -> int:
    # First of all, before the imports below: the workers' start overlaps ours.
    early = start_early_workers(sys.argv[1:] if argv is None else argv)
    args, config = parse_args(argv)
    from scaler_executor.cli.common import bind_failure, daemon_security, setup_logging, tune_gc

    setup_logging(config, "scaler-daemon")
    if args.discard:
        return _discard(config.journal or "")
    assert config.address is not None
    directory = daemon_security(config, config.address)
    ephemeral: dict[str, Any] = {}  # the local workers' and the dashboard's keys, allowed in memory only
    dashboard = None
    if args.dashboard is not None:  # first: a port that is taken stops us before anything else starts
        from scaler_executor.monitor.launch import DashboardFailed, start_dashboard

        credential = None
        if directory is not None:  # its own monitor key, handed over on its stdin
            from scaler_executor.security.keys import EphemeralKeys

            credential = EphemeralKeys(directory.daemon_keys()[0], ephemeral).issue("dashboard", "monitor")
        try:
            dashboard = start_dashboard(
                config, args.dashboard, metrics_without_token=args.metrics_without_token, credential=credential
            )
        except DashboardFailed as exc:
            from scaler_executor.cli.common import fail

            fail("scaler-daemon", str(exc))
    from scaler_executor.manager.local import LocalWorkerManager

    manager = None
    keys = None
    if directory is not None and config.workers:
        from scaler_executor.security.keys import EphemeralKeys

        keys = EphemeralKeys(directory.daemon_keys()[0], ephemeral)
    if config.workers:
        manager = LocalWorkerManager(
            config,
            config.address,
            count=config.workers,
            processors=config.processors_per_worker,
            minimum=config.min_workers,
            initializer_file=args.initializer,
            max_tasks_per_child=config.max_tasks_per_child,
            keys=keys,
        )
        # Early workers (the embedded cluster's, ipc:// only: they need no key) are adopted;
        # the others start before the daemon's own modules are imported, so their start-up
        # (an interpreter and its imports) overlaps ours; they connect and wait.
        manager.adopt(early)
        if not config.journal:  # with one, after the journal named the workers still running
            manager.start()
    from scaler_executor.scheduler.loop import Daemon

    security = None
    if directory is not None:
        from scaler_executor.security.server import ServerSecurity

        security = ServerSecurity(directory, ephemeral)
    try:
        daemon = Daemon(
            config, config.address, lifeline_fd=0 if args.lifeline else None, manager=manager, security=security,
            report=args.report,
        )
    except Exception as exc:
        if manager is not None:
            manager.stop()
        if dashboard is not None:
            dashboard.stop()
        from scaler_executor.scheduler.journal import JournalError

        if isinstance(exc, JournalError):  # its message names the journal and the fix
            from scaler_executor.cli.common import fail
            from scaler_executor.scheduler.journal import JournalLocked

            way_out = "" if isinstance(exc, JournalLocked) else (
                f"; or give up its work and free the store region it keeps: scaler-daemon --journal {config.journal} --discard"
            )
            fail("scaler-daemon", f"cannot use the journal: {exc}{way_out}")
        bind_failure("scaler-daemon", config.address, exc)
        raise
    if manager is not None and config.journal:
        adopted = manager.adopt_running(daemon.restored_local_pids())
        if adopted:
            import logging

            logging.getLogger("scaler_executor.daemon").warning(
                "daemon: kept %d local worker(s) of its previous run (restarted on its journal)", adopted
            )
        manager.start()
    daemon.install_signal_handlers()
    tune_gc()
    try:
        return daemon.run()
    finally:
        if dashboard is not None:
            dashboard.stop()
        if args.workdir:
            # The embedded cluster's directory (socket, config, initializer): gone with the
            # daemon, even when the client that made it was killed.
            import shutil

            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    _code = main()
    from scaler_executor.cli.common import exit_now

    exit_now(_code)
