"""The client's ``multiprocessing`` authkey, for processors on the client's own host only.

A ``multiprocessing.Manager()`` proxy (``Queue``, ``dict``, ``Event``, ``Lock``, ...) that
is unpickled connects to its manager and authenticates with
``multiprocessing.current_process().authkey``.  Processes that ``multiprocessing`` starts
inherit their parent's key; the cluster's processors do not, so each of a client's tasks
runs with the client's key set (``worker/mpkey.py``), then the processor's own comes back.

How the key travels — it does not::

    client ── writes its key to <0700 directory>/mp-authkey (mode 0600)
       │
       └─Hello(authkey_file=path)─► daemon ── TaskDispatch(authkey_file=path), only to a
                                               worker whose Hello names the client's host
                                                  │
                         processor ◄─RUN(path)── worker agent (a lane task: the path of
                            reads the file once     the lane's first dispatched task)

Only the path crosses the network.  The key is read from the file system, so a processor
gets it only if it runs on the client's host *and* as the client's user: a worker on another
host that claims the client's host name (host names are not proof) gets a path it cannot
open, and so does another user's worker on this host.  The daemon never holds the key
either, so a daemon on a third host never sees it.  Why the key must stay on the host: a
manager unpickles what its peers send, so whoever holds the key can run code in the client
(the manager is a thread of the client's process), and a manager's proxies are useless off
the host anyway when it listens on a Unix socket (the default).

The file lives in the embedded cluster's directory, or for a client of a running cluster in
a directory of its own named like the embedded cluster's (``scaler-<pid>-*``), so a client
that dies without cleaning up has it removed by the next client's sweep of stale directories.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

log = logging.getLogger(__name__)

KEY_FILE = "mp-authkey"


class AuthkeyFile:
    """The file that holds this process's authkey, as it is when the client starts.

    ``reserve`` names it (for the ``Hello``), ``write`` writes it, before any task is sent:
    importing ``multiprocessing`` costs a few milliseconds, which then overlap the wait for
    the daemon's ``Welcome`` instead of adding to the client's start.  ``path`` is "" when
    there is no directory to write it in (manager proxies then do not work in tasks, and the
    processor's error says that no key was given)."""

    def __init__(self, path: str, own_directory: str | None) -> None:
        self.path = path
        self._own_directory = own_directory

    @classmethod
    def reserve(cls, directory: str | None) -> AuthkeyFile:
        """The file's place: in ``directory`` (private to this user), or a new one of its own."""
        own = None
        if directory is None:
            try:
                directory = own = tempfile.mkdtemp(prefix=f"scaler-{os.getpid()}-")  # mode 0700
            except OSError as exc:
                log.warning("no multiprocessing authkey for this client's tasks (%s): manager proxies will not work in them", exc)
                return cls("", None)
        return cls(os.path.join(directory, KEY_FILE), own)

    def write(self) -> None:
        if not self.path:
            return
        import multiprocessing

        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, bytes(multiprocessing.current_process().authkey))
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("could not write this client's multiprocessing authkey to %s (%s): manager proxies "
                        "will not work in its tasks", self.path, exc)

    def close(self) -> None:
        """Remove the file (and its directory if it is this client's own); idempotent."""
        if self._own_directory is not None:
            shutil.rmtree(self._own_directory, ignore_errors=True)
            self._own_directory = None
        elif self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass  # the embedded cluster's directory is going with it
        self.path = ""
