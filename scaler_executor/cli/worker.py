"""``scaler-worker``: workers for a running daemon.

    scaler-worker tcp://scheduler-host:8786 --workers 2 --processors 8

Each worker is one agent process driving ``--processors`` processor children.
Stops cleanly on SIGINT or SIGTERM; with ``--drain-seconds S`` a SIGTERM drains first: the
worker hands back the tasks it never started, finishes the ones it runs (at most S seconds),
then stops (a second SIGTERM, or SIGINT, stops at once).
"""

from __future__ import annotations

import argparse
import signal
import sys

from scaler_executor.cli.common import (
    Parser,
    connecting_security,
    exit_now,
    fail,
    load_config,
    read_initializer,
    setup_logging,
    tune_gc,
)
from scaler_executor.config import add_config_arguments, check_address
from scaler_executor.exceptions import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    # Not at run time: ipc:// (the embedded cluster's) needs no security, and its import
    # (hashlib's OpenSSL, tomllib: ~6 ms) delayed the worker, the last process of a cold
    # start to be ready; nor subprocess (~2 ms), used only to start several workers.
    from scaler_executor.security.client import ClientSecurity


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="scaler-worker",
        description="Run scaler-executor workers for a daemon.",
    )
    parser.add_argument("daemon", metavar="ADDRESS", help="the daemon's address, e.g. tcp://host:8786")
    parser.add_argument("--workers", type=int, default=1, help="worker agents to run (default 1)")
    parser.add_argument(
        "--processors",
        type=int,
        default=None,
        help="processor processes per worker (default: processors_per_worker from the config)",
    )
    parser.add_argument("--name", help="the worker's name in logs and task facts (default host:pid)")
    parser.add_argument(
        "--resources",
        metavar="NAME=QTY,...",
        help="resources this worker offers, e.g. cpu=4,gpu=1,mem=16e9 (default: worker_resources from "
        "the config file or SCALER_WORKER_RESOURCES)",
    )
    parser.add_argument(
        "--tags",
        metavar="TAG,...",
        help="tags this worker has, e.g. linux,ssd (default: worker_tags from the config file or SCALER_WORKER_TAGS)",
    )
    parser.add_argument(
        "--fetch-objects-over-network",
        action="store_true",
        help="read the daemon host's object store through the daemon even if this host could map it "
        "(what a worker on another host does anyway)",
    )
    parser.add_argument("--initializer", metavar="FILE", help="cloudpickle.dumps((initializer, initargs)) file")
    parser.add_argument("--lifeline", action="store_true", help=argparse.SUPPRESS)  # stop when stdin closes
    parser.add_argument("--workers-on-host", type=int, default=1, help=argparse.SUPPRESS)  # shares memory_limit=auto
    # A worker its daemon started: its own key arrives as a line on stdin (never in a file).
    parser.add_argument("--credentials-stdin", action="store_true", help=argparse.SUPPRESS)
    add_config_arguments(
        parser,
        include=[
            "heartbeat_interval",
            "heartbeat_liveness",
            "daemon_loss_timeout",
            "worker_daemon_loss_timeout",
            "drain_seconds",
            "send_hwm",
            "log_level",
            "max_tasks_per_child",
            "credentials",
            "insecure",
            "memory_limit",
            "object_store_threshold",
            "arrays_in_store",
            "capture_output_limit",
        ],
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    config = load_config(parser, args)
    try:
        check_address(args.daemon, "daemon address")
    except ConfigError as exc:
        fail(parser.prog, str(exc))
    processors = args.processors if args.processors is not None else config.processors_per_worker
    if processors < 1 or args.workers < 1:
        fail(parser.prog, "--workers and --processors must be at least 1")
    from scaler_executor.config import parse_resources, parse_tags

    try:
        resources = parse_resources(args.resources if args.resources is not None else config.worker_resources, "--resources")
    except ConfigError as exc:
        fail(parser.prog, str(exc))
    initializer = read_initializer(args.initializer, parser.prog)  # here: N workers would say it N times
    setup_logging(config, "scaler-worker")
    security: ClientSecurity | None
    if args.credentials_stdin:
        from scaler_executor.security.client import ClientSecurity
        from scaler_executor.security.keys import read_credential_line

        try:
            security = ClientSecurity(read_credential_line(0), args.daemon)
        except ConfigError as exc:
            fail(parser.prog, str(exc))
    else:
        security = connecting_security(config, args.daemon, "worker", parser.prog)
    if args.workers > 1:
        return _run_several(argv or sys.argv[1:], args.workers)
    from scaler_executor.worker.agent import WorkerAgent

    tags = parse_tags(args.tags if args.tags is not None else config.worker_tags)
    from scaler_executor.worker.memory import memory_limit

    limit = memory_limit(config.memory_limit, max(1, args.workers_on_host))

    agent = WorkerAgent(
        config,
        args.daemon,
        processors=processors,
        name=args.name,
        initializer=initializer,
        max_tasks_per_child=config.max_tasks_per_child,
        lifeline_fd=0 if args.lifeline else None,
        resources=resources,
        tags=tags,
        memory_limit=limit,
        fetch_objects=args.fetch_objects_over_network,
        security=security,
    )
    agent.install_signal_handlers()
    tune_gc()
    return agent.run()


def _run_several(argv: list[str], count: int) -> int:
    """Run ``count`` single-worker processes and forward SIGINT/SIGTERM to them."""
    rest = list(argv)
    for i, arg in enumerate(rest):
        if arg == "--workers":
            del rest[i : i + 2]
            break
        if arg.startswith("--workers="):
            del rest[i]
            break
    rest += ["--workers-on-host", str(count)]
    import subprocess

    children = [subprocess.Popen([sys.executable, "-m", "scaler_executor.cli.worker", *rest]) for _ in range(count)]

    def forward(signum: int, frame: object) -> None:
        for child in children:
            child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    codes = [child.wait() for child in children]
    return max((abs(c) for c in codes), default=0)


if __name__ == "__main__":
    exit_now(main())
