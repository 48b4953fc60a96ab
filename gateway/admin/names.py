"""Destination names in admin paths and bodies: plain (``orders.eu``) or canonical (``queue://orders.eu``).

Paths carry plain names, URL-encoded; a canonical name of the right kind is
accepted too, and every answer names the canonical destination.  Views look a
name up as it is (``queue_name``, ``topic_name``: a name that cannot exist is
just not found); actions check it first (``canonical``): a name no
destination could have is a 400 saying why, and a name to send to, move to
or create is checked as a producer's would be.
"""
from __future__ import annotations

from core.broker import Broker
from core.errors import BrokerError
from gateway.admin.http import HttpError

QUEUE_PREFIX = "queue://"
TOPIC_PREFIX = "topic://"
# How the MQTT protocol names a persistent session's queue and state (protocols/mqtt/hub.py queue_key).
MQTT_SESSION_PREFIX = "mqtt:"
# What durable subscriptions and MQTT sessions need ``admin`` on: client state, not a destination.
SESSIONS = "broker://sessions"


def queue_name(name: str) -> str:
    return name if name.startswith(QUEUE_PREFIX) else QUEUE_PREFIX + name


def topic_name(name: str) -> str:
    return name if name.startswith(TOPIC_PREFIX) else TOPIC_PREFIX + name


def plain(destination: str) -> str:
    """``queue://orders`` -> ``orders``."""
    return destination.split("://", 1)[1]


def canonical(kind: str, name: str, broker: Broker, field: str | None = None, target: bool = False) -> str:
    """``orders.eu`` -> ``queue://orders.eu`` (a canonical name of that kind passes as it is).

    ``target``: a name to send, move to or create, checked as a producer's
    (``Broker.check_destination``: no ``a.*``); other names find what exists.
    ``field``: the body field the name came from, for the 400's text and ``field``.
    """
    where = f"field {field!r}: " if field else ""
    extra = {"field": field} if field else {}
    if "://" in name:
        if not name.startswith(f"{kind}://"):
            raise HttpError(400, f"{where}{name!r} is not a {kind} name", **extra)
        full = name
    else:
        full = f"{kind}://{name}"
    try:
        if target:
            broker.check_destination(full)
        else:
            broker.check_name(full, allow_wildcards=False)
    except BrokerError as exc:
        raise HttpError(400, f"{where}{exc}", **extra) from None
    return full
