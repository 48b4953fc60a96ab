"""STOMP destination names to and from canonical names.

``/queue/a.b`` is ``queue://a.b``; ``/topic/a.b`` is ``topic://a.b`` (STOMP
already separates topic levels with ``.``, as canonical names do);
``/temp-queue/x`` is the connection's own temporary queue and
``/remote-temp-queue/<id>`` names any connection's one, which is how a
``reply-to`` travels to a responder (as ActiveMQ does).  ``/stream/NAME`` is a
stream to consume from an offset.

RabbitMQ's forms mean what they mean there: ``/amq/queue/NAME`` names an
existing queue or stream (never creates one), and
``/exchange/amq.topic/KEY`` is the topic ``KEY`` -- where RabbitMQ's MQTT
plugin publishes, so mixed STOMP/MQTT code keeps working.  Other exchanges do
not exist here; the error says what to use instead.

A SEND may name several destinations separated by commas, as ActiveMQ's
composite destinations: ``/queue/a,/topic/b``; a part without a type
(``/queue/a,b``) has the type of the part before it.
"""
from __future__ import annotations

from typing import Callable

from core.destination import InvalidDestination

_FIXED = (
    ("/queue/", "queue://"), ("/topic/", "topic://"), ("/remote-temp-queue/", "temp-queue://"),
    ("/stream/", "stream://"), ("/exchange/amq.topic/", "topic://"),
)
_TYPES = ("/queue/", "/topic/", "/temp-queue/", "/remote-temp-queue/", "/stream/", "/amq/queue/", "/exchange/amq.topic/")
_USE = "use /queue/NAME, /topic/NAME, /temp-queue/NAME, /remote-temp-queue/NAME or /stream/NAME"

Resolve = Callable[[str], str]


def to_canonical(name: str, temp_queue: Resolve, existing_queue: Resolve | None = None) -> str:
    """One destination.  ``temp_queue(name)`` resolves (and creates) the connection's
    own temporary queue; ``existing_queue(name)`` resolves ``/amq/queue/NAME`` to the
    queue or stream of that name, or raises."""
    if "," in name:
        raise InvalidDestination(
            f"destination {name[:200]!r} has a comma: several destinations (a composite, /queue/a,/queue/b) "
            "can be sent to but not subscribed to; subscribe to each"
        )
    for prefix, scheme in _FIXED:
        if name.startswith(prefix):
            return scheme + _rest(name, prefix)
    if name.startswith("/temp-queue/"):
        return temp_queue(_rest(name, "/temp-queue/"))
    if name.startswith("/amq/queue/"):
        rest = _rest(name, "/amq/queue/")
        if existing_queue is None:
            raise InvalidDestination(f"{name!r} names an existing queue, which cannot be looked up here; use /queue/{rest}")
        return existing_queue(rest)
    if name.startswith("/exchange/"):
        exchange, _, key = name[len("/exchange/"):].partition("/")
        raise InvalidDestination(
            f"exchange {exchange!r} does not exist here: this broker has queues and topics, not exchanges "
            f"(RabbitMQ's amq.topic is /exchange/amq.topic/KEY, the same as /topic/KEY); "
            f"use /topic/{key or 'KEY'} for a topic or /queue/{key or 'NAME'} for a queue"
        )
    raise InvalidDestination(f"unknown destination {name[:200]!r}: {_USE}")


def to_canonical_all(name: str, temp_queue: Resolve, existing_queue: Resolve | None = None) -> list[str]:
    """A SEND's destination: one, or a composite (``/queue/a,/topic/b``, ``/queue/a,b``), in order, without repeats."""
    if "," not in name:
        return [to_canonical(name, temp_queue, existing_queue)]
    out: list[str] = []
    kind = ""
    for part in name.split(","):
        if not part:
            raise InvalidDestination(f"composite destination {name[:200]!r} has an empty part")
        typed = next((t for t in _TYPES if part.startswith(t)), "")
        if typed:
            kind = typed
        elif part.startswith("/"):
            kind = ""  # not a type this broker has: to_canonical says what to use instead
        elif not kind:
            raise InvalidDestination(
                f"composite destination {name[:200]!r} starts without a type: write /queue/{part} or /topic/{part}"
            )
        else:
            part = kind + part
        canonical = to_canonical(part, temp_queue, existing_queue)
        if canonical not in out:
            out.append(canonical)
    return out


def _rest(name: str, prefix: str) -> str:
    rest = name[len(prefix):]
    if not rest:
        raise InvalidDestination(f"empty destination name in {name!r}")
    return rest


def from_canonical(canonical: str) -> str:
    for prefix, scheme in _FIXED:
        if canonical.startswith(scheme):
            return prefix + canonical[len(scheme):]
    return canonical
