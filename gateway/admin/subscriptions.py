"""``/api/v1/durable-subscriptions``: subscriptions that keep receiving while their client is away.

STOMP's durable subscriptions (``client-id`` + ``activemq.subscriptionName``,
keyed ``CLIENT:NAME``) and the filters of MQTT persistent sessions (keyed by
the session, gateway/admin/sessions.py) are listed together, as what holds
messages for absent clients.  Seeing one needs ``admin`` on its topic; ending
one needs ``admin`` on ``broker://sessions``, and only while its client is
away (409 otherwise, as ActiveMQ refuses to destroy an active durable
subscriber): cutting a connected client's subscription from under it would
leave its session acknowledging deliveries that no longer exist.  An MQTT
session's filters are ended with the session, not here.
"""
from __future__ import annotations

from typing import Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.topic import Subscription
from gateway.admin.changes import Audit, Changes
from gateway.admin.descriptions import describe_subscription, queue_figures, subscription_kind
from gateway.admin.http import HttpError, Router, json_body, permitted, require
from gateway.admin.listing import page_request, paged
from gateway.admin.names import MQTT_SESSION_PREFIX, SESSIONS


class DurableSubscriptionsAPI:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.changes = Changes(broker, audit)

    def install(self, router: Router) -> None:
        router.add("/api/v1/durable-subscriptions", get=self.list)
        router.add("/api/v1/durable-subscriptions/{key}", get=self.describe, delete=self.delete_key)
        router.add("/api/v1/durable-subscriptions/{client_id}/{name}", delete=self.delete)

    def _describe(self, key: str, sub: Subscription) -> dict[str, Any]:
        answer = describe_subscription(sub)
        if subscription_kind(sub) == "mqtt":
            client, _, name = key.partition("\x1f")
            client = client.removeprefix(MQTT_SESSION_PREFIX)
        else:
            client, _, name = key.partition(":")
        answer.update(key=key, client_id=client, name=name, active=bool(sub.queue.consumers), user=getattr(sub, "user", None))
        answer.update(queue_figures(sub.queue, self.broker.now_ms()))
        return answer

    def list(self, request: server.Request) -> Any:
        sorts = {
            "key": lambda item: item[0],
            "destination": lambda item: item[1].destination,
            "messages": lambda item: len(item[1].queue) + item[1].queue.inflight,
            "consumers": lambda item: len(item[1].queue.consumers),
        }
        page = page_request(request, sorts, "key")
        items = [
            (key, sub) for key, sub in self.broker.durables.items()
            if permitted(request, Permission.ADMIN, sub.destination)
        ]
        return json_body(200, paged(
            page, items, text=lambda item: f"{item[0]} {item[1].destination}", sorts=sorts,
            describe=lambda item: self._describe(*item), name="durable_subscriptions",
        ))

    def describe(self, request: server.Request, key: str) -> Any:
        sub = self.broker.durables.get(key)
        # Who may see it depends on its destination: unknown keys are refused alike for the unprivileged.
        require(request, Permission.ADMIN, sub.destination if sub is not None else SESSIONS)
        if sub is None:
            raise HttpError(404, f"no durable subscription {key!r}", "unknown_subscription")
        return json_body(200, self._describe(key, sub))

    def delete(self, request: server.Request, client_id: str, name: str) -> Any:
        """STOMP's durable subscription ``client-id`` + ``activemq.subscriptionName``."""
        return self._delete(request, f"{client_id}:{name}")

    def delete_key(self, request: server.Request, key: str) -> Any:
        """The same by the key the listing shows (``CLIENT:NAME``)."""
        return self._delete(request, key)

    def _delete(self, request: server.Request, key: str) -> Any:
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
        self.changes.audited(request, "delete_durable_subscription", key=key, dropped=held)
        return self.changes.durably(json_body(200, {"key": key, "destination": sub.destination, "dropped": held}))
