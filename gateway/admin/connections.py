"""Connections for operators: who is connected, what they send and receive, and closing one.

The counts come from two integers on each core connection, incremented where
the core already handles each message (``Connection.send`` and
``Consumer.deliver``).  Closing goes through the closer the connection's
session registered (``Connection.close_for``), so the client is told why in
its own protocol: STOMP an ``ERROR`` frame with the reason, MQTT 5 a
``DISCONNECT`` with reason code 0x98 (administrative action) and the reason
string; MQTT 3.1.1 has no such packet and is just closed.

Every route needs ``admin`` on ``broker://connections`` once users are configured.
"""
from __future__ import annotations

import json
from typing import Any

from twisted.logger import Logger
from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.connection import Connection
from gateway.admin.descriptions import SubscriptionIndex, iso_ms
from gateway.admin.http import (
    HttpError,
    Router,
    json_body,
    query,
    request_body,
    require,
)
from gateway.admin.listing import page_request, paged

log = Logger(namespace="gateway.admin")

RESOURCE = "broker://connections"
DEFAULT_REASON = "closed by an administrator"
MAX_REASON = 1000


def subscriptions_of(conn: Connection, index: SubscriptionIndex) -> list[str]:
    """The destinations a connection consumes from, canonical: queues, topic filters, streams."""
    found: list[str] = []
    for consumer in conn.consumers.values():
        sub = conn.subscription_of(consumer)
        feed = conn.feed_of(consumer)
        if sub is not None:
            found.append(sub.destination)
        elif feed is not None:
            found.append(f"stream://{feed.stream.name}")
        elif consumer.queue.name.startswith(("queue://", "temp-queue://")):
            found.append(consumer.queue.name)
        else:  # a queue the protocol manages (an MQTT session, a shared subscription): its filters
            found.extend(s.destination for s in index.of(consumer.queue))
    return sorted(set(found))


# The core's protocol names (``mqtt/4``: the CONNECT packet's protocol level) as people know them.
_PROTOCOL_NAMES = {"mqtt/3": "MQTT 3.1", "mqtt/4": "MQTT 3.1.1", "mqtt/5": "MQTT 5.0", "http": "HTTP"}


def protocol_name(protocol: str, remote: str) -> str:
    """``mqtt/4`` -> ``MQTT 3.1.1``, ``stomp/1.2`` -> ``STOMP 1.2``, with `` over WebSocket`` for a
    WebSocket client (its remote address starts ``ws:``, protocols/websocket.py).

    For people (the console's Protocol column); ``protocol`` stays the machine
    value scripts sort and filter by, as /metrics labels do.
    """
    name = _PROTOCOL_NAMES.get(protocol)
    if name is None:
        family, _, version = protocol.partition("/")
        name = f"{family.upper()} {version}".strip() if family else "unknown"
    return f"{name} over WebSocket" if remote.startswith(("ws:", "wss:")) else name


def _reason(text: object) -> str:
    if text is None or text == "":
        return DEFAULT_REASON
    if not isinstance(text, str) or len(text) > MAX_REASON or not text.isprintable():
        raise HttpError(400, f"reason must be printable text of at most {MAX_REASON} characters")
    return text


class ConnectionsAPI:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def install(self, router: Router) -> None:
        router.add("/api/v1/connections", get=self.connections)
        router.add("/api/v1/connections/{id}", get=self.describe, delete=self.close)
        router.add("/api/v1/connections/{id}/close", post=self.close_post)

    def _describe(self, conn: Connection, index: SubscriptionIndex) -> dict[str, Any]:
        return {
            "id": conn.id,
            "protocol": conn.protocol,
            "protocol_name": protocol_name(conn.protocol, conn.remote),
            "client_id": conn.client_id,
            "user": conn.user,
            "remote": conn.remote,
            "connected_since": iso_ms(conn.since_ms),
            "connected_since_ms": conn.since_ms,
            "messages_in": conn.messages_in,
            "messages_out": conn.messages_out,
            # Skipped because its rules deny the topic (wildcard subscriptions a deny rule overlaps).
            "messages_denied": conn.messages_denied,
            "unacknowledged": sum(c.held() for c in conn.consumers.values()),
            "subscriptions": subscriptions_of(conn, index),
        }

    def connections(self, request: server.Request) -> Any:
        require(request, Permission.ADMIN, RESOURCE)
        sorts = {
            "since": lambda c: c.since_ms,
            "id": lambda c: c.id,
            "client_id": lambda c: c.client_id or "",
            "user": lambda c: c.user or "",
            "protocol": lambda c: c.protocol,
            "remote": lambda c: c.remote,
            "messages_in": lambda c: c.messages_in,
            "messages_out": lambda c: c.messages_out,
        }
        page = page_request(request, sorts, "since")
        index = SubscriptionIndex(self.broker)
        return json_body(200, paged(
            page, list(self.broker.connections.values()),
            text=lambda c: f"{c.id} {c.protocol} {protocol_name(c.protocol, c.remote)} {c.client_id or ''} {c.user or ''} {c.remote}",
            sorts=sorts, describe=lambda c: self._describe(c, index), name="connections",
        ))

    def _find(self, request: server.Request, id: str) -> Connection:
        require(request, Permission.ADMIN, RESOURCE)
        conn = self.broker.connections.get(id)
        if conn is None or conn.closed:
            raise HttpError(404, f"no connection {id!r}", "unknown_connection")
        return conn

    def describe(self, request: server.Request, id: str) -> Any:
        return json_body(200, self._describe(self._find(request, id), SubscriptionIndex(self.broker)))

    def close(self, request: server.Request, id: str) -> Any:
        """DELETE /api/v1/connections/ID?reason=..."""
        conn = self._find(request, id)
        return self._close(conn, _reason(query(request, "reason")))

    def close_post(self, request: server.Request, id: str) -> Any:
        """POST /api/v1/connections/ID/close with {"reason": "..."} (or no body)."""
        conn = self._find(request, id)
        body = request_body(request)
        reason: object = None
        if body.strip():
            try:
                document = json.loads(body)
            except (ValueError, RecursionError):
                raise HttpError(400, 'body must be JSON like {"reason": "maintenance"}') from None
            if not isinstance(document, dict):
                raise HttpError(400, 'body must be JSON like {"reason": "maintenance"}')
            reason = document.get("reason")
        return self._close(conn, _reason(reason))

    def _close(self, conn: Connection, reason: str) -> Any:
        if not conn.close_for(reason):
            raise HttpError(409, f"connection {conn.id} cannot be closed from here (its session registered no way to)", "not_closable")
        log.info("connection {id} ({client}) closed by an administrator: {reason}", id=conn.id, client=conn.client_id or "-", reason=reason)
        return json_body(200, {"closed": conn.id, "reason": reason})
