"""``/api/v1/topics``: topics as their subscriptions make them, and a message sent to one.

A topic holds nothing of its own: what exists is subscriptions (plain,
durable, MQTT sessions', shared groups') and, for MQTT, a retained message.
So the list is the topics that have subscriptions, wildcard filters listed as
they were subscribed, and a topic's view is what a publish there would reach.
Names in paths are plain (``/api/v1/topics/sensors.room1``, URL-encoded) or
canonical; everything needs ``admin`` on the topic once users are configured.
"""
from __future__ import annotations

from typing import Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.topic import Subscription
from gateway.admin import message_json
from gateway.admin.changes import Audit, Changes
from gateway.admin.descriptions import describe_subscription
from gateway.admin.http import HttpError, Router, json_body, permitted, require
from gateway.admin.listing import page_request, paged
from gateway.admin.names import canonical, plain, topic_name
from gateway.admin.publish import PublishAPI


class TopicsAPI:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.publisher = PublishAPI(broker)
        self.changes = Changes(broker, audit)

    def install(self, router: Router) -> None:
        router.add("/api/v1/topics", get=self.list)
        router.add("/api/v1/topics/{name}", get=self.describe)
        router.add("/api/v1/topics/{name}/messages", post=self.send)

    def _subscriptions(self, request: server.Request) -> dict[str, list[Subscription]]:
        """Subscriptions by the topic (or filter) they were made on, those the caller may administer."""
        by_destination: dict[str, list[Subscription]] = {}
        for sub in self.broker.topics.trie:
            by_destination.setdefault(sub.destination, []).append(sub)
        return {d: subs for d, subs in by_destination.items() if permitted(request, Permission.ADMIN, d)}

    @staticmethod
    def _describe(destination: str, subs: list[Subscription]) -> dict[str, Any]:
        return {
            "name": plain(destination), "destination": destination,
            "subscriptions": len(subs),
            "durable": sum(1 for s in subs if s.durable_key is not None),
            "consumers": sum(len(s.queue.consumers) for s in subs),
            "messages": sum(len(s.queue) + s.queue.inflight for s in subs),
            # Messages these subscriptions were given (publishes to the topic are not counted per topic).
            "enqueued": sum(s.queue.enqueued for s in subs),
        }

    def list(self, request: server.Request) -> Any:
        """Topics that have subscriptions (wildcard filters are listed as they were subscribed)."""
        sorts = {
            "name": lambda item: item[0],
            "subscriptions": lambda item: len(item[1]),
            "consumers": lambda item: sum(len(s.queue.consumers) for s in item[1]),
            "messages": lambda item: sum(len(s.queue) + s.queue.inflight for s in item[1]),
            "enqueued": lambda item: sum(s.queue.enqueued for s in item[1]),
        }
        page = page_request(request, sorts, "name")
        items = list(self._subscriptions(request).items())
        return json_body(200, paged(
            page, items, text=lambda item: plain(item[0]), sorts=sorts,
            describe=lambda item: self._describe(*item), name="topics",
        ))

    def describe(self, request: server.Request, name: str) -> Any:
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
        answer = self._describe(destination, subs)
        answer["retained"] = retained
        answer["subscription_list"] = [describe_subscription(s) for s in subs]
        return json_body(200, answer)

    def send(self, request: server.Request, name: str) -> Any:
        """A message to the topic, as to a queue (gateway/admin/message_json.py)."""
        return message_json.send(self.publisher, self.changes, request, canonical("topic", name, self.broker, target=True))
