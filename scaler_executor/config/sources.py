"""Where a configuration's values come from: the TOML file, ``SCALER_*`` environment
variables (with near-miss warnings), CLI mappings and flags (``argparse``), each parsed and
checked in its layer against :mod:`~scaler_executor.config.schema`'s field table, then
merged by ``ClusterConfig.load``."""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from scaler_executor.config.schema import (
    _FIELDS,
    ClusterConfig,
    _allowed,
    _check_value,
    _Field,
    _invalid,
    _toml_value,
    _unknown_keys,
)
from scaler_executor.config.spec import (
    CONFIG_DEST,
    CONFIG_ENV,
    ENV_PREFIX,
    NEAR_MISS_EDITS,
    RESERVED_ENV,
    WARNED_ENV,
)
from scaler_executor.exceptions import ConfigError, ConfigWarning

# The package's logger, as before the split (a filter on "scaler_executor.config" sees it).
log = logging.getLogger("scaler_executor.config")

_TRUE: Final = frozenset({"1", "true", "yes"})
_FALSE: Final = frozenset({"0", "false", "no"})
_NONE: Final = frozenset({"", "none"})


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
