"""``msgq dump``: print the messages of services as they arrive, decoded with the schema in
force (msgq's own, or the application's of ``--schema``/``--registry``): the values
pycapnp reads, declared defaults included. A message that is not an Event of the service
it came on (another schema's, or mislabeled) is said in one line, never shown as that
service."""

from __future__ import annotations

import argparse
import base64
import difflib
import json
import re
import sys
import time
from typing import Any

import msgq
from msgq.cli.output import EXIT_FAILURE, EXIT_OK, UsageError, number, print_error
from msgq.cli.services import check_services, schema_in_force_name
from msgq.queues import namespace_prefix
from msgq.schemas import MessageDecodeError, decode_event, new_message, schema_in_force

EPILOG = """\
examples:
  msgq dump vehicleState                     every vehicleState message, as capnp text
  msgq dump gyroscope accelerometer --json   one JSON object per line (bytes as base64)
  msgq dump can --raw --count 5              the first 5 messages as hex, then exit
  msgq dump vehicleState --values speed      one field per line (a dotted path works too:
                                             --values cruiseState.setSpeed)
  ZMQ=1 msgq dump gpsLocation --addr 192.168.1.10   from another machine, over ZMQ
  msgq --schema cereal/log.capnp --registry cereal/services.py dump carState
                                             an application's schema (cereal's here)

SERVICE is a service of the registry in force: msgq's own, or the one --schema FILE.capnp
and --registry FILE (or MSGQ_SCHEMA and MSGQ_REGISTRY) select; messages are decoded with
that schema, so it must be the publisher's. A message that is another service's Event
(another schema's) is shown as one line saying so.

Only messages sent after the command started are shown. Exit 0 after --count messages or
Ctrl-C; 1 when --timeout passes with nothing received."""

#: Seconds without a message before dump says on stderr what it is waiting for.
WAITING_NOTICE_S = 2.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq dump``."""
    parser = subparsers.add_parser(
        "dump", help="print messages of services as they arrive",
        description="Subscribe to SERVICE(s) and print each message as it arrives, decoded "
                    "with the schema in force.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("services", nargs="+", metavar="SERVICE",
                        help="services of the registry in force")
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


def _field_names(value: Any) -> tuple[str, ...] | None:
    """The field names of a Cap'n Proto struct value; None when it is not a struct."""
    names = getattr(getattr(value, "schema", None), "fieldnames", None)
    return tuple(names) if names is not None else None


def _walk(payload: Any, path: str, service: str) -> Any:
    """The value at dotted ``path`` under ``payload``; a one-line UsageError naming the
    fields that do exist when a part of the path is not one."""
    value = payload
    where = service
    for part in path.split("."):
        names = _field_names(value)
        if names is None:
            raise UsageError(f"--values {path}: {where} is a {_kind(value)}, not a struct "
                             "with fields")
        if part not in names:
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"--values {path}: {where} has no field '{part}'{hint} "
                             f"(its fields: {', '.join(names)})")
        value = getattr(value, part)
        where = f"{where}.{part}"
    return value


def _kind(value: Any) -> str:
    if hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
        return "list"
    return type(value).__name__


def check_values_path(services: list[str], path: str) -> None:
    """Fails (one line, exit 2) before anything is received when ``path`` names no field
    of a service's payload (checked on an empty message of each service)."""
    for service in services:
        _walk(getattr(new_message(service), service), path, service)


def _field(payload: Any, path: str, service: str = "the payload") -> Any:
    value = _walk(payload, path, service)
    if hasattr(value, "to_dict"):
        return json.dumps(_jsonable(value.to_dict()))
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "__len__") and not isinstance(value, str):
        return json.dumps(_jsonable([v.to_dict() if hasattr(v, "to_dict") else v
                                     for v in value]))
    return value


def _reason(error: BaseException) -> str:
    """One short line of why bytes did not decode: pycapnp's text without its C++ file
    names and stack addresses."""
    text = str(error).split("stack:", 1)[0]
    text = re.sub(r"\S+\.c\+\+:\d+: (failed: )?", "", text)
    text = " ".join(text.split())
    return text[:160] or type(error).__name__


def _mislabeled(data: bytes, service: str) -> str | None:
    """The line that says ``data`` is not an Event of ``service`` in the schema in force
    (an Event of another member: the publisher's schema is another), else None."""
    identity = schema_in_force().layout.identify(data)
    if identity is None or identity[2] == service:
        return None  # not an Event at all is said by the decoder
    return (f"{service}: a {identity[2]} event, not {service} ({len(data)} bytes): does the "
            f"publisher use the schema in force, {schema_in_force_name()}?")


def _format(args: argparse.Namespace, service: str, data: bytes) -> str:
    import capnp  # for its exception type; loading pycapnp would slow every command's start

    if args.raw:
        return f"{service} {data.hex()}"
    try:
        mislabeled = _mislabeled(data, service)
        if mislabeled is not None:
            return mislabeled
        msg = decode_event(data)
        if args.json:
            return json.dumps({"service": service, "logMonoTime": msg.logMonoTime,
                               "valid": msg.valid,
                               service: _jsonable(msg.to_dict().get(service))})
        payload = getattr(msg, service)
        if args.values:
            return str(_field(payload, args.values, service))
        return f"{service} logMonoTime={msg.logMonoTime} valid={msg.valid}\n  {payload}"
    except UsageError:
        raise
    except (MessageDecodeError, capnp.KjException, UnicodeDecodeError, RuntimeError,
            ValueError) as e:
        # A root that reads but a damaged pointer further in (pycapnp finds it while
        # formatting): shown as undecodable like any other bad message; dump goes on.
        return (f"{service}: undecodable message ({len(data)} bytes): {_reason(e)} (is "
                f"{schema_in_force_name()} the publisher's schema?)")


def run(args: argparse.Namespace) -> int:
    """Prints messages until --count, --timeout or Ctrl-C."""
    services = check_services(args.services)
    if args.values:
        check_values_path(services, args.values)
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
                                f"{args.timeout:g} s (is a publisher running in "
                                f"{_namespace()}?)")
            return EXIT_FAILURE
        if not noticed and shown == 0 and now - last >= WAITING_NOTICE_S:
            print(f"msgq dump: waiting for {', '.join(services)} in {_namespace()}: no "
                  "publisher yet? (a publisher needs the same MSGQ_PREFIX)", file=sys.stderr)
            noticed = True


def _namespace() -> str:
    """Which namespace this command works in, as a person reads it."""
    prefix = namespace_prefix()
    return f"namespace {prefix!r} (MSGQ_PREFIX)" if prefix else \
        "the default namespace (no MSGQ_PREFIX)"
