"""The environment layer is lenient: SCALER_* variables that name no key are ignored, and only
near-misses of our own names are warned about (once each), never refused.

Each test uses variable names of its own: a near-miss is warned about once per process.
"""

from __future__ import annotations

import logging
import warnings

import pytest

from scaler_executor.config import RESERVED_ENV, WARNED_ENV, ClusterConfig, warned_env
from scaler_executor.exceptions import ConfigError, ConfigWarning


def load_recording(env: dict[str, str]) -> tuple[ClusterConfig, list[str]]:
    """The config for ``env`` and the texts of the ConfigWarnings that loading it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = ClusterConfig.load(env=env)
    return config, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


@pytest.mark.parametrize(
    "name",
    ["SCALER_HOME", "SCALER_LOG", "SCALER_VERSION", "SCALER_PORT", "SCALER_CONFIG_FILE", "SCALER_MAX_PREFETCHXYZ"],
)
def test_unrelated_variables_are_ignored_without_a_word(name: str, caplog: pytest.LogCaptureFixture) -> None:
    config, texts = load_recording({name: "/x", "PATH": "/bin"})
    assert config == ClusterConfig()
    assert texts == []
    assert name not in caplog.text


@pytest.mark.parametrize(
    ("name", "guess"),
    [
        ("SCALER_MAX_RETRY", "SCALER_MAX_RETRIES"),  # the singular of a key
        ("SCALER_WORKER", "SCALER_WORKERS"),
        ("SCALER_ADDR", "SCALER_ADDRESS"),  # two edits
        ("SCALER_HEARTBEAT_INTERVL", "SCALER_HEARTBEAT_INTERVAL"),
        ("SCALER_CONFG", "SCALER_CONFIG"),  # a variable of ours that is no key
        ("SCALER_DEBUG_LOCK", "SCALER_DEBUG_LOCKS"),
    ],
)
def test_near_misses_warn_with_the_suggestion_and_are_ignored(
    name: str, guess: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scaler_executor.config")
    config, texts = load_recording({name: "9"})
    assert config == ClusterConfig()  # the value is not applied to any key
    assert len(texts) == 1
    assert texts[0].startswith(f"ignoring environment variable {name}: ")
    assert f"did you mean {guess}?" in texts[0]
    assert [r.getMessage() for r in caplog.records if name in r.getMessage()] == texts


def test_a_near_miss_is_warned_about_once_per_variable() -> None:
    env = {"SCALER_SEND_HWMS": "1", "SCALER_SUBMIT_WINDOWS": "1"}
    _, first = load_recording(env)
    _, second = load_recording(env)
    assert len(first) == 2 and second == []
    assert {"SCALER_SEND_HWMS", "SCALER_SUBMIT_WINDOWS"} <= warned_env()
    _, third = load_recording({**env, "SCALER_MAX_PREFETCHS": "1"})
    assert len(third) == 1 and "SCALER_MAX_PREFETCHS" in third[0]


def test_names_a_parent_already_warned_about_are_not_warned_again() -> None:
    _, texts = load_recording({"SCALER_CANCEL_WAITS": "1", WARNED_ENV: "SCALER_X,SCALER_CANCEL_WAITS"})
    assert texts == []


def test_reserved_names_are_never_near_misses() -> None:
    RESERVED_ENV.add("SCALER_WORKERZ")
    try:
        config, texts = load_recording({"SCALER_WORKERZ": "1", "SCALER_DEBUG_LOCKS": "1", "SCALER_DAEMON_ADDRESS": "x"})
    finally:
        RESERVED_ENV.discard("SCALER_WORKERZ")
    assert config == ClusterConfig() and texts == []


def test_warnings_can_be_made_errors_like_any_other() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        with pytest.raises(ConfigWarning, match="SCALER_CLIENT_TIMEOUTS"):
            ClusterConfig.load(env={"SCALER_CLIENT_TIMEOUTS": "1"})


def test_known_variables_still_apply_and_bad_values_still_fail() -> None:
    config, texts = load_recording({"SCALER_MAX_RETRIES": "5", "SCALER_HOME": "/x"})
    assert config.max_retries == 5 and texts == []
    with pytest.raises(ConfigError, match=r"invalid max_retries='x' \(from environment variable SCALER_MAX_RETRIES\)"):
        ClusterConfig.load(env={"SCALER_MAX_RETRIES": "x"})


def test_files_and_flags_stay_strict() -> None:
    with pytest.raises(ConfigError, match="unknown keys in CLI options: 'max_retry' \\(did you mean 'max_retries'\\?\\)"):
        ClusterConfig.load(env={}, cli={"max_retry": 1})
    with pytest.raises(ConfigError, match="unknown keys in my dict: 'home'"):
        ClusterConfig.from_dict({"home": "/x"}, source="my dict")
