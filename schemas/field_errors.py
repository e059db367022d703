"""Misspelled field names, said in one line: the struct, the closest field, its fields.

pycapnp answers a field name its struct lacks with ``capnp/schema.c++:511: failed: struct
has no such member; name = vEgoo`` and a line of stack addresses. Every place where a
user's field name meets a struct says instead::

    CarState (carState) has no field 'vEgoo'; did you mean 'vEgo'? (fields: vEgo, aEgo, ...)

* :func:`unknown_field_message` builds that line (the CLI, Spark and plot code call it
  where they resolve a field path; :func:`resolve_field_path` walks a dotted path);
* payload views (``sm[s].vEgoo``) and ``new_message(**fields)`` raise
  :class:`UnknownFieldError` with it;
* pycapnp's own readers and builders (``msg.carState.vEgoo = 1``) raise in C++, which
  does not say which struct it was: :func:`install` (done when msgq loads pycapnp)
  rewrites pycapnp's error, on its error path only, into one line naming the structs of
  the schema in force that have a close field.

Layer: the Event layer (standard library only; pycapnp objects are duck-typed).
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "UnknownFieldError",
    "install",
    "resolve_field_path",
    "struct_name",
    "unknown_field_error",
    "unknown_field_message",
]

#: How many characters of field names the message lists before "and N more".
_FIELDS_SHOWN_CHARS = 600
_MEMBER_RE = re.compile(r"has no such member; name = (\S+)")

try:  # pycapnp's exception type: the error stays catchable as what pycapnp raised
    from capnp.lib.capnp import KjException as _KjException
except ImportError:  # pragma: no cover - pycapnp is a dependency
    _KjException = Exception  # type: ignore[assignment,misc]


class UnknownFieldError(AttributeError, _KjException):  # type: ignore[misc,valid-type]
    """A field name the struct does not have. An AttributeError (what pycapnp's readers and
    builders raise) and pycapnp's KjException (what ``new_message(**fields)`` raised).
    ``field_name`` is the name; the message may be worked out when first read (``hasattr``
    and ``getattr(x, name, default)`` never read it)."""

    def __init__(self, message: str | Callable[[], str], field_name: str | None = None
                 ) -> None:
        AttributeError.__init__(self)
        self._message = message
        self.field_name = field_name
        self.wrapper = None
        self.nature = self.durability = None
        self._type = "FAILED"

    @property
    def message(self) -> str:  # type: ignore[override]
        """The one-line message."""
        if callable(self._message):
            self._message = self._message()
        return self._message

    def __str__(self) -> str:
        return self.message


def struct_name(struct_schema: Any) -> str:
    """The struct's name without its file (``CarState``, ``RadarState.LeadData``)."""
    node = struct_schema.node
    return str(node.displayName[node.displayNamePrefixLength:]) if \
        node.displayNamePrefixLength else str(node.displayName).rpartition(":")[2]


def unknown_field_message(owner: str, name: str, fields: Sequence[str]) -> str:
    """``owner has no field 'name'; did you mean 'x'? (fields: ...)``, in one line."""
    close = difflib.get_close_matches(str(name), list(fields), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    shown: list[str] = []
    used = 0
    for field in fields:
        if used + len(field) > _FIELDS_SHOWN_CHARS:
            break
        shown.append(field)
        used += len(field) + 2
    more = f" and {len(fields) - len(shown)} more" if len(shown) < len(fields) else ""
    listed = ", ".join(shown) + more if fields else "none"
    return f"{owner} has no field '{name}'{hint} (fields: {listed})"


def unknown_field_error(struct_schema: Any, name: str, label: str | None = None
                        ) -> UnknownFieldError:
    """The error for ``name`` on a struct of ``struct_schema`` (a pycapnp struct schema);
    ``label`` is where the struct sits (``carState``), said in parentheses."""
    owner = struct_name(struct_schema)
    if label and label != owner:
        owner = f"{owner} ({label})"
    return UnknownFieldError(unknown_field_message(owner, name, list(struct_schema.fieldnames)),
                             name)


def resolve_field_path(struct_schema: Any, path: str, label: str | None = None) -> list[Any]:
    """The pycapnp field of each part of the dotted ``path`` from ``struct_schema`` (a
    struct, group or list-of-struct field continues the walk); :class:`UnknownFieldError`
    (one line: the struct, the closest field, its fields) at the first part that is not a
    field, ValueError when the path goes on below a field that is not a struct."""
    fields = []
    current = struct_schema
    where = label or struct_name(struct_schema)
    for part in path.split("."):
        if current is None:
            raise ValueError(f"{path}: {where} is not a struct, it has no field '{part}'")
        if part not in current.fields:
            raise unknown_field_error(current, part, where)
        field = current.fields[part]
        fields.append(field)
        current = _struct_below(field)
        where = f"{where}.{part}"
    return fields


def _struct_below(field: Any) -> Any:
    """The struct schema a field leads to (struct, group, list of structs), else None."""
    proto = field.proto
    if proto.which() == "group":
        return field.schema
    kind = proto.slot.type.which()
    if kind == "struct":
        return field.schema
    if kind == "list" and proto.slot.type.list.elementType.which() == "struct":
        return field.schema.elementType
    return None


# --- pycapnp's own readers and builders --------------------------------------------------

_index_lock = threading.Lock()
_indexes: dict[int, dict[str, list[str]]] = {}


def _field_index(root: Any) -> dict[str, list[str]]:
    """field name -> the structs (names) that have it, over every struct ``root`` reaches."""
    key = int(root.node.id)
    index = _indexes.get(key)
    if index is not None:
        return index
    index = {}
    seen: set[int] = set()
    pending = [root]
    while pending:
        struct = pending.pop()
        node_id = struct.node.id
        if node_id in seen:
            continue
        seen.add(node_id)
        owner = struct_name(struct)
        for name, field in struct.fields.items():
            index.setdefault(name, []).append(owner)
            try:
                below = _struct_below(field)
            except Exception:  # a field kind pycapnp cannot describe: not walked
                below = None
            if below is not None:
                pending.append(below)
    with _index_lock:
        _indexes[key] = index
    return index


_guesses: dict[tuple[str, tuple[int, ...]], str] = {}


def guess_message(name: str, roots: Iterable[Any]) -> str:
    """pycapnp's "struct has no such member" in one line: the field and, since pycapnp
    does not say which struct it was, the structs under ``roots`` with a close field."""
    roots = list(roots)
    key = (name, tuple(int(root.node.id) for root in roots))
    text = _guesses.get(key)
    if text is None:
        if len(_guesses) > 1024:
            _guesses.clear()
        text = _guesses[key] = _guess(name, roots)
    return text


def _guess(name: str, roots: list[Any]) -> str:
    candidates: dict[str, list[str]] = {}
    for root in roots:
        index = _field_index(root)
        for close in difflib.get_close_matches(name, list(index), n=3, cutoff=0.75):
            candidates.setdefault(close, [])
            candidates[close] = sorted(set(candidates[close]) | set(index[close]))
    text = f"struct has no field '{name}'"
    if candidates:
        hints = "; ".join(f"'{f}' (a field of {', '.join(owners[:4])}"
                          f"{' and more' if len(owners) > 4 else ''})"
                          for f, owners in candidates.items())
        text += f"; did you mean {hints}?"
    return text + " (pycapnp does not say which struct; print(msg.schema.fieldnames) lists " \
        "a struct's fields)"


_installed = False


def install(roots: Any) -> None:
    """Makes pycapnp's "struct has no such member" AttributeError (raised by the
    ``__getattr__``/``__setattr__`` of every pycapnp reader and builder) an
    :class:`UnknownFieldError` in one line (:func:`guess_message`, over the structs of
    ``roots()``: the schema in force's root). Only the error path changes; once per
    process."""
    global _installed
    if _installed:
        return
    original = getattr(_KjException, "_to_python", None)
    if original is None:  # another pycapnp: its errors stay as they are
        return

    def _to_python(self: Any) -> Any:
        converted = original(self)
        if not isinstance(converted, AttributeError) or isinstance(converted,
                                                                   UnknownFieldError):
            return converted
        match = _MEMBER_RE.search(str(self.message))
        if match is None or match.group(1).startswith("_"):  # dunder probes: as they are
            return converted
        name = match.group(1)
        original_text = str(converted)

        def message() -> str:  # worked out when read: hasattr() misses cost nothing
            try:
                return guess_message(name, roots())
            except Exception:  # never hide pycapnp's error behind one of ours
                return original_text

        return UnknownFieldError(message, name).with_traceback(converted.__traceback__)

    _KjException._to_python = _to_python  # type: ignore[attr-defined]
    _installed = True
