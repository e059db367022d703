"""``msgq foxglove``: serve the running system to Foxglove over its WebSocket protocol."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgq.cli.output import EXIT_OK, CommandError, UsageError, number
from msgq.cli.services import check_services
from msgq.schemas import schema_in_force
from msgq.tables import plural
from msgq.viz import MissingExtraError
from msgq.viz.live import LiveServer

DESCRIPTION = """\
Serve every service of the current namespace (or --services) live to Foxglove, over
Foxglove's WebSocket protocol (foxglove-sdk): one channel /<service> per service, JSON
with the same JSON Schema as 'msgq export', each sent at most --max-rate times a second
(the newest message; only while a viewer subscribes to it), and /msgq/health with the
SubMaster health of every service (alive, valid, freq_ok, measured vs expected rate).
--cameras NAME:STREAM adds VisionIPC streams as foxglove.CompressedImage (JPEG, scaled
to --camera-width, at most --camera-rate frames a second; needs Pillow).

It is a subscriber like any other: its sockets conflate, it never slows a publisher, a
viewer that falls behind loses the oldest messages of its own queue (--backlog), and it
goes on when a viewer disconnects or a publisher restarts. Open it in Foxglove: Open
connection > Foxglove WebSocket > ws://HOST:PORT. A recording shows the same way:
'msgq replay rec/' in one terminal, 'msgq foxglove' in another (docs/tools.md).
Needs the viz extra: pip install 'msgq-shm[viz]'."""

EPILOG = """\
examples:
  msgq foxglove                                   every service, ws://127.0.0.1:8765
  msgq foxglove --services vehicleState,can --max-rate 10
  msgq foxglove --host 0.0.0.0 --port 8765        viewers on other machines
  msgq foxglove --cameras camerad:0               with the road camera as JPEG
  msgq replay rec/ --loop & msgq foxglove         a recording, live"""

_rate = number(float, 0.0, "a positive rate in Hz", exclusive=True)
_seconds = number(float, 0.0, "a positive number of seconds", exclusive=True)
_port = number(int, 0, "a TCP port (0-65535)")
_count = number(int, 1, "a positive count")


def _camera(text: str) -> tuple[str, int]:
    name, colon, stream = text.rpartition(":")
    if not colon or not name or not stream.isdigit():
        raise argparse.ArgumentTypeError(f"not NAME:STREAM (e.g. camerad:0): {text!r}")
    return name, int(stream)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq foxglove``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "foxglove",
        help="serve the live services to Foxglove (WebSocket)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--services", metavar="A,B",
                        help="only these services (default: every service of the registry)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=_port, default=8765,
                        help="TCP port (default 8765, Foxglove's; 0: any free port)")
    parser.add_argument("--max-rate", type=_rate, default=30.0, metavar="HZ",
                        help="at most this many messages a second per service (default 30)")
    parser.add_argument("--health-rate", type=_rate, default=2.0, metavar="HZ",
                        help="health messages a second (default 2)")
    parser.add_argument("--backlog", type=_count, default=256, metavar="N",
                        help="messages queued per viewer before the oldest are dropped "
                             "(default 256)")
    parser.add_argument("--cameras", type=_camera, nargs="+", default=[],
                        metavar="NAME:STREAM", help="VisionIPC streams to send as JPEG")
    parser.add_argument("--camera-rate", type=_rate, default=5.0, metavar="HZ",
                        help="frames a second per camera (default 5)")
    parser.add_argument("--camera-width", type=number(int, 16, "a width >= 16 pixels"),
                        default=320, metavar="PIXELS",
                        help="frames are scaled down to this width (default 320)")
    parser.add_argument("--duration", type=_seconds, default=None, metavar="S",
                        help="stop after S seconds (default: at Ctrl-C)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Serves until Ctrl-C or --duration."""
    schema = schema_in_force()
    services = check_services([args.services], schema.services) if args.services else None
    try:
        server = LiveServer(services, host=args.host, port=args.port,
                            max_rate=args.max_rate, health_rate=args.health_rate,
                            backlog=args.backlog, cameras=args.cameras,
                            camera_rate=args.camera_rate, camera_width=args.camera_width,
                            schema=schema)
    except MissingExtraError as e:
        raise CommandError(str(e)) from None
    except RuntimeError as e:  # the SDK's: the port is taken, the address is wrong
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e}") from None
    print(f"msgq foxglove: serving {plural(len(server.services), 'service')} on "
          f"ws://{args.host}:{server.port} (Ctrl-C stops)", file=sys.stderr, flush=True)
    try:
        stats = server.run(duration=args.duration)
    finally:
        server.stop()
    sent = sum(stats.sent.values())
    received = sum(stats.received.values())
    print(f"msgq foxglove: received {received} messages, sent {sent}", file=sys.stderr)
    return EXIT_OK
