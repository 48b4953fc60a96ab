"""ActiveMQ's virtual topics with real clients: stomp.py groups of consumers, paho publishers.

Producers publish to ``/topic/VirtualTopic.orders`` (MQTT ``VirtualTopic/orders``);
each consumer group reads its own queue, ``/queue/Consumer.<group>.VirtualTopic.orders``,
so every group gets every message once, spread over the group's consumers.
"""
from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import (
    BrokerHandle,
    Collector,
    connect,
    disconnect,
    drop,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

TOPIC = "/topic/VirtualTopic.orders"
CANONICAL_TOPIC = "topic://VirtualTopic.orders"


def group_queue(group: str) -> str:
    return f"/queue/Consumer.{group}.VirtualTopic.orders"


_ids = itertools.count(1)


class Worker(Collector):
    """A stomp.py consumer that acks each message as it arrives (unless told to hold them)."""

    def __init__(self, conn: Any, hold: bool = False) -> None:
        super().__init__()
        self.conn = conn
        self.hold = hold

    def on_message(self, frame: Any) -> None:
        super().on_message(frame)
        if not self.hold:
            self.conn.ack(frame.headers["ack"])


def worker(handle: BrokerHandle, destination: str, prefetch: int = 5, hold: bool = False, client_id: str | None = None) -> tuple[Any, Worker]:
    conn, _ = connect(handle, "1.2", client_id)
    got = Worker(conn, hold)
    conn.set_listener("collector", got)
    conn.subscribe(destination, id=f"w{next(_ids)}", ack="client-individual", headers={"activemq.prefetchSize": str(prefetch)})
    sync(conn, got)  # subscribed before anyone publishes
    return conn, got


@pytest.fixture
def workers(broker: BrokerHandle) -> Iterator[Any]:
    made: list[Any] = []

    def make(destination: str, handle: BrokerHandle | None = None, **kwargs: Any) -> tuple[Any, Worker]:
        conn, got = worker(handle or broker, destination, **kwargs)
        made.append(conn)
        return conn, got

    yield make
    for conn in made:
        disconnect(conn)


def publish(handle: BrokerHandle, bodies: list[str], persistent: bool = False) -> None:
    """Send each body to the virtual topic with a receipt on the last: all routed when it returns."""
    conn, got = connect(handle)
    headers = {"persistent": "true"} if persistent else {}
    for body in bodies:
        conn.send(TOPIC, body, headers=headers)
    sync(conn, got)
    disconnect(conn)


def wait_total(groups: list[list[tuple[Any, Worker]]], count: int, timeout: float = 15.0) -> None:
    """Every group's consumers together have ``count`` messages."""
    wait_until(lambda: all(sum(len(w.messages) for _, w in members) >= count for members in groups), timeout,
               lambda: f"{count} messages in each group, got {[[len(w.messages) for _, w in members] for members in groups]}")


def test_each_group_gets_every_message_once_spread_over_its_consumers(broker, workers):
    group_a = [workers(group_queue("A")) for _ in range(3)]
    group_b = [workers(group_queue("B")) for _ in range(2)]
    topic_conn, topic_got = connect(broker)
    topic_conn.subscribe(TOPIC, id="plain", ack="auto")
    sync(topic_conn, topic_got)
    total = 300
    publish(broker, [str(i) for i in range(total)], persistent=True)

    wait_total([group_a, group_b], total)
    topic_got.wait_for(total)
    for members in (group_a, group_b):
        for _, w in members:
            w.settle(0.2)
        counts = Counter(m.body for _, w in members for m in w.messages)
        assert len(counts) == total and set(counts.values()) == {1}, "a message was lost or given twice in a group"
        assert all(w.messages for _, w in members), [len(w.messages) for _, w in members]
    assert sorted(int(m.body) for m in topic_got.settle()) == list(range(total))  # the topic is still a topic

    (first, *_) = group_a[0][1].messages
    assert first.headers["destination"] == group_queue("A")
    assert first.headers["originalDestination"] == CANONICAL_TOPIC
    assert "redelivered" not in first.headers
    assert broker.queue_depth("queue://Consumer.A.VirtualTopic.orders") == 0
    assert broker.queue_depth("queue://Consumer.B.VirtualTopic.orders") == 0
    disconnect(topic_conn)


def test_a_consumer_leaving_redelivers_its_unacked_messages_to_its_own_group(broker, workers):
    leaver_conn, leaver = workers(group_queue("A"), prefetch=50, hold=True)
    stayer_conn, stayer = workers(group_queue("A"), prefetch=50)
    group_b = [workers(group_queue("B"), prefetch=50) for _ in range(2)]
    publish(broker, [str(i) for i in range(20)], persistent=True)
    wait_total([[(leaver_conn, leaver), (stayer_conn, stayer)], group_b], 20)
    held = sorted(m.body for m in leaver.settle(0.2))
    assert held, "the leaving consumer got nothing to hold"
    b_before = [len(w.messages) for _, w in group_b]

    drop(leaver_conn, leaver)  # a crashed consumer: nothing acked
    wait_until(lambda: len(stayer.messages) >= 20, 10, lambda: f"20 messages for the stayer, got {len(stayer.messages)}")
    again = [m for m in stayer.settle(0.3) if m.headers.get("redelivered") == "true"]
    assert sorted(m.body for m in again) == held
    assert sorted(m.body for m in stayer.messages) == sorted(str(i) for i in range(20))
    assert [len(w.messages) for _, w in group_b] == b_before  # group B is not touched
    assert sorted(m.body for _, w in group_b for m in w.messages) == sorted(str(i) for i in range(20))


@pytest.mark.policy(max_redeliveries=1, individual_dlq=True)
def test_a_message_nacked_past_max_redeliveries_goes_to_the_groups_dead_letter_queue(broker, workers):
    conn, got = connect(broker)
    conn.subscribe(group_queue("A"), id="a", ack="client-individual")
    sync(conn, got)
    _, b = workers(group_queue("B"))
    publish(broker, ["poison"], persistent=True)
    for attempt in range(2):
        message = got.wait_for(attempt + 1)[-1]
        conn.nack(message.headers["ack"])
    conn.subscribe("/queue/DLQ.Consumer.A.VirtualTopic.orders", id="dlq", ack="auto")
    dead = got.wait_for(3)[-1]
    assert dead.body == "poison" and dead.headers["subscription"] == "dlq"
    assert dead.headers["originalDestination"] == "queue://Consumer.A.VirtualTopic.orders"
    assert "dlqDeliveryFailureCause" in dead.headers
    assert [m.body for m in b.settle(0.2)] == ["poison"]  # acked once by group B, never failed there
    assert broker.queue_depth("queue://Consumer.B.VirtualTopic.orders") == 0
    disconnect(conn)


def test_mqtt_publishes_to_the_virtual_topic_reach_every_group(broker, workers):
    group_a = [workers(group_queue("A")) for _ in range(2)]
    group_b = [workers(group_queue("B")) for _ in range(2)]
    sub, sub_got = mqtt_connect(broker, "vt-watcher")
    sub.subscribe("VirtualTopic/#", qos=1)
    sub_got.wait_for(1, what="subacks")
    pub, _ = mqtt_connect(broker, "vt-publisher")
    total = 50
    for i in range(total):
        pub.publish("VirtualTopic/orders", f"m{i}".encode(), qos=1).wait_for_publish(5)

    wait_total([group_a, group_b], total)
    for members in (group_a, group_b):
        counts = Counter(m.body for _, w in members for m in w.settle(0.2))
        assert counts == Counter(f"m{i}" for i in range(total))
        assert all(w.messages for _, w in members)
    seen = sub_got.wait_for(total)  # an MQTT subscriber of the topic still gets it as a topic
    assert {m.topic for m in seen} == {"VirtualTopic/orders"} and len({m.payload for m in seen}) == total
    assert group_a[0][1].messages[0].headers["destination"] == group_queue("A")
    mqtt_close(pub)
    mqtt_close(sub)


def test_a_wildcard_consumer_queue_takes_every_virtual_topic_below_it(broker, workers):
    _, every = workers("/queue/Consumer.W.VirtualTopic.>")
    _, exact = workers(group_queue("A"))
    conn, got = connect(broker)
    conn.send(TOPIC, "order")
    conn.send("/topic/VirtualTopic.refunds", "refund")
    conn.send("/topic/orders", "not virtual")
    sync(conn, got)
    every.wait_for(2)
    assert [(m.body, m.headers["originalDestination"]) for m in every.settle(0.2)] == [
        ("order", CANONICAL_TOPIC), ("refund", "topic://VirtualTopic.refunds"),
    ]
    assert [m.body for m in exact.settle(0.1)] == ["order"]
    disconnect(conn)


@pytest.mark.policy(store_limit=40_000, store_full_policy="fail")
def test_an_absent_groups_backlog_counts_against_the_store_limit(broker):
    conn, _ = worker(broker, group_queue("A"))
    disconnect(conn)  # group A is away: its copies stay in the store
    producer, got = connect(broker)
    for _ in range(60):
        producer.send(TOPIC, "x" * 1000, headers={"persistent": "true"})
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Store limit reached"
    assert 30 <= broker.queue_depth("queue://Consumer.A.VirtualTopic.orders") < 60


# -- groups away, and a broker restart ----------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Any) -> Iterator[Any]:
    live: list[BrokerHandle] = []

    def start() -> BrokerHandle:
        handle = BrokerHandle(make_config(tmp_path))  # RocksDB in <tmp>/data, the same every time
        live.append(handle)
        return handle

    yield start, live
    for handle in live:
        handle.stop()


def test_persistent_messages_wait_in_the_queue_of_an_absent_group_also_across_a_restart(data_dir):
    start, live = data_dir
    h = start()
    # Group A subscribes and goes away; group B drains everything and goes away too.
    for _ in range(2):
        conn, _ = worker(h, group_queue("A"))
        disconnect(conn)
    conn, b = worker(h, group_queue("B"))
    publish(h, ["p1", "p2", "p3"], persistent=True)
    publish(h, ["transient"])
    assert [m.body for m in b.wait_for(4)] == ["p1", "p2", "p3", "transient"]
    sync(conn, b)  # the acks are in
    disconnect(conn)
    assert h.queue_bodies("queue://Consumer.A.VirtualTopic.orders") == [b"p1", b"p2", b"p3", b"transient"]
    assert h.queue_depth("queue://Consumer.B.VirtualTopic.orders") == 0

    live.remove(h)
    h.stop()
    h = start()
    # Before either group is back: A's queue came back with its messages, B's empty one
    # from its record; both still take copies.
    publish(h, ["after"], persistent=True)
    a1_conn, a1 = worker(h, group_queue("A"), prefetch=2)
    a2_conn, a2 = worker(h, group_queue("A"), prefetch=2)
    b_conn, b = worker(h, group_queue("B"))
    wait_until(lambda: len(a1.messages) + len(a2.messages) >= 4, 10, "4 messages for group A")
    got_a = a1.settle(0.2) + a2.settle(0.2)
    assert sorted(m.body for m in got_a) == ["after", "p1", "p2", "p3"]  # the transient one is gone
    assert all("redelivered" not in m.headers for m in got_a)  # never handed out before
    assert [m.body for m in b.wait_for(1)] == ["after"]
    for conn in (a1_conn, a2_conn, b_conn):
        disconnect(conn)
