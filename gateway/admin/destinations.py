"""Read-only views of destinations for operators: queues, topics, durable subscriptions, MQTT sessions.

Everything is read from the broker's live state at request time, on the
reactor thread, and nothing on the message path is counted for it beyond the
per-queue integers the core keeps anyway (enqueued, dequeued, expired, dead
lettered).  Producers are not listed: STOMP and MQTT clients never declare
one, and tracking every (connection, destination) pair a client ever sent to
would cost a set insertion per message.

Names in URLs are plain names (``/api/v1/queues/orders``, URL-encoded); a
canonical name (``queue://orders``) is accepted too.  Answers carry the
canonical ``destination``.  Each destination needs ``admin`` on its
canonical name once users are configured; lists show only what the caller may
administer, and a refusal says nothing of whether the destination exists.
MQTT sessions are client state, not a destination: ``admin`` on
``broker://sessions`` (as for ending one, gateway/admin/session_actions.py).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.connection import Connection
from core.queue import MessageQueue
from core.storage import STATE_KIND, QueueStorage
from core.topic import Subscription
from gateway.admin.http import HttpError, Router, json_body, permitted, require
from gateway.admin.listing import page_request, paged
from persistence.store import StoreError

QUEUE_PREFIX = "queue://"
TOPIC_PREFIX = "topic://"
# How the MQTT protocol names a persistent session's queue and state (protocols/mqtt/hub.py queue_key).
MQTT_SESSION_PREFIX = "mqtt:"


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC, as people and JavaScript's Date read them."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def oldest_timestamp(queue: MessageQueue) -> int | None:
    """The broker timestamp of the oldest message waiting in the queue, O(priorities).

    The head of each priority level is its oldest entry (redeliveries go back
    to the front); entries paged out to the store are newer than those in
    memory, so the store is read (one entry) only when memory holds none.
    """
    oldest: int | None = None
    for level in queue.pending.levels:
        if level:
            ts = level[0].message.timestamp
            if ts and (oldest is None or ts < oldest):
                oldest = ts
    if oldest is None and queue.paged and queue.storage is not None:
        try:
            for _, message in queue.storage.page(queue.page_from):
                return message.timestamp or None
        except StoreError:  # a store closing under a request: no age rather than an error
            return None
    return oldest


def queue_figures(queue: MessageQueue, now_ms: int) -> dict[str, Any]:
    """What operators ask of a queue first; O(consumers) for the unacknowledged count."""
    ready = queue.pending.size + queue.paged
    unacked = queue.inflight
    oldest = oldest_timestamp(queue)
    storage = queue.storage
    return {
        "messages": ready + unacked,
        "ready": ready,
        "unacknowledged": unacked,
        "consumers": len(queue.consumers),
        "enqueued": queue.enqueued,
        "dequeued": queue.dequeued,
        "expired": queue.expired,
        "dead_lettered": queue.dead_lettered,
        "oldest_message_age_ms": None if oldest is None else max(0, now_ms - oldest),
        "memory_bytes": queue.pending.bytes,
        "paged": queue.paged,
        # The core's estimate of its persistent messages in the store (as the store limit counts them).
        "store_bytes": storage.bytes if isinstance(storage, QueueStorage) else None,
    }


# queue_figures of a queue that does not exist yet (same keys, so a listing has one shape).
NO_QUEUE_FIGURES: dict[str, Any] = {
    "messages": 0, "ready": 0, "unacknowledged": 0, "consumers": 0, "enqueued": 0, "dequeued": 0, "expired": 0,
    "dead_lettered": 0, "oldest_message_age_ms": None, "memory_bytes": 0, "paged": 0, "store_bytes": None,
}


def queue_name(name: str) -> str:
    return name if name.startswith(QUEUE_PREFIX) else QUEUE_PREFIX + name


def topic_name(name: str) -> str:
    return name if name.startswith(TOPIC_PREFIX) else TOPIC_PREFIX + name


def plain(destination: str) -> str:
    return destination.split("://", 1)[1]


def subscription_kind(sub: Subscription) -> str:
    """What made a subscription, from its queue's name (the core names them by kind)."""
    name = sub.queue.name
    if name.startswith("shared://"):
        return "shared"
    if name.startswith(("mqtt://", "durable://" + MQTT_SESSION_PREFIX)):
        return "mqtt"
    if sub.durable_key is not None:
        return "durable"
    return "subscription"


def describe_subscription(sub: Subscription) -> dict[str, Any]:
    queue = sub.queue
    ready = queue.pending.size + queue.paged
    unacked = queue.inflight
    return {
        "destination": sub.destination,
        "kind": subscription_kind(sub),
        "durable_key": sub.durable_key,
        "client_id": sub.owner_id,
        "queue": queue.name,
        "selector": getattr(sub.selector, "text", None),
        "no_local": sub.no_local,
        "consumers": len(queue.consumers),
        "messages": ready + unacked,
        "ready": ready,
        "unacknowledged": unacked,
        "enqueued": queue.enqueued,
        "dequeued": queue.dequeued,
    }


class SubscriptionIndex:
    """Topic subscriptions by the queue they feed, built once per request (O(subscriptions)).

    MQTT sessions and shared subscriptions feed queues the core does not map
    back to their filters; one walk of the topic trie answers that for a whole page.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._by_queue: dict[int, list[Subscription]] | None = None

    def of(self, queue: MessageQueue) -> list[Subscription]:
        if self._by_queue is None:
            index: dict[int, list[Subscription]] = {}
            for sub in self.broker.topics.trie:
                index.setdefault(id(sub.queue), []).append(sub)
            self._by_queue = index
        return self._by_queue.get(id(queue), [])


class DestinationsAPI:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def install(self, router: Router) -> None:
        router.add("/api/v1/queues", get=self.queues)
        router.add("/api/v1/queues/{name}", get=self.queue)
        router.add("/api/v1/topics", get=self.topics)
        router.add("/api/v1/topics/{name}", get=self.topic)
        router.add("/api/v1/durable-subscriptions", get=self.durables)
        router.add("/api/v1/durable-subscriptions/{key}", get=self.durable)
        router.add("/api/v1/mqtt-sessions", get=self.mqtt_sessions)
        router.add("/api/v1/mqtt-sessions/{client_id}", get=self.mqtt_session)

    # -- queues -------------------------------------------------------------

    def _describe_queue(self, queue: MessageQueue, now: int) -> dict[str, Any]:
        return {
            "name": plain(queue.name), "destination": queue.name,
            "dead_letter_queue": self.broker.is_dead_letter_queue(queue.name),
            **queue_figures(queue, now),
        }

    def queues(self, request: server.Request) -> Any:
        sorts = {
            "name": lambda q: q.name,
            "messages": lambda q: len(q) + q.inflight,
            "ready": len,
            "unacknowledged": lambda q: q.inflight,
            "consumers": lambda q: len(q.consumers),
            "enqueued": lambda q: q.enqueued,
            "dequeued": lambda q: q.dequeued,
        }
        page = page_request(request, sorts, "name")
        now = self.broker.now_ms()
        visible = [
            q for name, q in self.broker.queues.items()
            if name.startswith(QUEUE_PREFIX) and permitted(request, Permission.ADMIN, name)
        ]
        return json_body(200, paged(
            page, visible, text=lambda q: q.name[len(QUEUE_PREFIX):], sorts=sorts,
            describe=lambda q: self._describe_queue(q, now), name="queues",
        ))

    def queue(self, request: server.Request, name: str) -> Any:
        destination = queue_name(name)
        require(request, Permission.ADMIN, destination)
        queue = self.broker.queues.get(destination)
        if queue is None:
            raise HttpError(404, f"no queue {destination}", "unknown_queue")
        now = self.broker.now_ms()
        answer = self._describe_queue(queue, now)
        answer["consumer_list"] = [
            {
                "id": c.id, "connection": getattr(c.owner, "id", None),
                "client_id": getattr(c.owner, "client_id", None),
                "ack_mode": c.ack_mode.value, "prefetch": c.prefetch, "unacknowledged": c.held(),
                "selector": getattr(c.selector, "text", None), "exclusive": c.exclusive,
            }
            for c in queue.consumers
        ]
        answer["streams"] = [
            f"/api/v1/streams/{s.name}" for s in self.broker.streams.streams.values() if s.matches(destination)
        ]
        return json_body(200, answer)

    # -- topics -------------------------------------------------------------

    def _topic_subscriptions(self, request: server.Request) -> dict[str, list[Subscription]]:
        by_destination: dict[str, list[Subscription]] = {}
        for sub in self.broker.topics.trie:
            by_destination.setdefault(sub.destination, []).append(sub)
        return {d: subs for d, subs in by_destination.items() if permitted(request, Permission.ADMIN, d)}

    @staticmethod
    def _describe_topic(destination: str, subs: list[Subscription]) -> dict[str, Any]:
        return {
            "name": plain(destination), "destination": destination,
            "subscriptions": len(subs),
            "durable": sum(1 for s in subs if s.durable_key is not None),
            "consumers": sum(len(s.queue.consumers) for s in subs),
            "messages": sum(len(s.queue) + s.queue.inflight for s in subs),
            # Messages these subscriptions were given (publishes to the topic are not counted per topic).
            "enqueued": sum(s.queue.enqueued for s in subs),
        }

    def topics(self, request: server.Request) -> Any:
        """Topics that have subscriptions (wildcard filters are listed as they were subscribed)."""
        sorts = {
            "name": lambda item: item[0],
            "subscriptions": lambda item: len(item[1]),
            "consumers": lambda item: sum(len(s.queue.consumers) for s in item[1]),
            "messages": lambda item: sum(len(s.queue) + s.queue.inflight for s in item[1]),
            "enqueued": lambda item: sum(s.queue.enqueued for s in item[1]),
        }
        page = page_request(request, sorts, "name")
        items = list(self._topic_subscriptions(request).items())
        return json_body(200, paged(
            page, items, text=lambda item: plain(item[0]), sorts=sorts,
            describe=lambda item: self._describe_topic(*item), name="topics",
        ))

    def topic(self, request: server.Request, name: str) -> Any:
        """A topic's subscriptions: for a plain name every one a publish there reaches, wildcards included;
        for a filter (``sensors.>``) the subscriptions made with exactly that filter."""
        destination = topic_name(name)
        require(request, Permission.ADMIN, destination)
        levels = tuple(plain(destination).split("."))
        if "*" in levels or ">" in levels:
            subs = [s for s in self.broker.topics.trie if s.destination == destination]
        else:
            subs = self.broker.topics.match(levels)
        first = levels[0]
        retained = plain(destination) in self.broker.retained.index.get(first, {})
        if not subs and not retained:
            raise HttpError(404, f"no subscription or retained message on {destination}", "unknown_topic")
        answer = self._describe_topic(destination, subs)
        answer["retained"] = retained
        answer["subscription_list"] = [describe_subscription(s) for s in subs]
        return json_body(200, answer)

    # -- durable subscriptions ----------------------------------------------

    def _describe_durable(self, key: str, sub: Subscription) -> dict[str, Any]:
        answer = describe_subscription(sub)
        if subscription_kind(sub) == "mqtt":
            client, _, name = key.partition("\x1f")
            client = client.removeprefix(MQTT_SESSION_PREFIX)
        else:
            client, _, name = key.partition(":")
        answer.update(key=key, client_id=client, name=name, active=bool(sub.queue.consumers), user=getattr(sub, "user", None))
        answer.update(queue_figures(sub.queue, self.broker.now_ms()))
        return answer

    def durables(self, request: server.Request) -> Any:
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
            describe=lambda item: self._describe_durable(*item), name="durable_subscriptions",
        ))

    def durable(self, request: server.Request, key: str) -> Any:
        sub = self.broker.durables.get(key)
        # Who may see it depends on its destination: unknown keys are refused alike for the unprivileged.
        require(request, Permission.ADMIN, sub.destination if sub is not None else "broker://sessions")
        if sub is None:
            raise HttpError(404, f"no durable subscription {key!r}", "unknown_subscription")
        return json_body(200, self._describe_durable(key, sub))

    # -- MQTT sessions ------------------------------------------------------

    def _mqtt_clients(self) -> tuple[dict[str, tuple[MessageQueue | None, bool]], dict[str, Connection]]:
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

    def _describe_session(
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

    def mqtt_sessions(self, request: server.Request) -> Any:
        require(request, Permission.ADMIN, "broker://sessions")
        sorts = {
            "client_id": lambda item: item[0],
            "messages": lambda item: (len(item[1][0]) + item[1][0].inflight) if item[1][0] is not None else 0,
        }
        page = page_request(request, sorts, "client_id")
        index = SubscriptionIndex(self.broker)
        clients, live = self._mqtt_clients()
        items: Iterable[tuple[str, tuple[MessageQueue | None, bool]]] = clients.items()
        return json_body(200, paged(
            page, items, text=lambda item: item[0], sorts=sorts,
            describe=lambda item: self._describe_session(item[0], *item[1], live.get(item[0]), index),
            name="mqtt_sessions",
        ))

    def mqtt_session(self, request: server.Request, client_id: str) -> Any:
        require(request, Permission.ADMIN, "broker://sessions")
        clients, live = self._mqtt_clients()
        found = clients.get(client_id)
        if found is None:
            raise HttpError(404, f"no MQTT session of client {client_id!r}", "unknown_session")
        return json_body(200, self._describe_session(client_id, *found, live.get(client_id), SubscriptionIndex(self.broker)))
