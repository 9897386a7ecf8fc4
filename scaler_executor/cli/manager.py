"""``scaler-worker-manager``: workers for a daemon, started and stopped on its decisions.

    scaler-worker-manager tcp://scheduler:8786 --credentials manager.cred \\
        --adapter local --max-workers 8 --processors 4 --resources gpu=1

It connects with the ``manager`` role (``scaler-keys issue DIR NAME --role manager``),
offers what its workers bring, and starts and stops them through the adapter
(docs/managers.rst). Each worker gets its own short-lived key from this manager; no
credential file is shared among workers. Stops its workers and itself on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import socket
import sys
from typing import TYPE_CHECKING, cast

from scaler_executor.cli.common import connecting_security, setup_logging
from scaler_executor.config import add_config_arguments, config_from_args

if TYPE_CHECKING:
    from scaler_executor.manager.adapter import AdapterModule


def _parser(adapter: str | None) -> argparse.ArgumentParser:
    from scaler_executor.manager.adapter import ADAPTERS

    parser = argparse.ArgumentParser(
        prog="scaler-worker-manager", description="Start and stop scaler-executor workers on a daemon's scaling decisions."
    )
    parser.add_argument("daemon", metavar="ADDRESS", help="the daemon's address, e.g. tcp://host:8786")
    parser.add_argument("--adapter", required=True, choices=sorted(ADAPTERS), help="where the workers run")
    parser.add_argument("--max-workers", dest="most", type=int, required=True, metavar="N", help="the most workers it runs at once")
    parser.add_argument("--min-workers", dest="fewest", type=int, default=0, metavar="N", help="workers kept even when idle (default 0)")
    parser.add_argument(
        "--name",
        help="this manager's name; its workers' names start with it (default: manager-HOST; unique per daemon)",
    )
    parser.add_argument(
        "--processors", type=int, default=None, help="processors per worker (default: processors_per_worker from the config)"
    )
    parser.add_argument("--resources", metavar="NAME=QTY,...", help="resources each worker offers, e.g. gpu=1 (default: worker_resources)")
    parser.add_argument("--tags", metavar="TAG,...", help="tags each worker has (default: worker_tags)")
    add_config_arguments(
        parser,
        include=["heartbeat_interval", "heartbeat_liveness", "daemon_loss_timeout", "send_hwm", "log_level", "credentials", "insecure", "worker_resources", "worker_tags", "processors_per_worker"],
    )  # fmt: skip
    if adapter in ADAPTERS:
        module = _adapter_module(parser, adapter)
        module.add_arguments(parser)
    return parser


def _adapter_module(parser: argparse.ArgumentParser, adapter: str) -> AdapterModule:
    from scaler_executor.manager.adapter import ADAPTERS

    try:
        return cast("AdapterModule", importlib.import_module(ADAPTERS[adapter]))
    except ImportError as exc:
        parser.error(f"--adapter {adapter}: its module {ADAPTERS[adapter]} cannot be imported ({exc}); install a build that has it")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The adapter's own options join the parser, so look at --adapter first.
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--adapter")
    known, _ = pre.parse_known_args(argv)
    parser = _parser(known.adapter)
    args = parser.parse_args(argv)
    config = config_from_args(args)
    setup_logging(config, "scaler-worker-manager")

    from scaler_executor.config import parse_resources, parse_tags
    from scaler_executor.exceptions import ConfigError
    from scaler_executor.manager.adapter import (
        AdapterError,
        AdapterSetup,
        WorkerTemplate,
        cluster_id,
    )

    processors = args.processors if args.processors is not None else config.processors_per_worker
    if processors < 1:
        parser.error(f"--processors {processors}: a worker needs at least 1")
    if args.most < 1 or not 0 <= args.fewest <= args.most:
        parser.error(f"--max-workers {args.most} --min-workers {args.fewest}: need 0 <= min <= max and max >= 1")
    try:
        resources = parse_resources(args.resources if args.resources is not None else config.worker_resources, "--resources")
    except ConfigError as exc:
        parser.error(str(exc))
    tags = frozenset(parse_tags(args.tags if args.tags is not None else config.worker_tags))
    name = args.name or f"manager-{socket.gethostname()}"
    if not name or len(name) > 100 or any(c.isspace() for c in name):
        parser.error(f"--name {name!r}: give a short name without spaces")
    template = WorkerTemplate(processors, resources, tags)
    # Before the adapter: the cluster's id comes from the daemon's key in the credential (and
    # --print-job-script shows the job names of the run this command line would start).
    security = connecting_security(config, args.daemon, "manager", "scaler-worker-manager")
    cluster = cluster_id(args.daemon, security.credential.daemon_public_key if security is not None else "")
    module = _adapter_module(parser, args.adapter)
    try:
        adapter = module.from_args(args, AdapterSetup(name + "-", args.most, template, cluster))
    except AdapterError as exc:
        raise SystemExit(f"scaler-worker-manager: {exc}") from None

    from scaler_executor.manager.runner import WorkerManager

    manager = WorkerManager(config, args.daemon, adapter, template, name=name, min_workers=args.fewest, security=security)
    manager.install_signal_handlers()
    return manager.run()


if __name__ == "__main__":
    sys.exit(main())
