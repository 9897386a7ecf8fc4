"""What a configuration key is: its declaration (``_opt``: help, limits, choices, in the
field's metadata), the names and limits the keys share, and the parsers of the values that
are more than a number (addresses, resources, tags).  Nothing here knows the keys themselves:
they are :class:`~scaler_executor.config.schema.ClusterConfig`'s fields."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from scaler_executor.exceptions import ConfigError

ENV_PREFIX: Final = "SCALER_"
#: Names the TOML file when ``load()`` is given no ``file``.
CONFIG_ENV: Final = "SCALER_CONFIG"
#: Near-miss variables a parent process already warned about, comma-separated: the commands
#: set it for the workers they start, so one mistake makes one warning per command.
WARNED_ENV: Final = "SCALER_WARNED_ENV"
#: ``SCALER_*`` variables that are not config keys but that this package reads: they are
#: never taken for near-misses of a key (and a near-miss of one of them is warned about).
#: A module that reads its own ``SCALER_*`` variable adds the name here at import time
#: (``RESERVED_ENV.add("SCALER_FOO")``).
# SCALER_DEBUG_LOCKS: the lock-order checker (scaler_executor/_locks.py), on in the tests.
RESERVED_ENV: set[str] = {CONFIG_ENV, WARNED_ENV, "SCALER_DAEMON_ADDRESS", "SCALER_DEBUG_LOCKS"}
#: ``argparse`` destination of ``--config FILE``.
CONFIG_DEST: Final = "config_file"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
#: The largest integer a key may hold unless its field says less: counts travel in messages
#: as msgpack's signed 64-bit integers, and larger ones cannot be encoded.
INT_MAX: Final = 2**63 - 1
#: The largest float a key may hold unless its field says less: every float key is a time in
#: seconds, and threads wait on some of them (``threading.TIMEOUT_MAX``, about 292 years).
FLOAT_MAX: Final = threading.TIMEOUT_MAX
#: Variables that are not ours unless they are this close (edits) to one of our names.
NEAR_MISS_EDITS: Final = 2

_META: Final = "scaler_executor.config"
_T = TypeVar("_T")



@dataclass(frozen=True, slots=True)
class _Spec:
    """What a field means and which values it allows (beyond its type)."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None  # default: INT_MAX or FLOAT_MAX by the field's type
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    check: Callable[[str], str | None] | None = None  # a str value's problem, or None


def _opt(
    default: _T,
    what: str,
    tradeoff: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    check: Callable[[str], str | None] | None = None,
) -> _T:
    """A dataclass field whose help and limits live in metadata, so they exist at runtime."""
    spec = _Spec(f"{what} ({tradeoff})", ge=ge, gt=gt, le=le, choices=choices, metavar=metavar, check=check)
    return field(default=default, metadata={_META: spec})


def _address_problem(address: str) -> str | None:
    """What is wrong with a daemon address, with the fix; None if it is usable."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        if address.startswith(("/", ".")):
            return f"it has no scheme: write ipc://{address} for a Unix socket"
        return f"it has no scheme: write tcp://{address} (or ipc:///PATH for a Unix socket)"
    if scheme not in ("tcp", "ipc"):
        return f"the scheme {scheme}:// is not supported: write tcp://HOST:PORT or ipc:///PATH"
    if scheme == "ipc":
        if not rest:
            return "it names no socket path: write ipc:///PATH"
        if len(os.fsencode(rest)) > 107:  # sun_path holds 108 bytes with the terminating NUL
            return "its path is longer than the 107 bytes a Unix socket allows: choose a shorter path"
        return None
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not (port == "*" or (port.isdigit() and int(port) <= 65535)):
        return f"it needs a host and a port from 0 to 65535: write tcp://HOST:PORT, e.g. tcp://{host or rest or 'localhost'}:8786"
    return None


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) → (host, port); ValueError naming the fix."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"dashboard address {text!r} is not HOST:PORT (say 127.0.0.1:8787)")
    return host.strip("[]"), int(port)


def check_address(address: object, what: str = "address") -> str:
    """``address`` if it is ``tcp://HOST:PORT`` or ``ipc://PATH``.

    Raises TypeError for a non-string and ConfigError (a ValueError) naming ``what`` and
    the fix for anything else, such as ``localhost:8786`` without its scheme.
    """
    if not isinstance(address, str):
        raise TypeError(f"{what} must be a string such as 'tcp://host:8786', got {type(address).__name__}")
    problem = _address_problem(address)
    if problem is not None:
        raise ConfigError(f"invalid {what} {address!r}: {problem}")
    return address



def parse_resources(text: str, source: str = "worker_resources") -> dict[str, float]:
    """``'cpu=4,gpu=1,mem=16e9'`` -> ``{'cpu': 4.0, 'gpu': 1.0, 'mem': 16e9}``; ConfigError naming the bad part."""
    resources: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, quantity = part.partition("=")
        name = name.strip()
        try:
            value = float(quantity) if sep else math.nan
        except ValueError:
            value = math.nan
        if not name or not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"invalid resource {part!r} in {source}: write NAME=QUANTITY with a number >= 0, "
                "e.g. 'cpu=4,gpu=1,mem=16e9'"
            )
        if name in resources:
            raise ConfigError(f"resource {name!r} appears twice in {source}")
        resources[name] = value
    return resources


def parse_tags(text: str) -> list[str]:
    """``'linux, ssd'`` -> ``['linux', 'ssd']``."""
    return sorted({t.strip() for t in text.split(",") if t.strip()})
