"""How the admin API describes queues and subscriptions (gateway/admin/descriptions.py), on a broker without sockets."""
from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock

from core.broker import Broker
from core.message import Message
from gateway.admin.descriptions import (
    NO_QUEUE_FIGURES,
    SubscriptionIndex,
    describe_subscription,
    iso_ms,
    oldest_timestamp,
    queue_figures,
    subscription_kind,
)
from persistence.memory import MemoryStore


def make():
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(MemoryStore(), clock)
    broker.start()
    return broker, clock


def send(broker, conn, destination, **fields):
    conn.send(Message(broker.new_message_id(), destination, b"x", {}, timestamp=broker.now_ms(), **fields))


def test_times_are_iso_8601_utc_in_milliseconds():
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


def test_a_queues_figures_and_its_oldest_message():
    broker, clock = make()
    producer = broker.connect("p", protocol="stomp/1.2")
    queue = broker.queue("queue://q")
    assert oldest_timestamp(queue) is None
    assert set(queue_figures(queue, broker.now_ms())) == set(NO_QUEUE_FIGURES)  # one shape, queue or none
    send(broker, producer, "queue://q", priority=4)
    clock.advance(0.005)
    send(broker, producer, "queue://q", priority=9)  # delivered first, but not the oldest
    clock.advance(0.010)
    assert oldest_timestamp(queue) == broker.now_ms() - 15
    figures = queue_figures(queue, broker.now_ms())
    assert (figures["messages"], figures["ready"], figures["unacknowledged"], figures["consumers"]) == (2, 2, 0, 0)
    assert figures["enqueued"] == 2 and figures["oldest_message_age_ms"] == 15 and figures["memory_bytes"] > 0


def test_subscriptions_by_kind_and_by_the_queue_they_feed():
    broker, _ = make()
    plain = broker.connect("c1", protocol="stomp/1.2")
    plain.subscribe("topic://news.>", lambda *_: None)
    keeper = broker.connect("keeper", protocol="stomp/1.2")
    keeper.subscribe("topic://news.eu", lambda *_: None, durable_name="eu")
    [durable] = broker.durables.values()
    assert subscription_kind(durable) == "durable"
    view = describe_subscription(durable)
    assert (view["destination"], view["kind"], view["client_id"], view["consumers"]) == ("topic://news.eu", "durable", "keeper", 1)
    index = SubscriptionIndex(broker)
    assert [s.destination for s in index.of(durable.queue)] == ["topic://news.eu"]
    subs = {s.destination: s for s in broker.topics.trie}
    assert subscription_kind(subs["topic://news.>"]) == "subscription"
    assert index.of(broker.queue("queue://unrelated")) == []


def test_kinds_the_protocols_make_are_told_by_their_queues_names():
    def sub(queue_name, durable_key=None):
        return SimpleNamespace(queue=SimpleNamespace(name=queue_name), durable_key=durable_key)

    assert subscription_kind(sub("shared://group/a.b")) == "shared"
    assert subscription_kind(sub("mqtt://device-1")) == "mqtt"  # a clean MQTT session
    assert subscription_kind(sub("durable://mqtt:device-2", "mqtt:device-2\x1fa.b")) == "mqtt"  # a persistent one
