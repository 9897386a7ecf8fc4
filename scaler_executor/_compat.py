"""Small facts every process needs at start-up, kept free of heavy imports."""

from __future__ import annotations

import platform


def python_version() -> str:
    """'3.11': the part of the version that must match for pickles to travel."""
    return ".".join(platform.python_version_tuple()[:2])


# Set by worker agents for the processes that run tasks: the daemon that get_executor() joins.
DAEMON_ADDRESS_ENV = "SCALER_DAEMON_ADDRESS"
