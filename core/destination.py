"""Canonical destination names shared by every protocol.

``queue://a.b.c``, ``topic://a.b.c``, ``temp-queue://owner:name`` and
``stream://name`` (a stream, consumed from an offset, never sent to).  Topic
names are sequences of levels; protocols map their own separators onto levels
(STOMP ``.``, MQTT ``/``), so one topic is one topic whoever publishes to it.
Wildcards in canonical form are ``*`` (one level) and ``>`` (this level and
all below), as ActiveMQ spells them.
"""
from __future__ import annotations

from core.errors import BrokerError

QUEUE = "queue"
TOPIC = "topic"
TEMP_QUEUE = "temp-queue"
STREAM = "stream"

_PREFIXES = {"queue://": QUEUE, "topic://": TOPIC, "temp-queue://": TEMP_QUEUE, "stream://": STREAM}

ONE_LEVEL = "*"
ALL_LEVELS = ">"


class InvalidDestination(BrokerError, ValueError):
    """A destination name the broker cannot route to."""


def kind_of(destination: str) -> str:
    for prefix, kind in _PREFIXES.items():
        if destination.startswith(prefix):
            return kind
    raise InvalidDestination(f"unknown destination type in {destination!r}")


def name_of(destination: str) -> str:
    """The part after the scheme."""
    return destination.split("://", 1)[1]


def topic_levels(name: str) -> tuple[str, ...]:
    """Levels of a canonical topic name (without the scheme)."""
    return tuple(name.split("."))


def wildcard_level(destination: str) -> str:
    """The first wildcard level (``*`` or ``>``) of a queue or topic name; "" when it has none.

    Only a whole level is a wildcard, as in subscriptions: ``a.b*`` is a plain name.
    """
    if not destination.startswith(("queue://", "topic://")):
        return ""
    for level in topic_levels(name_of(destination)):
        if level == ONE_LEVEL or level == ALL_LEVELS:
            return level
    return ""


def wildcard_send(destination: str, level: str) -> InvalidDestination:
    """The refusal of a message, or of a new queue, named with a wildcard, saying what to use instead.

    A wildcard selects several topics in a subscription; in a name to send to it
    would select nothing (a topic) or make a queue literally called ``a.*`` that
    nothing else ever reaches (a queue), so both are refused where they are named.

    Protocol-neutral (names without the STOMP or MQTT spelling), since every
    entry point -- STOMP, MQTT, the admin API -- shows the same words.
    """
    name = name_of(destination)
    if destination.startswith("topic://"):
        return InvalidDestination(
            f"topic name {name!r} has the wildcard {level!r}: wildcards are for subscribing; "
            f"send to a full topic name, which subscribers of {name!r} receive"
        )
    levels = topic_levels(name)
    as_filter = f"the topic {name!r}" if ALL_LEVELS not in levels[:-1] else "a topic filter"
    return InvalidDestination(
        f"queue name {name!r} has the wildcard {level!r}, but a queue is one queue named in full: "
        f"use a plain queue name, or a topic (send to full topic names, subscribe to {as_filter} to receive them all)"
    )


def validate(destination: str, *, allow_wildcards: bool) -> str:
    """Check a canonical name before it reaches a queue or the trie.

    Wildcards are only meaningful in topic subscriptions; a ``>`` that is not
    the last level would never match anything, so it is refused up front.
    """
    kind = kind_of(destination)
    name = name_of(destination)
    if not name:
        raise InvalidDestination("empty destination name")
    if kind == TOPIC:
        levels = topic_levels(name)
        for i, level in enumerate(levels):
            if level in (ONE_LEVEL, ALL_LEVELS):
                if not allow_wildcards:
                    raise wildcard_send(destination, level)
                if level == ALL_LEVELS and i != len(levels) - 1:
                    raise InvalidDestination(f"'>' must be the last level: {destination}")
    return destination


def check_limits(destination: str, max_levels: int, max_length: int) -> None:
    """Refuse names longer or deeper than the broker allows, naming the limit that was hit."""
    if max_length and len(destination) > max_length:
        raise InvalidDestination(
            f"destination of {len(destination)} characters is over the limit of {max_length} (max_destination_length)"
        )
    if max_levels:
        levels = destination.count(".") + 1
        if levels > max_levels:
            raise InvalidDestination(
                f"destination of {levels} levels is over the limit of {max_levels} (max_destination_levels)"
            )
