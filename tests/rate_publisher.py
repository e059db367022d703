"""A publisher process for tests: ``python tests/rate_publisher.py SERVICE=HZ ...``.

Sends each service at its rate, on an absolute schedule (a late process catches up: it
sends every message that is due, so the count over any window stays ``rate * window``),
prints ``ready`` once its sockets exist, and runs until killed, or until ``--count``
messages of each service were sent (then prints ``sent N`` and exits 0). Message ``i`` of
a service carries ``i`` where the test can read it back:

- default: a cereal-style Event (``valid=True``) with ``--value FIELD`` (of the service's
  struct) set to ``float(i)`` (``(OFFSET + i) * SCALE`` with ``--value-offset`` /
  ``--value-scale``: a restarted publisher's values told apart from the first one's) and
  ``--text FIELD=TEXT`` set as given, where the service has that field;
- ``--builder MODULE:FUNCTION``: ``FUNCTION(service, i)`` of a module beside this script
  builds message ``i`` (``None``: the default above);
- ``--sequenced``: :func:`msgq.bench.logs.sequenced_message` (a log test reads ``i`` back
  with ``sequence_number``), through a plain socket; services outside the benchmark's
  set get an empty message.

Started with :func:`helpers.start_publisher`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rate_publisher.py")
    parser.add_argument("rates", nargs="+", metavar="SERVICE=HZ")
    parser.add_argument("--count", type=int, default=0, help="stop after N of each (0: never)")
    parser.add_argument("--value", default="", help="field set to the message number")
    parser.add_argument("--value-offset", type=int, default=0, metavar="OFFSET",
                        help="message i's value is (OFFSET + i) * SCALE")
    parser.add_argument("--value-scale", type=float, default=1.0, metavar="SCALE")
    parser.add_argument("--text", action="append", default=[], metavar="FIELD=TEXT")
    parser.add_argument("--sequenced", action="store_true")
    parser.add_argument("--builder", default="", metavar="MODULE:FUNCTION",
                        help="FUNCTION(service, i) builds message i (None: the default)")
    parser.add_argument("--announce", action="append", default=[], metavar="SERVICE",
                        help="print SERVICE on stdout for each one sent")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Publishes until killed (or ``--count`` of each service were sent)."""
    args = _args(argv)
    rates = {name: float(hz) for name, hz in (a.split("=", 1) for a in args.rates)}
    texts = dict(t.split("=", 1) for t in args.text)

    import msgq
    from msgq.messaging import PubMaster, new_message

    if args.sequenced:
        from msgq.bench.logs import RECORD_SERVICES, sequenced_message

        socks = {name: msgq.pub_sock(name) for name in rates}

        def send(name: str, i: int) -> None:
            data = sequenced_message(name, i) if name in RECORD_SERVICES \
                else new_message(name).to_bytes()
            socks[name].send(data)
    else:
        pm = PubMaster(list(rates))
        builder = None
        if args.builder:
            import importlib

            module, function = args.builder.split(":")
            builder = getattr(importlib.import_module(module), function)

        def send(name: str, i: int) -> None:
            built = builder(name, i) if builder is not None else None
            if built is not None:
                pm.send(name, built)
                return
            msg = new_message(name, valid=True)
            body: Any = getattr(msg, name)
            fields = set(body.schema.fieldnames) if hasattr(body, "schema") else set()
            if args.value in fields:
                setattr(body, args.value, (args.value_offset + i) * args.value_scale)
            for field, text in texts.items():
                if field in fields:
                    setattr(body, field, text)
            pm.send(name, msg)

    print("ready", flush=True)
    sent = dict.fromkeys(rates, 0)
    start = time.monotonic()
    while True:
        now = time.monotonic()
        for name, hz in rates.items():
            due = int((now - start) * hz) + 1  # messages due by now
            if args.count:
                due = min(due, args.count)
            while sent[name] < due:
                send(name, sent[name])
                sent[name] += 1
                if name in args.announce:
                    print(name, flush=True)
        if args.count and all(n >= args.count for n in sent.values()):
            print(f"sent {sum(sent.values())}", flush=True)
            return 0
        wake = min(start + sent[name] / hz for name, hz in rates.items()
                   if not args.count or sent[name] < args.count)
        time.sleep(max(0.0, min(wake - time.monotonic(), 0.05)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
