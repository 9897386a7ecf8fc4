"""Security: CURVE keys with roles on every tcp:// connection, on by default.

* ``keys``: the security directory, credentials, the allow-list (``scaler-keys``).
* ``server``: the daemon's ZAP handler and its per-message role and revocation gate.
* ``client``: CURVE on a connecting socket, and handshake failures that say what happened.

This module holds the policy every command shares: which addresses need keys, and the
one way around them (``insecure``), which warns on every start. The threat model is in
``docs/security.rst``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scaler_executor.exceptions import ConfigError

if TYPE_CHECKING:
    from scaler_executor.config import ClusterConfig
    from scaler_executor.security.client import ClientSecurity
    from scaler_executor.security.keys import SecurityDir

__all__ = ["for_connecting", "for_daemon", "warn_insecure"]

log = logging.getLogger("scaler_executor.security")


def warn_insecure(address: str) -> None:
    log.warning(
        "%s runs WITHOUT security (--insecure / insecure = true): no key, no encryption; anyone "
        "who can reach this port can run code on the cluster and read its data. Use it only on a "
        "trusted network; see docs/security.rst for the secure set-up (scaler-keys).",
        address,
    )


def for_connecting(config: ClusterConfig, address: str, role: str) -> ClientSecurity | None:
    """CURVE for a ``role`` (client, worker, ...) connecting to ``address``; None on ipc:// or
    with ``insecure`` (then it warns). ConfigError when tcp:// has neither a credential nor
    ``insecure``, when both are given, or when the credential is unusable."""
    if not address.startswith("tcp://"):
        return None
    if config.credentials:
        if config.insecure:
            raise ConfigError(
                "both credentials and insecure are set: a credential secures the connection, "
                "insecure turns security off; drop one of them"
            )
        from scaler_executor.security.client import ClientSecurity
        from scaler_executor.security.keys import load_credential, require_curve

        require_curve()
        return ClientSecurity(load_credential(config.credentials), address)
    if config.insecure:
        warn_insecure(address)
        return None
    raise ConfigError(
        f"{address} is tcp:// and no credential was given: a {role} needs one, made by "
        f"`scaler-keys issue DIR NAME --role {role} --output FILE` and passed as --credentials FILE, "
        "credentials = \"FILE\" in the config file or SCALER_CREDENTIALS; or, on a trusted "
        "network only, pass --insecure (insecure = true)"
    )


def for_daemon(config: ClusterConfig, address: str) -> SecurityDir | None:
    """The security directory of a daemon serving ``address``; None on ipc:// or with
    ``insecure`` (then it warns). ConfigError as for :func:`for_connecting`."""
    if not address.startswith("tcp://"):
        if config.security:
            raise ConfigError(
                f"security = {config.security!r} applies to tcp:// only; {address} is reachable by "
                "this user alone (owner-only socket): drop --security, or serve tcp://"
            )
        return None
    if config.security:
        if config.insecure:
            raise ConfigError("both security and insecure are set: drop one of them")
        from scaler_executor.security.keys import SecurityDir, require_curve

        require_curve()
        directory = SecurityDir(config.security)
        directory.daemon_keys()  # fail now, with the file's name, if it is missing or readable by others
        directory.entries()
        return directory
    if config.insecure:
        warn_insecure(address)
        return None
    raise ConfigError(
        f"refusing to serve {address} without security: pass --security DIR (make DIR with "
        "`scaler-keys init DIR`, then give each party a credential with `scaler-keys issue`), "
        "or, on a trusted network only, --insecure"
    )
