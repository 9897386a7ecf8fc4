"""The keys of a cluster's configuration: :class:`ClusterConfig`, one field per key, the
table of fields the layers read (``_FIELDS``), and the checks of each value and of the
values together.  Where the values come from (file, environment, CLI) is ``sources.py``."""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from scaler_executor.config.spec import (
    _META,
    CONFIG_ENV,
    ENV_PREFIX,
    FLOAT_MAX,
    INT_MAX,
    LOG_LEVELS,
    _address_problem,
    _opt,
    _Spec,
    parse_resources,
)
from scaler_executor.exceptions import ConfigError
from scaler_executor.sizes import parse_size


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
        "seconds of silence after which a peer sends a heartbeat (an idle worker, and the daemon "
        "toward a worker, after a quarter of heartbeat_interval * heartbeat_liveness if longer)",
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
        # The layers read this class's field table: imported here, once the class exists.
        from scaler_executor.config.sources import _cli_layer, _env_layer, _file_layer

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
        from scaler_executor.config.sources import _mapping_layer

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
# Its public home (reprs, pickles by reference, the docs): the package re-exports it.  Set after
# _describe, whose get_type_hints reads the annotations in this module's namespace.
ClusterConfig.__module__ = "scaler_executor.config"



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


def _toml_value(value: object) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return quoted(value, toml=True)
    return repr(value)  # int, or a finite float whose repr is valid TOML


def quoted(text: str, *, toml: bool = False) -> str:
    """``text`` as a double-quoted ASCII string that reads back as ``text``: a JSON string
    (``\\uXXXX`` escapes, surrogate pairs beyond the BMP) or, with ``toml``, a TOML basic
    string (``\\UXXXXXXXX`` beyond the BMP; TOML has no lone surrogates).  Here rather than
    ``json.dumps``: importing ``json`` cost the embedded cluster's constructor, which writes
    both files, ~1.5 ms."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for ch in text:
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        elif toml:
            out.append(f"\\U{code:08x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return '"' + "".join(out) + '"'
