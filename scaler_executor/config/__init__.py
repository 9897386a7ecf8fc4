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

The package's modules, each importing only the ones above it (``schema`` imports
``sources`` inside ``ClusterConfig.load``, once the class exists)::

    spec.py      what a key is (``_opt``: help and limits in the field's metadata), the
                 shared names and limits, parsers of addresses, resources and tags
    schema.py    ClusterConfig (one field per key), the field table, the value checks
    sources.py   the file, environment and CLI layers; ``argparse`` flags

Import from ``scaler_executor.config``: where a name lives inside it may change.
"""

from __future__ import annotations

from scaler_executor.config.schema import ClusterConfig
from scaler_executor.config.sources import add_config_arguments, config_from_args, warned_env
from scaler_executor.config.sources import log as log
from scaler_executor.config.spec import _META as _META
from scaler_executor.config.spec import (
    CONFIG_DEST,
    CONFIG_ENV,
    ENV_PREFIX,
    FLOAT_MAX,
    INT_MAX,
    LOG_LEVELS,
    NEAR_MISS_EDITS,
    RESERVED_ENV,
    WARNED_ENV,
    check_address,
    parse_resources,
    parse_tags,
)
from scaler_executor.config.spec import parse_listen as parse_listen
from scaler_executor.exceptions import ConfigError as ConfigError
from scaler_executor.exceptions import ConfigWarning as ConfigWarning

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
# Also importable from here, as from the module before it became a package: parse_listen,
# ConfigError, ConfigWarning, log (the "scaler_executor.config" logger) and _META.
