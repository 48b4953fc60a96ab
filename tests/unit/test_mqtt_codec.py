"""Tests for the sans-IO MQTT codec (protocols.mqtt.codec)."""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.mqtt.codec import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProtocolError,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_publish,
    encode_variable_byte_integer,
    publish_parts,
)

LEVELS = (3, 4, 5)
PROTOCOL_NAME = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


def decode_all(data: bytes, level: int | None = None, server: bool = True) -> list[Packet]:
    dec = MqttDecoder(level=level, server=server)
    packets = dec.feed(data)
    assert dec.buffered == 0
    return packets


def decode_bytewise(data: bytes, level: int | None = None, server: bool = True) -> list[Packet]:
    dec = MqttDecoder(level=level, server=server)
    packets: list[Packet] = []
    for i in range(len(data)):
        packets += dec.feed(data[i : i + 1])
    assert dec.buffered == 0
    return packets


def error_of(
    data: bytes | list[bytes],
    level: int | None = 5,
    server: bool = True,
    max_packet_size: int = 268435455,
) -> MqttProtocolError:
    dec = MqttDecoder(max_packet_size, level=level, server=server)
    chunks = [data] if isinstance(data, bytes) else data
    with pytest.raises(MqttProtocolError) as info:
        for chunk in chunks:
            dec.feed(chunk)
    return info.value


def connect_bytes(level: int, client_id: str = "c") -> bytes:
    return encode(Connect(PROTOCOL_NAME[level], level, True, 60, client_id), level)


def s(text: str) -> bytes:
    """An MQTT UTF-8 string: two length bytes and the encoding."""
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def packet(b0: int, body: bytes) -> bytes:
    return bytes((b0,)) + encode_variable_byte_integer(len(body)) + body


def qos0(
    payload: bytes, level: int = 4, topic: str = "t", props: dict[str, Any] | None = None
) -> bytes:
    return encode_publish(topic, payload, 0, False, False, None, props, level)


# --------------------------------------------------------------------------- samples

CLIENT_PUBLISH_PROPS = {
    "payload_format_indicator": 1,
    "message_expiry_interval": 3600,
    "topic_alias": 7,
    "response_topic": "reply/to/me",
    "correlation_data": b"\x00\x01corr",
    "user_properties": [("k", "v1"), ("k", "v2"), ("\u00e9", "\U0001f600")],
    "content_type": "text/plain; charset=utf-8",
}
# Only a server attaches Subscription Identifiers.
SERVER_PUBLISH_PROPS = {**CLIENT_PUBLISH_PROPS, "subscription_identifier": [1, 268435455, 200]}
ALL_CONNACK_PROPS = {
    "session_expiry_interval": 0xFFFFFFFF,
    "receive_maximum": 100,
    "maximum_qos": 1,
    "retain_available": 0,
    "maximum_packet_size": 1048576,
    "assigned_client_identifier": "auto-1234",
    "topic_alias_maximum": 10,
    "reason_string": "ok",
    "user_properties": [("a", "b")],
    "wildcard_subscription_available": 1,
    "subscription_identifier_available": 0,
    "shared_subscription_available": 1,
    "server_keep_alive": 30,
    "response_information": "resp/",
    "server_reference": "other:1883",
    "authentication_method": "SCRAM-SHA-1",
    "authentication_data": b"\x01\x02",
}


def client_samples(level: int) -> list[Packet]:
    v5 = level == 5
    name = PROTOCOL_NAME[level]
    out: list[Packet] = [
        Connect(name, level, True, 60, "client-1"),
        Connect(name, level, False, 0, "", "user", b"\x00pw\xff"),
        Connect(
            name,
            level,
            True,
            65535,
            "\u00fcnic\u00f8de",
            "u",
            b"p",
            Will(
                "last/will",
                b"gone" * 50,
                2,
                True,
                {
                    "will_delay_interval": 10,
                    "payload_format_indicator": 1,
                    "message_expiry_interval": 5,
                    "content_type": "text/plain",
                    "response_topic": "r/t",
                    "correlation_data": b"c",
                    "user_properties": [("w", "1")],
                }
                if v5
                else {},
            ),
            {
                "session_expiry_interval": 300,
                "receive_maximum": 20,
                "maximum_packet_size": 65536,
                "topic_alias_maximum": 5,
                "request_response_information": 1,
                "request_problem_information": 0,
                "user_properties": [("x", "y"), ("x", "z")],
                "authentication_method": "PLAIN",
                "authentication_data": b"secret",
            }
            if v5
            else {},
        ),
        Publish("a/b", b"hello"),
        Publish("a/b", b"", 1, True, False, 1),
        Publish("\u65e5\u672c/\u00e9", bytes(range(256)) * 2, 2, False, True, 65535),
        Puback(1),
        Pubrec(2),
        Pubrel(3),
        Pubcomp(65535),
        Subscribe(
            10,
            [
                SubscriptionRequest("a/+/c", 0),
                SubscriptionRequest("#", 1),
                SubscriptionRequest("$share/g/x", 2),
            ],
        ),
        Unsubscribe(11, ["a/+/c", "#", ""]),
        Pingreq(),
        Disconnect(),
    ]
    if v5:
        out += [
            Connect(name, level, True, 10, "v5-only-password", None, b"pw"),
            Publish("t", b"p", 1, False, False, 9, dict(CLIENT_PUBLISH_PROPS)),
            Publish("", b"aliased", 0, False, False, None, {"topic_alias": 3}),
            Puback(5, ReasonCode.NO_MATCHING_SUBSCRIBERS),
            Puback(5, 0x80, {"reason_string": "nope", "user_properties": [("a", "b")]}),
            Pubrec(6, 0x10, {"reason_string": "x"}),
            Pubrel(7, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
            Pubcomp(8, 0, {"user_properties": [("q", "")]}),
            Subscribe(
                12,
                [
                    SubscriptionRequest("a", 2, True, True, 2),
                    SubscriptionRequest("b", 1, False, True, 1),
                ],
                {"subscription_identifier": 268435455, "user_properties": [("s", "1")]},
            ),
            Unsubscribe(13, ["x"], {"user_properties": [("u", "2")]}),
            Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE),
            Disconnect(0, {"session_expiry_interval": 0, "reason_string": "bye"}),
            Auth(),
            Auth(ReasonCode.CONTINUE_AUTHENTICATION),
            Auth(0x19, {"authentication_method": "SCRAM", "authentication_data": b"\x00"}),
        ]
    return out


def server_samples(level: int) -> list[Packet]:
    v5 = level == 5
    out: list[Packet] = [
        Connack(False, 0),
        Connack(level != 3, 0),
        Connack(False, 5 if not v5 else ReasonCode.NOT_AUTHORIZED),
        Publish("a/b", b"x" * 300, 1, True, True, 77),
        Publish("a", b"", 0),
        Puback(1),
        Pubrec(1),
        Pubrel(1),
        Pubcomp(1),
        Suback(3, [0, 1, 2, 0x80]),
        Unsuback(4, [0, 0x11] if v5 else []),
        Pingresp(),
    ]
    if v5:
        out += [
            Connack(True, 0, dict(ALL_CONNACK_PROPS)),
            Publish("t", b"p", 2, False, False, 4, dict(SERVER_PUBLISH_PROPS)),
            Publish("t", b"p", 0, False, False, None, {"subscription_identifier": [5]}),
            Suback(5, [0, 1, 2, 0x87, 0x8F, 0x9E], {"reason_string": "mixed"}),
            Unsuback(6, [0x80], {"user_properties": [("a", "b")]}),
            Disconnect(ReasonCode.SERVER_MOVED, {"server_reference": "b:1883"}),
            Disconnect(ReasonCode.SESSION_TAKEN_OVER),
            Auth(ReasonCode.CONTINUE_AUTHENTICATION, {"authentication_method": "m"}),
        ]
    return out


def _cases(kind: str) -> list[Any]:
    samples = client_samples if kind == "client" else server_samples
    return [
        pytest.param(level, pkt, id=f"v{level}-{i}-{type(pkt).__name__}")
        for level in LEVELS
        for i, pkt in enumerate(samples(level))
    ]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(("level", "pkt"), _cases("client"))
def test_client_packets_round_trip(level: int, pkt: Packet) -> None:
    wire = encode(pkt, level)
    if isinstance(pkt, Connect):
        dec = MqttDecoder()
        assert dec.feed(wire) == [pkt]
        assert dec.level == level
        assert decode_bytewise(wire) == [pkt]
    else:
        assert decode_all(wire, level) == [pkt]
        assert decode_bytewise(wire, level) == [pkt]


@pytest.mark.parametrize(("level", "pkt"), _cases("server"))
def test_server_packets_round_trip(level: int, pkt: Packet) -> None:
    wire = encode(pkt, level)
    assert decode_all(wire, level, server=False) == [pkt]
    assert decode_bytewise(wire, level, server=False) == [pkt]


@pytest.mark.parametrize("level", LEVELS)
def test_whole_session_stream_every_split(level: int) -> None:
    clients = client_samples(level)
    stream = b"".join(encode(p, level) for p in clients)
    dec = MqttDecoder()
    assert dec.feed(stream) == clients
    assert dec.level == level
    for cut in range(1, len(stream), 7):
        dec = MqttDecoder()
        assert dec.feed(stream[:cut]) + dec.feed(stream[cut:]) == clients, cut
        assert dec.buffered == 0
    assert decode_bytewise(stream) == clients


def test_three_x_drops_what_it_cannot_carry() -> None:
    assert encode(Publish("t", b"p", 1, packet_id=2, properties={"topic_alias": 1}), 4) == (
        b"\x32\x06\x00\x01t\x00\x02p"
    )
    assert encode(Puback(2, 0x80, {"reason_string": "x"}), 4) == b"\x40\x02\x00\x02"
    assert encode(Disconnect(0x04, {"reason_string": "x"}), 4) == b"\xe0\x00"
    assert encode(Unsuback(9, [0, 0x11]), 4) == b"\xb0\x02\x00\x09"
    sub = Subscribe(1, [SubscriptionRequest("a", 1, True, True, 2)], {"subscription_identifier": 3})
    assert decode_all(encode(sub, 4), 4) == [Subscribe(1, [SubscriptionRequest("a", 1)])]
    # MQTT 5 failure codes become the 3.x generic failure.
    assert encode(Suback(1, [0, 2, 0x87, 0x8F]), 4) == b"\x90\x06\x00\x01\x00\x02\x80\x80"
    with pytest.raises(ValueError):
        encode(Suback(1, [0x11]), 4)
    assert encode(Connack(True, 0), 3) == b"\x20\x02\x00\x00"  # 3.1 has no Session Present


# --------------------------------------------------------------------------- byte-exact


def test_remaining_length_spec_table() -> None:
    table = {
        0: b"\x00",
        127: b"\x7f",
        128: b"\x80\x01",
        16383: b"\xff\x7f",
        16384: b"\x80\x80\x01",
        2097151: b"\xff\xff\x7f",
        2097152: b"\x80\x80\x80\x01",
        268435455: b"\xff\xff\xff\x7f",
    }
    for value, wire in table.items():
        assert encode_variable_byte_integer(value) == wire
    with pytest.raises(ValueError):
        encode_variable_byte_integer(268435456)
    with pytest.raises(ValueError):
        encode_variable_byte_integer(-1)

    assert decode_all(b"\xc0\x00", 4) == [Pingreq()]
    for value in (127, 128, 16383, 16384, 2097151, 2097152):
        payload = b"p" * (value - 3)
        wire = b"\x30" + table[value] + b"\x00\x01t" + payload
        assert encode_publish("t", payload, 0, False, False, None, None, 4) == wire
        assert decode_all(wire, 4) == [Publish("t", payload)]
    # The largest remaining length: only the header is needed to judge it.
    big = b"\x30\xff\xff\xff\x7f\x00\x01t"
    dec = MqttDecoder(268435455 + 5, level=4)
    assert dec.feed(big) == []
    assert dec.buffered == len(big)
    err = error_of(big, level=4, max_packet_size=268435455 + 4)
    assert err.reason_code == 0x95
    assert "268435460" in err.message


def test_mqtt311_connect_from_mosquitto_pub() -> None:
    wire = bytes.fromhex("101800044d5154540402003c000c6d6f73717075627c31323334")
    pkt = Connect("MQTT", 4, True, 60, "mosqpub|1234")
    assert decode_all(wire) == [pkt]
    assert encode(pkt, 4) == wire


def test_mqtt31_connect() -> None:
    wire = bytes.fromhex("1011" "00064d5149736470" "03" "02" "0005" "0003616263")
    (pkt,) = decode_all(wire)
    assert pkt == Connect("MQIsdp", 3, True, 5, "abc")
    assert encode(pkt, 3) == wire


def test_publish_qos1_bytes() -> None:
    wire = bytes.fromhex("3209 0003 612f62 000a 6869".replace(" ", ""))
    pkt = Publish("a/b", b"hi", 1, False, False, 10)
    assert encode(pkt, 4) == wire
    assert decode_all(wire, 4) == [pkt]
    assert encode_publish("a/b", b"hi", 1, False, False, 10, None, 4) == wire
    # 5.0 adds a zero property length after the packet identifier.
    assert encode(pkt, 5) == bytes.fromhex("320a0003612f62000a006869")


def test_mqtt5_connect_spec_example() -> None:
    # Variable header from the 5.0 spec's example (3.1.2.11): flags 0xCE,
    # keep alive 10, Session Expiry Interval 10.
    variable = bytes.fromhex("00044d515454" "05" "ce" "000a" "05" "110000000a")
    payload = s("") + b"\x00" + s("t") + s("p") + s("u") + s("pw")
    wire = packet(0x10, variable + payload)
    pkt = Connect(
        "MQTT", 5, True, 10, "", "u", b"pw", Will("t", b"p", 1), {"session_expiry_interval": 10}
    )
    assert decode_all(wire) == [pkt]
    assert encode(pkt, 5) == wire


def test_small_packets_bytes() -> None:
    assert encode(Subscribe(1, [SubscriptionRequest("a/b/c", 1)]), 4) == (
        b"\x82\x0a\x00\x01\x00\x05a/b/c\x01"
    )
    assert encode(Suback(1, [1]), 4) == b"\x90\x03\x00\x01\x01"
    assert encode(Unsubscribe(2, ["a"]), 4) == b"\xa2\x05\x00\x02\x00\x01a"
    assert encode(Pubrel(3), 4) == b"\x62\x02\x00\x03"
    assert encode(Pingreq(), 5) == b"\xc0\x00"
    assert encode(Pingresp(), 3) == b"\xd0\x00"
    assert encode(Connack(True, 0), 4) == b"\x20\x02\x01\x00"
    assert encode(Connack(False, 0), 5) == b"\x20\x03\x00\x00\x00"
    sub5 = Subscribe(
        1, [SubscriptionRequest("a", 2, True, True, 2)], {"subscription_identifier": 300}
    )
    assert encode(sub5, 5) == b"\x82\x0a\x00\x01\x03\x0b\xac\x02\x00\x01a\x2e"


def test_mqtt5_short_forms() -> None:
    # Encoded and accepted: PUB* of remaining length 2 and 3, DISCONNECT/AUTH of 0 and 1.
    assert encode(Puback(1), 5) == b"\x40\x02\x00\x01"
    assert encode(Pubrec(1, 0x10), 5) == b"\x50\x03\x00\x01\x10"
    assert encode(Pubcomp(1, 0, {"reason_string": "r"}), 5) == (
        b"\x70\x08\x00\x01\x00\x04\x1f\x00\x01r"
    )
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Disconnect(0x04), 5) == b"\xe0\x01\x04"
    assert encode(Auth(), 5) == b"\xf0\x00"
    assert encode(Auth(0x18), 5) == b"\xf0\x02\x18\x00"
    stream = (
        b"\x40\x02\x00\x01\x50\x03\x00\x02\x10\x62\x02\x00\x03\x70\x04\x00\x04\x92\x00"
        b"\xe0\x00\xf0\x00\xf0\x01\x18"
    )
    assert decode_all(stream, 5) == [
        Puback(1),
        Pubrec(2, 0x10),
        Pubrel(3),
        Pubcomp(4, 0x92),
        Disconnect(),
        Auth(),
        Auth(0x18),
    ]
    assert decode_all(b"\xe0\x01\x8e", 5, server=False) == [Disconnect(0x8E)]


def test_user_properties_keep_order_and_repeats() -> None:
    props = {"user_properties": [("b", "2"), ("a", "1"), ("b", "3"), ("b", "2")]}
    wire = encode(Publish("t", b"", properties=props), 5)
    (pkt,) = decode_all(wire, 5)
    assert pkt.properties == props
    # A dict and a bare subscription identifier are accepted for convenience.
    wire2 = encode(
        Publish("t", b"", properties={"user_properties": {"a": "1"}, "subscription_identifier": 4}),
        5,
    )
    assert decode_all(wire2, 5, server=False)[0].properties == {
        "user_properties": [("a", "1")],
        "subscription_identifier": [4],
    }


def test_a_user_property_that_is_not_a_pair_of_strings_is_refused_whatever_its_form() -> None:
    # A list of pairs takes the encoder's fast path, a tuple of them the general loop: both refuse alike.
    for pairs in ([("a", "1"), ("b", 2)], (("a", "1"), ("b", 2)), [("a", "1"), (None, "x")]):
        with pytest.raises(ValueError, match="bad value for property user_properties"):
            encode(Publish("t", b"", properties={"user_properties": pairs}), 5)
    wire = encode(Publish("t", b"", properties={"user_properties": (("a", "1"), ("b", "2"))}), 5)
    assert decode_all(wire, 5)[0].properties == {"user_properties": [("a", "1"), ("b", "2")]}


# --------------------------------------------------------------------------- feeding


def test_partial_and_coalesced_input() -> None:
    pub = encode_publish("x/y", b"z" * 1000, 1, False, False, 5, None, 4)
    dec = MqttDecoder(level=4)
    assert dec.feed(pub[:1]) == []
    assert dec.buffered == 1
    assert dec.feed(pub[1:3]) == []  # two of three length bytes... then more
    assert dec.feed(pub[3:500]) == []
    assert dec.buffered == 500
    # While incomplete, further pieces are only appended.
    assert dec.feed(pub[500:-1]) == []
    assert dec.feed(pub[-1:] + b"\xc0\x00\xc0") == [
        Publish("x/y", b"z" * 1000, 1, False, False, 5),
        Pingreq(),
    ]
    assert dec.buffered == 1
    assert dec.feed(b"\x00") == [Pingreq()]
    assert dec.buffered == 0
    assert dec.feed(b"") == []


def test_feed_accepts_bytearray_and_memoryview() -> None:
    dec = MqttDecoder(level=4)
    assert dec.feed(bytearray(b"\xc0")) == []
    assert dec.feed(memoryview(b"\x00\xc0\x00")) == [Pingreq(), Pingreq()]


def test_payload_is_bytes_whichever_buffer_it_came_from() -> None:
    wire = qos0(b"x" * 600) + qos0(b"yy")
    for cut in (0, 5, len(wire) - 1):
        dec = MqttDecoder(level=4)
        pkts = dec.feed(wire[:cut]) + dec.feed(wire[cut:])
        assert [type(p.payload) for p in pkts] == [bytes, bytes]  # type: ignore[union-attr]


def test_connect_sets_level_for_what_follows() -> None:
    # The PUBLISH after the 5.0 CONNECT has a property block; parsed as 3.1.1 it
    # would yield a different payload.
    pub = Publish("t", b"data", properties={"content_type": "x"})
    wire = connect_bytes(5) + encode(pub, 5)
    dec = MqttDecoder()
    assert dec.level is None
    assert dec.feed(wire)[1] == pub
    assert dec.level == 5


def test_second_connect_is_decoded_and_level_kept() -> None:
    dec = MqttDecoder()
    first = dec.feed(connect_bytes(4))
    assert dec.level == 4
    (second,) = dec.feed(connect_bytes(5, "again"))
    assert isinstance(second, Connect) and second.level == 5
    assert first[0].level == 4  # type: ignore[union-attr]
    assert dec.level == 4


def test_error_carries_packets_completed_before_it() -> None:
    good = encode(Publish("a", b"1"), 4) + encode(Pingreq(), 4)
    err = error_of(good + b"\x00\x00", level=4)
    assert err.reason_code == 0x81
    assert err.packets == [Publish("a", b"1"), Pingreq()]


def test_client_decoder_needs_a_level() -> None:
    with pytest.raises(ValueError):
        MqttDecoder(server=False)
    with pytest.raises(ValueError):
        MqttDecoder(level=6)


# --------------------------------------------------------------------------- errors


def test_remaining_length_too_long() -> None:
    err = error_of(b"\x30\xff\xff\xff\xff\x01", level=4)
    assert (err.reason_code, err.message) == (0x81, "Malformed remaining length")
    # Known bad as soon as the 4th length byte has its continuation bit.
    assert error_of(b"\x30\xff\xff\xff\x80", level=4).reason_code == 0x81
    dec = MqttDecoder(level=4)
    assert dec.feed(b"\x30\xff\xff\xff") == []


def test_packet_too_large_before_the_body_arrives() -> None:
    err = error_of(b"\x30\xe8\x07", level=4, max_packet_size=1002)  # 1003 bytes in all
    assert err.reason_code == 0x95
    ok = qos0(b"x" * (1002 - 3 - 3))
    assert len(ok) == 1002
    dec = MqttDecoder(1002, level=4)
    assert len(dec.feed(ok)) == 1
    dec.max_packet_size = 1001
    assert dec.feed(b"\x30") == []
    with pytest.raises(MqttProtocolError) as info:
        dec.feed(b"\xe8\x07")
    assert info.value.reason_code == 0x95


@pytest.mark.parametrize(
    ("first", "level"),
    [
        (0x11, None),  # CONNECT
        (0x41, 4),  # PUBACK
        (0x51, 4),
        (0x60, 4),  # PUBREL needs 0b0010
        (0x63, 5),
        (0x6A, 4),  # DUP on PUBREL: 3.1 only
        (0x72, 5),
        (0x80, 4),  # SUBSCRIBE
        (0x83, 5),
        (0xA0, 4),  # UNSUBSCRIBE
        (0xAA, 5),
        (0xC1, 4),  # PINGREQ
        (0xE2, 5),  # DISCONNECT
        (0xF1, 5),  # AUTH
        (0x36, 4),  # PUBLISH QoS 3
        (0x3E, 5),
        (0x38, 4),  # PUBLISH DUP at QoS 0
        (0x39, 5),
        (0x00, 4),  # packet type 0
        (0x00, None),
        (0xF0, 4),  # AUTH before 5.0
        (0xF0, 3),
    ],
)
def test_bad_first_byte_is_malformed(first: int, level: int | None) -> None:
    # Rejected on the first byte, without waiting for the rest.
    err = error_of(bytes((first,)), level=level)
    assert err.reason_code == 0x81, err.message


def test_three_one_allows_dup_on_pubrel_subscribe_unsubscribe() -> None:
    assert decode_all(b"\x6a\x02\x00\x01", 3) == [Pubrel(1)]
    wire = b"\x8a\x06\x00\x01\x00\x01a\x01"
    assert decode_all(wire, 3) == [Subscribe(1, [SubscriptionRequest("a", 1)])]
    assert error_of(wire, level=4).reason_code == 0x81


@pytest.mark.parametrize("first", [0x20, 0x90, 0xB0, 0xD0])
def test_server_only_packets_from_a_client(first: int) -> None:
    assert error_of(bytes((first, 0)), level=4).reason_code == 0x82


@pytest.mark.parametrize("first", [0x10, 0x82, 0xA2, 0xC0])
def test_client_only_packets_from_a_server(first: int) -> None:
    assert error_of(bytes((first, 0)), level=5, server=False).reason_code == 0x82


def test_first_packet_must_be_connect() -> None:
    for first in (0x30, 0xC0, 0xE0, 0xF0):
        assert error_of(bytes((first,)), level=None).reason_code == 0x82


@pytest.mark.parametrize(
    ("name", "level"),
    [("MQTX", 4), ("MQTT", 3), ("MQTT", 6), ("MQIsdp", 4), ("MQIsdp", 5), ("", 4), ("mqtt", 4)],
)
def test_unsupported_protocol(name: str, level: int) -> None:
    wire = packet(0x10, s(name) + bytes((level, 2, 0, 60)) + s("c"))
    err = error_of(wire, level=None)
    assert err.reason_code == 0x84
    assert err.connack_return_code == 1
    assert (err.protocol_name, err.protocol_level) == (name, level)


def _connect(flags: int, level: int = 4, payload: bytes | None = None) -> bytes:
    name = PROTOCOL_NAME[level]
    props = b"\x00" if level == 5 else b""
    if payload is None:
        payload = s("c")
    return packet(0x10, s(name) + bytes((level, flags, 0, 60)) + props + payload)


@pytest.mark.parametrize("level", LEVELS)
def test_connect_flag_errors(level: int) -> None:
    will = (b"\x00" if level == 5 else b"") + s("w") + s("p")
    cases = {
        0x03: s("c"),  # reserved bit
        0x0A: s("c"),  # Will QoS 1 without Will
        0x22: s("c"),  # Will Retain without Will
        0x1E: s("c") + will,  # Will QoS 3
    }
    for flags, payload in cases.items():
        err = error_of(_connect(flags, level, payload), level=None)
        assert err.reason_code == 0x81, (hex(flags), err.message)
        assert err.protocol_level == level
    assert decode_all(_connect(0x2E, level, s("c") + will))[0] == Connect(
        PROTOCOL_NAME[level], level, True, 60, "c", will=Will("w", b"p", 1, True)
    )


def test_password_without_username() -> None:
    for level in (3, 4):
        err = error_of(_connect(0x42, level, s("c") + s("pw")), level=None)
        assert err.reason_code == 0x81
    (pkt,) = decode_all(_connect(0x42, 5, s("c") + s("pw")))
    assert pkt.username is None and pkt.password == b"pw"  # type: ignore[union-attr]


def test_connect_truncated_or_trailing() -> None:
    good = _connect(0xC2, 4, s("c") + s("u") + s("p"))
    for cut in range(3, len(good) - 1):
        body = good[2:cut]
        err = error_of(packet(0x10, body), level=None)
        assert err.reason_code in (0x81, 0x84), cut
    assert error_of(packet(0x10, good[2:] + b"x"), level=None).reason_code == 0x81


def test_will_topic_must_be_a_topic_name() -> None:
    for topic, code in (("a/#", 0x90), ("+", 0x90), ("", 0x90), ("a\0", 0x81)):
        err = error_of(_connect(0x06, 4, s("c") + s(topic) + s("p")), level=None)
        assert err.reason_code == code, topic


def test_client_id_rules_are_left_to_the_session() -> None:
    long_id = "x" * 200 + "/+#"
    (pkt,) = decode_all(_connect(0x00, 3, s(long_id)))
    assert pkt.client_id == long_id  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",  # never valid
        b"\xc3\x28",  # bad continuation
        b"\xe2\x82",  # truncated sequence
        b"\xed\xa0\x80",  # UTF-16 surrogate
        b"\xc0\xaf",  # overlong '/'
        b"a\x00b",  # U+0000
    ],
)
def test_invalid_utf8(raw: bytes) -> None:
    topic = len(raw).to_bytes(2, "big") + raw
    err = error_of(packet(0x30, topic + b"payload"), level=4)
    assert err.reason_code == 0x81 and "UTF-8" in err.message
    err = error_of(_connect(0x00, 4, topic), level=None)
    assert err.reason_code == 0x81 and "UTF-8" in err.message
    err = error_of(packet(0x82, b"\x00\x01" + topic + b"\x00"), level=4)
    assert err.reason_code == 0x81 and "UTF-8" in err.message


def test_string_past_the_end_of_the_packet() -> None:
    # The next packet's bytes must not be read as part of this one.
    wire = packet(0x30, b"\x00\x05ab") + b"\xc0\x00\xc0\x00"
    assert error_of(wire, level=4).reason_code == 0x81
    assert error_of(packet(0x30, b"\x00"), level=4).reason_code == 0x81
    assert error_of(packet(0xA2, b"\x00\x01\x00\x09abc"), level=4).reason_code == 0x81


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("topic", ["a/+", "#", "a/#", "+/b", "sport+"])
def test_publish_topic_with_wildcards(level: int, topic: str) -> None:
    wire = encode_publish(topic, b"x", 1, False, False, 1, None, level)
    err = error_of(wire, level=level)
    assert err.reason_code == 0x90


def test_publish_empty_topic() -> None:
    for level in (3, 4):
        assert error_of(qos0(b"x", level, ""), level=level).reason_code == 0x82
    assert error_of(qos0(b"x", 5, ""), level=5).reason_code == 0x82
    wire = qos0(b"x", 5, "", {"topic_alias": 1})
    assert decode_all(wire, 5) == [Publish("", b"x", properties={"topic_alias": 1})]


def test_publish_packet_identifier() -> None:
    for level in LEVELS:
        props = b"\x00" if level == 5 else b""
        zero = packet(0x32, s("t") + b"\x00\x00" + props)
        assert error_of(zero, level=level).reason_code == 0x82
        missing = b"\x32\x04" + s("t") + b"\x00"
        assert error_of(missing, level=level).reason_code == 0x81
    # QoS 0 has no packet identifier: the bytes are payload.
    assert decode_all(b"\x30\x05" + s("t") + b"\x00\x00", 4) == [Publish("t", b"\x00\x00")]


def test_publish_payload_is_not_validated() -> None:
    wire = qos0(b"\xff\x00", 5, "t", {"payload_format_indicator": 1})
    assert decode_all(wire, 5)[0].payload == b"\xff\x00"  # type: ignore[union-attr]


def test_subscribe_errors() -> None:
    pid = b"\x00\x01"
    assert error_of(packet(0x82, pid), level=4).reason_code == 0x82
    assert error_of(packet(0x82, pid + b"\x00"), level=5).reason_code == 0x82
    assert error_of(packet(0x82, b"\x00\x00" + s("a") + b"\x00"), level=4).reason_code == 0x82
    assert error_of(packet(0x82, pid + s("a")), level=4).reason_code == 0x81  # no options byte
    for opts in (0x03, 0x04, 0x08, 0x10, 0x80):
        assert error_of(packet(0x82, pid + s("a") + bytes((opts,))), level=4).reason_code == 0x81
        assert error_of(packet(0x82, pid + s("a") + bytes((opts,))), level=3).reason_code == 0x81
    for opts in (0x03, 0x30, 0x40, 0x80):
        wire = packet(0x82, pid + b"\x00" + s("a") + bytes((opts,)))
        assert error_of(wire, level=5).reason_code == 0x81, hex(opts)
    # Filters come back as given: wildcard placement is the session's business.
    wire = packet(0x82, pid + s("a/#/b") + b"\x01" + s("") + b"\x00")
    assert decode_all(wire, 4) == [
        Subscribe(1, [SubscriptionRequest("a/#/b", 1), SubscriptionRequest("", 0)])
    ]


def test_unsubscribe_errors() -> None:
    assert error_of(packet(0xA2, b"\x00\x01"), level=4).reason_code == 0x82
    assert error_of(packet(0xA2, b"\x00\x01\x00"), level=5).reason_code == 0x82
    assert error_of(packet(0xA2, b"\x00\x00" + s("a")), level=4).reason_code == 0x82
    assert error_of(packet(0xA2, b"\x00"), level=4).reason_code == 0x81


@pytest.mark.parametrize("first", [0x40, 0x50, 0x62, 0x70])
def test_ack_lengths(first: int) -> None:
    assert error_of(bytes((first, 3, 0, 1, 0)), level=4).reason_code == 0x81
    assert error_of(bytes((first, 1, 0)), level=4).reason_code == 0x81
    assert error_of(bytes((first, 1, 0)), level=5).reason_code == 0x81
    assert error_of(bytes((first, 0)), level=5).reason_code == 0x81
    assert error_of(bytes((first, 2, 0, 0)), level=5).reason_code == 0x82  # packet id 0
    # Property length claiming more than is there; trailing bytes.
    assert error_of(bytes((first, 4, 0, 1, 0, 5)), level=5).reason_code == 0x81
    assert error_of(bytes((first, 5, 0, 1, 0, 0, 0)), level=5).reason_code == 0x81


def test_ping_and_three_x_disconnect_must_be_empty() -> None:
    assert error_of(b"\xc0\x01\x00", level=4).reason_code == 0x81
    assert error_of(b"\xd0\x01\x00", level=4, server=False).reason_code == 0x81
    for level in (3, 4):
        assert error_of(b"\xe0\x01\x00", level=level).reason_code == 0x81
    assert error_of(b"\xe0\x03\x00\x05\x00", level=5).reason_code == 0x81


def test_connack_and_suback_errors_client_side() -> None:
    assert error_of(b"\x20\x02\x02\x00", level=4, server=False).reason_code == 0x81
    assert error_of(b"\x20\x03\x00\x00\x00", level=4, server=False).reason_code == 0x81
    assert error_of(b"\x20\x02\x00\x00", level=5, server=False).reason_code == 0x81
    assert decode_all(b"\x20\x02\xff\x01", 3, server=False) == [Connack(False, 1)]
    assert error_of(b"\x90\x03\x00\x01\x03", level=4, server=False).reason_code == 0x81
    assert error_of(b"\x90\x02\x00\x01", level=4, server=False).reason_code == 0x82
    assert error_of(b"\xb0\x03\x00\x01\x00", level=4, server=False).reason_code == 0x81


# --------------------------------------------------------------------------- property errors


def _pub5(props: bytes) -> bytes:
    return packet(0x30, s("t") + encode_variable_byte_integer(len(props)) + props + b"pl")


@pytest.mark.parametrize(
    ("props", "code"),
    [
        (b"\x11\x00\x00\x00\x01", 0x81),  # Session Expiry Interval: not on PUBLISH
        (b"\x7f\x00", 0x81),  # unknown identifier
        (b"\x80\x01\x00", 0x81),  # multi-byte identifier: unknown
        (b"\x00", 0x81),  # identifier 0
        (b"\x03\x00\x01a\x03\x00\x01b", 0x82),  # Content Type twice
        (b"\x23\x00\x01\x23\x00\x02", 0x82),  # Topic Alias twice
        (b"\x01\x02", 0x82),  # Payload Format Indicator 2
        (b"\x23\x00\x00", 0x82),  # Topic Alias 0
        (b"\x0b\x00", 0x82),  # Subscription Identifier 0
        (b"\x0b\x01", 0x82),  # Subscription Identifier from a client
        (b"\x08\x00\x03a/+", 0x82),  # Response Topic with a wildcard
        (b"\x02\x00\x00", 0x81),  # Four Byte Integer cut short
        (b"\x03\x00\x05ab", 0x81),  # string past the property block
        (b"\x0b\xff\xff\xff\xff\x01", 0x81),  # 5-byte Variable Byte Integer
        (b"\x26\x00\x01a", 0x81),  # User Property without a value
        (b"\x03\x00\x01\xff", 0x81),  # bad UTF-8
    ],
)
def test_publish_property_errors(props: bytes, code: int) -> None:
    err = error_of(_pub5(props), level=5)
    assert err.reason_code == code, err.message


def test_properties_longer_than_the_packet() -> None:
    wire = packet(0x30, s("t") + b"\x0a\x01\x01")
    assert error_of(wire, level=5).reason_code == 0x81
    assert error_of(packet(0x30, s("t")), level=5).reason_code == 0x81  # no property length


def test_repeatable_properties() -> None:
    wire = _pub5(b"\x0b\x01\x0b\x02\x26\x00\x01k\x00\x01v\x26\x00\x01k\x00\x00")
    (pkt,) = decode_all(wire, 5, server=False)
    assert pkt.properties == {  # type: ignore[union-attr]
        "subscription_identifier": [1, 2],
        "user_properties": [("k", "v"), ("k", "")],
    }
    # [MQTT-3.3.4-6]: a client must not send them.
    assert error_of(wire, level=5).reason_code == 0x82
    # On SUBSCRIBE the Subscription Identifier is single and an int.
    base = b"\x00\x01"
    wire = packet(0x82, base + b"\x04\x0b\x01\x0b\x02" + s("a") + b"\x00")
    assert error_of(wire, level=5).reason_code == 0x82
    wire = packet(0x82, base + b"\x02\x0b\x05" + s("a") + b"\x00")
    (sub,) = decode_all(wire, 5)
    assert sub.properties == {"subscription_identifier": 5}  # type: ignore[union-attr]
    wire = packet(0x82, base + b"\x02\x0b\x00" + s("a") + b"\x00")
    assert error_of(wire, level=5).reason_code == 0x82


@pytest.mark.parametrize(
    ("props", "code"),
    [
        (b"\x21\x00\x00", 0x82),  # Receive Maximum 0
        (b"\x27\x00\x00\x00\x00", 0x82),  # Maximum Packet Size 0
        (b"\x17\x02", 0x82),  # Request Problem Information 2
        (b"\x19\x05", 0x82),  # Request Response Information 5
        (b"\x11\x00\x00\x00\x01\x11\x00\x00\x00\x02", 0x82),  # twice
        (b"\x23\x00\x01", 0x81),  # Topic Alias: not on CONNECT
        (b"\x18\x00\x00\x00\x01", 0x81),  # Will Delay Interval belongs to the Will
    ],
)
def test_connect_property_errors(props: bytes, code: int) -> None:
    wire = packet(
        0x10,
        s("MQTT") + b"\x05\x02\x00\x3c" + encode_variable_byte_integer(len(props)) + props + s("c"),
    )
    err = error_of(wire, level=None)
    assert err.reason_code == code, err.message
    assert err.protocol_level == 5


def test_will_property_errors() -> None:
    def wire(will_props: bytes) -> bytes:
        return packet(
            0x10,
            s("MQTT")
            + b"\x05\x06\x00\x3c\x00"
            + s("c")
            + bytes((len(will_props),))
            + will_props
            + s("w")
            + s("p"),
        )

    (pkt,) = decode_all(wire(b"\x18\x00\x00\x00\x05"))
    expected = Will("w", b"p", 0, False, {"will_delay_interval": 5})
    assert pkt.will == expected  # type: ignore[union-attr]
    assert error_of(wire(b"\x11\x00\x00\x00\x05"), level=None).reason_code == 0x81
    assert error_of(wire(b"\x01\x07"), level=None).reason_code == 0x82


def test_connack_property_errors() -> None:
    def wire(props: bytes) -> bytes:
        return packet(0x20, b"\x00\x00" + bytes((len(props),)) + props)

    for bad in (b"\x24\x02", b"\x25\x02", b"\x28\x03", b"\x29\x02", b"\x2a\x02", b"\x21\x00\x00"):
        assert error_of(wire(bad), level=5, server=False).reason_code == 0x82, bad
    assert error_of(wire(b"\x17\x01"), level=5, server=False).reason_code == 0x81  # CONNECT-only


# --------------------------------------------------------------------------- encoding


def test_encode_refuses_what_the_wire_cannot_carry() -> None:
    bad: list[tuple[Any, int]] = [
        (Publish("t", b"", 3), 4),
        (Publish("t", b"", 1), 4),  # no packet id
        (Publish("t", b"", 1, packet_id=0), 4),
        (Publish("t", b"", 1, packet_id=65536), 4),
        (Publish("t", b"", 0, dup=True), 4),
        (Publish("t" * 70000, b""), 4),
        (Publish("t", b"", properties={"nope": 1}), 5),
        (Publish("t", b"", properties={"session_expiry_interval": 1}), 5),
        (Publish("t", b"", properties={"topic_alias": 0}), 5),
        (Publish("t", b"", properties={"topic_alias": 70000}), 5),
        (Publish("t", b"", properties={"message_expiry_interval": -1}), 5),
        (Publish("t", b"", properties={"content_type": 5}), 5),
        (Puback(0), 4),
        (Auth(), 4),
        (Subscribe(1, []), 4),
        (Subscribe(1, [SubscriptionRequest("a", 3)]), 4),
        (Subscribe(1, [SubscriptionRequest("a", 1, retain_handling=3)]), 5),
        (Unsubscribe(1, []), 4),
        (Suback(1, []), 4),
        (Connect("MQTT", 4, True, 70000, "c"), 4),
        (Connect("MQTT", 4, True, 0, "c", None, b"pw"), 4),
        (Connect("MQTT", 4, True, 0, "c\0"), 4),
        (Connack(False, 300), 4),
        (Disconnect(), 6),
    ]
    for pkt, level in bad:
        with pytest.raises(ValueError):
            encode(pkt, level)
    with pytest.raises(TypeError):
        encode("PUBLISH", 4)  # type: ignore[arg-type]


def test_publish_parts() -> None:
    props = {"user_properties": [("k", "v")], "content_type": "c"}
    for level in LEVELS:
        for qos in (0, 1, 2):
            payload = b"p" * 200
            prefix, suffix = publish_parts("a/b", payload, qos, True, props, level)
            for pid in (1, 258, 65535):
                pid_bytes = pid.to_bytes(2, "big") if qos else b""
                expected = encode_publish(
                    "a/b", payload, qos, True, False, pid if qos else None, props, level
                )
                assert prefix + pid_bytes + suffix == expected
            if qos:
                prefix, suffix = publish_parts("a/b", payload, qos, True, props, level, dup=True)
                (pkt,) = decode_all(prefix + b"\x00\x07" + suffix, level)
                assert pkt.dup and pkt.packet_id == 7  # type: ignore[union-attr]


def test_reprs() -> None:
    text = repr(Connect("MQTT", 4, True, 60, "c", "u", b"hunter2"))
    assert "hunter2" not in text and "<7 bytes>" in text
    assert "(1000 bytes)" in repr(Publish("t", b"x" * 1000))
    assert repr(Pingreq()) == "Pingreq()"
    assert "0x81" in repr(MqttProtocolError(0x81, "x"))


def test_reason_codes() -> None:
    assert ReasonCode.SUCCESS == ReasonCode.NORMAL_DISCONNECTION == ReasonCode.GRANTED_QOS_0 == 0
    assert ReasonCode.MALFORMED_PACKET == 0x81
    assert ReasonCode.PROTOCOL_ERROR == 0x82
    assert ReasonCode.PACKET_TOO_LARGE == 0x95
    assert ReasonCode.PAYLOAD_FORMAT_INVALID == 0x99
    assert ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED == 0xA2


# --------------------------------------------------------------------------- paho-mqtt


def test_properties_match_paho_encoding() -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    paho = Properties(PacketTypes.PUBLISH)
    paho.PayloadFormatIndicator = 1
    paho.MessageExpiryInterval = 3600
    paho.ContentType = "text/plain"
    paho.ResponseTopic = "reply/to"
    paho.CorrelationData = b"\x01\x02"
    paho.SubscriptionIdentifier = 300
    paho.SubscriptionIdentifier = 2
    paho.TopicAlias = 7
    paho.UserProperty = ("a", "1")
    paho.UserProperty = ("b", "\u00e9")
    block = paho.pack()
    wire = packet(0x30, s("t") + block + b"payload")
    (pkt,) = decode_all(wire, 5, server=False)
    expected = {
        "payload_format_indicator": 1,
        "message_expiry_interval": 3600,
        "content_type": "text/plain",
        "response_topic": "reply/to",
        "correlation_data": b"\x01\x02",
        "subscription_identifier": [300, 2],
        "topic_alias": 7,
        "user_properties": [("a", "1"), ("b", "\u00e9")],
    }
    assert pkt.properties == expected  # type: ignore[union-attr]
    # paho writes properties in identifier order, as does a dict in that order.
    ordered = dict(sorted(expected.items(), key=lambda kv: _IDS[kv[0]]))
    assert encode(Publish("t", b"payload", properties=ordered), 5) == wire
    back = Properties(PacketTypes.PUBLISH)
    back.unpack(bytes(encode(Publish("t", b"", properties=ordered), 5)[5:]))
    assert back.UserProperty == [("a", "1"), ("b", "\u00e9")]
    assert back.SubscriptionIdentifier == [300, 2]


_IDS = {
    "payload_format_indicator": 1,
    "message_expiry_interval": 2,
    "content_type": 3,
    "response_topic": 8,
    "correlation_data": 9,
    "subscription_identifier": 11,
    "topic_alias": 35,
    "user_properties": 38,
}


class _Responder(threading.Thread):
    """A one-connection fake broker: decodes with MqttDecoder, answers with encode."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.received: list[Packet] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(10)
                self._serve(conn)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.sock.close()

    def _serve(self, conn: socket.socket) -> None:
        dec = MqttDecoder()
        while True:
            data = conn.recv(65536)
            if not data:
                return
            for pkt in dec.feed(data):
                self.received.append(pkt)
                level = dec.level
                assert level is not None
                replies: list[Packet] = []
                if isinstance(pkt, Connect):
                    props = {"topic_alias_maximum": 0} if level == 5 else {}
                    replies.append(Connack(False, 0, props))
                elif isinstance(pkt, Subscribe):
                    replies.append(Suback(pkt.packet_id, [r.qos for r in pkt.subscriptions]))
                    # Deliver something back so paho parses our PUBLISH encoding.
                    props = {"user_properties": [("from", "server")], "content_type": "x/y"}
                    replies.append(Publish("down/1", b"to client", 1, False, False, 42, props))
                elif isinstance(pkt, Publish):
                    if pkt.qos == 1:
                        replies.append(Puback(pkt.packet_id))  # type: ignore[arg-type]
                    elif pkt.qos == 2:
                        replies.append(Pubrec(pkt.packet_id))  # type: ignore[arg-type]
                elif isinstance(pkt, Pubrel):
                    replies.append(Pubcomp(pkt.packet_id))
                elif isinstance(pkt, Pingreq):
                    replies.append(Pingresp())
                elif isinstance(pkt, Disconnect):
                    return
                if replies:
                    conn.sendall(b"".join(encode(r, level) for r in replies))


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(5), f"timed out waiting for {what}"


@pytest.mark.parametrize("protocol_level", [3, 4, 5])
def test_decode_what_paho_sends(protocol_level: int) -> None:
    mqtt = pytest.importorskip("paho.mqtt.client")
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.subscribeoptions import SubscribeOptions

    proto = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[protocol_level]
    v5 = protocol_level == 5
    server = _Responder()
    server.start()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-test", protocol=proto)
    connected, subscribed, got_message = threading.Event(), threading.Event(), threading.Event()
    messages: list[Any] = []
    client.on_connect = lambda *a: connected.set()
    client.on_subscribe = lambda *a: subscribed.set()

    def on_message(_client: Any, _userdata: Any, message: Any) -> None:
        messages.append(message)
        got_message.set()

    client.on_message = on_message
    client.username_pw_set("user", "secret")
    will_props = None
    connect_props = None
    pub_props = None
    if v5:
        will_props = Properties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = 30
        connect_props = Properties(PacketTypes.CONNECT)
        connect_props.SessionExpiryInterval = 120
        connect_props.ReceiveMaximum = 10
        connect_props.UserProperty = ("hello", "world")
        pub_props = Properties(PacketTypes.PUBLISH)
        pub_props.ContentType = "application/json"
        pub_props.UserProperty = ("k", "v")
        pub_props.ResponseTopic = "reply/here"
        pub_props.CorrelationData = b"\x00\x01"
        pub_props.MessageExpiryInterval = 60
    client.will_set("will/topic", b"gone", qos=1, retain=True, properties=will_props)
    try:
        client.connect("127.0.0.1", server.port, keepalive=30, properties=connect_props)
        client.loop_start()
        _wait(connected, "CONNACK")
        if v5:
            client.subscribe(
                [
                    ("a/+", SubscribeOptions(qos=1, noLocal=True, retainHandling=1)),
                    ("b/#", SubscribeOptions(qos=2, retainAsPublished=True)),
                ]
            )
        else:
            client.subscribe([("a/+", 1), ("b/#", 2)])
        _wait(subscribed, "SUBACK")
        _wait(got_message, "PUBLISH from the server")
        for qos in (0, 1, 2):
            payload = f"payload {qos}".encode()
            info = client.publish(f"up/{qos}", payload, qos=qos, properties=pub_props)
            info.wait_for_publish(5)
            assert info.is_published()
        client.unsubscribe("a/+")
        client.disconnect()
    finally:
        client.loop_stop()
    server.join(5)
    assert server.error is None, server.error

    # What paho made of our PUBLISH.
    (message,) = messages
    assert (message.topic, message.payload, message.qos) == ("down/1", b"to client", 1)
    if v5:
        assert message.properties.UserProperty == [("from", "server")]
        assert message.properties.ContentType == "x/y"

    received = server.received
    connect = received[0]
    assert isinstance(connect, Connect)
    expected_connect_props = (
        {
            "session_expiry_interval": 120,
            "receive_maximum": 10,
            "user_properties": [("hello", "world")],
        }
        if v5
        else {}
    )
    assert connect == Connect(
        PROTOCOL_NAME[protocol_level],
        protocol_level,
        True,
        30,
        "paho-test",
        "user",
        b"secret",
        Will("will/topic", b"gone", 1, True, {"will_delay_interval": 30} if v5 else {}),
        expected_connect_props,
    )
    kinds = [type(p).__name__ for p in received]
    assert kinds == [
        "Connect",
        "Subscribe",
        "Puback",
        "Publish",
        "Publish",
        "Publish",
        "Pubrel",
        "Unsubscribe",
        "Disconnect",
    ], kinds
    sub = received[1]
    assert isinstance(sub, Subscribe)
    if v5:
        assert sub.subscriptions == [
            SubscriptionRequest("a/+", 1, True, False, 1),
            SubscriptionRequest("b/#", 2, False, True, 0),
        ]
    else:
        assert sub.subscriptions == [SubscriptionRequest("a/+", 1), SubscriptionRequest("b/#", 2)]
    assert received[2] == Puback(42)
    expected_pub_props = (
        {
            "content_type": "application/json",
            "user_properties": [("k", "v")],
            "response_topic": "reply/here",
            "correlation_data": b"\x00\x01",
            "message_expiry_interval": 60,
        }
        if v5
        else {}
    )
    for qos, pub in zip((0, 1, 2), received[3:6]):
        assert isinstance(pub, Publish)
        assert (pub.topic, pub.payload, pub.qos, pub.retain, pub.dup) == (
            f"up/{qos}",
            f"payload {qos}".encode(),
            qos,
            False,
            False,
        )
        assert (pub.packet_id is None) == (qos == 0)
        assert pub.properties == expected_pub_props
    assert received[6] == Pubrel(received[5].packet_id)  # type: ignore[union-attr]
    unsub = received[7]
    assert isinstance(unsub, Unsubscribe) and unsub.topic_filters == ["a/+"]
    assert received[8] == Disconnect()


# --------------------------------------------------------------------------- hypothesis

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
_topic = _text.filter(lambda t: t and "+" not in t and "#" not in t)
_pid = st.integers(1, 65535)
_u16 = st.integers(0, 65535)
_u32 = st.integers(0, 0xFFFFFFFF)
_flag = st.integers(0, 1)
_pairs = st.lists(st.tuples(_text, _text), min_size=1, max_size=3)

_PROP_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": _flag,
    "message_expiry_interval": _u32,
    "content_type": _text,
    "response_topic": _topic,
    "correlation_data": st.binary(max_size=8),
    "session_expiry_interval": _u32,
    "assigned_client_identifier": _text,
    "server_keep_alive": _u16,
    "authentication_method": _text,
    "authentication_data": st.binary(max_size=8),
    "request_problem_information": _flag,
    "will_delay_interval": _u32,
    "request_response_information": _flag,
    "response_information": _text,
    "server_reference": _text,
    "reason_string": _text,
    "receive_maximum": st.integers(1, 65535),
    "topic_alias_maximum": _u16,
    "topic_alias": st.integers(1, 65535),
    "maximum_qos": _flag,
    "retain_available": _flag,
    "user_properties": _pairs,
    "maximum_packet_size": st.integers(1, 0xFFFFFFFF),
    "wildcard_subscription_available": _flag,
    "subscription_identifier_available": _flag,
    "shared_subscription_available": _flag,
}
_MSG_PROPS = [
    "payload_format_indicator",
    "message_expiry_interval",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_properties",
]
_ALLOWED = {
    "connect": [
        "session_expiry_interval",
        "authentication_method",
        "authentication_data",
        "request_problem_information",
        "request_response_information",
        "receive_maximum",
        "topic_alias_maximum",
        "user_properties",
        "maximum_packet_size",
    ],
    "will": _MSG_PROPS + ["will_delay_interval"],
    "connack": list(ALL_CONNACK_PROPS),
    "publish": _MSG_PROPS + ["topic_alias"],
    "publish_down": _MSG_PROPS + ["topic_alias"],
    "ack": ["reason_string", "user_properties"],
    "subscribe": ["user_properties"],
    "unsubscribe": ["user_properties"],
    "disconnect": [
        "session_expiry_interval",
        "reason_string",
        "user_properties",
        "server_reference",
    ],
    "auth": ["authentication_method", "authentication_data", "reason_string", "user_properties"],
}


def _props(level: int, kind: str) -> st.SearchStrategy[dict[str, Any]]:
    if level != 5:
        return st.just({})
    optional = {name: _PROP_VALUES[name] for name in _ALLOWED[kind]}
    if kind == "publish_down":
        ids = st.lists(st.integers(1, 268435455), min_size=1, max_size=3)
        optional["subscription_identifier"] = ids
    if kind == "subscribe":
        optional["subscription_identifier"] = st.integers(1, 268435455)
    return st.fixed_dictionaries({}, optional=optional)  # type: ignore[arg-type]


def _reason(level: int) -> st.SearchStrategy[int]:
    return st.integers(0, 255) if level == 5 else st.just(0)


def _publish(level: int, from_server: bool) -> st.SearchStrategy[Publish]:
    @st.composite
    def build(draw: Callable[..., Any]) -> Publish:
        qos = draw(st.integers(0, 2))
        return Publish(
            draw(_topic),
            draw(st.binary(max_size=300)),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) if qos else False,
            draw(_pid) if qos else None,
            draw(_props(level, "publish_down" if from_server else "publish")),
        )

    return build()


def _acks(level: int) -> list[st.SearchStrategy[Any]]:
    return [
        st.builds(cls, _pid, _reason(level), _props(level, "ack"))
        for cls in (Puback, Pubrec, Pubrel, Pubcomp)
    ]


def _client_packet(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == 5
    sub_request = st.builds(
        SubscriptionRequest,
        _text,
        st.integers(0, 2),
        st.booleans() if v5 else st.just(False),
        st.booleans() if v5 else st.just(False),
        st.integers(0, 2) if v5 else st.just(0),
    )
    options = [
        _publish(level, False),
        *_acks(level),
        st.builds(
            Subscribe,
            _pid,
            st.lists(sub_request, min_size=1, max_size=4),
            _props(level, "subscribe"),
        ),
        st.builds(
            Unsubscribe,
            _pid,
            st.lists(_text, min_size=1, max_size=4),
            _props(level, "unsubscribe"),
        ),
        st.just(Pingreq()),
        st.builds(Disconnect, _reason(level), _props(level, "disconnect")),
    ]
    if v5:
        options.append(st.builds(Auth, _reason(level), _props(level, "auth")))
    return st.one_of(options)


def _server_packet(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == 5
    codes = st.lists(
        st.integers(0, 255) if v5 else st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=5
    )
    options = [
        st.builds(
            Connack,
            st.booleans() if level != 3 else st.just(False),
            st.integers(0, 255),
            _props(level, "connack"),
        ),
        _publish(level, True),
        *_acks(level),
        st.builds(Suback, _pid, codes, _props(level, "ack")),
        st.builds(
            Unsuback,
            _pid,
            st.lists(st.integers(0, 255), min_size=1, max_size=5) if v5 else st.just([]),
            _props(level, "ack"),
        ),
        st.just(Pingresp()),
        st.builds(Disconnect, _reason(level), _props(level, "disconnect")),
    ]
    if v5:
        options.append(st.builds(Auth, _reason(level), _props(level, "auth")))
    return st.one_of(options)


def _connect_packet(level: int) -> st.SearchStrategy[Connect]:
    @st.composite
    def build(draw: Callable[..., Any]) -> Connect:
        will = None
        if draw(st.booleans()):
            will = Will(
                draw(_topic),
                draw(st.binary(max_size=20)),
                draw(st.integers(0, 2)),
                draw(st.booleans()),
                draw(_props(level, "will")),
            )
        username = draw(st.none() | _text)
        password = draw(st.none() | st.binary(max_size=10))
        if username is None and level != 5:
            password = None
        return Connect(
            PROTOCOL_NAME[level],
            level,
            draw(st.booleans()),
            draw(_u16),
            draw(_text),
            username,
            password,
            will,
            draw(_props(level, "connect")),
        )

    return build()


def _split(draw: Callable[..., Any], data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), level=st.sampled_from(LEVELS))
def test_random_client_streams_round_trip_through_random_splits(data: Any, level: int) -> None:
    packets: list[Packet] = [data.draw(_connect_packet(level))]
    packets += data.draw(st.lists(_client_packet(level), max_size=5))
    wire = b"".join(encode(p, level) for p in packets)
    dec = MqttDecoder()
    out: list[Packet] = []
    for chunk in _split(data.draw, wire):
        out += dec.feed(chunk)
    assert out == packets
    assert dec.buffered == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), level=st.sampled_from(LEVELS))
def test_random_server_streams_round_trip_through_random_splits(data: Any, level: int) -> None:
    packets = data.draw(st.lists(_server_packet(level), min_size=1, max_size=5))
    wire = b"".join(encode(p, level) for p in packets)
    dec = MqttDecoder(level=level, server=False)
    out: list[Packet] = []
    for chunk in _split(data.draw, wire):
        out += dec.feed(chunk)
    assert out == packets
    assert dec.buffered == 0


def _feed_checked(dec: MqttDecoder, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            packets = dec.feed(chunk)
            for pkt in packets:
                # Whatever decodes can be re-encoded.
                encode(pkt, pkt.level if isinstance(pkt, Connect) else dec.level or 5)
    except MqttProtocolError as exc:
        assert 0x81 <= exc.reason_code <= 0xA2
        assert isinstance(exc.packets, list)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.binary(max_size=120),
    level=st.sampled_from([None, 3, 4, 5]),
    server=st.booleans(),
    prefix=st.booleans(),
)
def test_random_bytes_only_raise_protocol_errors(
    raw: bytes, level: int | None, server: bool, prefix: bool
) -> None:
    if level is None:
        server = True
    dec = MqttDecoder(200, level=level, server=server)
    head = connect_bytes(level or 5) if prefix and server and level is None else b""
    _feed_checked(dec, [head + raw])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), level=st.sampled_from(LEVELS), server=st.booleans())
def test_mutated_packets_only_raise_protocol_errors(data: Any, level: int, server: bool) -> None:
    strategy = _client_packet(level) if server else _server_packet(level)
    wire = bytearray(encode(data.draw(strategy), level))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del wire[data.draw(st.integers(0, len(wire) - 1)) :]
    dec = MqttDecoder(level=level, server=server)
    _feed_checked(dec, _split(data.draw, bytes(wire)))
