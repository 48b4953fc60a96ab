"""The disk's free-space floor, in a broker on this machine's disk: held, refused, resumed.

The floor is set above whatever this disk has free (99.9% of it), so the alarm
is real (read with statvfs by the broker's own check), and it is cleared by
setting the floor back to 0, as an operator would by freeing space.  What a
really full disk does is in tests/system/test_disk_full.py, on a tmpfs.
"""
from __future__ import annotations

import errno
import json
import threading
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest

from core.stream_config import StreamSpec
from protocols.mqtt import codec as mq
from tests.support import (
    BrokerHandle,
    RawMqtt,
    RawStomp,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    wait_stable,
    wait_until,
)

BODY = "x" * 1000


@pytest.fixture
def handle(tmp_path: Any, request: Any) -> Iterator[BrokerHandle]:
    marker = request.node.get_closest_marker("policy")
    config = make_config(tmp_path, **(marker.kwargs if marker else {}))
    config.persistence.disk_free_limit = 0  # raised by each test when it means to
    config.sys_interval = 0.2
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"])]
    broker = BrokerHandle(config)
    yield broker
    broker.stop()


def set_floor(broker: BrokerHandle, floor: int | float) -> None:
    """What an operator's disk does to the alarm, checked at once instead of at the next second."""
    def apply() -> None:
        watch = broker.gateway.storewatch
        watch.floor.floor = floor
        watch.check()

    broker.inspect(apply)


def http(broker: BrokerHandle, path: str, body: bytes | None = None, content_type: str = "") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}{path}", data=body, method="POST" if body else "GET")
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def metric(broker: BrokerHandle, name: str) -> float:
    _, text = http(broker, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.policy(store_full_policy="block")
def test_below_the_floor_producers_of_stored_messages_are_held_and_resume_when_space_returns(handle):
    set_floor(handle, 0.999)
    status, ready = http(handle, "/api/v1/ready")
    assert status == 503 and "below disk_free_limit" in ready["reason"] and " free at " in ready["reason"]
    assert http(handle, "/api/v1/health")[1]["store"] == ready["reason"]  # alive, with the reason
    assert metric(handle, "gateway_store_alarm") == 1 and metric(handle, "gateway_store_fault") == 0
    assert metric(handle, "gateway_disk_free_bytes") < metric(handle, "gateway_disk_free_limit_bytes")
    watcher, wgot = mqtt_connect(handle, "sys-watcher")
    watcher.subscribe("$SYS/broker/store/alarm", qos=0)
    wgot.wait_for(1, what="subacks")
    # The retained figure from before the alarm first, then the next interval's.
    wait_until(lambda: any(b"below disk_free_limit" in m.payload for m in wgot.messages),
               what=lambda: f"the alarm on $SYS, got {[m.payload for m in wgot.messages]}")
    mqtt_close(watcher)

    producer, pgot = connect(handle)
    sent = threading.Thread(target=lambda: [
        producer.send("/queue/held", f"{i:03d}" + BODY, headers={"persistent": "true"}, receipt=f"r{i}") for i in range(50)
    ], daemon=True)
    sent.start()
    held_at = wait_stable(lambda: len(pgot.receipts))
    assert 1 <= held_at < 50, f"{held_at} receipts: the producer was not held below the floor"
    # Messages nobody stores pass: a non-persistent queue send, an MQTT QoS 0 publish to a topic
    # no stream records (a QoS 0 publish to the stream's topic would be stored: held, below).
    other, ogot = connect(handle)
    other.subscribe("/queue/light", id="l")
    other.send("/queue/light", "not stored")
    assert ogot.wait_for(1)[0].body == "not stored"
    listener, lgot = mqtt_connect(handle, "listener")
    listener.subscribe("plain/#", qos=0)
    lgot.wait_for(1, what="subacks")
    qos0, _ = mqtt_connect(handle, "qos0")
    qos0.publish("plain/t", b"live", qos=0)
    assert lgot.wait_for(1)[0].payload == b"live"

    set_floor(handle, 0)  # space is back
    assert len(pgot.wait_for(50, what="receipts", timeout=10)) == 50
    assert http(handle, "/api/v1/ready")[0] == 200 and metric(handle, "gateway_store_alarm") == 0
    consumer, cgot = connect(handle)
    consumer.subscribe("/queue/held", id="c")
    assert [m.body[:3] for m in cgot.wait_for(50)] == [f"{i:03d}" for i in range(50)]
    for conn in (producer, other, consumer):
        disconnect(conn)
    mqtt_close(listener)
    mqtt_close(qos0)


@pytest.mark.policy(store_full_policy="block")
def test_a_stream_records_every_message_so_below_the_floor_even_qos0_publishers_to_it_are_held(handle):
    set_floor(handle, 0.999)
    publisher, _ = mqtt_connect(handle, "sensor")
    for i in range(200):
        publisher.publish("sensors/t", f"{i:03d}".encode(), qos=0)

    def records() -> int:
        return sum(p.end for p in handle.broker.streams.get("sensors").partitions)

    stored = wait_stable(records)
    assert 1 <= stored < 200, f"{stored} records: the QoS 0 publisher to a stream was not held"
    set_floor(handle, 0)
    wait_until(lambda: records() >= 200, 10, lambda: f"200 records once there is room, {records()} so far")
    assert records() == 200
    mqtt_close(publisher)


@pytest.mark.policy(store_full_policy="fail")
def test_with_the_fail_policy_every_protocol_is_refused_naming_the_free_space(handle):
    # Stored before the alarm: consumers and acks must keep working under it.
    producer, pgot = connect(handle)
    for i in range(3):
        producer.send("/queue/kept", f"m{i}", headers={"persistent": "true"}, receipt=f"k{i}")
    pgot.wait_for(3, what="receipts")
    disconnect(producer)
    set_floor(handle, 0.999)

    raw = RawStomp(handle)
    raw.connect()
    raw.frame("SEND", {"destination": "/queue/refused", "persistent": "true", "receipt": "r1"}, b"no room")
    error = raw.expect_error_and_close()
    assert error.headers["message"] == "Disk space low"
    assert "below disk_free_limit" in error.body.decode() and " free at " in error.body.decode()

    raw5 = RawMqtt(handle, level=5)
    assert raw5.connect("raw5").reason_code == 0
    raw5.packet(mq.Publish("q/t", b"no room", qos=1, packet_id=7))
    puback = raw5.read(5)
    assert puback.reason_code == mq.ReasonCode.QUOTA_EXCEEDED
    assert "below disk_free_limit" in puback.properties["reason_string"]
    raw5.close()

    raw4 = RawMqtt(handle, level=4)
    assert raw4.connect("raw4").reason_code == 0
    raw4.packet(mq.Publish("q/t", b"no room", qos=1, packet_id=8))
    assert raw4.closed_by_peer(5), "a 3.1.1 publisher the broker cannot take is disconnected"

    status, body = http(handle, "/api/v1/messages", b'{"destination": "/queue/refused", "body": "x", "persistent": true}\n',
                        "application/x-ndjson")
    assert status == 507 and body["code"] == "insufficient_storage" and "below disk_free_limit" in body["error"]

    consumer, cgot = connect(handle)
    consumer.subscribe("/queue/kept", id="c", ack="client-individual")
    messages = cgot.wait_for(3)
    for message in messages:
        consumer.ack(message.headers["ack"], receipt=f"a{message.body}")
    cgot.wait_for(3, what="receipts")  # acks are written and confirmed under the alarm
    disconnect(consumer)
    assert handle.queue_depth("queue://refused") == 0 and handle.queue_depth("queue://kept") == 0


def test_a_store_error_other_than_a_full_disk_stops_the_broker_saying_why(handle):
    told: list[str] = []
    client, got = connect(handle)

    def fail_a_sync() -> None:
        gateway = handle.gateway
        gateway.on_fatal = lambda why: (told.append(why), gateway.stop())
        store = gateway.store
        store.put_message("queue://q", 1, b"x")
        store.flush()
        # What the worker thread hands back when fsync fails with EIO.
        store._sync_done(store._written, OSError(errno.EIO, "Input/output error"))

    handle.inspect(fail_a_sync)
    assert told and "cannot recover" in told[0] and "Input/output error" in told[0]
    assert handle.gateway.fatal_error == told[0]
    assert got.disconnected.wait(5), "clients were not disconnected by the stop"
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Broker shutting down"
    del client
