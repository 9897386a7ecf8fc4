"""``scaler-worker``: workers for a running daemon.

    scaler-worker tcp://scheduler-host:8786 --workers 2 --processors 8

Each worker is one agent process driving ``--processors`` processor children.
Stops cleanly on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from scaler_executor.cli.common import check_tcp, read_initializer, setup_logging
from scaler_executor.config import add_config_arguments, config_from_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaler-worker", description="Run scaler-executor workers for a daemon.")
    parser.add_argument("daemon", metavar="ADDRESS", help="the daemon's address, e.g. tcp://host:8786")
    parser.add_argument("--workers", type=int, default=1, help="worker agents to run (default 1)")
    parser.add_argument(
        "--processors",
        type=int,
        default=None,
        help="processor processes per worker (default: processors_per_worker from the config)",
    )
    parser.add_argument("--name", help="the worker's name in logs and task facts (default host:pid)")
    parser.add_argument("--initializer", metavar="FILE", help="cloudpickle.dumps((initializer, initargs)) file")
    parser.add_argument("--lifeline", action="store_true", help=argparse.SUPPRESS)  # stop when stdin closes
    add_config_arguments(parser, include=["heartbeat_interval", "heartbeat_liveness", "send_hwm", "log_level",
                                          "max_tasks_per_child", "allow_tcp_unauthenticated"])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    config = config_from_args(args)
    setup_logging(config, "scaler-worker")
    check_tcp(config, args.daemon)
    processors = args.processors if args.processors is not None else config.processors_per_worker
    if processors < 1 or args.workers < 1:
        parser.error("--workers and --processors must be at least 1")
    if args.workers > 1:
        return _run_several(argv or sys.argv[1:], args.workers)
    from scaler_executor.worker.agent import WorkerAgent

    agent = WorkerAgent(
        config,
        args.daemon,
        processors=processors,
        name=args.name,
        initializer=read_initializer(args.initializer),
        max_tasks_per_child=config.max_tasks_per_child,
        lifeline_fd=0 if args.lifeline else None,
    )
    agent.install_signal_handlers()
    return agent.run()


def _run_several(argv: list[str], count: int) -> int:
    """Run ``count`` single-worker processes and forward SIGINT/SIGTERM to them."""
    rest = [a for a in argv if not a.startswith("--workers")]
    if "--workers" in argv:
        i = argv.index("--workers")
        rest = argv[:i] + argv[i + 2 :]
    children = [subprocess.Popen([sys.executable, "-m", "scaler_executor.cli.worker", *rest]) for _ in range(count)]

    def forward(signum: int, frame: object) -> None:
        for child in children:
            child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    codes = [child.wait() for child in children]
    return max((abs(c) for c in codes), default=0)


if __name__ == "__main__":
    sys.exit(main())
