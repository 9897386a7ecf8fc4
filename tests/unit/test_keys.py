"""Keys on disk (security/keys.py), scaler-keys, and the daemon's gate (security/server.py).

The gate is tested through its public methods with real key files; the ZAP handshake and
the sockets are exercised by tests/integration/test_security.py.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from scaler_executor.cli import keys as keys_cli
from scaler_executor.config import ClusterConfig
from scaler_executor.exceptions import ConfigError
from scaler_executor.protocol import messages as m
from scaler_executor.security import for_connecting, for_daemon
from scaler_executor.security.keys import (
    Credential,
    EphemeralKeys,
    KeyEntry,
    SecurityDir,
    fingerprint,
    keypair,
    load_credential,
    read_credential_line,
)
from scaler_executor.security.server import ServerSecurity


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 000: the modes below must not depend on the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def hello(role: str) -> m.Hello:
    return m.Hello(role, m.PROTOCOL_VERSION, "3.11", "3.0", "0", "test", 1, "host", 1 if role == "worker" else 0, {}, [])


def test_init_issue_list_revoke_with_owner_only_modes(tmp_path: Path, open_umask: None) -> None:
    d = SecurityDir.init(str(tmp_path / "keys"))
    assert mode(d.path) == 0o700 and mode(d.daemon_key_path) == 0o600 and mode(d.allow_path) == 0o600
    cred = d.issue("alice", "client", str(tmp_path / "alice.cred"))
    assert mode(tmp_path / "alice.cred") == 0o600
    loaded = load_credential(str(tmp_path / "alice.cred"))
    assert loaded == Credential("alice", "client", cred.public_key, cred.secret_key, d.daemon_keys()[0], str(tmp_path / "alice.cred"))
    d.issue("w1", "worker", str(tmp_path / "w1.cred"))
    assert [(e.name, e.role, e.revoked) for e in d.entries()] == [("alice", "client", ""), ("w1", "worker", "")]
    before = d.signature()
    d.revoke("alice")
    assert d.signature() != before  # what the daemon watches
    alice, w1 = d.entries()
    assert alice.revoked and not w1.revoked
    # the name is free again, with a new key
    again = d.issue("alice", "client", str(tmp_path / "alice2.cred"))
    assert again.public_key != cred.public_key


def test_credential_readable_by_others_is_refused(tmp_path: Path) -> None:
    d = SecurityDir.init(str(tmp_path / "keys"))
    path = tmp_path / "c.cred"
    d.issue("c", "client", str(path))
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=r"accessible by others \(mode -rw-r--r--\).*chmod 600"):
        load_credential(str(path))
    os.chmod(d.daemon_key_path, 0o640)
    with pytest.raises(ConfigError, match=r"daemon key .* accessible by others"):
        d.daemon_keys()


@pytest.mark.parametrize(
    ("name", "role", "expected"),
    [
        ("bob", "admin", "invalid role 'admin': choose one of client, worker, manager, monitor"),
        ("bad name", "client", "invalid key name 'bad name'"),
        ("alice", "client", "'alice' already has a key"),
    ],
)
def test_issue_refuses_bad_names_roles_and_duplicates(tmp_path: Path, name: str, role: str, expected: str) -> None:
    d = SecurityDir.init(str(tmp_path / "keys"))
    d.issue("alice", "client", str(tmp_path / "a.cred"))
    with pytest.raises(ConfigError, match=expected):
        d.issue(name, role, str(tmp_path / "new.cred"))
    assert not (tmp_path / "new.cred").exists()


def test_issue_never_overwrites_and_init_never_reinitialises(tmp_path: Path) -> None:
    d = SecurityDir.init(str(tmp_path / "keys"))
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ConfigError, match="exists: choose another --output"):
        d.issue("a", "client", str(tmp_path / "taken"))
    with pytest.raises(ConfigError, match="already holds a daemon key"):
        SecurityDir.init(d.path)


def test_revoke_unknown_name_lists_live_keys(tmp_path: Path) -> None:
    d = SecurityDir.init(str(tmp_path / "keys"))
    d.issue("alice", "client", str(tmp_path / "a.cred"))
    with pytest.raises(ConfigError, match=r"no live key named 'bob'.*live keys: alice"):
        d.revoke("bob")


def test_credential_file_missing_fields_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.cred"
    path.write_text('name = "x"\nrole = "client"\n')
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError, match="lacks public_key, secret_key, daemon_public_key"):
        load_credential(str(path))


def test_scaler_keys_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = str(tmp_path / "keys")
    assert keys_cli.main(["init", keys]) == 0
    assert keys_cli.main(["issue", keys, "mon", "--role", "monitor", "--output", str(tmp_path / "mon.cred")]) == 0
    assert keys_cli.main(["list", keys]) == 0
    out = capsys.readouterr().out
    assert "start the daemon with --security" in out
    assert "mon " in out and "monitor" in out and "allowed" in out
    assert keys_cli.main(["revoke", keys, "mon"]) == 0
    assert keys_cli.main(["list", keys]) == 0
    assert "revoked 2" in capsys.readouterr().out  # "revoked <timestamp>"
    assert keys_cli.main(["revoke", keys, "mon"]) == 2
    assert "scaler-keys: no live key named 'mon'" in capsys.readouterr().err


def test_ephemeral_credential_travels_as_one_line() -> None:
    table: dict[str, KeyEntry] = {}
    keys = EphemeralKeys(keypair()[0], table)
    cred = keys.issue("local-worker-1")
    assert set(table) == {cred.public_key} and table[cred.public_key].role == "worker"
    r, w = os.pipe()
    try:
        os.write(w, (cred.to_line() + "\n").encode())
        assert read_credential_line(r) == Credential(
            cred.name, "worker", cred.public_key, cred.secret_key, cred.daemon_public_key, "the credential on stdin"
        )
        os.write(w, b"scaler-credential-1 a worker short\n")
        with pytest.raises(ConfigError, match="not a credential line"):
            read_credential_line(r)
        os.close(w)
        w = -1
        with pytest.raises(ConfigError, match="stdin closed before the daemon sent"):
            read_credential_line(r)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    keys.withdraw(cred)
    assert not table


# ---------------------------------------------------------------------- policy


def test_tcp_needs_a_credential_or_insecure(tmp_path: Path) -> None:
    config = ClusterConfig()
    with pytest.raises(ConfigError, match=r"no credential was given: a worker needs one.*--insecure"):
        for_connecting(config, "tcp://h:1", "worker")
    with pytest.raises(ConfigError, match="refusing to serve tcp://h:1 without security: pass --security DIR"):
        for_daemon(config, "tcp://h:1")
    assert for_connecting(config.replace(insecure=True), "tcp://h:1", "client") is None
    assert for_connecting(config, "ipc:///x", "client") is None
    with pytest.raises(ConfigError, match="applies to tcp:// only"):
        for_daemon(config.replace(security=str(tmp_path)), "ipc:///x")
    d = SecurityDir.init(str(tmp_path / "keys"))
    d.issue("a", "client", str(tmp_path / "a.cred"))
    with pytest.raises(ConfigError, match="both credentials and insecure"):
        for_connecting(config.replace(insecure=True, credentials=str(tmp_path / "a.cred")), "tcp://h:1", "client")
    secured = for_connecting(config.replace(credentials=str(tmp_path / "a.cred")), "tcp://h:1", "client")
    assert secured is not None and secured.credential.name == "a"


# ---------------------------------------------------------------------- the gate


@pytest.fixture
def gate(tmp_path: Path) -> tuple[SecurityDir, ServerSecurity, dict[str, Credential]]:
    d = SecurityDir.init(str(tmp_path / "keys"))
    creds = {role: d.issue(role, role, str(tmp_path / f"{role}.cred")) for role in ("client", "worker", "manager", "monitor")}
    security = ServerSecurity(d)
    security.use_counters({})
    return d, security, creds


def test_each_role_may_send_only_its_own_messages(gate: tuple[SecurityDir, ServerSecurity, dict[str, Credential]]) -> None:
    _, security, creds = gate
    submit = m.SubmitTasks([])
    results = m.TaskResults([])
    stats = m.StatsRequest()
    cases = {
        # role: (sent, kept)
        "client": ([hello("client"), submit, stats, results], [hello("client"), submit, stats]),
        "worker": ([hello("worker"), results, submit], [hello("worker"), results]),
        "monitor": ([hello("monitor"), stats, submit, m.CancelTasks([], False)], [hello("monitor"), stats]),
        "manager": ([hello("manager"), submit, m.Heartbeat(0, 0)], [hello("manager"), m.Heartbeat(0, 0)]),
    }
    for role, (sent, kept) in cases.items():
        allowed = security.admit(role.encode(), creds[role].public_key, None)
        assert allowed is not None and allowed.role == role
        assert security.within_role(role.encode(), allowed, sent, None) == kept, role
    assert security.counters["security_refused_role"] == 5
    assert security.replies == []  # messages outside the role are dropped, not answered


def test_a_key_cannot_join_as_another_role(gate: tuple[SecurityDir, ServerSecurity, dict[str, Credential]]) -> None:
    _, security, creds = gate
    for key_role, claimed in [("worker", "client"), ("client", "worker"), ("monitor", "client")]:
        allowed = security.admit(b"p", creds[key_role].public_key, None)
        assert allowed is not None
        assert security.within_role(b"p", allowed, [hello(claimed), m.SubmitTasks([])], None) == (
            [m.SubmitTasks([])] if key_role == "client" else []
        )
        peer, refusal = security.replies.pop()
        assert peer == b"p" and f"has role {key_role}: it cannot join as a {claimed}" in refusal.reason


def test_revocation_expels_live_peers_after_the_file_changes(gate: tuple[SecurityDir, ServerSecurity, dict[str, Credential]]) -> None:
    d, security, creds = gate
    assert security.admit(b"w", creds["worker"].public_key, None) is not None
    assert security.admit(b"c", creds["client"].public_key, None) is not None
    security.refresh(now=100.0)
    assert security.lost == []
    d.revoke("worker")
    assert security.refresh(now=100.5) is False  # checked at most every RELOAD_SECONDS
    assert security.refresh(now=101.5) is True
    assert security.lost == [b"w"]
    (peer, refusal), = security.replies
    assert peer == b"w" and f"this key ({fingerprint(creds['worker'].public_key)}) was revoked" in refusal.reason
    # its next transmission is not admitted (not decoded), and counted
    assert security.admit(b"w", creds["worker"].public_key, None) is None
    assert security.counters["security_refused_revoked"] == 1
    assert security.admit(b"c", creds["client"].public_key, None) is not None


def test_unknown_user_is_refused_and_a_broken_allow_list_keeps_the_last_good_one(
    gate: tuple[SecurityDir, ServerSecurity, dict[str, Credential]],
) -> None:
    d, security, creds = gate
    assert security.admit(b"x", "0" * 40, None) is None
    with open(d.allow_path, "a") as f:
        f.write("this is not TOML [[[\n")
    assert security.refresh(now=1e6) is True
    assert security.lookup(creds["client"].public_key) is not None  # kept the last good list


def test_ephemeral_keys_are_allowed_in_memory_only(tmp_path: Path) -> None:
    d = SecurityDir.init(str(tmp_path / "keys"))
    table: dict[str, KeyEntry] = {}
    security = ServerSecurity(d, table)
    keys = EphemeralKeys(d.daemon_keys()[0], table)
    cred = keys.issue("local-worker-7")
    allowed = security.lookup(cred.public_key)
    assert allowed is not None and allowed.role == "worker"
    assert d.entries() == []
    keys.withdraw(cred)
    assert security.lookup(cred.public_key) is None


def test_refusals_are_logged_once_per_peer_and_counted_each_time(
    gate: tuple[SecurityDir, ServerSecurity, dict[str, Credential]], caplog: pytest.LogCaptureFixture
) -> None:
    _, security, creds = gate
    allowed = security.admit(b"w", creds["worker"].public_key, None)
    assert allowed is not None
    with caplog.at_level("WARNING", logger="scaler_executor.security"):
        for _ in range(100):
            security.within_role(b"w", allowed, [m.SubmitTasks([])], None)
        other = security.admit(b"w2", creds["worker"].public_key, None)
        assert other is not None
        security.within_role(b"w2", other, [m.SubmitTasks([])], None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # one per peer within the minute
    assert "refused SubmitTasks from worker key 'worker'" in lines[0] and creds["worker"].fingerprint in lines[0]
    assert security.counters["security_refused_role"] == 101
