"""One side of the SubMaster-vs-cereal comparison (``msgq bench messaging --cereal``).

A standalone program, run by path as ``python -P`` would run it, on 3.10 too
(``msgq.bench.messaging.script_command``): it imports only the standard library and
``cereal.messaging`` — msgq's (the shim of :mod:`msgq.compat.cereal`, with the
checkout's schema) or cereal's own over upstream msgq (``scripts/cereal-bench.sh`` builds
that environment) — so that both sides run the very same code on the same bytes.

* ``--role pub``: publishes the 8 services of :data:`SERVICES` at their rates
  (100/100/20/20/2/4/100/100 Hz) on a 100 Hz clock until killed, every message built once.
* ``--role sub``: the measured process. ``SubMaster`` of the 8 services, polled on
  ``carState`` (100 Hz); every tick reads one field of each updated service and sends one
  ``carOutput`` message; after a warm-up prints one JSON line: ticks, the process's CPU
  time (``time.process_time``) and wall time over them, the messages read per service.
  With ``--phases``: the thread CPU µs of each part of a tick instead (median, mean).
* ``--role sizes``: the size of each service's message, in bytes.
* ``--role count --ticks N``: the tick without a clock, for instruction counts
  (``scripts/bench-ab.sh``'s submaster count row runs it under callgrind with N and 3N
  ticks): one process publishes what is due at each tick itself (the rates above), then
  runs the measured tick (``update(0)``, the reads, one message sent). Every message
  arrives before the update that takes it, so every run of N ticks does the same work.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

#: (service, rate Hz, the one field a consumer reads) — rates of cereal's registry.
SERVICES: tuple[tuple[str, float, str], ...] = (
    ("carState", 100.0, "vEgo"),
    ("controlsState", 100.0, "enabled"),
    ("radarState", 20.0, "leadOne.dRel"),
    ("longitudinalPlan", 20.0, "hasLead"),
    ("deviceState", 2.0, "thermalStatus"),
    ("liveCalibration", 4.0, "calStatus"),
    ("carControl", 100.0, "enabled"),
    ("can", 100.0, "[0].address"),
)
#: How deep each message is filled (default 1: its fields and those of its structs), so
#: that every message is between 192 and 384 bytes (within 2x).
FILL_DEPTH = {"deviceState": 0}
#: What the measured process sends once per tick.
OUTPUT = "carOutput"
TICK_HZ = 100.0
_PRIMITIVE_LISTS = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                    "uint64", "float32", "float64")


def _fill(builder: Any, schema: Any, depth: int) -> None:
    """Sets every number, bool and text of ``builder`` (struct fields ``depth`` levels
    down, lists of numbers with 4 elements): messages of realistic, similar sizes."""
    union = set(schema.union_fields)
    for field in schema.fields_list:
        proto = field.proto
        name = proto.name
        if name in union or proto.which() != "slot" or name.endswith("DEPRECATED"):
            continue
        kind = proto.slot.type.which()
        if kind == "bool":
            setattr(builder, name, True)
        elif kind.startswith("float"):
            setattr(builder, name, 1.25)
        elif kind.startswith(("int", "uint")):
            setattr(builder, name, 7)
        elif kind == "text":
            setattr(builder, name, "abc")
        elif kind == "struct" and depth > 0:
            _fill(builder.init(name), field.schema, depth - 1)
        elif kind == "list" and proto.slot.type.list.elementType.which() in _PRIMITIVE_LISTS:
            setattr(builder, name, [1] * 4)


def payloads(messaging: Any) -> dict[str, bytes]:
    """The message each service sends, built once."""
    out = {}
    for service, _, _ in SERVICES:
        if service == "can":
            msg = messaging.new_message("can", 6)
            for i, frame in enumerate(msg.can):
                frame.address = 0x100 + i
                frame.dat = bytes(range(8))
                frame.src = 1
        else:
            msg = messaging.new_message(service)
            _fill(getattr(msg, service), messaging.log.Event.schema.fields[service].schema,
                  FILL_DEPTH.get(service, 1))
        msg.valid = True
        out[service] = msg.to_bytes()
    return out


def _reader(path: str) -> Any:
    """A function reading ``path`` (``a.b`` attributes, ``[0].x`` an element's) of a payload."""
    if path.startswith("[0]."):
        name = path[4:]
        return lambda payload: getattr(payload[0], name)
    first, _, second = path.partition(".")
    if second:
        return lambda payload: getattr(getattr(payload, first), second)
    return lambda payload: getattr(payload, first)


def publish(messaging: Any) -> None:
    """Publishes every service at its rate on a 100 Hz clock, until killed."""
    data = payloads(messaging)
    pm = messaging.PubMaster([s for s, _, _ in SERVICES])
    every = {s: max(1, round(TICK_HZ / hz)) for s, hz, _ in SERVICES}
    period = 1.0 / TICK_HZ
    tick = 0
    next_t = time.monotonic()
    while True:
        for service, _, _ in SERVICES:
            if tick % every[service] == 0:
                pm.send(service, data[service])
        tick += 1
        next_t += period
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _phase_loop(messaging: Any, sm: Any, pm: Any, services: list[str], readers: Any,
                end: float) -> dict[str, list[float]]:
    """The measured loop with the thread CPU time of each part of every tick: the
    median and mean µs of update, the field reads, new_message (with the field it sets)
    and send (``--phases``; the clock reads add about 1 µs per part)."""
    now = time.thread_time_ns
    parts: dict[str, list[int]] = {"update": [], "reads": [], "new_message": [], "send": []}
    while time.monotonic() < end:
        t0 = now()
        sm.update(1000)
        t1 = now()
        for service in services:
            if sm.updated[service]:
                readers[service](sm[service])
        t2 = now()
        msg = messaging.new_message(OUTPUT)
        msg.carOutput.actuatorsOutput.accel = 0.5
        t3 = now()
        pm.send(OUTPUT, msg)
        t4 = now()
        for part, ns in zip(parts.values(), (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            part.append(ns)
    return {name: [round(sorted(v)[len(v) // 2] / 1000, 1), round(sum(v) / len(v) / 1000, 1)]
            for name, v in parts.items() if v}


def measure(messaging: Any, seconds: float, warmup: float,
            phases: bool = False) -> dict[str, Any]:
    """The measured loop; returns the JSON record (with ``phases``: the µs of each part
    of a tick, median and mean, instead of the CPU per tick)."""
    services = [s for s, _, _ in SERVICES]
    readers = {s: _reader(path) for s, _, path in SERVICES}
    sm = messaging.SubMaster(services, poll="carState")
    pm = messaging.PubMaster([OUTPUT])
    start = time.monotonic()
    while time.monotonic() - start < warmup:  # the publisher starts, queues fill
        sm.update(1000)
    if phases:
        return {"phases_us": _phase_loop(messaging, sm, pm, services, readers,
                                         time.monotonic() + seconds)}
    reads = dict.fromkeys(services, 0)
    sink = 0.0
    ticks = 0
    cpu0 = time.process_time()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        sm.update(1000)
        for service in services:
            if sm.updated[service]:
                value = readers[service](sm[service])
                sink += 1.0 if value else 0.0
                reads[service] += 1
        msg = messaging.new_message(OUTPUT)
        msg.carOutput.actuatorsOutput.accel = 0.5
        pm.send(OUTPUT, msg)
        ticks += 1
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"ticks": ticks, "cpu_s": cpu, "wall_s": wall, "reads": reads,
            "user_s": usage.ru_utime - usage0.ru_utime,
            "system_s": usage.ru_stime - usage0.ru_stime,
            "context_switches": (usage.ru_nvcsw - usage0.ru_nvcsw
                                 + usage.ru_nivcsw - usage0.ru_nivcsw),
            "all_alive": bool(sm.all_alive()), "sink": sink}


def count(messaging: Any, ticks: int) -> None:
    """``ticks`` ticks of the measured loop, publishing in this process (``--role
    count``); the same work at every run, so that instruction counts repeat."""
    data = payloads(messaging)
    services = [s for s, _, _ in SERVICES]
    readers = {s: _reader(path) for s, _, path in SERVICES}
    every = {s: max(1, round(TICK_HZ / hz)) for s, hz, _ in SERVICES}
    sm = messaging.SubMaster(services, poll="carState")
    pm = messaging.PubMaster([OUTPUT, *services])
    time.sleep(0.05)  # the ZMQ backend's slow joiners (the shared ring needs none)
    sink = 0.0
    for tick in range(ticks):
        for service in services:
            if tick % every[service] == 0:
                pm.send(service, data[service])
        sm.update(0)
        for service in services:
            if sm.updated[service]:
                sink += 1.0 if readers[service](sm[service]) else 0.0
        msg = messaging.new_message(OUTPUT)
        msg.carOutput.actuatorsOutput.accel = 0.5
        pm.send(OUTPUT, msg)
    if sink == 0.0:
        raise SystemExit("no message was read")


def main() -> int:
    """Entry point: ``submaster_tick.py --role pub|sub [--seconds S]`` (run by path)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("pub", "sub", "sizes", "count"), required=True)
    parser.add_argument("--ticks", type=int, default=1000, help="count: ticks to run")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--phases", action="store_true",
                        help="sub: print the CPU µs of update, reads, new_message and send "
                        "per tick (median, mean) instead of the CPU per tick")
    args = parser.parse_args()
    from cereal import messaging  # msgq's shim or cereal's own: whichever is on the path

    if args.role == "pub":
        publish(messaging)
    elif args.role == "count":
        count(messaging, args.ticks)
    elif args.role == "sizes":
        print(json.dumps({s: len(d) for s, d in payloads(messaging).items()}))
    else:
        print(json.dumps(measure(messaging, args.seconds, args.warmup, args.phases)),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
