"""``scaler-daemon``: the scheduler, and optionally workers on the same host.

    scaler-keys init ~/cluster-keys
    scaler-daemon --address tcp://0.0.0.0:8786 --security ~/cluster-keys --workers 4

On tcp:// it needs ``--security DIR`` (or, on a trusted network only, ``--insecure``).

Stops cleanly on SIGINT or SIGTERM (clients see their pending futures fail with
DaemonLost; local workers stop with it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scaler_executor.cli.common import (
    Parser,
    bind_failure,
    daemon_security,
    fail,
    load_config,
    setup_logging,
    tune_gc,
)
from scaler_executor.config import ClusterConfig, add_config_arguments


def _parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--lifeline", action="store_true", help=argparse.SUPPRESS)  # stop when stdin closes
    parser.add_argument("--workdir", help=argparse.SUPPRESS)  # the embedded cluster's private directory
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, ClusterConfig]:
    parser = _parser()
    args = parser.parse_args(argv)
    config = load_config(parser, args)
    if not config.address:
        fail(parser.prog, "an address is required: --address tcp://HOST:PORT or ipc:///PATH")
    if args.initializer:
        try:
            with open(args.initializer, "rb"):
                pass
        except OSError as exc:
            fail(parser.prog, f"cannot read --initializer {args.initializer}: {exc.strerror or exc}; fix the path")
    return args, config


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    setup_logging(config, "scaler-daemon")
    assert config.address is not None
    directory = daemon_security(config, config.address)
    from scaler_executor.manager.local import LocalWorkerManager

    manager = None
    ephemeral: dict[str, Any] = {}  # the local workers' keys, allowed in memory only
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
        # Start the workers before importing the daemon's own modules: their start-up
        # (an interpreter and its imports) then overlaps ours; they connect and wait.
        manager.start()
    from scaler_executor.scheduler.loop import Daemon

    security = None
    if directory is not None:
        from scaler_executor.security.server import ServerSecurity

        security = ServerSecurity(directory, ephemeral)
    try:
        daemon = Daemon(
            config, config.address, lifeline_fd=0 if args.lifeline else None, manager=manager, security=security
        )
    except Exception as exc:
        if manager is not None:
            manager.stop()
        bind_failure("scaler-daemon", config.address, exc)
        raise
    daemon.install_signal_handlers()
    tune_gc()
    try:
        return daemon.run()
    finally:
        if args.workdir:
            # The embedded cluster's directory (socket, config, initializer): gone with the
            # daemon, even when the client that made it was killed.
            import shutil

            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
