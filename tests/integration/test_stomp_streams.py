"""STOMP consumers of a stream (RabbitMQ's ``x-stream-offset``), fed by STOMP and MQTT producers."""
from __future__ import annotations

import time

import pytest

from core.stream import StreamSpec
from tests.support import (
    BrokerHandle,
    RawStomp,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
    wait_past,
)


@pytest.fixture
def streams_broker(tmp_path):
    config = make_config(tmp_path)
    config.streams = [
        StreamSpec("sensors", ["topic://sensors.>"]),
        StreamSpec("wide", ["topic://wide.>"], partitions=3),
    ]
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


def produce(handle, n, start=0, topic="/topic/sensors.room1.temp"):
    conn, got = connect(handle)
    for i in range(start, start + n):
        conn.send(topic, f"m{i}", headers={"persistent": "true", "seq": str(i)})
    sync(conn, got)
    disconnect(conn)


def offsets(frames):
    return [int(f.headers["x-stream-offset"]) for f in frames]


def test_first_replays_everything_in_order_then_follows_live(streams_broker):
    produce(streams_broker, 5)
    mqtt, _ = mqtt_connect(streams_broker, "dev1", version=5)
    mqtt.publish("sensors/room2/temp", b"from mqtt", qos=1).wait_for_publish()
    conn, got = connect(streams_broker)
    conn.subscribe("/stream/sensors", id="s1", ack="client-individual", headers={"x-stream-offset": "first", "prefetch-count": "100"})
    frames = got.wait_for(6)
    assert offsets(frames) == list(range(6))
    assert [f.body for f in frames] == ["m0", "m1", "m2", "m3", "m4", "from mqtt"]
    assert frames[0].headers["destination"] == "/topic/sensors.room1.temp" and frames[0].headers["seq"] == "0"
    assert frames[5].headers["destination"] == "/topic/sensors.room2.temp" and frames[5].headers["mqtt-qos"] == "1"
    for f in frames:
        conn.ack(f.headers["ack"])
    mqtt.publish("sensors/room2/temp", b"live", qos=0)
    produce(streams_broker, 1, start=5)
    live = got.wait_for(8)[6:]
    assert sorted(f.body for f in live) == ["live", "m5"] and offsets(live) == [6, 7]
    mqtt_close(mqtt)
    disconnect(conn)


@pytest.mark.parametrize("spec, expected", [
    ("last", ["m9"]),
    ("7", ["m7", "m8", "m9"]),
    ("offset=8", ["m8", "m9"]),
    ("next", []),
])
def test_where_a_subscription_starts(streams_broker, spec, expected):
    produce(streams_broker, 10)
    conn, got = connect(streams_broker)
    conn.subscribe("/stream/sensors", id="s1", ack="auto", headers={"x-stream-offset": spec})
    assert [f.body for f in got.settle()] == expected
    produce(streams_broker, 1, start=10)
    assert got.wait_for(len(expected) + 1)[-1].body == "m10"
    disconnect(conn)


def test_timestamp_offset_and_rabbitmq_destination_name(streams_broker):
    produce(streams_broker, 3)  # stamped (whole milliseconds of the broker's clock) before their receipt
    cut = int(time.time() * 1000) + 2  # after m0..m2's stamps, even read back a millisecond short
    wait_past(cut, "the clock past the cut")  # m3 and m4 are stamped at or after it
    produce(streams_broker, 2, start=3)
    conn, got = connect(streams_broker)
    conn.subscribe("/amq/queue/sensors", id="s1", ack="auto", headers={"x-stream-offset": f"timestamp={cut / 1000:.3f}"})
    sync(conn, got)
    produce(streams_broker, 1, start=5)  # a live marker: the replay comes before it
    assert [f.body for f in got.wait_for(3)] == ["m3", "m4", "m5"]
    disconnect(conn)


def test_prefetch_bounds_unacked_records_and_acks_release_more(streams_broker):
    produce(streams_broker, 50)
    conn, got = connect(streams_broker)
    conn.subscribe("/stream/sensors", id="s1", ack="client-individual", headers={"x-stream-offset": "first", "prefetch-count": "10"})
    assert len(got.settle()) == 10
    for f in list(got.messages):
        conn.ack(f.headers["ack"])
    assert len(got.settle()) == 20
    assert offsets(got.messages) == list(range(20))
    disconnect(conn)


def test_partitions_are_named_and_can_be_chosen(streams_broker):
    conn, got = connect(streams_broker)
    for room in range(9):
        conn.send(f"/topic/wide.room{room}", f"r{room}", headers={"persistent": "true"})
    sync(conn, got)
    conn.subscribe("/stream/wide", id="all", ack="auto", headers={"x-stream-offset": "first"})
    frames = got.wait_for(9)
    partitions = {f.headers["destination"]: int(f.headers["x-stream-partition"]) for f in frames}
    assert len(set(partitions.values())) > 1
    chosen = next(iter(partitions.values()))
    conn2, got2 = connect(streams_broker)
    conn2.subscribe("/stream/wide", id="one", ack="auto", headers={"x-stream-offset": "first", "x-stream-partition": str(chosen)})
    only = got2.settle()
    assert only and {int(f.headers["x-stream-partition"]) for f in only} == {chosen}
    assert sorted(f.body for f in only) == sorted(f"r{d.rsplit('room', 1)[1]}" for d, p in partitions.items() if p == chosen)
    disconnect(conn)
    disconnect(conn2)


@pytest.mark.parametrize("destination, headers, reason", [
    ("/stream/nope", {"x-stream-offset": "first"}, "unknown stream 'nope'"),
    ("/stream/sensors", {"x-stream-offset": "yesterday"}, "x-stream-offset must be first, last, next"),
    ("/stream/sensors", {"x-stream-offset": "-3"}, "must not be negative"),
    ("/stream/sensors", {"x-stream-offset": "timestamp=soon"}, "epoch seconds"),
    ("/stream/sensors", {"x-stream-partition": "5"}, "partitions 0-0, not 5"),
])
def test_bad_stream_subscriptions_get_an_error_and_a_close(streams_broker, destination, headers, reason):
    raw = RawStomp(streams_broker)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": destination, "id": "1", **headers})
    error = raw.expect_error_and_close()
    assert reason in error.body.decode()
    raw.close()
    produce(streams_broker, 1)  # the broker keeps serving


def test_sending_to_a_stream_is_refused(streams_broker):
    raw = RawStomp(streams_broker)
    raw.connect()
    raw.frame("SEND", {"destination": "/stream/sensors"}, b"x")
    error = raw.expect_error_and_close()
    assert "is a stream" in error.body.decode()
    raw.close()


def test_websocket_clients_feed_and_read_streams(streams_broker):
    """A browser's STOMP over WebSocket: its SEND lands in the stream, and it can replay the stream."""
    from websockets.sync.client import connect as ws_connect

    from protocols.stomp.codec import StompDecoder, encode_frame

    def frames(ws, count):
        decoder, got = StompDecoder(version="1.2"), []
        while len(got) < count:
            data = ws.recv(timeout=5)
            got.extend(decoder.feed(data.encode() if isinstance(data, str) else data))
        return got

    produce(streams_broker, 2)
    with ws_connect(f"ws://127.0.0.1:{streams_broker.ws_port}/", subprotocols=["v12.stomp"]) as ws:
        ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]).decode())
        assert frames(ws, 1)[0].command == "CONNECTED"
        ws.send(encode_frame("SEND", [("destination", "/topic/sensors.browser"), ("persistent", "true"), ("receipt", "r1")], b"from a browser").decode())
        assert frames(ws, 1)[0].command == "RECEIPT"
        ws.send(encode_frame("SUBSCRIBE", [("destination", "/stream/sensors"), ("id", "s"), ("ack", "auto"), ("x-stream-offset", "first")]).decode())
        got = frames(ws, 3)
    assert [f.body for f in got] == [b"m0", b"m1", b"from a browser"]
    assert [f.headers["x-stream-offset"] for f in got] == ["0", "1", "2"]
