"""``/api/v1/mqtt-sessions``: MQTT clients' sessions, connected or kept for their return.

A persistent session (clean session false, or a session expiry) is listed
whether its client is connected or not, with what waits for it and when it
left; a clean session only while its client is connected.  Sessions are
client state, not a destination: every route needs ``admin`` on
``broker://sessions``.  A kept session is ended only while its client is
away (409 otherwise), as a durable subscription is
(gateway/admin/subscriptions.py); the answer comes once that is on disk.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.connection import Connection
from core.queue import MessageQueue
from core.storage import STATE_KIND
from gateway.admin.changes import Audit, Changes
from gateway.admin.descriptions import NO_QUEUE_FIGURES, SubscriptionIndex, iso_ms, queue_figures
from gateway.admin.http import HttpError, Router, json_body, require
from gateway.admin.listing import page_request, paged
from gateway.admin.names import MQTT_SESSION_PREFIX, SESSIONS


class MqttSessionsAPI:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.changes = Changes(broker, audit)

    def install(self, router: Router) -> None:
        router.add("/api/v1/mqtt-sessions", get=self.list)
        router.add("/api/v1/mqtt-sessions/{client_id}", get=self.describe, delete=self.delete)

    def _clients(self) -> tuple[dict[str, tuple[MessageQueue | None, bool]], dict[str, Connection]]:
        """client id -> (its session queue, persistent) for persistent sessions, connected or not, and
        the connected clients of clean sessions; and client id -> its MQTT connection.  O(sessions + connections)."""
        clients: dict[str, tuple[MessageQueue | None, bool]] = {}
        live: dict[str, Connection] = {}
        for key, queue in self.broker.durable_queues.items():
            if key.startswith(MQTT_SESSION_PREFIX):
                clients[key[len(MQTT_SESSION_PREFIX):]] = (queue, True)
        for conn in self.broker.connections.values():
            client_id = conn.client_id
            if not client_id or not conn.protocol.startswith("mqtt") or conn.closed:
                continue
            live[client_id] = conn  # the newest, after a take-over
            if client_id not in clients:
                # A clean session has its own queue only once it has subscribed.
                own = f"mqtt://{client_id}"
                mine = next((c.queue for c in conn.consumers.values() if c.queue.name == own), None)
                clients[client_id] = (mine, False)
        return clients, live

    def _describe(
        self, client_id: str, queue: MessageQueue | None, persistent: bool, conn: Connection | None,
        index: SubscriptionIndex,
    ) -> dict[str, Any]:
        broker = self.broker
        answer: dict[str, Any] = {
            "client_id": client_id, "persistent": persistent, "connected": conn is not None,
            "connection": conn.id if conn is not None else None,
            "user": conn.user if conn is not None else None,
            "subscriptions": sorted({s.destination for s in index.of(queue)}) if queue is not None else [],
        }
        if queue is not None:
            answer.update(queue_figures(queue, broker.now_ms()))
        else:  # a clean session that has not subscribed yet has no queue: nothing waits for it
            answer.update(NO_QUEUE_FIGURES)
        if persistent:
            raw = broker.store.get_record(STATE_KIND, MQTT_SESSION_PREFIX + client_id)
            state: dict[str, Any] = {}
            if raw is not None:
                try:
                    state = json.loads(raw)
                except ValueError:
                    state = {}
            left_at = state.get("left_at") or 0
            answer["expiry_interval"] = state.get("expiry")
            if answer["user"] is None:
                answer["user"] = state.get("user")
            answer["disconnected_at"] = iso_ms(left_at) if left_at and conn is None else None
        return answer

    def list(self, request: server.Request) -> Any:
        require(request, Permission.ADMIN, SESSIONS)
        sorts = {
            "client_id": lambda item: item[0],
            "messages": lambda item: (len(item[1][0]) + item[1][0].inflight) if item[1][0] is not None else 0,
        }
        page = page_request(request, sorts, "client_id")
        index = SubscriptionIndex(self.broker)
        clients, live = self._clients()
        items: Iterable[tuple[str, tuple[MessageQueue | None, bool]]] = clients.items()
        return json_body(200, paged(
            page, items, text=lambda item: item[0], sorts=sorts,
            describe=lambda item: self._describe(item[0], *item[1], live.get(item[0]), index),
            name="mqtt_sessions",
        ))

    def describe(self, request: server.Request, client_id: str) -> Any:
        require(request, Permission.ADMIN, SESSIONS)
        clients, live = self._clients()
        found = clients.get(client_id)
        if found is None:
            raise HttpError(404, f"no MQTT session of client {client_id!r}", "unknown_session")
        return json_body(200, self._describe(client_id, *found, live.get(client_id), SubscriptionIndex(self.broker)))

    def delete(self, request: server.Request, client_id: str) -> Any:
        """End a kept session: its subscriptions and whatever waits for it go."""
        require(request, Permission.ADMIN, SESSIONS)
        keeper = self.broker.sessions.get("mqtt")
        if keeper is not None and keeper.session_live(client_id):
            raise HttpError(409, f"MQTT client {client_id!r} is connected; its session can be ended once it has left",
                            "session_connected", client_id=client_id)
        if keeper is None or not keeper.end_session(client_id):
            raise HttpError(404, f"no kept MQTT session of client {client_id!r}", "unknown_session", client_id=client_id)
        self.changes.audited(request, "delete_mqtt_session", client_id=client_id)
        return self.changes.durably((204, {}, b""))
