"""Configuration values are checked where they enter: every key's range, the daemon address,
and config files that cannot be read, each with one line naming the key or file, its layer
and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scaler_executor.config import FLOAT_MAX, INT_MAX, ClusterConfig, check_address
from scaler_executor.exceptions import ConfigError


def one_line_error(**load: object) -> str:
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load(**load)  # type: ignore[arg-type]  # the tests pass each layer by name
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------- ranges


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("max_retries", 10**23, "an integer >= 0 and <= 9223372036854775807"),
        ("workers", INT_MAX + 1, "an integer >= 0 and <= 9223372036854775807"),
        ("send_hwm", 2**31, "an integer >= 1 and <= 2147483647"),
        ("heartbeat_interval", 1e300, "a finite number > 0 and <= 9.22337e+09"),
        ("client_timeout", float("inf"), "a finite number > 0 and <= 9.22337e+09"),
    ],
)
def test_each_layer_names_the_key_its_source_and_range(tmp_path: Path, key: str, value: float, rule: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"{key} = {'inf' if value == float('inf') else repr(value)}\n")
    env_name = "SCALER_" + key.upper()
    flag = "--" + key.replace("_", "-")
    for load, source in [
        ({"file": path, "env": {}}, f"config file {path}"),
        ({"env": {env_name: str(value)}}, f"environment variable {env_name}"),
        ({"env": {}, "cli": {key: str(value)}}, f"CLI flag {flag}"),
        ({"env": {}, "cli": {key: value}}, f"CLI flag {flag}"),
    ]:
        message = one_line_error(**load)
        assert message.startswith(f"invalid {key}="), message
        assert f"(from {source}): must be {rule}" in message


def test_the_bounds_themselves_are_accepted() -> None:
    config = ClusterConfig(max_retries=INT_MAX, send_hwm=2**31 - 1, client_timeout=FLOAT_MAX)
    assert (config.max_retries, config.send_hwm, config.client_timeout) == (INT_MAX, 2**31 - 1, FLOAT_MAX)


def test_an_enormous_integer_is_reported_without_printing_it(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"max_retries = {'9' * 4000}\n")
    message = one_line_error(file=path, env={})
    assert "invalid max_retries=<an integer of 13288 bits> (from config file" in message
    path.write_text(f"max_retries = {'9' * 5000}\n")  # more digits than Python reads
    message = one_line_error(file=path, env={})
    assert message.startswith(f"config file {path} cannot be read as TOML: Exceeds the limit")


# ---------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "fix"),
    [
        ("localhost:8786", "it has no scheme: write tcp://localhost:8786"),
        ("/tmp/d.sock", "it has no scheme: write ipc:///tmp/d.sock"),
        ("http://h:1", "the scheme http:// is not supported: write tcp://HOST:PORT or ipc:///PATH"),
        ("tcp://h", "it needs a host and a port from 0 to 65535: write tcp://HOST:PORT, e.g. tcp://h:8786"),
        ("tcp://h:99999", "a port from 0 to 65535"),
        ("tcp://:8786", "it needs a host"),
        ("ipc://", "it names no socket path"),
        ("ipc:///" + "d" * 120, "longer than the 107 bytes a Unix socket allows"),
    ],
)
def test_bad_addresses_name_the_fix(address: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_address(address)
    assert str(info.value) == f"invalid address {address!r}: {fix}" or fix in str(info.value)
    message = one_line_error(env={"SCALER_ADDRESS": address})
    assert f"invalid address={address!r} (from environment variable SCALER_ADDRESS): " in message
    assert fix in message


@pytest.mark.parametrize(
    "address", ["tcp://127.0.0.1:8786", "tcp://*:8786", "tcp://[::1]:8786", "tcp://host.example:0", "ipc:///tmp/x", "ipc://rel.sock"]
)
def test_good_addresses_pass(address: str) -> None:
    assert check_address(address) == address
    assert ClusterConfig(address=address).address == address


def test_an_address_that_is_no_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="address must be a string such as 'tcp://host:8786', got int"):
        check_address(8786)


# ---------------------------------------------------------------------- unreadable files


def test_a_binary_file_is_named_not_a_unicode_error(tmp_path: Path) -> None:
    path = tmp_path / "scaler.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    message = one_line_error(file=path, env={})
    assert message.startswith(f"config file {path} is not a text file (byte 0 is not UTF-8)"), message
    assert "name that file instead" in message
    # The same file named by $SCALER_CONFIG says so.
    message = one_line_error(env={"SCALER_CONFIG": str(path)})
    assert f"config file {path} (named by SCALER_CONFIG) is not a text file" in message


def test_a_latin1_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "scaler.toml"
    path.write_bytes('address = "ipc:///tmp/caf\u00e9"\n'.encode("latin-1"))
    assert "is not a text file (byte 25 is not UTF-8)" in one_line_error(file=path, env={})


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "scaler.toml"
    path.write_text("workers = 2\nmax_retries = = 3\n")
    message = one_line_error(file=path, env={})
    assert message.startswith(f"config file {path} is not valid TOML: ")
    assert "line 2" in message and message.endswith("fix that line")


def test_a_missing_file_and_a_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert one_line_error(file=missing, env={}) == f"config file {missing} does not exist: fix the path or drop it"
    assert one_line_error(file=tmp_path, env={}) == f"config file {tmp_path} is a directory: name the TOML file in it"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file, so permission is never denied")
def test_a_file_without_permission(tmp_path: Path) -> None:
    path = tmp_path / "scaler.toml"
    path.write_text("workers = 1\n")
    path.chmod(0)
    message = one_line_error(file=path, env={})
    assert message == f"cannot read config file {path}: permission denied; make it readable or name another file"
