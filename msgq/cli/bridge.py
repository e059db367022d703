"""``msgq bridge``: carry services and VisionIPC frames between machines over ZMQ."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from msgq.bridge import DEFAULT_PORT, Inbound, Outbound
from msgq.cli.output import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    UsageError,
    number,
    print_json,
    print_table,
)
from msgq.cli.services import check_services
from msgq.schemas import registry_in_force
from msgq.tables import plural

EPILOG = """\
examples:
  msgq bridge serve vehicleState gpsLocation can          on the robot: forward these
  msgq bridge serve --all --vision camerad:0,2 --compress zstd
                                                          every service and two camera streams
  msgq bridge connect 192.168.1.10                        on the laptop: re-publish locally;
                                                          local subscribers and VisionIpcClient
                                                          work unchanged
  msgq bridge connect 192.168.1.10 vehicleState --no-vision
  msgq --schema cereal/log.capnp --registry cereal/services.py bridge serve carState
                                                          an application's schema (cereal's)
  msgq bridge serve --all --keys keys/                    CurveZMQ: encrypted, only the client
                                                          keys keys/permissions.toml allows
  msgq bridge connect 192.168.1.10 --keys keys/ --client laptop

Security: without keys the bridge is open (upstream's behaviour): anyone who reaches the
ports reads everything, and serve says so in one line at start. With --keys DIR (or
MSGQ_ZMQ_KEYS=DIR; make one with `msgq keys init DIR`) traffic is encrypted, connect
accepts only DIR's server key, and serve gives each client key only the services and
streams DIR/permissions.toml allows it (docs/security.md).

Services are those of the registry in force: msgq's own, or the one --schema FILE.capnp
and --registry FILE (or MSGQ_SCHEMA and MSGQ_REGISTRY) select; --all is every one of them.
Both sides must use the same schema: serve announces its own, and connect refuses another
(one line, exit 1: no message is re-published mislabeled); one grown by union members at
the end is the same. connect re-publishes only messages that are Events of the service
they came on, and counts the others (mislabeled; unknown_services: not in its registry).

Two TCP ports: --port (services, default 8010) and --port + 1 (VisionIPC frames).
Frames travel raw by default (lossless, no CPU, ~3.5 MB per 1928x1208 frame: 20 fps needs
~70 MB/s, gigabit Ethernet or faster); --compress zstd trades robot CPU for bandwidth
(lossless; camera images typically shrink 1.5-3x). A link slower than the camera drops
frames (newest wins) instead of falling behind. Frame ids and timestamps are preserved."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq bridge`` with its ``serve`` and ``connect`` sides."""
    parser = subparsers.add_parser(
        "bridge", help="carry services and VisionIPC frames between machines",
        description="Forward local msgq services and VisionIPC streams to ZMQ (serve, on the "
                    "robot) or re-publish them from a remote bridge into local msgq (connect, "
                    "on the laptop).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sides = parser.add_subparsers(dest="side", metavar="<side>", required=True)
    serve = sides.add_parser(
        "serve", help="forward local services (and frames) to ZMQ", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("services", nargs="*", metavar="SERVICE")
    serve.add_argument("--all", action="store_true",
                       help="every service of the registry in force")
    serve.add_argument("--vision", action="append", default=[], metavar="NAME:STREAMS",
                       help="VisionIPC server NAME and comma-separated stream ids (repeatable)")
    serve.add_argument("--bind", default="*", help="address to bind (default every interface)")
    serve.add_argument("--compress", choices=("none", "zstd"), default="none",
                       help="frame compression (default none)")
    connect = sides.add_parser(
        "connect", help="re-publish a remote bridge's services and frames locally",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    connect.add_argument("address", help="the robot's address")
    connect.add_argument("services", nargs="*", metavar="SERVICE",
                         help="only these services (default: all that arrive)")
    connect.add_argument("--no-vision", action="store_true", help="do not re-serve frames")
    for side in (serve, connect):
        side.add_argument("--port", type=int, default=None,
                          help="services port; frames use the next one (default 8010)")
        side.add_argument("--duration", type=number(float, 0.0, "a positive number of seconds",
                                                    exclusive=True), metavar="S",
                          help="stop after S seconds (default: until Ctrl-C)")
        side.add_argument("--json", action="store_true", help="final counts as JSON")
        side.add_argument("--keys", metavar="DIR", default=None,
                          help="CurveZMQ key directory (default: MSGQ_ZMQ_KEYS; none: open)")
    connect.add_argument("--client", metavar="NAME", default=None,
                         help="the client key of DIR/clients to use (default: "
                              "MSGQ_ZMQ_CLIENT, else the only one there)")
    return parser


def _vision_specs(specs: list[str]) -> list[tuple[str, list[int]]]:
    out = []
    for spec in specs:
        name, sep, streams = spec.rpartition(":")
        try:
            ids = [int(s) for s in streams.split(",") if s]
        except ValueError:
            ids = []
        if not sep or not name or not ids or any(not 0 <= i < 2**32 for i in ids):
            raise UsageError(f"--vision {spec!r}: use NAME:STREAM[,STREAM...], e.g. camerad:0,2")
        out.append((name, ids))
    return out


def run(args: argparse.Namespace) -> int:
    """Runs one side until Ctrl-C, SIGTERM or --duration."""
    refused: list[str] = []
    port = DEFAULT_PORT if args.port is None else args.port
    if not 1 <= port < 65535:
        raise UsageError("--port must be 1..65534 (frames use the next port)")
    if args.side == "serve":
        services = list(registry_in_force()) if args.all else check_services(args.services)
        vision = _vision_specs(args.vision)
        if not services and not vision:
            raise UsageError("name services to forward (or --all) and/or --vision NAME:STREAMS")
        try:
            side: Any = Outbound(services, vision, bind=args.bind, port=port,
                                 compression=args.compress, keys=args.keys)
        except ValueError as e:  # a key directory that is missing or unsafe
            raise CommandError(str(e)) from None
        except OSError as e:  # an address not of this machine, or ports in use
            reason = (e.strerror or str(e)).split(" (addr=")[0]
            raise CommandError(
                f"cannot bind {args.bind} on ports {port}/{port + 1}: {reason.rsplit(': ', 1)[-1]}"
                " (--bind takes an address of this machine, * for every interface; --port "
                "another port)") from None
        streams = sum(len(v[1]) for v in vision)
        what = f"forwarding {plural(len(services), 'service')} and " \
               f"{plural(streams, 'VisionIPC stream')} on ports {port}/{port + 1}"
        if side.keys is None:
            where = "every interface" if args.bind in ("*", "0.0.0.0", "::") else args.bind
            print(f"msgq bridge serve: serving {where} unauthenticated and unencrypted: "
                  "whoever reaches the ports reads every message; use --keys DIR "
                  "(msgq keys --help)", file=sys.stderr)
    else:
        services = check_services(args.services) if args.services else None

        def refuse(problem: str) -> None:  # another schema: said once, then exit 1
            refused.append(problem)
            side.stop()

        try:
            side = Inbound(args.address, port, services, vision=not args.no_vision,
                           notify=refuse, keys=args.keys, client=args.client)
        except ValueError as e:  # a key directory that is missing or unsafe
            raise CommandError(str(e)) from None
        what = f"re-publishing from {args.address}:{port}/{port + 1}"
    print(f"msgq bridge {args.side}: {what} (Ctrl-C to stop)", file=sys.stderr)

    previous = signal.signal(signal.SIGTERM, lambda *_: side.stop())
    timer = threading.Timer(args.duration, side.stop) if args.duration else None
    if timer is not None:
        timer.start()
    interrupted = False
    try:
        side.run()
    except KeyboardInterrupt:
        interrupted = True  # the counters still go out; the exit code says Ctrl-C
    finally:
        if timer is not None:
            timer.cancel()
        signal.signal(signal.SIGTERM, previous)
        side.close()
    counts = dict(sorted(side.counts.items()))
    if args.json:
        print_json(counts)
    else:
        print_table(("counter", "value"), list(counts.items()) or [("messages", 0)])
    if refused:
        raise CommandError(refused[0])
    dropped = counts.get("mislabeled", 0) + counts.get("unknown_services", 0)
    if dropped and getattr(side, "last_service_error", ""):
        print(f"msgq bridge {args.side}: {dropped} messages dropped, the last because "
              f"{side.last_service_error}", file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else EXIT_OK
