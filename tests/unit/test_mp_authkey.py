"""The pure parts of multiprocessing interop and remote tracebacks, by plain calls.

* The daemon names a client's authkey file only to workers whose Hello names the client's
  host (``client/authkey.py`` says why only the path travels).
* A processor sets the key of the task's client and restores its own; an unreadable file
  is remembered, and a proxy error becomes ``ProxyUnavailable`` saying why.
* ``fill_sources`` adds the client's source lines only where the worker showed none.
"""

from __future__ import annotations

import linecache
import multiprocessing
import os
import pickle
import socket
from typing import Any

import pytest
from core_testing import Cluster, hello, spec, tid

from scaler_executor.client import serialization as ser
from scaler_executor.exceptions import ProxyUnavailable
from scaler_executor.protocol import messages as m
from scaler_executor.protocol.tracebacks import fill_sources
from scaler_executor.worker.mpkey import ClientKeys

KEY_FILE = "/tmp/scaler-1-x/mp-authkey"


@pytest.mark.parametrize(
    "worker_host, expected",
    [("node-1", KEY_FILE), ("node-2", "")],
    ids=["same-host", "other-host"],
)
def test_the_key_file_is_named_only_to_workers_on_the_clients_host(worker_host: str, expected: str) -> None:
    cluster = Cluster()
    cluster.join(b"c1", hello(m.Role.CLIENT, name="c1", host="node-1", authkey_file=KEY_FILE))
    cluster.worker(b"w1", host=worker_host)
    t = tid(cluster.ids[b"c1"], 1)
    out = cluster.send(b"c1", m.SubmitTasks([spec(t)]))
    assert [d.authkey_file for d in out.dispatched(b"w1")] == [expected]


def test_a_processor_uses_its_clients_key_and_restores_its_own(tmp_path: Any) -> None:
    key, other = os.urandom(32), os.urandom(32)
    path, other_path = tmp_path / "mp-authkey", tmp_path / "other-authkey"
    path.write_bytes(key)
    other_path.write_bytes(other)
    keys = ClientKeys()
    process = multiprocessing.current_process()
    own = bytes(process.authkey)
    keys.use("")  # no key given: nothing changes
    assert bytes(process.authkey) == own
    keys.use(str(path))
    assert bytes(process.authkey) == key
    keys.use(str(path))  # the same client's next task: still its key
    assert bytes(process.authkey) == key
    keys.use(str(other_path))  # another client's task runs with that client's key
    assert bytes(process.authkey) == other
    keys.use("")  # a task without a key file runs with the processor's own
    assert bytes(process.authkey) == own
    path.unlink()
    keys.use(str(path))  # read once: the key stays known to this processor
    assert bytes(process.authkey) == key
    keys.use(str(tmp_path / "missing"))  # unreadable: the processor's own, not the last client's
    assert bytes(process.authkey) == own
    keys.use(str(other_path))
    keys.release()
    assert bytes(process.authkey) == own


def _proxy_error() -> BaseException:
    """A real error from unpickling a proxy whose manager refuses this process's key."""
    manager = multiprocessing.Manager()
    try:
        blob = pickle.dumps(manager.dict())
        process = multiprocessing.current_process()
        own = process.authkey
        process.authkey = os.urandom(32)
        try:
            pickle.loads(blob)
        except BaseException as exc:  # noqa: BLE001 - the error is what the test needs
            return exc
        finally:
            process.authkey = own
        raise AssertionError("the proxy connected with a wrong key")
    finally:
        manager.shutdown()


def test_a_proxy_error_says_why(tmp_path: Any) -> None:
    raw = _proxy_error()
    assert type(raw).__name__ == "AuthenticationError"
    keys = ClientKeys()
    elsewhere = keys.explain(raw, "", "the task's arguments")
    assert isinstance(elsewhere, ProxyUnavailable) and elsewhere.__cause__ is raw
    assert "not on the client's host" in str(elsewhere) and socket.gethostname() in str(elsewhere)
    unreadable = str(tmp_path / "missing")
    keys.use(unreadable)
    assert keys.key_file == ""  # not set: the processor's own key stays
    other_user = keys.explain(raw, unreadable, "the task's arguments")
    assert isinstance(other_user, ProxyUnavailable) and "could not read" in str(other_user)
    assert keys.explain(ValueError("unrelated"), "", "the task's arguments").args == ("unrelated",)


def test_by_value_code_keeps_its_file_name() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile("def f():\n    return lambda: 1\n", "/somewhere/program.py", "exec"), namespace)
    f = pickle.loads(ser.dumps(namespace["f"]))
    assert f.__code__.co_filename == "/somewhere/program.py"
    assert f().__code__.co_filename == "/somewhere/program.py"  # nested code too


def test_fill_sources_adds_only_missing_lines() -> None:
    path = "/nowhere/client_only.py"
    linecache.cache[path] = (30, None, ["x = 1\n", "raise KeyError(x)\n"], path)
    try:
        text = (
            "Traceback (most recent call last):\n"
            f'  File "{path}", line 2, in <module>\n'
            f'  File "{path}", line 1, in g\n'
            "    y = 2  # shown by the worker\n"
            "KeyError: 1\n"
        )
        assert fill_sources(text) == (
            "Traceback (most recent call last):\n"
            f'  File "{path}", line 2, in <module>\n'
            "    raise KeyError(x)\n"
            f'  File "{path}", line 1, in g\n'
            "    y = 2  # shown by the worker\n"
            "KeyError: 1\n"
        )
    finally:
        del linecache.cache[path]
