"""``/api/v1/retained``: MQTT retained messages, listed by topic and cleared one topic at a time.

The list gives names and sizes, never the messages (a retained message may be
large, and reading it is what subscribing does).  A topic is named in MQTT
form (``sensors/room1``, its slashes encoded or not: the rest of the path)
or canonical (``topic://sensors.room1``).  Clearing retains an empty
message, as an MQTT client clears one; the answer comes once that is on
disk.  Each topic needs ``admin`` on it; the list shows only those the
caller may administer.
"""
from __future__ import annotations

from typing import Any

from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.destination import name_of
from core.errors import BrokerError
from core.message import Message
from gateway.admin.changes import Audit, Changes
from gateway.admin.http import Answer, HttpError, Router, int_query, json_body, permitted, query, require
from gateway.admin.names import canonical
from protocols.mqtt.names import InvalidTopic, canonical_to_topic, filter_to_canonical, topic_to_canonical

DEFAULT_PAGE = 100
MAX_PAGE = 1000


class RetainedAPI:
    def __init__(self, broker: Broker, audit: Audit | None = None) -> None:
        self.broker = broker
        self.changes = Changes(broker, audit)

    def install(self, router: Router) -> None:
        router.add("/api/v1/retained", get=self.list)
        router.add("/api/v1/retained/{topic:path}", delete=self.clear)

    def list(self, request: server.Request) -> Answer:
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

    def clear(self, request: server.Request, topic: str) -> Any:
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
        self.changes.audited(request, "clear_retained", destination=full)
        return self.changes.durably((204, {}, b""))
