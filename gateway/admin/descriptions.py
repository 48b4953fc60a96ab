"""How the admin API describes what holds messages: a queue's figures, a subscription, a time.

Queues, topics, durable subscriptions, MQTT sessions, connections and
/metrics describe the same queues; the figures come from here so that they
agree.  Everything is read from the broker's live state at request time, on
the reactor thread, and nothing on the message path is counted for it beyond
the per-queue integers the core keeps anyway (enqueued, dequeued, expired,
dead lettered).
"""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core.broker import Broker
from core.queue import MessageQueue
from core.storage import QueueStorage
from core.topic import Subscription
from gateway.admin.names import MQTT_SESSION_PREFIX
from persistence.store import StoreError


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
