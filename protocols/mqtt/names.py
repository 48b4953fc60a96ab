"""MQTT topic names and filters to and from canonical destinations.

Levels are the unit: MQTT ``a/b/c`` is ``topic://a.b.c`` (STOMP
``/topic/a.b.c``).  A ``.`` inside an MQTT level becomes ``/`` in the
canonical level and back again (ActiveMQ's swap), so every MQTT topic survives
the round trip.  ``+`` and ``#`` become ``*`` and ``>``; as a consequence the
MQTT levels ``*`` and ``>`` cannot be published to (they would read as
wildcards elsewhere) and are refused as invalid topic names.
"""
from __future__ import annotations

_TO_CANONICAL = str.maketrans({"/": ".", ".": "/"})


class InvalidTopic(ValueError):
    pass


def topic_to_canonical(topic: str) -> str:
    """A PUBLISH topic name (no wildcards, checked by the codec)."""
    if "*" in topic or ">" in topic:
        for level in topic.split("/"):
            if level in ("*", ">"):
                raise InvalidTopic(f"topic level {level!r} is reserved (it is a wildcard for STOMP clients)")
    return "topic://" + topic.translate(_TO_CANONICAL)


def filter_to_canonical(topic_filter: str) -> str:
    """A subscription filter, validated as MQTT 4.7.1 requires."""
    if not topic_filter:
        raise InvalidTopic("empty topic filter")
    levels = topic_filter.split("/")
    last = len(levels) - 1
    out = []
    for i, level in enumerate(levels):
        if level == "#":
            if i != last:
                raise InvalidTopic("'#' must be the last level of a filter")
            out.append(">")
        elif level == "+":
            out.append("*")
        elif "+" in level or "#" in level:
            raise InvalidTopic(f"a wildcard must occupy a whole level: {level!r}")
        elif level in ("*", ">"):
            raise InvalidTopic(f"topic level {level!r} is reserved (it is a wildcard for STOMP clients)")
        else:
            out.append(level.replace(".", "/"))
    return "topic://" + ".".join(out)


def canonical_to_topic(destination: str) -> str | None:
    """The MQTT topic of a canonical topic, or None when MQTT cannot express it."""
    if not destination.startswith("topic://"):
        return None
    name = destination[8:]
    topic = name.translate(_TO_CANONICAL)
    if "+" in topic or "#" in topic:
        return None  # a STOMP topic with a level MQTT reserves for wildcards
    return topic


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """``$share/{group}/{filter}`` -> (group, filter); other filters -> (None, filter)."""
    if not topic_filter.startswith("$share/"):
        return None, topic_filter
    rest = topic_filter[len("$share/"):]
    group, sep, inner = rest.partition("/")
    if not sep or not group or not inner or "+" in group or "#" in group:
        raise InvalidTopic("a shared subscription is $share/{group}/{filter} with a non-empty group and filter")
    return group, inner
