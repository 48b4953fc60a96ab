"""STOMP destination names to and from canonical names.

``/queue/a.b`` is ``queue://a.b``; ``/topic/a.b`` is ``topic://a.b`` (STOMP
already separates topic levels with ``.``, as canonical names do);
``/temp-queue/x`` is the connection's own temporary queue and
``/remote-temp-queue/<id>`` names any connection's one, which is how a
``reply-to`` travels to a responder (as ActiveMQ does).  ``/stream/NAME`` is a
stream to consume from an offset; RabbitMQ's ``/amq/queue/NAME`` names the
same stream, so its STOMP stream clients work unchanged.
"""
from __future__ import annotations

from typing import Callable

from core.destination import InvalidDestination

_FIXED = (
    ("/queue/", "queue://"), ("/topic/", "topic://"), ("/remote-temp-queue/", "temp-queue://"),
    ("/stream/", "stream://"), ("/amq/queue/", "stream://"),
)


def to_canonical(name: str, temp_queue: Callable[[str], str]) -> str:
    """``temp_queue(name)`` resolves (and creates) the connection's own temporary queue."""
    for prefix, scheme in _FIXED:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if not rest:
                raise InvalidDestination(f"empty destination name in {name!r}")
            return scheme + rest
    if name.startswith("/temp-queue/"):
        rest = name[len("/temp-queue/"):]
        if not rest:
            raise InvalidDestination(f"empty destination name in {name!r}")
        return temp_queue(rest)
    raise InvalidDestination(
        f"unknown destination {name!r}: use /queue/NAME, /topic/NAME, /temp-queue/NAME, /remote-temp-queue/NAME or /stream/NAME"
    )


def from_canonical(canonical: str) -> str:
    for prefix, scheme in _FIXED:
        if canonical.startswith(scheme):
            return prefix + canonical[len(scheme):]
    return canonical
