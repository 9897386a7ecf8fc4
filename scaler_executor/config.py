"""Cluster configuration: one typed, frozen :class:`ClusterConfig`.

Where a value comes from, highest layer first (each layer overrides the ones below)::

    CLI flags       --heartbeat-interval 1.0              config_from_args(), load(cli=...)
    environment     SCALER_HEARTBEAT_INTERVAL=1.0         load(env=...), default os.environ
    TOML file       heartbeat_interval = 1.0              load(file=...), else $SCALER_CONFIG
    base            the field defaults, or load(base=...)

The TOML file holds the keys at its top level (a ``[scaler]`` table is rejected with a
message saying so: the file is ours alone, so a namespace would only be a second way to
write the same thing).  TOML has no null, so the string ``"none"`` unsets an optional key.

Unknown keys are errors in the file and CLI layers, with the closest valid key suggested.
The environment is shared with everything else the user runs, and ``SCALER_`` is a generic
prefix (shells, CI systems and other tools, the reference Scaler system among them, set such
variables), so a ``SCALER_*`` variable that names no key is ignored; only a near-miss of one
of our names (within two edits of it or of its singular, e.g. ``SCALER_MAX_RETRY``) gets a
:class:`~scaler_executor.exceptions.ConfigWarning` with the suggestion, once per variable,
also logged where logging is set up.  Names in :data:`RESERVED_ENV` are read by other parts
of the package and never warned about.  Every value is checked in the layer it
came from, against its type and range, so a bad value is reported with its file, variable or
flag even when a higher layer overrides it; cross-field rules run on the merged result.

Adding a field is one line in :class:`ClusterConfig`: its flag, environment variable,
parsing, validation, help text and TOML output all derive from ``dataclasses.fields`` and
the field's metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import threading
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from scaler_executor.exceptions import ConfigError, ConfigWarning
from scaler_executor.sizes import parse_size

__all__ = [
    "CONFIG_DEST",
    "CONFIG_ENV",
    "ENV_PREFIX",
    "FLOAT_MAX",
    "INT_MAX",
    "LOG_LEVELS",
    "NEAR_MISS_EDITS",
    "RESERVED_ENV",
    "WARNED_ENV",
    "ClusterConfig",
    "add_config_arguments",
    "check_address",
    "config_from_args",
    "parse_resources",
    "parse_tags",
    "warned_env",
]

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

log = logging.getLogger(__name__)

_META: Final = "scaler_executor.config"
_TRUE: Final = frozenset({"1", "true", "yes"})
_FALSE: Final = frozenset({"0", "false", "no"})
_NONE: Final = frozenset({"", "none"})
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """Every tunable of a cluster, validated on construction.

    Build one with :meth:`load` (file, environment and CLI layers), :meth:`from_dict` or the
    constructor; derive variants with :meth:`replace`.  Invalid values raise
    :class:`~scaler_executor.exceptions.ConfigError` naming the key, the value, what is
    allowed and, when known, where the value came from.  Keyword-only, so adding a field
    never shifts positional arguments.
    """

    address: str | None = _opt(
        None,
        "the daemon's address, tcp://host:port or ipc:///path",
        "ipc is faster but reaches the same host only",
        metavar="ADDRESS",
        check=_address_problem,
    )
    workers: int = _opt(
        0,
        "local worker processes the daemon starts itself, 0 = none",
        "each costs a process and its memory; remote workers may join anyway",
        ge=0,
    )
    min_workers: int | None = _opt(
        None,
        "autoscaling: the fewest local workers the daemon keeps (up to `workers` under load), none = always `workers`",
        "0 frees every process when idle, at the cost of a start-up when work arrives",
        ge=0,
    )
    scale_down_idle: float = _opt(
        5.0,
        "autoscaling: seconds a worker stays idle before it is stopped",
        "lower frees resources sooner, higher avoids restarting workers between bursts",
        ge=0,
        metavar="SECONDS",
    )
    processors_per_worker: int = _opt(
        1,
        "processor child processes per worker, each running one task at a time",
        "more share one worker's connection and queue; each costs a process",
        ge=1,
    )
    heartbeat_interval: float = _opt(
        0.5,
        "seconds of silence after which a peer sends a heartbeat",
        "lower detects deaths sooner but costs idle traffic",
        gt=0,
        metavar="SECONDS",
    )
    heartbeat_liveness: int = _opt(
        10,
        "intervals without any message after which a peer is declared dead",
        "higher rides out pauses such as swapping but detects deaths later",
        ge=2,
    )
    daemon_loss_timeout: float = _opt(
        15.0,
        "seconds of daemon silence after which a client fails pending futures with DaemonLost",
        "lower fails fast, higher rides out daemon stalls",
        gt=0,
        metavar="SECONDS",
    )
    worker_daemon_loss_timeout: float = _opt(
        300.0,
        "seconds a worker connected over the network (not started by the daemon) tries to join "
        "a daemon again before it exits with its processors",
        "longer rides out a daemon's restart and a journal's grace period; shorter frees the "
        "host of a cluster that is gone",
        gt=0,
        metavar="SECONDS",
    )
    drain_seconds: float = _opt(
        0.0,
        "seconds a worker given SIGTERM keeps running the tasks it started (taking no new ones, "
        "handing back those it never started) before it stops; 0 = stop at once. A second SIGTERM "
        "or a SIGINT stops at once",
        "set it below the time between the signal and the job's end (the Slurm manager does); "
        "longer lets longer tasks finish instead of running again elsewhere",
        ge=0,
        metavar="SECONDS",
    )
    connect_timeout: float = _opt(
        5.0,
        "seconds a client joining a running daemon (address=) waits for its answer to the handshake; "
        "then the constructor raises DaemonLost naming the address and the likely cause",
        "a daemon answers in milliseconds on a LAN and starts listening within about a second of "
        "its launch on a 2-core VM; higher tolerates a daemon started just after its clients, lower "
        "reports a wrong address sooner",
        gt=0,
        metavar="SECONDS",
    )
    cancel_wait: float = _opt(
        0.05,
        "seconds Future.cancel() on a user thread waits for the daemon to say whether a "
        "submitted task can still be kept from running (False if no answer came by then)",
        "a task the daemon holds can only be cancelled with its answer: one round trip, well "
        "under a millisecond on one host; higher rides out a slow network, lower bounds how "
        "long cancel() may block",
        ge=0,
        metavar="SECONDS",
    )
    client_timeout: float = _opt(
        60.0,
        "seconds without any message after which the daemon drops a client and cancels its tasks",
        "a client's process may pause for seconds (a full garbage collection over a million "
        "futures); an embedded cluster's daemon sees its client die at once through its lifeline",
        gt=0,
        metavar="SECONDS",
    )
    max_retries: int = _opt(
        3,
        "retries of a task whose worker or processor died",
        "higher survives flaky nodes but reruns a task that itself kills its process",
        ge=0,
    )
    max_tasks_per_child: int | None = _opt(
        None,
        "replace a processor after this many tasks, none = never",
        "bounds leaks in task code at the cost of process starts",
        ge=1,
    )
    send_hwm: int = _opt(
        1000,
        "ZeroMQ send high-water mark, in messages",
        "higher absorbs bursts but holds more memory before pushing back",
        ge=1,
        le=2**31 - 1,  # ZeroMQ's high-water marks are C ints
    )
    max_message_size: int = _opt(
        256 << 20,
        "largest frame, in bytes, the daemon accepts on tcp:// (ZMQ_MAXMSGSIZE): a peer that sends "
        "a larger one is disconnected before the frame is held in memory",
        "lower bounds what one peer can make the daemon allocate; keep it above 4 MiB (an object "
        "chunk) and the largest pickled callable clients send",
        ge=8 << 20,
        le=2**62,
    )
    max_backlog_bytes: int = _opt(
        1 << 30,
        "bytes the daemon holds, for all peers together, of sends to peers that do not read",
        "past it the peers with the largest backlogs are dropped as unreachable (a backlog of one "
        "transmission never is); lower bounds what slow or stalled readers cost the daemon",
        ge=1 << 20,
        le=2**62,
    )
    max_peers: int = _opt(
        10_000,
        "clients, workers, managers and monitors one daemon admits at once",
        "a Hello beyond it is refused with the reason; bounds the state peers can make the daemon hold",
        ge=1,
        le=2**31 - 1,
    )
    submit_window: int = _opt(
        100_000,
        "tasks a client may have sent and not yet had acknowledged",
        "higher pipelines submits, lower bounds client memory and applies backpressure",
        ge=1,
    )
    max_pending_tasks: int = _opt(
        1_000_000,
        "tasks a client may have pending (submitted, future not yet done)",
        "bounds the client's and the daemon's memory under a flood; at the limit submit waits or raises (pending_full)",
        ge=1,
    )
    max_pending_bytes: int = _opt(
        8 * 2**30,
        "bytes of pickled arguments a client may have pending",
        "bounds memory held by pending tasks' arguments; a larger task alone is still admitted",
        ge=1,
    )
    pending_full: str = _opt(
        "block",
        "what submit on a user thread does at a pending limit: block until a task completes, or raise PendingLimitReached",
        "block applies backpressure to the submitter; on the client's own threads (done-callbacks) submit always raises",
        check=lambda v: None if v in ("block", "raise") else "must be block or raise",
    )
    worker_lanes: bool = _opt(
        True,
        "a client on a worker's host submits a task it submitted alone straight to that worker",
        "the daemon leaves a sequential caller's round trip; turn off to send every task through it",
    )
    max_prefetch: int = _opt(
        256,
        "cap on the tasks queued at one worker beyond those it runs",
        "higher hides dispatch latency for short tasks, lower balances load better",
        ge=1,
    )
    worker_resources: str = _opt(
        "",
        "resources each worker this config starts declares, e.g. 'cpu=4,gpu=1,mem=16e9'",
        "tasks asking for resources run only where they fit, at most as many at once as the quantities allow",
        metavar="NAME=QTY,...",
    )
    worker_tags: str = _opt(
        "",
        "tags each worker this config starts declares, comma-separated, e.g. 'linux,ssd'",
        "tasks asking for tags run only on workers that have them all",
        metavar="TAG,...",
    )
    memory_limit: str = _opt(
        "auto",
        "private memory a worker's processors may use together: a size like 4G, 'auto' (95% of RAM "
        "shared by the host's workers) or 'none'",
        "the processor using most is killed when the sum goes over, before the kernel's OOM killer strikes",
        metavar="SIZE",
    )
    object_store_size: str = _opt(
        "auto",
        "size of the daemon host's shared-memory object store: a size like 8G, 'auto' (25% of RAM) or 'none'",
        "memory is committed only as objects fill it; large arguments and results travel through it once",
        metavar="SIZE",
    )
    object_store_threshold: int = _opt(
        65536,
        "bytes from which a pickled buffer or value goes through the object store instead of inline",
        "lower moves more through shared memory (zero-copy reads); higher keeps small values in messages; "
        "the daemon sizes its store's object index by its own value (one entry per this many bytes, "
        "at least 8 KiB)",
        ge=0,
        metavar="BYTES",
    )
    arrays_in_store: int = _opt(
        1 << 20,
        "bytes from which a NumPy array a task creates is allocated in the host's object store, 0 = never",
        "a returned array then reaches the caller without a copy and the returned array becomes read-only "
        "in the worker; arrays use at most half the store, np.zeros and smaller arrays stay private",
        ge=0,
        metavar="BYTES",
    )
    capture_output: bool = _opt(
        False,
        "collect each task's stdout, stderr and log records and attach them to its future (task_info(f).stdout)",
        "costs a few dup2 calls and two small reads per task; off, a task's output goes to its worker's stderr",
    )
    capture_output_limit: int = _opt(
        1 << 20,
        "bytes of each captured stream (and of log messages) a task returns: its head and tail halves, with a note",
        "higher keeps more of a chatty task's output, at that many bytes per stream on the wire and in the client",
        ge=2,
        metavar="BYTES",
    )
    forward_output: bool = _opt(
        False,
        "capture every task's output and print it on the client's stdout/stderr when the task ends, "
        "each line prefixed with its worker and task id",
        "shows remote workers' output where the client runs; it arrives at the task's end, not live",
    )
    forward_output_rate: float = _opt(
        1048576.0,
        "bytes per second (and burst) of forwarded output the client prints; lines beyond are dropped and counted",
        "higher shows more of chatty tasks, lower keeps a flood of output from swamping the client's terminal",
        gt=0,
        metavar="BYTES",
    )
    history_runs: int = _opt(
        20_000,
        "task runs (worker, start, end, status) the daemon keeps for the task stream of the dashboard "
        "and the report, the most recent; 0 = none: runs are not recorded at all and the stream is empty "
        "(the counters, windows, recent events and the run's coarse series are kept whatever this is)",
        "each worker records its runs in a ring of this many (at most 65,536; 17 bytes a run, allocated "
        "when it joins) and sends them beside its heartbeats, so the live stream lags by up to one "
        "heartbeat interval; the daemon keeps the reports as they came (~17 bytes a run) and each run is "
        "~50 bytes in every history sent; its cost to the daemon is measured in docs/monitoring.rst",
        ge=0,
        le=1_000_000,
        metavar="RUNS",
    )
    unsatisfiable_timeout: float | None = _opt(
        None,
        "seconds a task that no connected worker can ever satisfy waits before it fails, none = forever",
        "waiting lets a matching worker join later; 0 fails at once (the embedded cluster's setting)",
        ge=0,
        metavar="SECONDS",
    )
    no_worker_warning: float | None = _opt(
        10.0,
        "seconds tasks may wait with no connected worker able to run them (none at all, or none "
        "with their resources or tags) before their client warns, once per episode; none = never",
        "a worker starts in about a second on a 2-core VM and a dead one is replaced as fast, so "
        "10 s is a real problem, not a start-up; lower tells sooner, higher stays quiet through "
        "slow provisioning (a batch queue)",
        gt=0,
        metavar="SECONDS",
    )
    journal: str | None = _opt(
        None,
        "a directory for the daemon's write-ahead journal (created mode 0700; docs/durability.rst): "
        "with it the daemon can be killed and restarted on it without losing its clients' futures",
        "each task costs a few journal entries per loop turn (written before anything is sent); "
        "without it a restarted daemon knows nobody and pending futures fail with DaemonLost",
        metavar="PATH",
        check=lambda text: None if text.strip() else "it is empty: name a directory, or leave journal unset",
    )
    journal_fsync: str = _opt(
        "interval",
        "when the journal is flushed to disk: turn (fsync every loop turn before sending), interval "
        "(a group commit every journal_fsync_interval), os (never: the OS writes back)",
        "all three survive the daemon's death (it writes before it sends); only turn and interval "
        "(up to journal_fsync_interval of work lost) survive the host's crash; turn costs most",
        choices=("turn", "interval", "os"),
    )
    journal_fsync_interval: float = _opt(
        0.01,
        "seconds between the journal's fsyncs under journal_fsync=interval",
        "longer costs less disk time, and a host crash loses up to this much of what was journaled",
        gt=0,
        le=60.0,
        metavar="SECONDS",
    )
    restart_grace: float = _opt(
        30.0,
        "seconds a daemon restarted on its journal waits for the workers it had to come back "
        "(their tasks wait for them) and that its peers wait for it before giving up",
        "longer rides out slow restarts; a worker that never comes back holds its tasks this long "
        "before they are retried elsewhere",
        gt=0,
        le=86400.0,
        metavar="SECONDS",
    )
    log_level: str = _opt(
        "WARNING",
        "logging level",
        "DEBUG is verbose and slows hot paths",
        choices=LOG_LEVELS,
        metavar="LEVEL",
    )
    security: str | None = _opt(
        None,
        "the daemon's security directory (made by `scaler-keys init DIR`): its CURVE keypair and "
        "the allow-list of keys and roles; required to serve tcp:// unless insecure",
        "every party then needs a credential issued from it; revocations apply within seconds",
        metavar="DIR",
    )
    credentials: str | None = _opt(
        None,
        "a credential file (made by `scaler-keys issue`, mode 0600) for connecting to a tcp:// daemon "
        "as a client, worker, manager or monitor; unused on ipc://",
        "its key's role decides what the daemon accepts from this party",
        metavar="FILE",
    )
    insecure: bool = _opt(
        False,
        "use tcp:// without keys or encryption, with a warning on every start",
        "only for a trusted network: anyone who reaches the port can run code on the cluster",
    )

    def __post_init__(self) -> None:
        checked = _validate(self.to_dict(), {})
        for name, value in checked.items():
            if value is not getattr(self, name):  # ints widened to float, log level upper-cased
                object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(
        cls,
        *,
        file: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        cli: Mapping[str, object] | None = None,
        base: ClusterConfig | None = None,
    ) -> ClusterConfig:
        """Merge the layers, CLI > env > file > base (or the defaults), and validate.

        ``file`` is a TOML file with the keys at top level; when None, ``$SCALER_CONFIG`` (read
        from ``env``) may name one.  ``env`` defaults to ``os.environ``; its ``SCALER_<KEY>``
        variables are parsed per field type.  ``cli`` maps field names (snake or kebab case)
        to values; a string is parsed like an environment value, and None is a value (omit
        a key to leave it unset).  Raises ConfigError for unknown keys, unreadable files and
        invalid values.
        """
        environ: Mapping[str, str] = os.environ if env is None else env
        start = base if base is not None else cls()
        label = "base config" if base is not None else "default"
        values: dict[str, Any] = start.to_dict()
        sources = dict.fromkeys(values, label)

        layers: list[tuple[dict[str, Any], dict[str, str]]] = []
        if file is None and environ.get(CONFIG_ENV):
            path = environ[CONFIG_ENV]
            layers.append(_file_layer(path, f"config file {path} (named by {CONFIG_ENV})"))
        elif file is not None:
            layers.append(_file_layer(file, f"config file {os.fspath(file)}"))
        layers.append(_env_layer(environ))
        layers.append(_cli_layer(cli or {}))
        for layer_values, layer_sources in layers:
            values.update(layer_values)
            sources.update(layer_sources)
        return _build(cls, values, sources)

    @classmethod
    def from_dict(cls, mapping: Mapping[str, object], source: str = "mapping") -> ClusterConfig:
        """Defaults overridden by ``mapping`` (TOML-typed values; ``"none"`` unsets).

        ``source`` names where the mapping came from in error messages.  Raises ConfigError
        for unknown keys and invalid values.
        """
        values = cls().to_dict()
        sources = dict.fromkeys(values, "default")
        layer_values, layer_sources = _mapping_layer(mapping, source)
        return _build(cls, values | layer_values, sources | layer_sources)

    def replace(self, **changes: Any) -> ClusterConfig:
        """A copy with ``changes`` applied and validated; unknown names raise ConfigError."""
        unknown = [name for name in changes if name not in _FIELDS]
        if unknown:
            raise _unknown_keys(unknown, list(_FIELDS), "replace()", "keys")
        return _build(type(self), self.to_dict() | changes, dict.fromkeys(changes, "replace()"))

    # ------------------------------------------------------------------ output

    def to_dict(self) -> dict[str, Any]:
        """Field name → value, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_toml(self) -> str:
        """This configuration as a TOML file that :meth:`load` reads back unchanged."""
        lines = [
            "# scaler-executor cluster configuration: keys at top level, no [scaler] table.",
            '# Overridden by SCALER_<KEY> variables and CLI flags; "none" unsets a key.',
        ]
        for f in _FIELDS.values():
            lines += ["", f"# {f.spec.help}", f"{f.name} = {_toml_value(getattr(self, f.name))}"]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- field table


@dataclass(frozen=True, slots=True)
class _Field:
    """One config key as the layers see it, derived from its dataclass field."""

    name: str
    kind: type  # bool, int, float or str
    optional: bool  # None allowed
    default: object
    spec: _Spec

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _describe(cls: type) -> dict[str, _Field]:
    hints = typing.get_type_hints(cls)
    table: dict[str, _Field] = {}
    for f in dataclasses.fields(cls):
        kind, optional = hints[f.name], False
        if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
            members = [a for a in typing.get_args(kind) if a is not type(None)]
            kind, optional = members[0], len(members) < len(typing.get_args(kind))
            if len(members) != 1:
                raise TypeError(f"config field {f.name}: use one type, optionally '| None'")
        if kind not in (bool, int, float, str) or _META not in f.metadata:
            raise TypeError(f"config field {f.name}: declare it as bool/int/float/str via _opt()")
        table[f.name] = _Field(f.name, kind, optional, f.default, f.metadata[_META])
    return table


_FIELDS: Final = _describe(ClusterConfig)


# ---------------------------------------------------------------------- validation


def _from(source: str | None) -> str:
    return f" (from {source})" if source else ""


def _upper(f: _Field) -> float | None:
    """The largest number ``f`` allows (None for a non-number)."""
    if f.spec.le is not None:
        return f.spec.le
    return {int: INT_MAX, float: FLOAT_MAX}.get(f.kind)


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _allowed(f: _Field) -> str:
    if f.spec.choices:
        text = "one of " + ", ".join(f.spec.choices) + " (any case)"
    else:
        kinds = {
            bool: "true or false",
            int: "an integer",
            float: "a finite number",
            str: "a string",
        }
        text = kinds[f.kind]
    if f.spec.gt is not None:
        text += f" > {f.spec.gt:g}"
    if f.spec.ge is not None:
        text += f" >= {f.spec.ge:g}"
    upper = _upper(f)
    if upper is not None:
        text += f" and <= {_number(upper)}"
    return text + (" or none" if f.optional else "")


def _invalid(f: _Field, value: object, source: str | None, problem: str | None = None) -> ConfigError:
    if problem is not None:
        return ConfigError(f"invalid {f.name}={value!r}{_from(source)}: {problem}")
    note = " (a bool is not a number)" if isinstance(value, bool) and f.kind is not bool else ""
    shown = repr(value) if not isinstance(value, int) or value.bit_length() <= 256 else f"<an integer of {value.bit_length()} bits>"
    return ConfigError(f"invalid {f.name}={shown}{_from(source)}: must be {_allowed(f)}{note}")


def _in_range(f: _Field, number: float) -> bool:
    upper = _upper(f)
    return (
        (f.spec.gt is None or number > f.spec.gt)
        and (f.spec.ge is None or number >= f.spec.ge)
        and (upper is None or number <= upper)
    )


def _check_value(f: _Field, value: object, source: str | None) -> object:
    """``value`` if it has ``f``'s type and limits (ints widened to float); else ConfigError."""
    if value is None:
        if f.optional:
            return None
    elif isinstance(value, bool):  # before int: True is an int, but never a count
        if f.kind is bool:
            return value
    elif isinstance(value, int) and f.kind in (int, float):
        if _in_range(f, value):
            return f.kind(value)
    elif isinstance(value, float) and f.kind is float:
        if math.isfinite(value) and _in_range(f, value):
            return value
    elif isinstance(value, str) and f.kind is str:
        if f.spec.check is not None and (problem := f.spec.check(value)) is not None:
            raise _invalid(f, value, source, problem)
        if not f.spec.choices:
            return value
        for choice in f.spec.choices:  # any case; the choice as declared
            if value.upper() == choice.upper():
                return choice
    raise _invalid(f, value, source)


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


def _check_together(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    interval, timeout = values["heartbeat_interval"], values["daemon_loss_timeout"]
    if timeout < 2 * interval:
        raise ConfigError(
            f"daemon_loss_timeout={timeout!r}{_from(sources.get('daemon_loss_timeout'))} must be"
            f" >= 2 * heartbeat_interval={interval!r}{_from(sources.get('heartbeat_interval'))},"
            f" i.e. >= {2 * interval!r}: a shorter timeout declares a healthy but idle daemon"
            " lost between heartbeats; raise daemon_loss_timeout or lower heartbeat_interval"
        )
    parse_resources(values["worker_resources"], "worker_resources" + _from(sources.get("worker_resources")))
    minimum, workers = values["min_workers"], values["workers"]
    if minimum is not None and minimum > workers:
        raise ConfigError(
            f"min_workers={minimum!r}{_from(sources.get('min_workers'))} must be <= workers={workers!r}"
            f"{_from(sources.get('workers'))}: workers is the most the daemon starts when autoscaling"
        )
    for key in ("memory_limit", "object_store_size"):
        if values[key].strip().lower() in ("auto", "none"):
            continue
        try:
            parse_size(values[key])
        except ValueError as exc:
            raise ConfigError(f"invalid {key}{_from(sources.get(key))}: {exc}") from None


def _validate(values: Mapping[str, Any], sources: Mapping[str, str]) -> dict[str, Any]:
    checked = {n: _check_value(f, values[n], sources.get(n)) for n, f in _FIELDS.items()}
    _check_together(checked, sources)
    return checked


_C = TypeVar("_C", bound=ClusterConfig)


def _build(cls: type[_C], values: Mapping[str, Any], sources: Mapping[str, str]) -> _C:
    # Validate first so errors carry sources; __post_init__ then re-checks (cheap, no-op).
    return cls(**_validate(values, sources))


def _closest(key: str, valid: Iterable[str]) -> str | None:
    import difflib  # only on the way to an error message

    matches = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _unknown_keys(keys: Iterable[str], valid: list[str], where: str, what: str) -> ConfigError:
    named = []
    for key in sorted(keys):
        guess = _closest(key.replace("-", "_").lower(), valid)
        named.append(f"{key!r}" + (f" (did you mean {guess!r}?)" if guess else ""))
    return ConfigError(
        f"unknown {what} in {where}: {', '.join(named)}; valid {what}: {', '.join(valid)}"
    )


# ---------------------------------------------------------------------- layers


def _parse_text(f: _Field, text: str, source: str) -> object:
    """A string from the environment or a command line, as ``f``'s type (limits unchecked)."""
    word = text.strip()
    if f.optional and word.lower() in _NONE:
        return None
    try:
        if f.kind is bool:
            if word.lower() in _TRUE | _FALSE:
                return word.lower() in _TRUE
        elif f.kind is int:
            return int(word)
        elif f.kind is float:
            return float(word)
        else:
            return word
    except ValueError:
        pass
    raise _invalid(f, text, source)


def _file_layer(path: str | os.PathLike[str], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    import tomllib  # here, not at import: workers take their settings as flags, not files

    # One line naming the file and the fix for each way a file cannot be read (tomllib
    # itself lets a file that is not UTF-8 escape as a bare UnicodeDecodeError).
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"{source} does not exist: fix the path or drop it") from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a directory: name the TOML file in it") from None
    except PermissionError:
        raise ConfigError(f"cannot read {source}: permission denied; make it readable or name another file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source} is not a text file (byte {exc.start} is not UTF-8): a config file is UTF-8"
            " TOML text such as 'workers = 4'; name that file instead"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
        raise ConfigError(f"{source} is not valid TOML: {exc}; fix that line") from None
    except ValueError as exc:  # e.g. an integer of more than sys.get_int_max_str_digits() digits
        raise ConfigError(f"{source} cannot be read as TOML: {exc}") from None
    if isinstance(data.get("scaler"), dict):
        raise ConfigError(
            f"{source} has a [scaler] table, but config keys go at the top level of the"
            " file: delete the '[scaler]' line"
        )
    return _mapping_layer(data, source)


def _mapping_layer(
    mapping: Mapping[str, object], source: str
) -> tuple[dict[str, Any], dict[str, str]]:
    unknown = [key for key in mapping if key not in _FIELDS]
    if unknown:
        raise _unknown_keys(unknown, list(_FIELDS), source, "keys")
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        f = _FIELDS[key]
        if f.optional and isinstance(value, str) and value.lower() == "none":
            value = None  # TOML has no null
        values[key] = _check_value(f, value, source)
    return values, dict.fromkeys(values, source)


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions that turn ``a`` into ``b``."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


_warned_env: set[str] = set()  # near-miss variables already warned about, once per process


def warned_env() -> frozenset[str]:
    """The near-miss ``SCALER_*`` variables this process has warned about."""
    return frozenset(_warned_env)


def _singular(name: str) -> str:
    """``SCALER_MAX_RETRIES`` -> ``SCALER_MAX_RETRY``: a singular for a name's plural ending."""
    if name.endswith("IES"):
        return name[:-3] + "Y"
    return name[:-1] if name.endswith("S") else name


def _near_miss(name: str, known: Iterable[str]) -> tuple[int, str]:
    """The fewest edits from ``name`` to one of ``known`` (or to its singular), and that name.

    The singular counts because the commonest slip is the number: ``SCALER_MAX_RETRY`` is
    three edits from ``SCALER_MAX_RETRIES`` but none from its singular.
    """
    return min((min(_edits(name, k), _edits(name, _singular(k))), k) for k in known)


def _warn_near_misses(environ: Mapping[str, str], ours: Iterable[str]) -> None:
    """A ConfigWarning (and a log line) for each ``SCALER_*`` variable close to one of ours."""
    known = sorted(ours)
    already = _warned_env | set(environ.get(WARNED_ENV, "").split(","))
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name in already:
            continue
        distance, guess = _near_miss(name, known)
        if distance > NEAR_MISS_EDITS:
            continue  # another program's variable (SCALER_HOME, ...): not ours to judge
        _warned_env.add(name)
        text = (
            f"ignoring environment variable {name}: it names no config key; did you mean {guess}?"
            f" (rename it, or unset it if it belongs to another program)"
        )
        # Logged where logging is set up, and warned always (shown once by default, filterable,
        # an error under -W error): without a handler the log line would print it twice.
        if log.hasHandlers():
            log.warning("%s", text)
        warnings.warn(text, ConfigWarning, stacklevel=4)  # the caller of load()


def _env_layer(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    by_env = {f.env: f for f in _FIELDS.values()}
    _warn_near_misses(environ, [*by_env, *RESERVED_ENV])
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, f in by_env.items():
        if name in environ:
            source = sources[f.name] = f"environment variable {name}"
            values[f.name] = _check_value(f, _parse_text(f, environ[name], source), source)
    return values, sources


def _cli_layer(cli: Mapping[str, object]) -> tuple[dict[str, Any], dict[str, str]]:
    names = {key: key.replace("-", "_") for key in cli}
    unknown = [key for key, name in names.items() if name not in _FIELDS]
    if unknown:
        raise _unknown_keys(unknown, list(_FIELDS), "CLI options", "keys")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in cli.items():
        f = _FIELDS[names[key]]
        source = sources[f.name] = f"CLI flag {f.flag}"
        if isinstance(value, str):
            value = _parse_text(f, value, source)
        values[f.name] = _check_value(f, value, source)
    return values, sources


def _toml_value(value: object) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        import json

        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    return repr(value)  # int, or a finite float whose repr is valid TOML


# ---------------------------------------------------------------------- argparse


def _arg_type(f: _Field) -> Callable[[str], object]:
    source = f"CLI flag {f.flag}"

    def parse(text: str) -> object:
        try:
            return _check_value(f, _parse_text(f, text, source), source)
        except ConfigError as exc:  # argparse prints an ArgumentTypeError's message as is
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = f.name
    return parse


def add_config_arguments(
    parser: argparse.ArgumentParser, *, include: Iterable[str] | None = None
) -> None:
    """Add ``--config FILE`` and one ``--kebab-case`` flag per field (or per ``include`` name).

    Flags default to ``argparse.SUPPRESS``, so only the flags given on the command line
    appear in the namespace and override the lower layers; bool fields get
    ``--flag/--no-flag``.  Raises ConfigError for names in ``include`` that are not fields.
    """
    names = list(_FIELDS) if include is None else list(include)
    unknown = [name for name in names if name not in _FIELDS]
    if unknown:
        raise _unknown_keys(unknown, list(_FIELDS), "add_config_arguments(include=...)", "keys")
    group = parser.add_argument_group(
        "cluster configuration",
        f"precedence: these flags > {ENV_PREFIX}<KEY> environment variables > --config file"
        " > defaults",
    )
    group.add_argument(
        "--config",
        dest=CONFIG_DEST,
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"TOML file with config keys at top level (default: ${CONFIG_ENV} if set)",
    )
    for name in names:
        f = _FIELDS[name]
        shown = _toml_value(f.default).strip('"')
        allowed = "" if f.kind is bool else f"; {_allowed(f)}"
        help_text = f"{f.spec.help}{allowed} [default: {shown}; env {f.env}]"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help strings
        if f.kind is bool:
            action: Any = argparse.BooleanOptionalAction
            group.add_argument(
                f.flag, dest=name, action=action, default=argparse.SUPPRESS, help=help_text
            )
        else:
            metavar = f.spec.metavar or {int: "N", float: "X", str: "TEXT"}[f.kind]
            group.add_argument(
                f.flag,
                dest=name,
                type=_arg_type(f),
                metavar=metavar,
                default=argparse.SUPPRESS,
                help=help_text,
            )


def config_from_args(
    args: argparse.Namespace, *, env: Mapping[str, str] | None = None
) -> ClusterConfig:
    """The configuration for parsed ``args``: flags > ``env`` (default os.environ) > file.

    Reads the attributes that :func:`add_config_arguments` adds and ignores all others;
    the file is ``--config``, else ``$SCALER_CONFIG``.
    """
    given = vars(args)
    cli = {name: given[name] for name in _FIELDS if name in given}
    return ClusterConfig.load(file=given.get(CONFIG_DEST), env=env, cli=cli)
