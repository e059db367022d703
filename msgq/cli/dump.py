"""``msgq dump``: print the messages of services as they arrive, decoded."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any

from msgq.cli.output import EXIT_FAILURE, EXIT_OK, UsageError, number, print_error

EPILOG = """\
examples:
  msgq dump vehicleState                     every vehicleState message, as capnp text
  msgq dump gyroscope accelerometer --json   one JSON object per line (bytes as base64)
  msgq dump can --raw --count 5              the first 5 messages as hex, then exit
  msgq dump vehicleState --values speed      one field per line (a dotted path works too:
                                             --values cruiseState.setSpeed)
  ZMQ=1 msgq dump gpsLocation --addr 192.168.1.10   from another machine, over ZMQ

Only messages sent after the command started are shown. Exit 0 after --count messages or
Ctrl-C; 1 when --timeout passes with nothing received."""

#: Seconds without a message before dump says on stderr what it is waiting for.
WAITING_NOTICE_S = 2.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq dump``."""
    parser = subparsers.add_parser(
        "dump", help="print messages of services as they arrive",
        description="Subscribe to SERVICE(s) and print each message as it arrives, decoded "
                    "with the schema.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("services", nargs="+", metavar="SERVICE", help="registry services")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object per message")
    form.add_argument("--raw", action="store_true", help="the message bytes in hex")
    form.add_argument("--values", metavar="FIELD",
                      help="print only this field of the payload (dotted path)")
    parser.add_argument("--count", type=number(int, 1, "a number of messages >= 1"),
                        metavar="N", help="exit after N messages")
    parser.add_argument("--timeout", type=number(float, 0.0, "a number of seconds >= 0"),
                        metavar="S",
                        help="exit 1 when no message arrives within S seconds")
    parser.add_argument("--addr", default="127.0.0.1",
                        help="publisher host (ZMQ backend; default 127.0.0.1)")
    return parser


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _field(payload: Any, path: str) -> Any:
    value = payload
    for part in path.split("."):
        try:
            value = getattr(value, part)
        except Exception as e:  # pycapnp raises its own errors for unknown fields
            raise UsageError(f"no field {path!r} in this message ({e})") from None
    if hasattr(value, "to_dict"):
        return json.dumps(_jsonable(value.to_dict()))
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "__len__") and not isinstance(value, str):
        return json.dumps(_jsonable([v.to_dict() if hasattr(v, "to_dict") else v
                                     for v in value]))
    return value


def _format(args: argparse.Namespace, service: str, data: bytes) -> str:
    from msgq.messaging import MessageDecodeError, decode_event

    if args.raw:
        return f"{service} {data.hex()}"
    try:
        msg = decode_event(data)
    except MessageDecodeError as e:
        return f"{service}: undecodable message ({len(data)} bytes): {e}"
    if args.json:
        return json.dumps({"service": service, "logMonoTime": msg.logMonoTime,
                           "valid": msg.valid,
                           service: _jsonable(msg.to_dict().get(service))})
    payload = getattr(msg, service)
    if args.values:
        return str(_field(payload, args.values))
    return f"{service} logMonoTime={msg.logMonoTime} valid={msg.valid}\n  {payload}"


def run(args: argparse.Namespace) -> int:
    """Prints messages until --count, --timeout or Ctrl-C."""
    import msgq
    from msgq.cli.services import check_services

    services = check_services(args.services)
    poller = msgq.Poller()
    sockets = {}
    for service in services:
        sock = msgq.sub_sock(service, poller=poller, addr=args.addr)
        sockets[id(sock)] = (service, sock)
    started = last = time.monotonic()
    noticed = False
    shown = 0
    out = sys.stdout
    while True:
        ready = poller.poll(100)
        for sock in ready:
            service, _ = sockets[id(sock)]
            while (data := sock.receive(non_blocking=True)) is not None:
                out.write(_format(args, service, data) + "\n")
                shown += 1
                last = time.monotonic()
                if args.count is not None and shown >= args.count:
                    out.flush()
                    return EXIT_OK
        if ready:
            out.flush()
            continue
        now = time.monotonic()
        if args.timeout is not None and now - started >= args.timeout and shown == 0:
            print_error("dump", f"no message on {', '.join(services)} within "
                                f"{args.timeout:g} s (is a publisher running in this "
                                "namespace?)")
            return EXIT_FAILURE
        if not noticed and shown == 0 and now - last >= WAITING_NOTICE_S:
            print(f"msgq dump: waiting for {', '.join(services)} (no publisher yet?)",
                  file=sys.stderr)
            noticed = True
