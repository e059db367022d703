"""Service names on the command line: checked against the registry, with suggestions."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from msgq.cli.output import UsageError
from msgq.schemas import SERVICE_LIST
from msgq.schemas.services import unknown_service_error

__all__ = ["check_services"]


def check_services(names: Iterable[str], known: Collection[str] | None = None) -> list[str]:
    """The service names in ``names`` (an item is one name or several separated by commas,
    as ``--services a,b`` gives them; blanks ignored), without duplicates, each one of
    ``known`` (default: the registry's services, ``SERVICE_LIST``); an unknown one is a
    UsageError that names the closest (``unknown service 'x'; did you mean ...``)."""
    if known is None:
        known = SERVICE_LIST
    checked = [n for n in dict.fromkeys(n.strip() for item in names for n in item.split(","))
               if n]
    for name in checked:
        if name not in known:
            raise UsageError(unknown_service_error(name, known).args[0])
    return checked
