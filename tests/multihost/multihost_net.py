"""Hosts on real separate network stacks, for the multi-host tests.

::

      netns <run>-daemon      <run>-w1          <run>-w2          <run>-client     <run>-rogue
      10.231.0.1 eth0         10.231.0.2 eth0   10.231.0.3 eth0   10.231.0.4 eth0  10.231.0.5 eth0
            │                     │                 │                 │                │
      ──────┴── p-daemon ─────── p-w1 ──────────── p-w2 ──────────── p-client ─────── p-rogue ──
                              bridge br0 in netns <run>-switch

Each host is a network namespace joined to a bridge by a veth pair; the bridge and the
switch side of every pair live in a namespace of their own, so nothing is added to the
machine's own network stack, and no interface name can collide with another run's. Cutting a
host's link (``Hosts.cut``) sets its switch port down: the host keeps its address and route
and its TCP connections see silence, as with a pulled cable.

Every process a test starts on a host runs through ``ip netns exec`` and ``unshare --mount
--uts`` (its own host name) with fresh tmpfs mounts on ``/dev/shm`` and its ``TMPDIR``: no host can map another's object
store, so object bytes between hosts can only cross the network.

Names carry the run's prefix (``scx-<pid>-<n>``); ``Hosts.close`` kills every process in
the namespaces and deletes them, on every exit path (the fixtures' finalizers), and
``sweep`` removes what a killed earlier run left (its pid is gone) at session start; the
parties' logs (a temporary directory per ``Hosts``) go with them.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
PREFIX = "scx-"
SUBNET = "10.231.0"
ROLES = ("daemon", "w1", "w2", "client", "rogue")
SHM_SIZE = "1g"  # each host's private /dev/shm: the daemon's store (object_store_size) fits
_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def probe() -> str | None:
    """Why namespaces cannot be made here, or None (tries one, then removes it)."""
    for command in ("ip", "unshare", "mount"):
        if shutil.which(command) is None:
            return f"needs `{command}` (iproute2, util-linux: .ci/system-deps) for network namespaces"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    name = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        run = subprocess.run(
            ["ip", "netns", "exec", name, "unshare", "--mount", "--propagation", "private", "--",
             "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm"],
            capture_output=True, text=True, timeout=30,
        )
        if run.returncode != 0:
            return f"cannot mount a private /dev/shm in a mount namespace: {run.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(namespace: str) -> None:
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    for pid in pids:
        try:
            psutil.Process(int(pid)).wait(10)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired, ValueError, ChildProcessError):
            pass


def sweep() -> list[str]:
    """Remove namespaces an earlier run left (its pid is gone), what runs in them, and its logs."""
    removed = []
    for name in _namespaces():
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX) :].split("-")[0]
        if owner.isdigit() and int(owner) != os.getpid() and not psutil.pid_exists(int(owner)):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    stale = glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*-logs-*"))
    for path in stale + glob.glob(os.path.join(KEYS_ROOT, f"{PREFIX}*-keys-*")):
        owner = os.path.basename(path)[len(PREFIX) :].split("-")[0]
        if owner.isdigit() and int(owner) != os.getpid() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class Party:
    """A process on one host (its own session: killing it takes its children along)."""

    def __init__(self, host: str, argv: list[str], popen: subprocess.Popen[str], log_path: str) -> None:
        self.host = host
        self.argv = argv
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the process group and reap it; SIGKILL if it outlives ``timeout``."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(10)
        try:  # what the group left behind (a processor that ignored SIGTERM)
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()
        return self.popen.returncode

    def __repr__(self) -> str:
        return f"<Party {self.host} pid {self.popen.pid} {' '.join(self.argv[-3:])!r}>"


class Hosts:
    """Five hosts on one bridge (see the module doc); a context manager that removes them."""

    def __init__(self, mtu: int = 1500) -> None:
        self.mtu = mtu  # 1500: Ethernet's; 9000: a data centre's jumbo frames (bench/multihost.py)
        self.run = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.run}-switch"
        self.names = {role: f"{self.run}-{role}" for role in ROLES}
        self.addresses = {role: f"{SUBNET}.{i + 1}" for i, role in enumerate(ROLES)}
        self.parties: list[Party] = []
        self.logdir = tempfile.mkdtemp(prefix=f"{self.run}-logs-")
        self._made: list[str] = []
        self._security: list[Security] = []

    # ------------------------------------------------------------------ network

    def create(self) -> Hosts:
        try:
            self._add(self.switch)
            sw = self.switch
            _ip("-n", sw, "link", "add", "br0", "type", "bridge")
            _ip("-n", sw, "link", "set", "br0", "up")
            for role in ROLES:
                ns = self.names[role]
                self._add(ns)
                _ip("-n", sw, "link", "add", f"p-{role}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", sw, "link", "set", f"p-{role}", "mtu", str(self.mtu))
                _ip("-n", ns, "link", "set", "eth0", "mtu", str(self.mtu))
                _ip("-n", sw, "link", "set", f"p-{role}", "master", "br0")
                _ip("-n", sw, "link", "set", f"p-{role}", "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[role]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def cut(self, role: str) -> None:
        """Take ``role``'s link down at the switch (its address and routes stay)."""
        _ip("-n", self.switch, "link", "set", f"p-{role}", "down")

    def restore(self, role: str) -> None:
        _ip("-n", self.switch, "link", "set", f"p-{role}", "up")

    def port_bytes(self, role: str) -> tuple[int, int]:
        """Bytes (received, sent) by ``role``'s eth0: the kernel's counters of what crossed its link."""
        out = _ip("-n", self.names[role], "-j", "-s", "link", "show", "eth0").stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])

    # ------------------------------------------------------------------ processes

    def spawn(self, role: str, argv: list[str], env: dict[str, str] | None = None, stdin: bool = False) -> Party:
        """Run ``argv`` on ``role``'s host with a private /dev/shm and temp directory.

        The temp directory is a fresh tmpfs at a path of its own, named by ``TMPDIR`` (every
        socket directory and store fallback of the package goes through ``tempfile``), not a
        tmpfs over ``/tmp``: the checkout and its venv may live under ``/tmp`` (a CI clone),
        and a party must still see them.  stdout and stderr go to a log file
        (``Party.log``), unless ``stdin`` asks for a line-protocol party (``Driver``): then
        stdout is a pipe and stderr the log.
        """
        private_tmp = os.path.join(self.logdir, f"tmp-{role}-{len(self.parties)}")
        os.makedirs(private_tmp, exist_ok=True)
        wrapped = [
            "ip", "netns", "exec", self.names[role],
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "sh", "-c",
            (
                f"hostname {self.run}-{role}"
                f" && mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs /dev/shm"
                f" && mount -t tmpfs -o size=64m,mode=1777 tmpfs {private_tmp}"
                f' && export TMPDIR={private_tmp} && exec "$@"'
            ),
            "sh", *argv,
        ]
        log_path = os.path.join(self.logdir, f"{role}-{len(self.parties)}.log")
        log = open(log_path, "w")  # noqa: SIM115  (the child holds it; closed here right after)
        try:
            popen = subprocess.Popen(
                wrapped,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdin else log,
                stderr=log,
                env=env if env is not None else child_env(),
                text=True,
                start_new_session=True,
                cwd=REPO,
            )
        finally:
            log.close()
        party = Party(role, argv, popen, log_path)
        self.parties.append(party)
        return party

    def security(self) -> Security:
        """A new security directory for a cluster on these hosts (removed by ``close``)."""
        made = Security(self.run)
        self._security.append(made)
        return made

    def daemon_address(self, port: int = 8786) -> str:
        return f"tcp://{self.addresses['daemon']}:{port}"

    def close(self) -> None:
        for party in reversed(self.parties):
            party.stop(signal.SIGKILL, timeout=10)
        for ns in reversed(self._made):
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        for security in self._security:
            security.close()
        self._security.clear()
        shutil.rmtree(self.logdir, ignore_errors=True)  # a failed test's fixture printed them first

    def __enter__(self) -> Hosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a party: no SCALER_* leaks in; the tests' task modules import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_") and k != "TMPDIR"}
    paths = [REPO, HERE] + [os.getcwd() if p == "" else p for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Driver:
    """A client on its host (``multihost_client.py``), driven by one JSON line per command."""

    def __init__(self, party: Party, stdout: IO[str]) -> None:
        self.party = party
        self.stdout = stdout
        self.closed = False

    def call(self, op: str, answer_within: float = 60.0, **fields: Any) -> dict[str, Any]:
        stdin = self.party.popen.stdin
        assert stdin is not None
        self.closed = self.closed or op == "close"
        stdin.write(json.dumps({"op": op, **fields}) + "\n")
        stdin.flush()
        line = _readline(self.stdout, answer_within)
        if not line:
            raise AssertionError(f"the client exited during {op!r}; its log:\n{self.party.log()[-4000:]}")
        answer: dict[str, Any] = json.loads(line)
        if "bug" in answer:
            raise AssertionError(f"the client failed in {op!r}: {answer['bug']}\nits log:\n{self.party.log()[-4000:]}")
        return answer


def _readline(stream: IO[str], timeout: float) -> str:
    import select

    if not select.select([stream], [], [], timeout)[0]:
        raise AssertionError(f"no answer from the client within {timeout} s")
    return stream.readline()


def stats(client: Driver) -> dict[str, Any]:
    """The daemon's counters, as ``client`` reads them (its ``stats`` call also returns ``store``)."""
    return client.call("stats")["stats"]


def poll(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll a real condition until it holds (its value) or fail after ``timeout`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


# ---------------------------------------------------------------------- a cluster on the hosts

# Security: every cluster has keys by default (``Cluster(secure=True)``). ``Security`` makes the
# cluster's directory with ``scaler-keys init`` and one credential per party with ``scaler-keys
# issue``, outside the parties' private TMPDIR (each host mounts its own tmpfs there, so a file
# in the test process's temp directory is not visible to them): under KEYS_ROOT. ``secure=False`` runs the
# same cluster with ``--insecure`` (bench/multihost.py compares the two).
INSECURE_FLAGS: list[str] = ["--insecure"]
INSECURE_CLIENT: dict[str, Any] = {"insecure": True}
KEYS_ROOT = "/var/tmp"


class Security:
    """A cluster's security directory and its parties' credentials, made with ``scaler-keys``."""

    def __init__(self, run: str) -> None:
        self.root = tempfile.mkdtemp(prefix=f"{run}-keys-", dir=KEYS_ROOT)
        self.path = os.path.join(self.root, "cluster")
        keys("init", self.path)
        self.credentials: dict[str, str] = {}

    def credential(self, name: str, role: str) -> str:
        """The credential file of ``name`` (issued on first use with ``role``)."""
        if name not in self.credentials:
            output = os.path.join(self.root, f"{name}.cred")
            keys("issue", self.path, name, "--role", role, "--output", output)
            self.credentials[name] = output
        return self.credentials[name]

    def revoke(self, name: str) -> None:
        keys("revoke", self.path, name)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def keys(*args: str) -> str:
    """Run ``scaler-keys ARGS`` (the module, in this interpreter); its output, or fail with its error."""
    run = subprocess.run([sys.executable, "-m", "scaler_executor.cli.keys", *args], capture_output=True,
                         text=True, timeout=60, env=child_env(), cwd=REPO)
    if run.returncode != 0:
        raise AssertionError(f"scaler-keys {' '.join(args)} failed: {run.stderr.strip()}")
    return run.stdout


# Liveness on the multi-host tests' clusters: a peer silent for LIVENESS_LIMIT seconds is lost.
HEARTBEAT = 0.2
LIVENESS = 25  # 5 s: a loaded 2-core machine's starved process stays well inside it
LIVENESS_LIMIT = HEARTBEAT * LIVENESS
COMMON = ["--heartbeat-interval", str(HEARTBEAT), "--heartbeat-liveness", str(LIVENESS), "--log-level", "info"]


class Cluster:
    """A daemon on ``daemon``, workers on ``w1`` and ``w2``, a driven client on ``client``.

    With ``secure`` (the default) the daemon runs ``--security DIR`` and every party holds a
    credential of its own: a worker ``w1``'s is named ``w1`` (role worker), the n-th client's
    ``client-n`` (role client). They are issued before the daemon starts (it reads its
    allow-list at start and then every few seconds): the workers', ``CLIENTS`` clients' and
    those ``parties`` names (name: role).
    """

    CLIENTS = 4

    def __init__(self, hosts: Hosts, daemon_flags: list[str], worker_flags: list[str], secure: bool = True,
                 parties: dict[str, str] | None = None, port: int = 8786) -> None:
        self.hosts = hosts
        self.address = hosts.daemon_address(port)
        self.daemon_flags = daemon_flags
        self.worker_flags = worker_flags
        self.security = hosts.security() if secure else None
        if self.security is not None:
            wanted = {"w1": "worker", "w2": "worker", **{f"client-{i}": "client" for i in range(self.CLIENTS)}}
            for name, role in {**wanted, **(parties or {})}.items():
                self.security.credential(name, role)
        self.daemon: Party | None = None
        self.workers: dict[str, Party] = {}
        self.clients: list[Driver] = []

    def _flags(self, name: str, role: str) -> list[str]:
        if self.security is None:
            return INSECURE_FLAGS
        if role == "daemon":
            return ["--security", self.security.path]
        return ["--credentials", self.security.credential(name, role)]

    def start_daemon(self) -> Party:
        argv = [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", self.address,
                "--workers", "0", "--object-store-size", "768M", *COMMON, *self._flags("daemon", "daemon"),
                *self.daemon_flags]
        self.daemon = self.hosts.spawn("daemon", argv)
        return self.daemon

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        self.daemon.stop(signal.SIGKILL)

    def start_worker(self, role: str, flags: list[str] | None = None) -> Party:
        """A worker on host ``role`` with its own credential (``flags``, if given, instead)."""
        security = self._flags(role, "worker") if flags is None else flags
        argv = [sys.executable, "-m", "scaler_executor.cli.worker", self.address, "--name", role,
                "--processors", "2", *COMMON, *security, *self.worker_flags]
        self.workers[role] = party = self.hosts.spawn(role, argv)
        return party

    def client(self, credentials: str | None = None, host: str = "client", **config: Any) -> Driver:
        """A driven client on ``host``: its own credential (issued before the daemon started), or the file ``credentials``."""
        settings = {"heartbeat_interval": HEARTBEAT, "heartbeat_liveness": LIVENESS, **config}
        executor: dict[str, Any] = {}
        if self.security is None:
            settings.update(INSECURE_CLIENT)
        elif credentials is not None:
            executor["credentials"] = credentials
        else:
            name = f"client-{len(self.clients)}"
            if name not in self.security.credentials:  # issued now, it would race the daemon's next read
                raise AssertionError(f"{name} was not issued before the daemon started: raise Cluster.CLIENTS")
            executor["credentials"] = self.security.credentials[name]
        here = os.path.dirname(os.path.abspath(__file__))
        party = self.hosts.spawn(host, [sys.executable, os.path.join(here, "multihost_client.py")], stdin=True)
        assert party.popen.stdout is not None
        driver = Driver(party, party.popen.stdout)
        self.clients.append(driver)
        driver.call("open", address=self.address, config=settings, executor=executor)
        return driver

    def ready_client(self, workers: int = 1, **kwargs: Any) -> Driver:
        """A driven client (``client(**kwargs)``) once ``workers`` workers have joined the daemon."""
        client = self.client(**kwargs)
        poll(lambda: stats(client)["workers"] >= workers, 60, f"{workers} worker(s) joined\n{self.logs()}")
        return client

    def stop(self) -> None:
        """Close the clients, then stop the workers and the daemon (a bench runs clusters in turn)."""
        for driver in self.clients:
            if not driver.closed and driver.party.alive():
                driver.call("close", answer_within=60)
            driver.party.stop()
        for party in self.workers.values():
            party.stop()
        if self.daemon is not None:
            self.daemon.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.host} ({p.pid}) ---\n{p.log()[-3000:]}" for p in self.hosts.parties)
