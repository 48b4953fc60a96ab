"""Operators' actions on what clients leave behind: durable subscriptions, MQTT sessions, retained messages.

A durable subscription or an MQTT session is ended only while its client is
away (409 otherwise, as ActiveMQ refuses to destroy an active durable
subscriber): cutting a connected client's subscription from under it would
leave its session acknowledging deliveries that no longer exist.  Both need
``admin`` on ``broker://sessions``; retained messages need ``admin`` on
their topic.  Every answer is given once the change is on disk.
"""
from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.destination import name_of
from core.errors import BrokerError
from core.message import Message
from gateway.admin.actions import Audit, canonical
from gateway.admin.http import (
    Answer,
    HttpError,
    Router,
    grant_of,
    int_query,
    json_body,
    permitted,
    query,
    require,
)
from protocols.mqtt.names import (
    InvalidTopic,
    canonical_to_topic,
    filter_to_canonical,
    topic_to_canonical,
)

SESSIONS = "broker://sessions"
DEFAULT_PAGE = 100
MAX_PAGE = 1000


class SessionActions:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.audit = audit

    def install(self, router: Router) -> None:
        router.add("/api/v1/durable-subscriptions/{client_id}/{name}", delete=self.delete_durable)
        router.add("/api/v1/durable-subscriptions/{key}", delete=self.delete_durable_key)
        router.add("/api/v1/mqtt-sessions/{client_id}", delete=self.delete_mqtt_session)
        router.add("/api/v1/retained", get=self.retained)
        # The topic may hold "/" (MQTT form), encoded or not: the rest of the path.
        router.add("/api/v1/retained/(?P<topic>.+)", delete=self.clear_retained)

    def _durably(self, request: server.Request, action: str, answer: Answer, **fields: Any) -> defer.Deferred[Answer]:
        """Answer once the change is on disk; note it in the audit log."""
        grant = grant_of(request)
        user = grant.principal.name if grant is not None else None
        if self.audit is not None:
            self.audit("admin_action", user=user, action=action, **fields)
        done: defer.Deferred[Answer] = defer.Deferred()
        self.broker.when_durable(lambda: done.callback(answer))
        return done

    def delete_durable(self, request: server.Request, client_id: str, name: str) -> Any:
        """STOMP's durable subscription ``client-id`` + ``activemq.subscriptionName``."""
        return self._delete_durable(request, f"{client_id}:{name}")

    def delete_durable_key(self, request: server.Request, key: str) -> Any:
        """The same by the key the listing shows (``CLIENT:NAME``)."""
        return self._delete_durable(request, key)

    def _delete_durable(self, request: server.Request, key: str) -> Any:
        require(request, Permission.ADMIN, SESSIONS)
        sub = self.broker.durable(key)
        if sub is None or "\x1f" in key:  # an MQTT session's filter: /api/v1/mqtt-sessions ends those
            raise HttpError(404, f"no durable subscription {key!r} (client-id:subscription-name)", "unknown_subscription")
        if sub.queue.consumers:
            raise HttpError(409, f"durable subscription {key!r} is active (its subscriber is connected); "
                                 "it can be deleted once the subscriber has left", "subscription_active",
                            destination=sub.destination)
        held = len(sub.queue)
        self.broker.remove_durable(key)
        answer = json_body(200, {"key": key, "destination": sub.destination, "dropped": held})
        return self._durably(request, "delete_durable_subscription", answer, key=key, dropped=held)

    def delete_mqtt_session(self, request: server.Request, client_id: str) -> Any:
        require(request, Permission.ADMIN, SESSIONS)
        keeper = self.broker.sessions.get("mqtt")
        if keeper is not None and keeper.session_live(client_id):
            raise HttpError(409, f"MQTT client {client_id!r} is connected; its session can be ended once it has left",
                            "session_connected", client_id=client_id)
        if keeper is None or not keeper.end_session(client_id):
            raise HttpError(404, f"no kept MQTT session of client {client_id!r}", "unknown_session", client_id=client_id)
        return self._durably(request, "delete_mqtt_session", (204, {}, b""), client_id=client_id)

    def retained(self, request: server.Request) -> Answer:
        """Retained topics (names and sizes, never the messages) a filter matches, a page at a time, by name."""
        text = query(request, "filter") or "#"
        if text.startswith("topic://"):
            full = text
            try:
                self.broker.check_name(full, allow_wildcards=True)
            except BrokerError as exc:
                raise HttpError(400, f"parameter filter: {exc}") from None
        else:
            try:
                full = filter_to_canonical(text)
            except InvalidTopic as exc:
                raise HttpError(400, f"parameter filter: {exc}") from None
        page = int_query(request, "page", 1, low=1)
        per_page = int_query(request, "page_size", DEFAULT_PAGE, low=1, high=MAX_PAGE)
        found = [(name, size) for name, size in self.broker.retained.topics(full)
                 if permitted(request, Permission.ADMIN, f"topic://{name}")]
        shown = found[(page - 1) * per_page:page * per_page]
        return json_body(200, {
            "filter": full, "total": len(found), "page": page, "page_size": per_page,
            "pages": (len(found) + per_page - 1) // per_page,
            "topics": [
                {"destination": f"topic://{name}", "topic": canonical_to_topic(f"topic://{name}"), "bytes": size}
                for name, size in shown
            ],
        })

    def clear_retained(self, request: server.Request, topic: str) -> Any:
        """The topic in MQTT form (``sensors/room1``) or canonical (``topic://sensors.room1``)."""
        if topic.startswith("topic://"):
            full = canonical("topic", topic, self.broker)
        else:
            if "+" in topic.split("/") or "#" in topic.split("/"):
                raise HttpError(400, f"{topic!r} is a filter; name one topic")
            try:
                full = canonical("topic", topic_to_canonical(topic), self.broker)
            except InvalidTopic as exc:
                raise HttpError(400, str(exc)) from None
        require(request, Permission.ADMIN, full)
        broker = self.broker
        if not broker.retained.holds(name_of(full)):
            raise HttpError(404, f"no retained message on {full}", "unknown_retained", destination=full)
        broker.retain(Message(broker.new_message_id(), full, b"", timestamp=broker.now_ms()))  # empty: cleared (MQTT)
        return self._durably(request, "clear_retained", (204, {}, b""), destination=full)
