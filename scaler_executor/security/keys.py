"""Keys on disk: a cluster's security directory and the credentials issued from it.

::

    DIR/                    mode 0700, made by ``scaler-keys init DIR``
      daemon.key            the daemon's CURVE keypair (mode 0600)
      allow.toml            the allow-list: one [[key]] per party (name, role, public key,
                            issued, revoked), mode 0600; the daemon re-reads it when it changes
    FILE                    ``scaler-keys issue DIR NAME --role ROLE --output FILE``: the
                            party's keypair, its role and the daemon's public key (mode 0600)

Keys are Z85 text (40 characters for 32 bytes, ZeroMQ's own encoding, no quote or backslash,
so safe inside TOML strings). Every file is written to a temporary name beside it and renamed
into place: the daemon, watching ``allow.toml``, never reads half a file. Files holding a
secret key are refused when group or others may read them, as ssh refuses a private key.

Only the standard library and ZeroMQ's key functions: this module is read by the daemon at
start, by every connecting command, and by ``scaler-keys``.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import stat
import tomllib
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from scaler_executor.exceptions import ConfigError

ROLES = ("client", "worker", "manager", "monitor")
DAEMON_KEY = "daemon.key"
ALLOW_LIST = "allow.toml"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One party of the allow-list."""

    name: str
    role: str
    public_key: str  # Z85
    issued: str
    revoked: str = ""  # when, or "" while allowed

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)


@dataclass(frozen=True, slots=True)
class Credential:
    """What a connecting party holds: its keypair, its role and the daemon's public key."""

    name: str
    role: str
    public_key: str
    secret_key: str
    daemon_public_key: str
    path: str = ""  # where it was read from, for messages

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def to_line(self) -> str:
        """One line for a worker the daemon starts itself (its stdin, never a file)."""
        return " ".join(["scaler-credential-1", self.name, self.role, self.public_key, self.secret_key, self.daemon_public_key])

    @classmethod
    def from_line(cls, line: str, source: str) -> Credential:
        parts = line.split()
        if len(parts) != 6 or parts[0] != "scaler-credential-1":
            raise ConfigError(f"{source}: not a credential line from the daemon")
        _, name, role, public, secret, daemon = parts
        return _checked(cls(name, role, public, secret, daemon, source), source)


def fingerprint(public_key: str) -> str:
    """A short, stable name for a public key in logs: ``SHA256:`` and 16 hex digits."""
    return "SHA256:" + hashlib.sha256(public_key.encode("ascii")).hexdigest()[:16]


def keypair() -> tuple[str, str]:
    """A fresh CURVE keypair (public, secret), Z85 text."""
    import zmq

    require_curve()
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def require_curve() -> None:
    import zmq

    if not zmq.has("curve"):
        raise ConfigError(
            f"this pyzmq's libzmq ({zmq.zmq_version()}) was built without CURVE, so tcp:// cannot be "
            "secured: install a pyzmq wheel (they bundle libzmq with CURVE), or use --insecure on a "
            "trusted network"
        )


def now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------- files


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 whatever the umask, atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask; this is not
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_private(path: str, what: str) -> dict[str, Any]:
    """The TOML table in ``path``, refused if group or others may read or write it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist: fix the path") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{what} {path} is accessible by others (mode {stat.filemode(st.st_mode)}): it holds a "
                f"secret key; run chmod 600 {path} (and issue a new one if others may have read it)"
            )
        if st.st_uid != os.getuid():
            raise ConfigError(f"{what} {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): copy it and chmod 600")
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from exc


def _check_name(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= _NAME_CHARS:
        raise ConfigError(f"invalid key name {name!r}: use 1-64 letters, digits and . _ - @")
    return name


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ConfigError(f"invalid role {role!r}: choose one of {', '.join(ROLES)}")
    return role


def _check_key(key: object, field: str, source: str) -> str:
    if not isinstance(key, str) or len(key) != 40:
        raise ConfigError(f"{source}: {field} must be a 40-character Z85 CURVE key (made by scaler-keys)")
    try:
        from zmq.utils import z85

        z85.decode(key)
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{source}: {field} is not Z85 text") from None
    return key


def _checked(credential: Credential, source: str) -> Credential:
    _check_name(credential.name)
    _check_role(credential.role)
    for field in ("public_key", "secret_key", "daemon_public_key"):
        _check_key(getattr(credential, field), field, source)
    return credential


def load_credential(path: str) -> Credential:
    """A credential file, checked (mode 0600, its fields); ConfigError naming the problem."""
    path = os.path.expanduser(path)
    data = read_private(path, "credential")
    source = f"credential {path}"
    missing = [k for k in ("name", "role", "public_key", "secret_key", "daemon_public_key") if not isinstance(data.get(k), str)]
    if missing:
        raise ConfigError(f"{source} lacks {', '.join(missing)}: it was not written by scaler-keys issue")
    return _checked(
        Credential(data["name"], data["role"], data["public_key"], data["secret_key"], data["daemon_public_key"], path),
        source,
    )


def _toml_credential(c: Credential, cluster: str) -> str:
    return (
        f"# scaler-executor credential for {c.name!r}, role {c.role}, issued {now_text()} from {cluster}.\n"
        "# It holds a secret key: keep it mode 0600, never share it between parties.\n"
        f'name = "{c.name}"\nrole = "{c.role}"\npublic_key = "{c.public_key}"\n'
        f'secret_key = "{c.secret_key}"\ndaemon_public_key = "{c.daemon_public_key}"\n'
    )


# ---------------------------------------------------------------------- the directory


class SecurityDir:
    """A cluster's security directory (see the module doc)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self.daemon_key_path = os.path.join(self.path, DAEMON_KEY)
        self.allow_path = os.path.join(self.path, ALLOW_LIST)

    @classmethod
    def init(cls, path: str) -> SecurityDir:
        """Make the directory (0700), the daemon's keypair and an empty allow-list."""
        d = cls(path)
        if os.path.exists(d.daemon_key_path):
            raise ConfigError(f"{d.path} already holds a daemon key: it is a security directory already (rotate by making a new one)")
        os.makedirs(d.path, mode=0o700, exist_ok=True)
        os.chmod(d.path, 0o700)
        public, secret = keypair()
        write_private(
            d.daemon_key_path,
            "# the scaler-daemon's CURVE keypair: keep it mode 0600\n"
            f'public_key = "{public}"\nsecret_key = "{secret}"\ncreated = "{now_text()}"\n',
        )
        d._write_entries([])
        return d

    def daemon_keys(self) -> tuple[str, str]:
        """(public, secret) of the daemon."""
        self._check_directory()
        data = read_private(self.daemon_key_path, "daemon key")
        source = f"daemon key {self.daemon_key_path}"
        return _check_key(data.get("public_key"), "public_key", source), _check_key(data.get("secret_key"), "secret_key", source)

    def entries(self) -> list[KeyEntry]:
        """The allow-list, revoked entries included."""
        data = read_private(self.allow_path, "allow-list")
        source = f"allow-list {self.allow_path}"
        rows = data.get("key", [])
        if not isinstance(rows, list):
            raise ConfigError(f"{source}: 'key' must be an array of tables ([[key]])")
        out = []
        for row in rows:
            if not isinstance(row, dict):
                raise ConfigError(f"{source}: each [[key]] must be a table")
            try:
                entry = KeyEntry(
                    _check_name(str(row["name"])),
                    _check_role(str(row["role"])),
                    _check_key(row["public_key"], "public_key", source),
                    str(row.get("issued", "")),
                    str(row.get("revoked", "")),
                )
            except KeyError as exc:
                raise ConfigError(f"{source}: a [[key]] lacks {exc}") from None
            out.append(entry)
        return out

    def signature(self) -> tuple[int, int, int] | None:
        """What changes when the allow-list is rewritten (inode: files are replaced)."""
        try:
            st = os.stat(self.allow_path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def issue(self, name: str, role: str, output: str) -> Credential:
        """A new keypair for ``name`` in the allow-list, and its credential at ``output``."""
        _check_name(name)
        _check_role(role)
        entries = self.entries()
        if any(e.name == name and not e.revoked for e in entries):
            raise ConfigError(f"{name!r} already has a key in {self.allow_path}: revoke it first (scaler-keys revoke), or pick another name")
        output = os.path.abspath(os.path.expanduser(output))
        if os.path.exists(output):
            raise ConfigError(f"{output} exists: choose another --output (a credential is never overwritten)")
        daemon_public, _ = self.daemon_keys()
        public, secret = keypair()
        credential = Credential(name, role, public, secret, daemon_public, output)
        write_private(output, _toml_credential(credential, self.path))
        self._write_entries([*entries, KeyEntry(name, role, public, now_text())])
        return credential

    def revoke(self, name: str) -> list[KeyEntry]:
        """Mark every live key of ``name`` revoked; the daemon refuses it within seconds."""
        entries = self.entries()
        hit = [e for e in entries if e.name == name and not e.revoked]
        if not hit:
            known = sorted({e.name for e in entries if not e.revoked})
            raise ConfigError(f"no live key named {name!r} in {self.allow_path}; live keys: {', '.join(known) or 'none'}")
        when = now_text()
        self._write_entries(
            [KeyEntry(e.name, e.role, e.public_key, e.issued, when) if e in hit else e for e in entries]
        )
        return hit

    def _check_directory(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise ConfigError(f"security directory {self.path} does not exist: make it with scaler-keys init {self.path}") from None
        if st.st_mode & 0o077:
            raise ConfigError(f"security directory {self.path} is accessible by others (mode {stat.filemode(st.st_mode)}): chmod 700 {self.path}")

    def _write_entries(self, entries: list[KeyEntry]) -> None:
        lines = ["# scaler-executor allow-list: edit with scaler-keys issue / revoke; the daemon re-reads it."]
        for e in entries:
            lines += [
                "",
                "[[key]]",
                f'name = "{e.name}"',
                f'role = "{e.role}"',
                f'public_key = "{e.public_key}"',
                f'issued = "{e.issued}"',
            ]
            if e.revoked:
                lines.append(f'revoked = "{e.revoked}"')
        write_private(self.allow_path, "\n".join(lines) + "\n")


class EphemeralKeys:
    """Keys for the workers a daemon starts itself: made in memory, allowed in memory only
    (``table`` is the daemon's ServerSecurity.ephemeral), handed over on the worker's stdin."""

    def __init__(self, daemon_public_key: str, table: MutableMapping[str, KeyEntry]) -> None:
        self.daemon_public_key = daemon_public_key
        self.table = table

    def issue(self, name: str, role: str = "worker") -> Credential:
        public, secret = keypair()
        self.table[public] = KeyEntry(name, role, public, f"ephemeral {now_text()}")
        return Credential(name, role, public, secret, self.daemon_public_key, "")

    def withdraw(self, credential: Credential) -> None:
        self.table.pop(credential.public_key, None)


def read_credential_line(fd: int) -> Credential:
    """The credential a daemon wrote on this worker's stdin (one line), read before anything
    else so the lifeline (EOF on the same descriptor) still works after it."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            raise ConfigError("stdin closed before the daemon sent this worker's credential")
        data += chunk
        if len(data) > 4096:
            raise ConfigError("stdin holds more than a credential line")
    return Credential.from_line(data.decode("ascii", "replace"), "the credential on stdin")
