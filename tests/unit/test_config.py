"""ClusterConfig: defaults, validation, the file/env/CLI layers and argparse integration."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler_executor import config as config_module
from scaler_executor.config import (
    ClusterConfig,
    add_config_arguments,
    config_from_args,
)
from scaler_executor.config.schema import quoted
from scaler_executor.exceptions import ConfigError

NO_ENV: dict[str, str] = {}


def write(tmp_path: Path, text: str, name: str = "scaler.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def parser_with_config(include: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaler-test")
    add_config_arguments(parser, include=include)
    return parser


# ---------------------------------------------------------------------- the dataclass


def test_defaults() -> None:
    assert ClusterConfig().to_dict() == {
        "address": None,
        "workers": 0,
        "min_workers": None,
        "scale_down_idle": 5.0,
        "processors_per_worker": 1,
        "heartbeat_interval": 0.5,
        "heartbeat_liveness": 10,
        "daemon_loss_timeout": 15.0,
        "worker_daemon_loss_timeout": 300.0,
        "drain_seconds": 0.0,
        "connect_timeout": 5.0,
        "cancel_wait": 0.05,
        "client_timeout": 60.0,
        "max_retries": 3,
        "max_tasks_per_child": None,
        "send_hwm": 1000,
        "max_message_size": 256 << 20,
        "max_backlog_bytes": 1 << 30,
        "max_peers": 10_000,
        "submit_window": 100_000,
        "max_pending_tasks": 1_000_000,
        "max_pending_bytes": 8 * 2**30,
        "pending_full": "block",
        "worker_lanes": True,
        "max_prefetch": 256,
        "worker_resources": "",
        "worker_tags": "",
        "memory_limit": "auto",
        "object_store_size": "auto",
        "object_store_threshold": 65536,
        "arrays_in_store": 1048576,
        "capture_output": False,
        "capture_output_limit": 1048576,
        "forward_output": False,
        "forward_output_rate": 1048576.0,
        "history_runs": 20_000,
        "unsatisfiable_timeout": None,
        "no_worker_warning": 10.0,
        "journal": None,
        "journal_fsync": "interval",
        "journal_fsync_interval": 0.01,
        "restart_grace": 30.0,
        "log_level": "WARNING",
        "security": None,
        "credentials": None,
        "insecure": False,
    }


def test_frozen_and_keyword_only() -> None:
    config = ClusterConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.workers = 4  # type: ignore[misc]  # the point: assignment must fail
    with pytest.raises(TypeError):
        ClusterConfig("tcp://127.0.0.1:1")  # type: ignore[call-arg]  # positional is refused


def test_every_field_has_help_in_metadata() -> None:
    for f in dataclasses.fields(ClusterConfig):
        assert f.metadata[config_module._META].help, f.name


def test_float_fields_accept_ints_and_log_level_is_upper_cased() -> None:
    config = ClusterConfig(heartbeat_interval=1, daemon_loss_timeout=10, log_level="debug")
    assert type(config.heartbeat_interval) is float and config.heartbeat_interval == 1.0
    assert type(config.daemon_loss_timeout) is float
    assert config.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"workers": True}, "invalid workers=True: must be an integer >= 0 and <= 9223372036854775807 (a bool is not"),
        ({"workers": 2.0}, "invalid workers=2.0: must be an integer >= 0"),
        ({"workers": -1}, "invalid workers=-1: must be an integer >= 0"),
        ({"processors_per_worker": 0}, "processors_per_worker=0: must be an integer >= 1"),
        ({"heartbeat_interval": 0}, "heartbeat_interval=0: must be a finite number > 0"),
        ({"heartbeat_interval": float("nan")}, "heartbeat_interval=nan: must be a finite"),
        ({"heartbeat_interval": "1"}, "heartbeat_interval='1': must be a finite number"),
        ({"heartbeat_liveness": 1}, "heartbeat_liveness=1: must be an integer >= 2"),
        ({"daemon_loss_timeout": -1.0}, "daemon_loss_timeout=-1.0: must be a finite number > 0"),
        ({"max_retries": -1}, "max_retries=-1: must be an integer >= 0"),
        ({"max_tasks_per_child": 0}, "max_tasks_per_child=0: must be an integer >= 1 and <= 9223372036854775807 or none"),
        ({"send_hwm": 0}, "send_hwm=0: must be an integer >= 1"),
        ({"submit_window": 0}, "submit_window=0: must be an integer >= 1"),
        ({"max_prefetch": 0}, "max_prefetch=0: must be an integer >= 1"),
        ({"log_level": "LOUD"}, "log_level='LOUD': must be one of DEBUG, INFO, WARNING, ERROR"),
        ({"log_level": None}, "log_level=None: must be one of"),
        ({"insecure": 1}, "insecure=1: must be true or false"),
        ({"address": 5}, "address=5: must be a string or none"),
    ],
)
def test_invalid_values(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match="^invalid ") as info:
        ClusterConfig(**changes)
    assert expected in str(info.value)


def test_daemon_loss_timeout_must_cover_two_heartbeats() -> None:
    ClusterConfig(heartbeat_interval=1.0, daemon_loss_timeout=2.0)  # the boundary is allowed
    with pytest.raises(ConfigError) as info:
        ClusterConfig(heartbeat_interval=1.0, daemon_loss_timeout=1.5)
    message = str(info.value)
    assert "daemon_loss_timeout=1.5" in message and "2 * heartbeat_interval=1.0" in message
    assert "raise daemon_loss_timeout or lower heartbeat_interval" in message


def test_cross_field_error_names_the_layers() -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load(env={"SCALER_HEARTBEAT_INTERVAL": "4"}, cli={"daemon_loss_timeout": 1.0})
    message = str(info.value)
    assert "(from CLI flag --daemon-loss-timeout)" in message
    assert "(from environment variable SCALER_HEARTBEAT_INTERVAL)" in message


def test_replace_validates_and_rejects_unknown_names() -> None:
    config = ClusterConfig().replace(workers=4, log_level="info")
    assert (config.workers, config.log_level) == (4, "INFO")
    with pytest.raises(ConfigError, match=r"invalid workers=-2 \(from replace\(\)\)"):
        config.replace(workers=-2)
    with pytest.raises(ConfigError, match="'worker' \\(did you mean 'workers'\\?\\)"):
        config.replace(worker=4)


def test_from_dict() -> None:
    config = ClusterConfig.from_dict({"workers": 2, "max_tasks_per_child": "none"})
    assert (config.workers, config.max_tasks_per_child) == (2, None)
    with pytest.raises(ConfigError, match=r"invalid workers='2' \(from my dict\)"):
        ClusterConfig.from_dict({"workers": "2"}, source="my dict")
    with pytest.raises(ConfigError, match="unknown keys in my dict: 'max_retry'"):
        ClusterConfig.from_dict({"max_retry": 1}, source="my dict")


# ---------------------------------------------------------------------- TOML file


def test_load_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'address = "tcp://10.0.0.1:2345"\nworkers = 4\nheartbeat_interval = 1\n'
        'log_level = "info"\ninsecure = true\nmax_tasks_per_child = 50\n',
    )
    config = ClusterConfig.load(file=path, env=NO_ENV)
    assert config.address == "tcp://10.0.0.1:2345"
    assert (config.workers, config.heartbeat_interval, config.log_level) == (4, 1.0, "INFO")
    assert config.insecure is True and config.max_tasks_per_child == 50
    assert config.max_retries == 3  # untouched keys keep their defaults


def test_file_named_by_scaler_config_and_explicit_file_wins(tmp_path: Path) -> None:
    from_env = write(tmp_path, "workers = 1\n", "env.toml")
    explicit = write(tmp_path, "workers = 2\n", "explicit.toml")
    env = {"SCALER_CONFIG": str(from_env)}
    assert ClusterConfig.load(env=env).workers == 1
    assert ClusterConfig.load(file=explicit, env=env).workers == 2


def test_file_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    bad_value = write(tmp_path, "workers = -3\n")
    with pytest.raises(ConfigError, match=f"invalid workers=-3 \\(from config file {bad_value}\\)"):
        ClusterConfig.load(file=bad_value, env=NO_ENV)

    typo = write(tmp_path, "heartbeat-interval = 1.0\nworkerz = 1\n")
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load(file=typo, env=NO_ENV)
    message = str(info.value)
    assert f"unknown keys in config file {typo}" in message
    assert "'heartbeat-interval' (did you mean 'heartbeat_interval'?)" in message
    assert "'workerz' (did you mean 'workers'?)" in message

    table = write(tmp_path, "[scaler]\nworkers = 1\n")
    with pytest.raises(ConfigError, match="keys go at the top level.*delete the '\\[scaler\\]'"):
        ClusterConfig.load(file=table, env=NO_ENV)

    with pytest.raises(ConfigError, match="is not valid TOML"):
        ClusterConfig.load(file=write(tmp_path, "workers = \n"), env=NO_ENV)

    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=r"missing.toml \(named by SCALER_CONFIG\) does not"):
        ClusterConfig.load(env={"SCALER_CONFIG": str(missing)})


def test_to_toml_round_trips(tmp_path: Path) -> None:
    config = ClusterConfig(
        address='ipc:///tmp/sc "q"\\é',
        workers=3,
        heartbeat_interval=0.25,
        heartbeat_liveness=4,
        daemon_loss_timeout=7,
        max_tasks_per_child=10,
        log_level="error",
        insecure=True,
        credentials="/home/u/client.cred",
    )
    text = config.to_toml()
    assert tomllib.loads(text)["workers"] == 3
    assert ClusterConfig.load(file=write(tmp_path, text), env=NO_ENV) == config
    defaults_text = ClusterConfig().to_toml()
    assert 'address = "none"' in defaults_text  # TOML has no null
    assert ClusterConfig.load(file=write(tmp_path, defaults_text), env=NO_ENV) == ClusterConfig()


# ---------------------------------------------------------------------- environment


@pytest.mark.parametrize(
    ("env", "key", "expected"),
    [
        ({"SCALER_WORKERS": " 8 "}, "workers", 8),
        ({"SCALER_SUBMIT_WINDOW": "100_000"}, "submit_window", 100_000),
        ({"SCALER_HEARTBEAT_INTERVAL": "0.2"}, "heartbeat_interval", 0.2),
        ({"SCALER_DAEMON_LOSS_TIMEOUT": "9"}, "daemon_loss_timeout", 9.0),
        ({"SCALER_ADDRESS": "tcp://h:1"}, "address", "tcp://h:1"),
        ({"SCALER_ADDRESS": ""}, "address", None),
        ({"SCALER_MAX_TASKS_PER_CHILD": "None"}, "max_tasks_per_child", None),
        ({"SCALER_MAX_TASKS_PER_CHILD": "5"}, "max_tasks_per_child", 5),
        ({"SCALER_LOG_LEVEL": "debug"}, "log_level", "DEBUG"),
        ({"SCALER_INSECURE": "0"}, "insecure", False),
        ({"SCALER_INSECURE": "No"}, "insecure", False),
        ({"SCALER_INSECURE": "false"}, "insecure", False),
        ({"SCALER_INSECURE": "YES"}, "insecure", True),
        ({"SCALER_INSECURE": "1"}, "insecure", True),
        ({"SCALER_INSECURE": "true"}, "insecure", True),
    ],
)
def test_env_values_parse_per_type(env: dict[str, str], key: str, expected: object) -> None:
    value = getattr(ClusterConfig.load(env=env), key)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SCALER_WORKERS": "four"}, "invalid workers='four' (from environment variable"),
        ({"SCALER_WORKERS": ""}, "invalid workers='' (from environment variable SCALER_WORKERS"),
        ({"SCALER_HEARTBEAT_INTERVAL": "fast"}, "invalid heartbeat_interval='fast'"),
        ({"SCALER_INSECURE": "maybe"}, "must be true or false"),
        ({"SCALER_MAX_RETRIES": "-1"}, "invalid max_retries=-1 (from environment variable"),
    ],
)
def test_env_errors_name_the_variable(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig.load(env=env)
    assert expected in str(info.value)


def test_bad_lower_layer_is_reported_even_when_overridden() -> None:
    with pytest.raises(ConfigError, match="SCALER_WORKERS"):
        ClusterConfig.load(env={"SCALER_WORKERS": "-1"}, cli={"workers": 2})


# ---------------------------------------------------------------------- precedence


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "workers = 1\nmax_retries = 1\nsend_hwm = 1\n")
    env = {"SCALER_WORKERS": "2", "SCALER_MAX_RETRIES": "2", "SCALER_CONFIG": str(path)}
    config = ClusterConfig.load(env=env, cli={"workers": 3})
    assert config.workers == 3  # CLI > env > file
    assert config.max_retries == 2  # env > file
    assert config.send_hwm == 1  # file > default
    assert config.max_prefetch == 256  # default


def test_base_is_the_bottom_layer() -> None:
    base = ClusterConfig(workers=7, max_retries=9)
    config = ClusterConfig.load(env={"SCALER_WORKERS": "1"}, base=base)
    assert (config.workers, config.max_retries) == (1, 9)


def test_cli_mapping_accepts_kebab_keys_and_strings_and_rejects_unknown() -> None:
    config = ClusterConfig.load(env=NO_ENV, cli={"max-retries": "5", "address": "none"})
    assert (config.max_retries, config.address) == (5, None)
    with pytest.raises(ConfigError, match="'retries' \\(did you mean 'max_retries'\\?\\)"):
        ClusterConfig.load(env=NO_ENV, cli={"retries": 1})


# ---------------------------------------------------------------------- argparse


def test_argparse_flags_override_env_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "workers = 1\nmax_prefetch = 8\nlog_level = 'ERROR'\n")
    args = parser_with_config().parse_args(
        ["--config", str(path), "--workers", "3", "--max-tasks-per-child", "none",
         "--insecure", "--heartbeat-interval", "1"]
    )  # fmt: skip
    config = config_from_args(args, env={"SCALER_MAX_PREFETCH": "16"})
    assert config.workers == 3 and config.max_prefetch == 16 and config.log_level == "ERROR"
    assert config.max_tasks_per_child is None and config.insecure is True
    assert config.heartbeat_interval == 1.0


def test_argparse_only_given_flags_are_set() -> None:
    args = parser_with_config().parse_args(["--insecure"])
    assert vars(args) == {"insecure": True}
    assert config_from_args(args, env={"SCALER_WORKERS": "5"}).workers == 5


def test_argparse_include_and_other_arguments() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="x")
    add_config_arguments(parser, include=["workers"])
    assert config_from_args(parser.parse_args(["--workers", "2"]), env=NO_ENV).workers == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-retries", "2"])
    with pytest.raises(ConfigError, match="did you mean 'workers'"):
        add_config_arguments(argparse.ArgumentParser(), include=["worker"])


def test_argparse_rejects_bad_values_with_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser_with_config().parse_args(["--workers", "-1"])
    assert "argument --workers: invalid workers=-1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser_with_config().parse_args(["--log-level", "LOUD"])
    assert "one of DEBUG, INFO, WARNING, ERROR" in capsys.readouterr().err


def test_argparse_help_comes_from_field_metadata() -> None:
    text = " ".join(parser_with_config().format_help().split())  # undo line wrapping
    for f in dataclasses.fields(ClusterConfig):
        assert "--" + f.name.replace("_", "-") in text
        assert "SCALER_" + f.name.upper() in text
    assert "--no-insecure" in text
    assert "seconds of silence after which a peer sends a heartbeat" in text


def test_worker_resources_are_parsed_and_checked() -> None:
    from scaler_executor.config import parse_resources, parse_tags

    assert parse_resources("cpu=4, gpu=1,mem=16e9") == {"cpu": 4.0, "gpu": 1.0, "mem": 16e9}
    assert parse_resources("") == {}
    assert parse_tags(" linux, ssd ,linux") == ["linux", "ssd"]
    for bad in ("gpu", "gpu=x", "=1", "gpu=-1", "gpu=1,gpu=2"):
        with pytest.raises(ConfigError, match="worker_resources|resource"):
            ClusterConfig(worker_resources=bad)


def test_sizes_read_every_common_spelling_as_binary_multiples() -> None:
    from scaler_executor.sizes import parse_size

    assert parse_size("4G") == parse_size("4GB") == parse_size("4GiB") == 4 << 30
    assert parse_size("512mib") == parse_size(" 512 MB ") == 512 << 20
    assert parse_size("1.5e9") == 1_500_000_000
    for bad in ("4X", "IB", "4GIBB", "-1", ""):
        with pytest.raises(ValueError, match="cannot read .* as a size: .*e.g. 4G or 512MiB"):
            parse_size(bad)
    config = ClusterConfig().replace(object_store_size="256MiB")
    assert config.object_store_size == "256MiB"


def test_max_message_size_keeps_an_object_chunk() -> None:
    """Below 8 MiB a 4 MiB object chunk (plus its header) could be cut: refused, naming the key."""
    with pytest.raises(ConfigError, match="max_message_size"):
        ClusterConfig(max_message_size=1 << 20)
    assert ClusterConfig(max_message_size=8 << 20).max_message_size == 8 << 20


def test_journal_keys_are_validated_with_the_fix() -> None:
    assert ClusterConfig(journal="/var/lib/scaler", journal_fsync="TURN").journal_fsync == "turn"
    with pytest.raises(ConfigError, match="journal_fsync='sometimes': must be one of turn, interval, os"):
        ClusterConfig(journal_fsync="sometimes")
    with pytest.raises(ConfigError, match="journal='  ': it is empty: name a directory"):
        ClusterConfig(journal="  ")
    with pytest.raises(ConfigError, match="restart_grace=0"):
        ClusterConfig(restart_grace=0)
    with pytest.raises(ConfigError, match="journal_fsync_interval"):
        ClusterConfig(journal_fsync_interval=-1)


# --------------------------------------------------------------------- quoted strings


@given(st.text())
def test_quoted_is_a_json_string_that_reads_back_unchanged(text: str) -> None:
    import json

    written = quoted(text)
    assert written.isascii() and json.loads(written) == text


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_quoted_for_toml_is_a_basic_string_that_reads_back_unchanged(text: str) -> None:
    written = quoted(text, toml=True)
    assert written.isascii() and tomllib.loads(f"key = {written}")["key"] == text
