"""What the command-line programs share: logging set-up and security on tcp://."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import ConfigError

if TYPE_CHECKING:
    from scaler_executor.security.client import ClientSecurity
    from scaler_executor.security.keys import SecurityDir

log = logging.getLogger("scaler_executor")


def setup_logging(config: ClusterConfig, role: str) -> None:
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def daemon_security(config: ClusterConfig, address: str) -> SecurityDir | None:
    """The daemon's security directory for ``address`` (None: ipc://, or --insecure, which
    warns); exits with the reason when tcp:// has neither."""
    from scaler_executor.security import for_daemon

    try:
        return for_daemon(config, address)
    except ConfigError as exc:
        raise SystemExit(f"scaler-daemon: {exc}") from None


def connecting_security(config: ClusterConfig, address: str, role: str, program: str) -> ClientSecurity | None:
    """CURVE for a command connecting to ``address`` as ``role``; exits with the reason when
    tcp:// has neither a credential nor --insecure."""
    from scaler_executor.security import for_connecting

    try:
        return for_connecting(config, address, role)
    except ConfigError as exc:
        raise SystemExit(f"{program}: {exc}") from None


def read_initializer(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def tune_gc() -> None:
    """Garbage collection for a long-lived daemon or agent holding many records.

    What was imported at start-up is frozen out of every collection, and full collections
    become rare: the records these processes keep (tasks, workers) form no cycles, and a
    full pass over a million of them stalls the process for seconds — long enough for its
    peers to declare it dead. No collection first: after the imports it took ~17 ms (on the
    cold start's path, in the daemon and in each worker) to free a few dozen objects.
    """
    import gc

    gc.freeze()
    gc.set_threshold(20_000, 50, 1_000)
