"""What users arriving from ActiveMQ and RabbitMQ write in STOMP, with stomp.py (and paho where MQTT meets it).

Composite destinations (ActiveMQ's ``/queue/a,/topic/b``) and RabbitMQ's
``/amq/queue/NAME``, ``/exchange/amq.topic/KEY``, ``expiration`` and
``x-message-ttl``: each accepted with its meaning there, or refused with an
ERROR that names what to use here -- and a refused SEND stores nothing.
"""
from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support import BrokerHandle, bodies, connect, disconnect, make_config, mqtt_close, mqtt_connect, sync, wait_past


def refused(broker: BrokerHandle, send: Any) -> Any:
    """Run ``send(conn)`` on a fresh connection; the one ERROR it gets (the broker then closes it)."""
    conn, got = connect(broker)
    try:
        send(conn)
        (error,) = got.wait_for(1, what="errors")
        assert got.disconnected.wait(5), "the broker kept the connection after an ERROR"
        return error
    finally:
        disconnect(conn)


# -- composite destinations (ActiveMQ) ------------------------------------------------------------


def test_composite_send_reaches_every_queue_and_survives_a_restart(tmp_path):
    handle = BrokerHandle(make_config(tmp_path))
    try:
        conn, got = connect(handle)
        conn.send("/queue/c.a,/queue/c.b", "to both", headers={"persistent": "true"}, receipt="r1")
        conn.send("/queue/c.a,c.c", "bare part is a queue too", headers={"persistent": "true"}, receipt="r2")
        got.wait_for(2, what="receipts")
        disconnect(conn)
    finally:
        handle.stop()
    handle = BrokerHandle(make_config(tmp_path))
    try:
        assert handle.queue_bodies("queue://c.a") == [b"to both", b"bare part is a queue too"]
        assert handle.queue_bodies("queue://c.b") == [b"to both"]
        assert handle.queue_bodies("queue://c.c") == [b"bare part is a queue too"]
        conn, got = connect(handle)
        conn.subscribe("/queue/c.b", id="b", ack="client-individual")
        (message,) = got.wait_for(1)
        assert message.body == "to both" and message.headers["destination"] == "/queue/c.b"
        assert message.headers["persistent"] == "true"
        conn.ack(message.headers["ack"])
        disconnect(conn)
    finally:
        handle.stop()


def test_composite_send_to_a_queue_and_a_topic(broker):
    sub, sub_got = connect(broker)
    sub.subscribe("/topic/c.news", id="t")
    sync(sub, sub_got)
    mqtt, mqtt_got = mqtt_connect(broker, "composite-watcher")
    mqtt.subscribe("c/news", qos=1)
    mqtt_got.wait_for(1, what="subacks")
    conn, got = connect(broker)
    conn.send("/queue/c.work,/topic/c.news", "both kinds", receipt="r")
    got.wait_for(1, what="receipts")
    (message,) = sub_got.wait_for(1)
    assert message.headers["destination"] == "/topic/c.news" and message.body == "both kinds"
    assert [m.payload for m in mqtt_got.wait_for(1)] == [b"both kinds"]
    assert broker.queue_bodies("queue://c.work") == [b"both kinds"]
    # Ids are the copies' own: acks and redeliveries of one never touch the other.
    assert message.headers["message-id"] not in [e for e in broker.inspect(
        lambda: [x.message.id for x in broker.broker.queues["queue://c.work"].messages()])]
    mqtt_close(mqtt)
    disconnect(conn)
    disconnect(sub)


@pytest.mark.parametrize(("destination", "why"), [
    ("/queue/c.bad1,,/queue/c.bad2", "has an empty part"),
    ("c.bad1,/queue/c.bad2", "starts without a type: write /queue/c.bad1 or /topic/c.bad1"),
    ("/queue/c.bad1,/nope/c.bad2", "unknown destination '/nope/c.bad2': use /queue/NAME"),
    ("/queue/c.bad1,/exchange/amq.direct/c.bad2", "exchange 'amq.direct' does not exist here"),
])
def test_a_composite_that_cannot_be_meant_is_refused_and_nothing_is_stored(broker, destination, why):
    error = refused(broker, lambda conn: conn.send(destination, "x", headers={"persistent": "true"}))
    assert why in error.body, error.body
    for name in ("queue://c.bad1", "queue://c.bad2"):
        assert broker.queue_depth(name) == 0


def test_subscribing_to_a_composite_is_refused_with_what_to_do(broker):
    error = refused(broker, lambda conn: conn.subscribe("/queue/c.a,/queue/c.b", id="s"))
    assert "can be sent to but not subscribed to; subscribe to each" in error.body


# -- RabbitMQ's destinations ----------------------------------------------------------------------


def test_amq_queue_names_an_existing_queue_and_never_creates_one(broker):
    error = refused(broker, lambda conn: conn.send("/amq/queue/r.jobs", "lost?", headers={"persistent": "true"}))
    assert "no queue or stream 'r.jobs'" in error.body and "/queue/r.jobs creates it" in error.body
    assert broker.inspect(lambda: "queue://r.jobs" in broker.broker.queues) is False

    worker, worker_got = connect(broker)
    worker.subscribe("/queue/r.jobs", id="w")  # the queue exists from here on
    sync(worker, worker_got)
    conn, got = connect(broker)
    conn.send("/amq/queue/r.jobs", "job 1", receipt="r")
    got.wait_for(1, what="receipts")
    (message,) = worker_got.wait_for(1)
    assert message.body == "job 1" and message.headers["destination"] == "/queue/r.jobs"
    # Consuming through /amq/queue/ reads the same queue.
    other, other_got = connect(broker)
    other.subscribe("/amq/queue/r.jobs", id="o")
    sync(other, other_got)
    disconnect(worker)
    conn.send("/queue/r.jobs", "job 2")
    assert bodies(other_got.wait_for(1)) == ["job 2"]
    disconnect(other)
    disconnect(conn)


def test_exchange_amq_topic_is_the_topic_stomp_and_mqtt_share(broker):
    stomp_sub, stomp_got = connect(broker)
    stomp_sub.subscribe("/exchange/amq.topic/r.sensors.*", id="x")
    sync(stomp_sub, stomp_got)
    mqtt, mqtt_got = mqtt_connect(broker, "amq-topic-watcher")
    mqtt.subscribe("r/sensors/+", qos=0)
    mqtt_got.wait_for(1, what="subacks")
    conn, got = connect(broker)
    conn.send("/exchange/amq.topic/r.sensors.t1", "21.5", receipt="r")
    got.wait_for(1, what="receipts")
    (message,) = stomp_got.wait_for(1)
    assert message.body == "21.5" and message.headers["destination"] == "/topic/r.sensors.t1"
    assert [(m.topic, m.payload) for m in mqtt_got.wait_for(1)] == [("r/sensors/t1", b"21.5")]
    # What RabbitMQ's MQTT plugin publishes lands on amq.topic: an MQTT publish reaches the STOMP subscriber.
    mqtt.publish("r/sensors/t2", b"19.0", qos=1).wait_for_publish(5)
    assert [m.body for m in stomp_got.wait_for(2)][1] == "19.0"
    mqtt_close(mqtt)
    disconnect(conn)
    disconnect(stomp_sub)


def test_other_exchanges_are_refused_naming_the_equivalent(broker):
    error = refused(broker, lambda conn: conn.send("/exchange/amq.direct/r.key", "x"))
    assert "exchange 'amq.direct' does not exist here" in error.body
    assert "use /topic/r.key for a topic or /queue/r.key for a queue" in error.body


def test_expiration_is_milliseconds_to_live_as_in_rabbitmq(broker):
    conn, got = connect(broker)
    before = int(time.time() * 1000)
    conn.send("/queue/r.ttl", "short", headers={"expiration": "150", "persistent": "true"})
    conn.send("/queue/r.ttl", "long", headers={"expiration": "600000"}, receipt="r")
    got.wait_for(1, what="receipts")
    # Stamped before its RECEIPT was sent, "short" is due 150 ms after the RECEIPT at the latest.
    wait_past(int(time.time() * 1000) + 150, "'short' to expire")
    conn.subscribe("/queue/r.ttl", id="t")
    (message,) = got.wait_for(1)
    assert message.body == "long"
    # Consumers see ActiveMQ's absolute expires, whatever the producer wrote.
    assert before + 600_000 <= int(message.headers["expires"]) <= int(time.time() * 1000) + 600_000
    assert "expiration" not in message.headers
    assert got.settle(0.3) == [message]  # the short one expired (to the DLQ), never delivered
    assert b"short" in broker.queue_bodies("queue://DLQ")
    disconnect(conn)


@pytest.mark.parametrize("frame", ["SEND", "SUBSCRIBE"])
def test_x_message_ttl_is_refused_naming_expiration(broker, frame):
    def act(conn: Any) -> None:
        if frame == "SEND":
            conn.send("/queue/r.qttl", "x", headers={"x-message-ttl": "1000"})
        else:
            conn.subscribe("/queue/r.qttl", id="s", headers={"x-message-ttl": "1000"})

    error = refused(broker, act)
    assert error.headers["message"] == "Unsupported header x-message-ttl"
    assert "expiration (milliseconds to live" in error.body
    assert broker.queue_depth("queue://r.qttl") == 0


def test_expires_and_expiration_together_are_refused(broker):
    error = refused(broker, lambda conn: conn.send("/queue/r.both", "x", headers={"expires": "1", "expiration": "1"}))
    assert error.headers["message"] == "Conflicting expiry headers"


def test_prefetch_count_bounds_unacknowledged_deliveries_as_rabbitmq(broker):
    conn, got = connect(broker)
    for i in range(10):
        conn.send("/queue/r.prefetch", str(i))
    sync(conn, got)
    conn.subscribe("/queue/r.prefetch", id="p", ack="client-individual", headers={"prefetch-count": "3"})
    assert len(got.wait_for(3)) == 3
    assert len(got.settle(0.3)) == 3  # no more until one is acknowledged
    conn.ack(got.messages[0].headers["ack"])
    assert len(got.wait_for(4)) == 4
    disconnect(conn)
