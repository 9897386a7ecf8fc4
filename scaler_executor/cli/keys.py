"""``scaler-keys``: a cluster's security directory and the credentials issued from it.

    scaler-keys init DIR                                   the daemon's keypair + an allow-list
    scaler-keys issue DIR NAME --role ROLE --output FILE   a credential for one party (0600)
    scaler-keys list DIR                                   who holds a key, with role and state
    scaler-keys revoke DIR NAME                            the running daemon refuses it within seconds

Roles: client (submits work), worker (runs it), manager (starts workers), monitor (reads
statistics only). See docs/security.rst.
"""

from __future__ import annotations

import argparse
import sys

from scaler_executor.exceptions import ConfigError
from scaler_executor.security.keys import ROLES, SecurityDir, fingerprint


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaler-keys", description="Manage a scaler-executor cluster's CURVE keys and roles.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    init = sub.add_parser("init", help="make a security directory: the daemon's keypair and an empty allow-list")
    init.add_argument("dir", metavar="DIR")
    issue = sub.add_parser("issue", help="issue a credential for a named party and allow its key")
    issue.add_argument("dir", metavar="DIR")
    issue.add_argument("name", metavar="NAME")
    issue.add_argument("--role", required=True, choices=ROLES, help="what the daemon lets this key do")
    issue.add_argument("--output", required=True, metavar="FILE", help="where to write the credential (mode 0600; never overwritten)")
    listing = sub.add_parser("list", help="list the keys of the allow-list")
    listing.add_argument("dir", metavar="DIR")
    revoke = sub.add_parser("revoke", help="revoke a party's key (a running daemon picks it up within seconds)")
    revoke.add_argument("dir", metavar="DIR")
    revoke.add_argument("name", metavar="NAME")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "init":
            d = SecurityDir.init(args.dir)
            public, _ = d.daemon_keys()
            print(f"made {d.path}: daemon key {fingerprint(public)}; start the daemon with --security {d.path}")
        elif args.command == "issue":
            credential = SecurityDir(args.dir).issue(args.name, args.role, args.output)
            print(f"issued {credential.name!r} ({credential.role}, key {credential.fingerprint}) -> {credential.path}")
        elif args.command == "list":
            entries = SecurityDir(args.dir).entries()
            print(f"{'NAME':<24} {'ROLE':<8} {'KEY':<24} {'ISSUED':<21} STATE")
            for e in entries:
                state = f"revoked {e.revoked}" if e.revoked else "allowed"
                print(f"{e.name:<24} {e.role:<8} {e.fingerprint:<24} {e.issued:<21} {state}")
        else:
            for e in SecurityDir(args.dir).revoke(args.name):
                print(f"revoked {e.name!r} ({e.role}, key {e.fingerprint}); a running daemon refuses it within seconds")
    except ConfigError as exc:
        print(f"scaler-keys: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
