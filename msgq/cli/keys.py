"""``msgq keys``: CurveZMQ key directories for the ZMQ backend and the bridge.

``init`` makes the publishers' (server's) key pair and client key pairs in ZeroMQ's
certificate format (pyzmq's ``zmq.auth`` writes them; libzmq does the cryptography);
``add`` adds client pairs to an existing directory; ``list`` shows names and public keys
(never a secret). The layout is described in docs/security.md and
:func:`msgq.zmq.security.load_keys`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from msgq.cli.output import EXIT_OK, CommandError, print_json, print_table
from msgq.zmq.security import create_keys, load_keys

__all__ = ["add_parser", "run"]

EPILOG = """\
examples:
  msgq keys init keys/ --client laptop --client logger
                                       the publishers' key pair and two client key pairs
  msgq keys add keys/ dashboard        one more client key pair
  msgq keys list keys/                 names and public keys (secrets are never printed)
  MSGQ_ZMQ_KEYS=keys/ ZMQ=1 python my_publisher.py
                                       every ZMQ socket of the process uses the keys
  msgq bridge serve --all --keys keys/ the bridge, with keys and keys/permissions.toml

layout of DIR: server.key, server.key_secret (publishers), clients/NAME.key,
clients/NAME.key_secret (each client), permissions.toml (optional: which client reads
which services). Secrets are written 0600, folders 0700. A machine that only subscribes
needs server.key and its own clients/NAME.key_secret; a publisher needs
server.key_secret and the clients' public .key files. See docs/security.md."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq keys`` with its ``init``, ``add`` and ``list`` actions."""
    parser = subparsers.add_parser(
        "keys", help="make and list CurveZMQ keys for the ZMQ backend and the bridge",
        description="Make and list the CurveZMQ key directory that MSGQ_ZMQ_KEYS=DIR and "
                    "`msgq bridge serve --keys DIR` use: with it, ZMQ traffic is encrypted, "
                    "subscribers accept only the real publishers, and publishers admit only "
                    "the client keys their permissions allow.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="<action>", required=True)
    init = actions.add_parser("init", help="make a key directory", epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    init.add_argument("directory", metavar="DIR")
    init.add_argument("--client", action="append", default=[], metavar="NAME",
                      help="a client key pair to make (repeatable; default: one named "
                           "'client')")
    add = actions.add_parser("add", help="add client key pairs to a key directory",
                             epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add.add_argument("directory", metavar="DIR")
    add.add_argument("names", nargs="+", metavar="NAME")
    for action in (init, add):
        action.add_argument("--force", action="store_true",
                            help="replace existing keys (their holders need the new ones)")
    listing = actions.add_parser("list", help="names and public keys of a key directory",
                                 epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    listing.add_argument("directory", metavar="DIR")
    listing.add_argument("--json", action="store_true", help="as JSON")
    return parser


def _reads(grant: Any) -> str:
    if grant is None:
        return "nothing (not in permissions.toml)"
    what = ", ".join(grant.services) or "no service"
    return what + (f"; vision {', '.join(grant.vision)}" if grant.vision else "")


def run(args: argparse.Namespace) -> int:
    """Runs ``msgq keys ACTION``."""
    try:
        if args.action == "list":
            keys = load_keys(args.directory)
            rows = [("server", keys.server_public.decode(),
                     "public+secret" if keys.server_secret else "public")]
            for name, public in keys.clients.items():
                grant = keys.grant(public)
                rows.append((f"clients/{name}", public.decode(), _reads(grant)))
            rows += [(f"{g.name} (permissions.toml)", g.public_key.decode(), _reads(g))
                     for g in keys.grants.values() if g.public_key not in
                     keys.clients.values()]
            if args.json:
                print_json([{"name": name, "public_key": key, "reads": what}
                            for name, key, what in rows])
            else:
                print_table(("key", "public key (Z85)", "holds / may read"), rows)
            return EXIT_OK
        names = (args.client or ["client"]) if args.action == "init" else args.names
        written = create_keys(args.directory, names, server=args.action == "init",
                              force=args.force)
    except (FileExistsError, ValueError) as e:
        raise CommandError(str(e)) from None
    for name, public in written:
        where = name if name == "server" else f"clients/{name}"
        print(f"{where}: {public.decode()}")
    print(f"msgq keys: wrote {len(written)} key pairs in {os.path.abspath(args.directory)} "
          "(secrets 0600); msgq keys --help says where each file goes", file=sys.stderr)
    return EXIT_OK
