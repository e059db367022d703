"""``msgq queues``: the queue files of this namespace, who uses them, and ``--clean`` to
remove the ones nobody alive uses.

Only files named ``msgq_<endpoint>`` (a valid endpoint name) in the namespace's queue
folder are queues; other files there (fake-event files, VisionIPC sockets) are not ours to
list. Headers are read by the C core without connecting (``queues.inspect_queue``):
read-only, never registering, bounds-checked, so a damaged or foreign file is reported,
never trusted.
"""

from __future__ import annotations

import argparse
import os
import stat
import struct
from typing import Any

from msgq.cli.output import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    UsageError,
    human_age,
    human_bytes,
    paint,
    print_json,
    print_table,
)
from msgq.queues import (
    LAYOUT_VERSION,
    QUEUE_FILE_PREFIX,
    inspect_queue,
    namespace_prefix,
    queue_dir,
    remove_unused_queue,
    validate_endpoint,
)

DESCRIPTION = """\
List every queue file in the shm folder of the current namespace (MSGQ_PREFIX, else
OPENPILOT_PREFIX): its segment size, its publisher and whether that process is alive,
its reader slots (live/claimed), how far its write pointer has moved, and when it was
created. A file whose header is not a queue this build can read is listed as damaged,
or as foreign when it is a queue file of upstream msgq (same names, another format).
Publishers and subscribers replace damaged and foreign files with a new queue (renamed
into place, so a process still using the old file keeps it).

States: live (a live publisher or reader), dead (only dead processes registered),
unused (nobody registered), unfinished (its creator died while making it), damaged,
foreign (upstream msgq's format),
busy (being created or opened right now), unreadable (e.g. permission denied).

There is no "last write" time: the queue does not store one (a clock read per send
would slow every send), and the file's modification time does not move when the
publisher writes through its mapping. WRITTEN (the write pointer) shows activity
instead: run the command twice and compare, or use 'msgq top' for rates.

--clean removes dead, unused and unfinished queues, deciding under the same file lock
every publisher and subscriber takes to connect, so none can connect in between; a queue
with a live publisher or any live reader is never removed. A damaged or foreign file is removed
only when no process has it open or mapped (checked in /proc; kept when that cannot be
checked). Liveness is kill(pid, 0): a dead process whose pid was reused counts as alive,
and so does a killed child its parent has not reaped yet."""

EPILOG = """\
examples:
  msgq queues                         table of the queues of this namespace
  msgq queues --json                  the same as JSON, for scripts
  OPENPILOT_PREFIX=sim msgq queues    the queues of namespace "sim"
  msgq queues --clean --dry-run       what --clean would remove, removing nothing
  msgq queues --clean                 remove queues whose processes are all dead"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq queues``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "queues",
        help="list the queue files of this namespace; --clean removes dead ones",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=("list", "clean"),
        default="list",
        help="list (default) or clean (the same as --clean)",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="remove the queues no live process uses and print what was removed",
    )
    parser.add_argument(
        "-n",
        "--dry-run",
        action="store_true",
        help="with --clean: print what would be removed, remove nothing",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def run(args: argparse.Namespace) -> int:
    """Lists the queues, or cleans them with --clean."""
    clean = args.clean or args.action == "clean"
    if args.dry_run and not clean:
        raise UsageError("--dry-run goes with --clean")
    folder, prefix = _queue_folder()
    queues = [_describe(endpoint, path) for endpoint, path in _queue_files(folder)]
    queues = [q for q in queues if q["state"] != "gone"]  # removed while we looked
    if clean:
        return _clean(folder, prefix, queues, dry_run=args.dry_run, as_json=args.json)
    if args.json:
        print_json({"dir": folder, "prefix": prefix or None, "queues": queues})
        return EXIT_OK
    _print_list(folder, prefix, queues)
    return EXIT_OK


# --- finding and describing queue files ----------------------------------------------


def _queue_folder() -> tuple[str, str]:
    try:
        return queue_dir(), namespace_prefix()
    except ValueError as e:  # an invalid MSGQ_PREFIX / OPENPILOT_PREFIX
        raise CommandError(str(e)) from None


def _queue_files(folder: str) -> list[tuple[str, str]]:
    """(endpoint, path) of every ``msgq_<endpoint>`` entry of folder, by endpoint."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []  # nothing was ever created in this namespace
    found = []
    for name in names:
        if not name.startswith(QUEUE_FILE_PREFIX):
            continue
        endpoint = name[len(QUEUE_FILE_PREFIX) :]
        try:
            validate_endpoint(endpoint)
        except ValueError:
            continue  # not a name msgq gives a queue file
        found.append((endpoint, os.path.join(folder, name)))
    return sorted(found)


_KIND_OF_FILE = {
    stat.S_IFLNK: "a symlink",
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _describe(endpoint: str, path: str) -> dict[str, Any]:
    """The inspect_queue dict of one file with its endpoint and ``state`` added; a file
    that vanished meanwhile gets state "gone"."""
    base: dict[str, Any] = {"endpoint": endpoint, "path": path}
    try:
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = _KIND_OF_FILE.get(stat.S_IFMT(mode), "not a regular file")
            return {
                **base,
                "state": "damaged",
                "valid": False,
                "regular_file": False,
                "error": f"{kind}, not a queue file",
            }
        info = inspect_queue(path)
    except FileNotFoundError:
        return {**base, "state": "gone", "valid": False, "error": "removed meanwhile"}
    except BlockingIOError as e:
        return {**base, "state": "busy", "valid": None, "error": e.strerror}
    except OSError as e:
        return {**base, "state": "unreadable", "valid": None, "error": e.strerror or str(e)}
    info = {**base, **info, "path": path}
    info["state"] = _state(info)
    if info["state"] == "unfinished":
        # Seen under the file lock: a creator still at work would have held it.
        info["error"] = "empty, or its creator died before writing the header"
    elif info["state"] == "foreign":
        info["error"] = "a queue file of upstream msgq (another format)"
    elif info.get("layout_version") and info["layout_version"] != LAYOUT_VERSION:
        # an older (or newer) msgq's file, e.g. one left by the version before an upgrade
        info["error"] = (f"layout version {info['layout_version']}, this msgq's is "
                         f"{LAYOUT_VERSION}: the next opener replaces it")
    return info


#: Upstream msgq's queue file (msgq.cc): num_readers, write_pointer, write_uid, then 15
#: read pointers, 15 read valids and 15 read uids, all uint64, then the segment.
_UPSTREAM_READERS = 15
_UPSTREAM_HEADER = 8 * (3 + 3 * _UPSTREAM_READERS)


def _looks_like_upstream_queue(path: str, file_size: int) -> bool:
    """Whether path holds an upstream msgq queue: its header's reader count and valid
    flags have the only values upstream writes, and a segment follows."""
    if file_size <= _UPSTREAM_HEADER:
        return False
    try:
        with open(path, "rb") as f:
            header = f.read(_UPSTREAM_HEADER)
    except OSError:
        return False
    if len(header) < _UPSTREAM_HEADER:
        return False
    fields = struct.unpack(f"<{len(header) // 8}Q", header)
    num_readers = fields[0]
    valids = fields[3 + _UPSTREAM_READERS : 3 + 2 * _UPSTREAM_READERS]
    return num_readers <= _UPSTREAM_READERS and all(v in (0, 1) for v in valids)


def _state(info: dict[str, Any]) -> str:
    if not info["valid"]:
        if info["unfinished"]:
            return "unfinished"
        if info.get("file_size") and _looks_like_upstream_queue(info["path"], info["file_size"]):
            return "foreign"
        return "damaged"
    if info["publisher_alive"] or info["readers_live"] > 0:
        return "live"
    if info["publisher_pid"] is not None or info["readers_claimed"] > 0:
        return "dead"
    return "unused"


_ROW_COLOUR = {
    "live": None,
    "dead": "red",
    "unused": "dim",
    "unfinished": "yellow",
    "damaged": "yellow",
    "foreign": "yellow",
    "busy": "dim",
    "unreadable": "yellow",
}

#: States --clean removes without a further check / after checking /proc.
_REMOVABLE = ("dead", "unused", "unfinished")


def _publisher_text(q: dict[str, Any]) -> str:
    if not q.get("valid"):
        return "-"
    if q["publisher_pid"] is None:
        return "none"
    return f"{q['publisher_pid']} {'alive' if q['publisher_alive'] else 'dead'}"


def _readers_text(q: dict[str, Any]) -> str:
    if not q.get("valid"):
        return "-"
    return f"{q['readers_live']}/{q['readers_claimed']}"


def _folder_line(folder: str, prefix: str) -> str:
    namespace = f"namespace {prefix!r}" if prefix else "no namespace prefix"
    return f"queues in {folder} ({namespace})"


def _print_list(folder: str, prefix: str, queues: list[dict[str, Any]]) -> None:
    if not queues:
        print(f"no {_folder_line(folder, prefix)}")
        return
    print(_folder_line(folder, prefix))
    print()
    header = ["ENDPOINT", "STATE", "SEGMENT", "PUBLISHER", "READERS", "WRITTEN", "CREATED"]
    rows = [
        [
            q["endpoint"],
            q["state"],
            human_bytes(q.get("segment_size")),
            _publisher_text(q),
            _readers_text(q),
            human_bytes(q.get("bytes_written")),
            human_age(q.get("age_s")),
        ]
        for q in queues
    ]
    print_table(header, rows, [_ROW_COLOUR[q["state"]] for q in queues])
    notes = [q for q in queues if q.get("error")]
    if notes:
        print()
        for q in notes:
            print(paint(f"{q['endpoint']}: {q['state']}: {q['error']}", "yellow"))
    counts: dict[str, int] = {}
    for q in queues:
        counts[q["state"]] = counts.get(q["state"], 0) + 1
    removable = sum(counts.get(s, 0) for s in _REMOVABLE)
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    print()
    print(
        f"{len(queues)} queue file(s): {summary}"
        + (f"; 'msgq queues --clean' removes the {removable} not in use" if removable else "")
    )
    print(
        "READERS: live/claimed reader slots. WRITTEN: how far the write pointer has moved "
        "(payloads and framing)."
    )


# --- cleaning --------------------------------------------------------------------------


def _clean(
    folder: str, prefix: str, queues: list[dict[str, Any]], dry_run: bool, as_json: bool
) -> int:
    damaged = [
        q["path"]
        for q in queues
        if q["state"] in ("damaged", "foreign") and q.get("regular_file", True)
    ]
    users = _processes_using(damaged) if damaged else {}
    removed: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for q in queues:
        state = q["state"]
        reason = None
        if state == "live":
            reason = "in use by a live process"
        elif state in ("busy", "unreadable"):
            reason = f"{state}: {q['error']}"
        elif state == "damaged" and not q.get("regular_file", True):
            reason = f"{q['error']}: never removed"
        elif state in ("damaged", "foreign") and q["path"] in users:
            reason = f"{state} ({q['error']}); {users[q['path']]}"
        if reason is not None:
            kept.append({"endpoint": q["endpoint"], "state": state, "reason": reason})
            continue
        if dry_run:
            removed.append({"endpoint": q["endpoint"], "state": state, "why": _why(q)})
            continue
        try:
            result = remove_unused_queue(
                q["path"], remove_damaged=state in ("damaged", "foreign")
            )
        except FileNotFoundError:
            continue  # someone else removed it meanwhile
        except OSError as e:
            failed.append({"endpoint": q["endpoint"], "error": e.strerror or str(e)})
            continue
        if result["removed"]:
            removed.append({"endpoint": q["endpoint"], "state": state, "why": _why(q)})
        else:  # something connected since we looked
            kept.append(
                {"endpoint": q["endpoint"], "state": state, "reason": result["kept_because"]}
            )

    if as_json:
        print_json(
            {
                "dir": folder,
                "prefix": prefix or None,
                "dry_run": dry_run,
                "removed": removed,
                "kept": kept,
                "failed": failed,
            }
        )
    else:
        verb = "would remove" if dry_run else "removed"
        for r in removed:
            print(f"{verb} {r['endpoint']}: {r['why']}")
        for k in kept:
            print(paint(f"kept {k['endpoint']}: {k['reason']}", "dim"))
        for f in failed:
            print(paint(f"could not remove {f['endpoint']}: {f['error']}", "red"))
        if not queues:
            print(f"no {_folder_line(folder, prefix)}")
        else:
            print(
                f"{_folder_line(folder, prefix)}: {verb} {len(removed)}, kept {len(kept)}"
                + (f", failed {len(failed)}" if failed else "")
            )
    return EXIT_FAILURE if failed else EXIT_OK


def _why(q: dict[str, Any]) -> str:
    state = q["state"]
    if state == "unfinished":
        return "unfinished (its creator died while making it)"
    if state in ("damaged", "foreign"):
        return f"{state} ({q['error']}), no process has it open"
    parts = []
    if q["publisher_pid"] is not None:
        parts.append(f"publisher {q['publisher_pid']} dead")
    dead_readers = [r["pid"] for r in q["readers"] if not r["alive"]]
    if dead_readers:
        parts.append("reader(s) " + ", ".join(map(str, dead_readers)) + " dead")
    return state + (f" ({'; '.join(parts)})" if parts else ", nobody registered")


def _processes_using(paths: list[str]) -> dict[str, str]:
    """For each path some process has open or mapped, or might have (its /proc entries
    could not be read), why the file must stay. Paths absent from the result are used by
    no process. Without /proc nothing can be checked, and every path stays."""
    targets: dict[tuple[int, int], str] = {}
    shared: dict[str, bool] = {}
    for path in paths:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        targets[(st.st_dev, st.st_ino)] = path
        # msgq refuses a file owned by another user unless its mode shares it, so only
        # then can another user's process be a msgq user of it.
        shared[path] = bool(st.st_mode & 0o066)
    if not os.path.isdir("/proc/self/fd"):
        return {p: "cannot check which processes use it (no /proc)" for p in paths}
    found: dict[str, str] = {}
    me, my_uid = os.getpid(), os.geteuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            owner = os.stat(f"/proc/{pid}").st_uid
            held = _files_of(pid)
        except FileNotFoundError:
            continue  # exited meanwhile
        except PermissionError:
            for path in paths:
                if (owner == my_uid or shared.get(path)) and path not in found:
                    found[path] = f"cannot check process {pid}"
            continue
        for key in held & targets.keys():
            found[targets[key]] = f"process {pid} has it open"
    return found


def _files_of(pid: int) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file process pid has mapped or open."""
    held: set[tuple[int, int]] = set()
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) < 5 or fields[4] == "0":
                continue
            major, _, minor = fields[3].partition(":")
            try:
                held.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
            except ValueError:
                continue
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            st = os.stat(os.path.join(fd_dir, fd))
        except OSError:
            continue  # closed meanwhile, or a dangling link
        held.add((st.st_dev, st.st_ino))
    return held
