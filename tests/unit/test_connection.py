"""What a connection asks of the broker, through the broker's own methods (core.connection.Host)."""
from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from core.broker import Broker
from core.consumer import AckMode
from core.errors import UnknownDestination
from core.message import Message
from core.policy import Policy
from core.stream_config import UnknownStream
from core.sysinfo import SysPublisher
from persistence.memory import MemoryStore


def make(store=None):
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(store or MemoryStore(), clock, Policy())
    broker.start()
    return broker


def msg(broker, dest, body, **kw):
    return Message(broker.new_message_id(), dest, body.encode(), timestamp=broker.now_ms(), **kw)


def test_client_connected_while_open_and_not_after_close():
    broker = make()
    assert not broker.client_connected("app")
    conn = broker.connect("app", protocol="stomp/1.2")
    assert broker.client_connected("app")
    assert not broker.client_connected("other")
    conn.close()
    assert not broker.client_connected("app")
    conn.close()  # a second close changes nothing
    assert not broker.client_connected("app")
    assert broker.connection_count() == 0


def test_client_connected_holds_while_any_connection_of_that_id_is_open():
    # MQTT's session take-over: the new connection registers before the old one closes.
    broker = make()
    old = broker.connect("device-1", protocol="mqtt/5")
    new = broker.connect("device-1", protocol="mqtt/5")
    old.close()
    assert broker.client_connected("device-1")
    new.close()
    assert not broker.client_connected("device-1")


def test_connections_without_client_id_are_counted_not_indexed():
    broker = make()
    a, b = broker.connect(), broker.connect("named")
    assert broker.connection_count() == 2
    figures = SysPublisher(broker, 0, "test").figures()
    assert figures["$SYS.broker.clients.connected"] == "2"
    assert (figures["$SYS.broker.queues.count"], figures["$SYS.broker.queues.messages"]) == ("0", "0")
    a.close()
    assert broker.connection_count() == 1
    b.close()
    assert broker.connection_count() == 0


def test_temp_queue_owner_until_the_owner_leaves():
    broker = make()
    owner, other = broker.connect(), broker.connect()
    name = owner.temp_queue("replies")
    assert broker.temp_queue_owner(name) == owner.id
    other.send(msg(broker, name, "for the owner"))
    owner.close()
    assert broker.temp_queue_owner(name) is None
    with pytest.raises(UnknownDestination):
        other.send(msg(broker, name, "too late"))


def test_durable_lookup_follows_subscribe_and_remove():
    broker = make()
    conn = broker.connect("app")
    consumer = conn.subscribe("topic://t", lambda c, e, t: None, durable_name="d")
    sub = broker.durable("app:d")
    assert sub is not None and sub.destination == "topic://t" and sub.owner_id == "app"
    assert broker.subscription_count() == 1
    conn.unsubscribe(consumer)
    assert broker.durable("app:d") is sub  # still there while away
    assert conn.remove_durable("d")
    assert broker.durable("app:d") is None
    assert broker.subscription_count() == 0


def test_plain_topic_subscription_is_added_and_removed_through_the_broker():
    broker = make()
    conn = broker.connect()
    got = []
    consumer = conn.subscribe("topic://a.*", lambda c, e, t: got.append(e.message.body))
    assert broker.subscription_count() == 1
    conn.send(msg(broker, "topic://a.b", "one"))
    conn.unsubscribe(consumer)
    assert broker.subscription_count() == 0
    conn.send(msg(broker, "topic://a.b", "two"))
    assert got == [b"one"]


def test_unknown_stream_without_streams():
    broker = make()
    with pytest.raises(UnknownStream):
        broker.stream("nope")


def test_messages_sent_counts_every_delivery_and_the_mark_only_stored_ones():
    store = MemoryStore()
    broker = make(store)
    conn = broker.connect()
    got = []
    consumer = conn.subscribe(
        "queue://q", lambda c, e, t: got.append(t), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1,
    )
    queue = consumer.queue
    conn.send(msg(broker, "queue://q", "direct", persistent=True))   # straight to the consumer
    conn.send(msg(broker, "queue://q", "waits", persistent=False))   # no credit: pending
    conn.send(msg(broker, "queue://q", "waits too", persistent=True))
    assert broker.messages_sent == 1
    first_mark = queue.delivered_mark
    assert first_mark > 0
    conn.ack(consumer, got[-1])  # the non-persistent one goes out: no mark for it
    assert broker.messages_sent == 2 and queue.delivered_mark == first_mark
    conn.ack(consumer, got[-1])
    assert broker.messages_sent == 3 and queue.delivered_mark > first_mark
