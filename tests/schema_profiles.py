"""The schemas the suite runs on, and logs written the way other programs write them.

Two profiles: msgq's own schema, and ``tests/schemas/robot`` — a schema of our own with
what real application schemas have and msgq's lacks (openpilot's cereal is the reference:
``valid`` declared late with a default of true, a non-zero logMonoTime default, bools
defaulting to true, non-zero numeric defaults, deep nesting, lists of structs, Data lists,
enums, groups, a union inside a struct, an imported file, no ``logStart`` member, and a
registry without message sizes in a cereal-style ``services.py``).

:func:`write_loggerd_log` writes a log as openpilot's loggerd does: each Event's
``to_bytes()`` back to back, as ``rlog.zst``, ``rlog.bz2`` or a raw ``rlog``, in route
folders ``<route>--<n>/``.
"""

from __future__ import annotations

import bz2
import os
from collections.abc import Iterable
from typing import Any

import zstandard

from msgq.schemas import Schema, load_schema

__all__ = ["ROBOT_DIR", "ROBOT_SCHEMA", "ROBOT_SERVICES", "ROBOT_SERVICES_TOML",
           "robot_schema", "write_loggerd_log"]

ROBOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas", "robot")
ROBOT_SCHEMA = os.path.join(ROBOT_DIR, "robot.capnp")
ROBOT_SERVICES = os.path.join(ROBOT_DIR, "services.py")
ROBOT_SERVICES_TOML = os.path.join(ROBOT_DIR, "services.toml")

#: File name of each loggerd compression.
LOGGERD_NAMES = {"zstd": "rlog.zst", "bz2": "rlog.bz2", "none": "rlog"}


def robot_schema() -> Schema:
    """The robot schema with its cereal-style registry (not made the default)."""
    return load_schema(ROBOT_SCHEMA, ROBOT_SERVICES)


def robot_armstate(i: int, schema: Schema | None = None) -> Any:
    """armState number ``i`` of the robot schema's test publisher: speedLimit = i, valid =
    i is even, logMonoTime = 1000 (the schema's declared default, stored as zero) when
    ``i % 3 == 0``, else 5000 + i. ``schema``: the robot schema where it is not in force."""
    from msgq.schemas import new_message

    msg = new_message("armState", schema=schema, valid=i % 2 == 0,
                      logMonoTime=1000 if i % 3 == 0 else 5000 + i)
    msg.armState.speedLimit = float(i)
    return msg


def robot_message(service: str, i: int) -> Any:
    """Message ``i`` of ``service`` for ``rate_publisher.py --builder`` (the robot schema in
    force): :func:`robot_armstate` for armState, the default message for the rest."""
    return robot_armstate(i) if service == "armState" else None


def write_loggerd_log(path: str, events: Iterable[Any], compression: str = "zstd") -> str:
    """Writes ``events`` (builders or bytes) to ``path`` as loggerd does: their bytes back
    to back, compressed whole (``zstd``: one zstd stream, ``bz2``, or ``none``); returns
    ``path``."""
    data = b"".join(e if isinstance(e, (bytes, bytearray)) else e.to_bytes() for e in events)
    if compression == "zstd":
        data = zstandard.ZstdCompressor(level=3).compress(data)
    elif compression == "bz2":
        data = bz2.compress(data)
    elif compression != "none":
        raise ValueError(f"unknown compression {compression!r}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path
