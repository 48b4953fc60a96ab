"""Deep and long destination names against a real broker process, on every protocol.

A buggy device that generates topics in a loop once made the topic trie raise
RecursionError (a 30,000-level MQTT topic, a 5,000-level STOMP destination):
the publisher got "internal error" and the message was lost.  Now names are
bounded by ``max_destination_levels`` (128) and ``max_destination_length``
(1024) and refused with each protocol's answer, at SUBSCRIBE and at
PUBLISH/SEND; and with the bounds raised, the trie walks any depth.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from websockets.sync.client import connect as ws_connect

from protocols.mqtt import codec as mq
from protocols.stomp.codec import StompDecoder, encode_frame
from tests.support import RawMqtt, RawStomp, wait_for_port
from tests.system.test_cli import BrokerProcess, free_port


class Handle:
    """What the raw clients need of a broker: its address."""

    def __init__(self, stomp: int, mqtt: int, ws: int) -> None:
        self.host = "127.0.0.1"
        self.port = stomp
        self.mqtt_port = mqtt
        self.ws_port = ws


def start(tmp_path: Path, policy: str = "") -> tuple[BrokerProcess, Handle]:
    ports = [free_port() for _ in range(3)]
    config = tmp_path / "gateway.toml"
    config.write_text(f"[policy]\n{policy}\n")
    broker = BrokerProcess(
        "--config", str(config), "--data-dir", str(tmp_path / "data"), "--stomp-port", str(ports[0]),
        "--mqtt-port", str(ports[1]), "--ws-port", str(ports[2]), "--admin-port", "0", "--log-level", "warn",
        cwd=tmp_path,
    )
    handle = Handle(*ports)
    wait_for_port("127.0.0.1", ports[0], 20, broker, "the broker")
    return broker, handle


@pytest.fixture
def defaults(tmp_path: Path) -> Iterator[Handle]:
    broker, handle = start(tmp_path)
    yield handle
    assert broker.stop() == 0, "".join(broker.lines)
    assert "Traceback" not in "".join(broker.lines), "".join(broker.lines)


def mqtt_topic(levels: int) -> str:
    return "/".join(["d"] * levels)


def stomp_topic(levels: int) -> str:
    return "/topic/" + ".".join(["d"] * levels)


def still_serving(handle: Handle) -> None:
    """After each refusal: a fresh client's message still goes round."""
    raw = RawStomp(handle)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": "/queue/alive", "id": "1"})
    raw.frame("SEND", {"destination": "/queue/alive"}, b"yes")
    assert raw.read().body == b"yes"
    raw.close()


def test_mqtt5_publish_too_deep_gets_0x90(defaults):
    raw = RawMqtt(defaults, level=5)
    assert raw.connect("deep5").reason_code == 0
    raw.packet(mq.Publish(mqtt_topic(300), b"x", qos=1, packet_id=1))
    ack = raw.read()
    assert isinstance(ack, mq.Puback) and ack.reason_code == 0x90
    assert "300 levels" in ack.properties["reason_string"] and "max_destination_levels" in ack.properties["reason_string"]
    raw.packet(mq.Publish(mqtt_topic(30_000), b"x", qos=1, packet_id=2))
    ack = raw.read()
    assert isinstance(ack, mq.Puback) and ack.reason_code == 0x90
    assert "max_destination_length" in ack.properties["reason_string"]
    raw.packet(mq.Publish(mqtt_topic(30_000), b"x", qos=0))  # QoS 0 has no ack: a DISCONNECT says why
    bye = raw.read()
    assert isinstance(bye, mq.Disconnect) and bye.reason_code == 0x90
    assert raw.closed_by_peer()
    still_serving(defaults)


def test_mqtt5_subscribe_too_deep_or_too_long_gets_0x8f(defaults):
    raw = RawMqtt(defaults, level=5)
    raw.connect("deep5s")
    raw.packet(mq.Subscribe(1, [
        mq.SubscriptionRequest(mqtt_topic(30_000), 1),
        mq.SubscriptionRequest("long/" + "x" * 2000, 1),
        mq.SubscriptionRequest("fine/+/topic", 1),
    ]))
    ack = raw.read()
    assert isinstance(ack, mq.Suback) and ack.reason_codes == [0x8F, 0x8F, 1]
    still_serving(defaults)


def test_mqtt311_publish_too_deep_is_closed_and_subscribe_gets_0x80(defaults):
    raw = RawMqtt(defaults, level=4)
    raw.connect("deep4")
    raw.packet(mq.Subscribe(1, [mq.SubscriptionRequest(mqtt_topic(200), 0), mq.SubscriptionRequest("ok/#", 0)]))
    ack = raw.read()
    assert isinstance(ack, mq.Suback) and ack.reason_codes == [0x80, 0]
    raw.packet(mq.Publish(mqtt_topic(30_000), b"x", qos=1, packet_id=2))
    assert raw.closed_by_peer()
    still_serving(defaults)


def test_mqtt_will_on_a_too_deep_topic_is_refused_at_connect(defaults):
    raw = RawMqtt(defaults, level=5)
    raw.packet(mq.Connect("MQTT", 5, True, 60, "will5", will=mq.Will(mqtt_topic(500), b"bye")))
    ack = raw.read()
    assert isinstance(ack, mq.Connack) and ack.reason_code == 0x90
    assert raw.closed_by_peer()
    raw4 = RawMqtt(defaults, level=4)
    raw4.packet(mq.Connect("MQTT", 4, True, 60, "will4", will=mq.Will(mqtt_topic(500), b"bye")))
    assert raw4.closed_by_peer()
    still_serving(defaults)


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE"])
@pytest.mark.parametrize("levels, limit", [(300, "300 levels is over the limit of 128 (max_destination_levels)"),
                                           (5_000, "10007 characters is over the limit of 1024 (max_destination_length)")])
def test_stomp_too_deep_gets_an_error_naming_the_limit(defaults, command, levels, limit):
    raw = RawStomp(defaults)
    raw.connect()
    raw.frame(command, {"destination": stomp_topic(levels), "id": "1"}, b"x" if command == "SEND" else b"")
    error = raw.expect_error_and_close()
    assert limit in error.body.decode()
    raw.close()
    still_serving(defaults)


def test_stomp_over_websocket_too_long_gets_an_error(defaults):
    with ws_connect(f"ws://127.0.0.1:{defaults.ws_port}/", subprotocols=["v12.stomp"]) as ws:
        ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]).decode())
        decoder = StompDecoder(version="1.2")
        frames = decoder.feed(ws.recv(timeout=5).encode())
        assert frames[0].command == "CONNECTED"
        ws.send(encode_frame("SEND", [("destination", "/topic/" + "y" * 3000)], b"x").decode())
        frames = decoder.feed(ws.recv(timeout=5).encode())
        assert frames[0].command == "ERROR" and "max_destination_length" in frames[0].body.decode()
    still_serving(defaults)


def test_with_the_limits_raised_a_30000_level_topic_is_delivered(tmp_path):
    """The root cause: the trie walks any depth without recursion."""
    broker, handle = start(tmp_path, "max_destination_levels = 100000\nmax_destination_length = 1000000")
    try:
        sub = RawMqtt(handle, level=5)
        sub.connect("deep-sub")
        deep = mqtt_topic(30_000)
        sub.packet(mq.Subscribe(1, [mq.SubscriptionRequest(deep, 1), mq.SubscriptionRequest("d/+/#", 1)]))
        assert sub.read().reason_codes == [1, 1]
        pub = RawMqtt(handle, level=5)
        pub.connect("deep-pub")
        pub.packet(mq.Publish(deep, b"all the way down", qos=1, packet_id=1))
        ack = pub.read()
        assert isinstance(ack, mq.Puback) and ack.reason_code == 0
        delivered = sub.read()
        assert isinstance(delivered, mq.Publish) and delivered.payload == b"all the way down"
        stomp = RawStomp(handle)
        stomp.connect()
        stomp.frame("SUBSCRIBE", {"destination": stomp_topic(5_000), "id": "1"})
        stomp.frame("SEND", {"destination": stomp_topic(5_000)}, b"deep stomp")
        assert stomp.read().body == b"deep stomp"
        stomp.close()
    finally:
        assert broker.stop() == 0
    assert "RecursionError" not in "".join(broker.lines)


def test_other_input_controlled_depth_is_bounded(defaults):
    """Selectors nested thousands deep, and a forged MQTT user-properties header, cost one client at most."""
    raw = RawStomp(defaults)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": "/queue/sel", "id": "1", "selector": "(" * 5000 + "a = 1" + ")" * 5000})
    error = raw.expect_error_and_close()
    assert "nested too deeply" in error.body.decode()
    raw.close()
    # A STOMP producer can set the header MQTT uses to carry repeated user properties; garbage
    # or a deeply nested value there must not fail every MQTT 5 delivery of the message.
    sub = RawMqtt(defaults, level=5)
    sub.connect("props-sub")
    sub.packet(mq.Subscribe(1, [mq.SubscriptionRequest("forged", 0)]))
    assert sub.read().reason_codes == [0]
    stomp = RawStomp(defaults)
    stomp.connect()
    for value in ("[" * 5_000 + "]" * 5_000, "not json", '[["k", 1]]'):  # within STOMP's header limit
        stomp.frame("SEND", {"destination": "/topic/forged", "mqtt-user-properties": value, "k": "v"}, b"still delivered")
        got = sub.read()
        assert isinstance(got, mq.Publish) and got.payload == b"still delivered"
        assert ("k", "v") in got.properties["user_properties"]
    stomp.close()
    still_serving(defaults)
