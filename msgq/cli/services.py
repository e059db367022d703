"""Service names on the command line: checked against the registry, with suggestions."""

from __future__ import annotations

from collections.abc import Iterable

from msgq.cli.output import UsageError

__all__ = ["check_services"]


def check_services(names: Iterable[str]) -> list[str]:
    """``names`` without duplicates, each a registry service; an unknown one is a
    UsageError that names the closest services (``unknown service 'x'; did you mean ...``)."""
    from msgq.schemas import SERVICE_LIST
    from msgq.schemas.services import unknown_service_error

    checked = []
    for name in dict.fromkeys(names):
        if name not in SERVICE_LIST:
            raise UsageError(unknown_service_error(name, SERVICE_LIST).args[0])
        checked.append(name)
    return checked
