"""What an MQTT client keeps across connections: options as stored, the away filter, message building."""
from __future__ import annotations

import json

from twisted.internet.task import Clock

from core.broker import Broker
from core.topic import Subscription
from persistence.memory import MemoryStore
from protocols.mqtt.state import (
    NO_OPTIONS,
    AwayFilter,
    SubscriptionOptions,
    build_message,
    message_qos,
    options_of,
)


def test_options_record_is_the_json_stores_already_hold():
    options = SubscriptionOptions(qos=2, no_local=True, retain_as_published=True, retain_handling=1, identifier=7)
    assert options.record() == {"qos": 2, "nl": True, "rap": True, "rh": 1, "id": 7}
    assert "id" not in SubscriptionOptions(qos=1).record()
    # A record written before options had a type (booleans as ints, no id) reads back the same.
    stored = json.loads('{"qos": 1, "nl": 0, "rap": 1, "rh": 2}')
    assert SubscriptionOptions.from_record(stored) == SubscriptionOptions(1, False, True, 2, None)
    assert SubscriptionOptions.from_record(json.loads(json.dumps(options.record()))) == options
    assert SubscriptionOptions.from_record(None) == NO_OPTIONS == SubscriptionOptions.from_record("garbage")


def test_options_of_types_a_recovered_subscription_once():
    queue = Broker(MemoryStore(), Clock()).queue("queue://sub")
    recovered = Subscription(queue, "topic://a", options={"qos": 1, "nl": False, "rap": False, "rh": 0, "id": 3})
    typed = options_of(recovered)
    assert typed == SubscriptionOptions(qos=1, identifier=3)
    assert recovered.options is typed and options_of(recovered) is typed
    assert options_of(Subscription(queue, "topic://b")) is NO_OPTIONS


def test_away_filter_keeps_only_what_would_be_delivered_at_qos_1_or_2():
    headers = {"mqtt-qos": "0"}
    assert not AwayFilter(1).matches(headers.get)
    assert AwayFilter(1).matches({"mqtt-qos": "2"}.get)
    assert not AwayFilter(0).matches({"mqtt-qos": "2"}.get)  # granted QoS 0: nothing is kept
    assert AwayFilter(1).matches({"JMSDeliveryMode": "PERSISTENT"}.get)  # a persistent STOMP message
    assert not AwayFilter(1).matches({}.get)


def test_build_message_maps_mqtt5_properties_to_common_fields():
    clock = Clock()
    clock.advance(1_000)
    broker = Broker(MemoryStore(), clock)
    props = {
        "user_properties": [("k", "1"), ("k", "2"), ("x", "y")], "payload_format_indicator": 1,
        "message_expiry_interval": 30, "response_topic": "replies/a", "correlation_data": b"\xff\x00",
        "content_type": "text/plain",
    }
    message = build_message(broker, "topic://t", b"body", 1, True, props)
    assert message.persistent and message.expiration == 1_000_000 + 30_000
    assert message.headers["k"] == "1" and json.loads(message.headers["mqtt-user-properties"]) == [["k", "1"], ["k", "2"], ["x", "y"]]
    assert message.headers["mqtt-retain"] == "1" and message.headers["mqtt-payload-format"] == "1"
    assert message.reply_to == "topic://replies.a" and message.content_type == "text/plain"
    assert message.correlation_id.encode("utf-8", "surrogateescape") == b"\xff\x00"
    assert message_qos(message) == 1
    assert message_qos(build_message(broker, "topic://t", b"", 0, False, {})) == 0


def test_plain_publishes_share_their_headers_and_a_bridge_gives_one_new_headers_not_a_change():
    """A PUBLISH with no properties gets the QoS's shared map; a bridge that puts its remote on a
    message's path must not write into that map, or every plain message would carry the path."""
    from protocols.bridge.bridge import PATH_HEADER, Bridge
    from protocols.bridge.settings import BridgeSettings

    clock = Clock()
    clock.advance(1_000)
    broker = Broker(MemoryStore(), clock)
    first = build_message(broker, "topic://a", b"1", 1, False, {})
    second = build_message(broker, "topic://b", b"2", 1, False, {})
    assert first.headers is second.headers and first.headers == {"mqtt-qos": "1"}
    assert build_message(broker, "topic://a", b"", 0, False, {}).headers == {"mqtt-qos": "0"}
    retained = build_message(broker, "topic://a", b"", 1, True, {})
    assert retained.headers == {"mqtt-qos": "1", "mqtt-retain": "1"} and retained.headers is not first.headers
    bridge = Bridge(broker, BridgeSettings("up", "mqtt://127.0.0.1:1883"), "edge")
    bridge.remote_name = "centre"
    assert bridge.arrived(first)
    assert first.headers == {"mqtt-qos": "1", PATH_HEADER: "centre"}
    assert second.headers == {"mqtt-qos": "1"}  # the shared map is as it was
    assert build_message(broker, "topic://c", b"3", 1, False, {}).headers == {"mqtt-qos": "1"}
