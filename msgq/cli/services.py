"""Service names on the command line: checked against the schema in force (its registry,
see :func:`msgq.schemas.registry_in_force`), with suggestions.

Every command that takes service names checks them here, so that a name the schema in
force does not have is said the same way everywhere: one line that suggests close names,
says which schema is in force, and — when the name is a service of msgq's own schema or
of none known — that ``--schema``/``--registry`` (or MSGQ_SCHEMA/MSGQ_REGISTRY) select the
application's schema.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from msgq.cli.output import UsageError
from msgq.schemas import SERVICE_LIST, registry_in_force, schema_in_force, spec_in_force
from msgq.schemas.services import unknown_service_error

__all__ = ["check_services", "schema_in_force_name",
           "unknown_service_message"]

_SELECT_HINT = ("--schema FILE.capnp --registry FILE (or MSGQ_SCHEMA/MSGQ_REGISTRY) select "
                "the application's schema")


def schema_in_force_name() -> str:
    """The schema in force as a person names it: ``msgq's own schema``, or its files
    (``robot.capnp with the registry services.py``)."""
    spec = spec_in_force()
    if spec.is_msgq_own:
        return "msgq's own schema"
    schema = "msgq's log.capnp" if spec.path is None else os.path.basename(spec.path)
    if spec.root != "Event":
        schema += f" (root {spec.root})"
    if spec.services_path is not None:
        return f"{schema} with the registry {os.path.basename(spec.services_path)}"
    if spec.services is None:
        return f"{schema} (no registry: every union member)"
    return schema


def _union_members() -> Collection[str]:
    """The root struct's union members of the schema in force (loads it; on the error path
    only); empty when it cannot be loaded."""
    try:
        return schema_in_force().union_fields
    except Exception:  # a schema that does not load is said by whoever loads it
        return ()


def unknown_service_message(name: str, known: Collection[str]) -> str:
    """One line saying that ``name`` is not one of ``known`` (services of the schema in
    force), with the close names, the schema in force, and what to do."""
    text = unknown_service_error(name, known).args[0].replace(
        f"unknown service {name!r}", f"unknown service {name!r} in {schema_in_force_name()}", 1)
    if not text.endswith("?"):
        text += "."
    if spec_in_force().is_msgq_own:
        return f"{text} Is it a service of an application's schema? {_SELECT_HINT}."
    if name in SERVICE_LIST:
        return f"{text} {name!r} is a service of msgq's own schema; {_SELECT_HINT}."
    if name in _union_members():
        return (f"{text} {name!r} is a member of the schema's union but not a service of "
                "its registry: add it to the registry.")
    return f"{text} {_SELECT_HINT}."


def check_services(names: Iterable[str], known: Collection[str] | None = None) -> list[str]:
    """The service names in ``names`` (an item is one name or several separated by commas,
    as ``--services a,b`` gives them; blanks ignored), without duplicates, each one of
    ``known`` (default: the services of the registry in force,
    :func:`msgq.schemas.registry_in_force`); an unknown one is a UsageError of one line
    (see :func:`unknown_service_message`)."""
    if known is None:
        known = registry_in_force()
    checked = [n for n in dict.fromkeys(n.strip() for item in names for n in item.split(","))
               if n]
    for name in checked:
        if name not in known:
            raise UsageError(unknown_service_message(name, known))
    return checked
