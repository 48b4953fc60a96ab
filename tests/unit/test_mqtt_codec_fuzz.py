"""Fuzzing the sans-IO MQTT codec (protocols.mqtt.codec) with Hypothesis.

For MQTT 3.1 (level 3), 3.1.1 (4) and 5.0 (5), both directions:

* every packet the encoder can write (all types, 5.0 properties) decodes to
  itself, however the stream is cut into reads;
* generated packets after random edits, and random bytes, only ever give
  packets or ``MqttProtocolError`` with an MQTT 5 error reason code; what
  decodes can be encoded again and means the same; chunking never changes the
  outcome;
* remaining lengths (Variable Byte Integers) decode exactly, at every
  boundary, and a packet over the configured maximum is refused from its fixed
  header alone, before its body is buffered.

The example budget scales with ``FUZZ_EXAMPLES`` (see ``tests/fuzzing.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from protocols.mqtt.codec import (
    MAX_PACKET_SIZE,
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
    encode_variable_byte_integer,
)
from tests.fuzzing import fuzz_settings, mutate, split, timeout_mark

pytestmark = timeout_mark()

LEVELS = (3, 4, 5)
PROTOCOL_NAME = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
ERROR_REASONS = frozenset(code.value for code in ReasonCode if code.value >= 0x80)
FROM_CLIENT = (Connect, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Unsubscribe, Pingreq, Disconnect, Auth)
FROM_SERVER = (Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Suback, Unsuback, Pingresp, Disconnect, Auth)

# --------------------------------------------------------------------------- generated packets

# MQTT strings: UTF-8 without U+0000; mostly ASCII so that edits reach more than the UTF-8 check.
_char = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from("/+#$\n"),
    st.characters(codec="utf-8", exclude_characters="\x00"),
)
_text = st.text(_char, max_size=12)
_level_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00/+#"), max_size=6)
_topic = st.lists(_level_text, min_size=1, max_size=4).map(lambda levels: "/".join(levels) or "t")
_filter = st.lists(_level_text | st.sampled_from(["+", "#"]), min_size=1, max_size=4).map("/".join)
_pid = st.integers(1, 65535)
_u16 = st.integers(0, 65535)
_u32 = st.integers(0, 0xFFFFFFFF)
_flag = st.integers(0, 1)
_vbi = st.sampled_from([1, 127, 128, 16383, 16384, 2097151, 2097152, MAX_PACKET_SIZE]) | st.integers(
    1, MAX_PACKET_SIZE
)

_PROP_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": _flag,
    "message_expiry_interval": _u32,
    "content_type": _text,
    "response_topic": _topic,
    "correlation_data": st.binary(max_size=10),
    "session_expiry_interval": _u32,
    "assigned_client_identifier": _text,
    "server_keep_alive": _u16,
    "authentication_method": _text,
    "authentication_data": st.binary(max_size=10),
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
    "user_properties": st.lists(st.tuples(_text, _text), min_size=1, max_size=3),
    "maximum_packet_size": st.integers(1, 0xFFFFFFFF),
    "wildcard_subscription_available": _flag,
    "subscription_identifier_available": _flag,
    "shared_subscription_available": _flag,
}
_MESSAGE = [
    "payload_format_indicator",
    "message_expiry_interval",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_properties",
]
# Which properties each packet may carry (MQTT 5.0 table 2-4).
_ALLOWED: dict[str, list[str]] = {
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
    "will": [*_MESSAGE, "will_delay_interval"],
    "connack": [
        "session_expiry_interval",
        "assigned_client_identifier",
        "server_keep_alive",
        "authentication_method",
        "authentication_data",
        "response_information",
        "server_reference",
        "reason_string",
        "receive_maximum",
        "topic_alias_maximum",
        "maximum_qos",
        "retain_available",
        "user_properties",
        "maximum_packet_size",
        "wildcard_subscription_available",
        "subscription_identifier_available",
        "shared_subscription_available",
    ],
    "publish": [*_MESSAGE, "topic_alias"],
    "ack": ["reason_string", "user_properties"],
    "subscribe": ["user_properties"],
    "unsubscribe": ["user_properties"],
    "disconnect": ["session_expiry_interval", "reason_string", "user_properties", "server_reference"],
    "auth": ["authentication_method", "authentication_data", "reason_string", "user_properties"],
}


def props(level: int, kind: str, from_server: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """A 5.0 property set valid for ``kind``; always empty below 5.0."""
    if level != 5:
        return st.just({})
    optional = {name: _PROP_VALUES[name] for name in _ALLOWED[kind]}
    if kind == "publish" and from_server:
        # Only a server attaches them, one per matching subscription.
        optional["subscription_identifier"] = st.lists(_vbi, min_size=1, max_size=3)
    if kind == "subscribe":
        optional["subscription_identifier"] = _vbi
    return st.fixed_dictionaries({}, optional=optional)  # type: ignore[arg-type]


def _reason(level: int) -> st.SearchStrategy[int]:
    return st.integers(0, 255) if level == 5 else st.just(0)


def _payload(max_size: int) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size) | st.text(max_size=max_size).map(str.encode)


@st.composite
def connect_packet(draw: Callable[..., Any], level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(_topic), draw(_payload(20)), draw(st.integers(0, 2)), draw(st.booleans()), draw(props(level, "will"))
        )
    username = draw(st.none() | _text)
    password = draw(st.none() | st.binary(max_size=10))
    if username is None and level != 5:
        password = None  # 3.x: no password without a user name
    return Connect(
        PROTOCOL_NAME[level],
        level,
        draw(st.booleans()),
        draw(_u16),
        draw(_text),
        username,
        password,
        will,
        draw(props(level, "connect")),
    )


@st.composite
def publish_packet(draw: Callable[..., Any], level: int, from_server: bool, max_payload: int = 64) -> Publish:
    qos = draw(st.integers(0, 2))
    properties = draw(props(level, "publish", from_server))
    # 5.0 may send an empty topic with a Topic Alias.
    topic = "" if "topic_alias" in properties and draw(st.booleans()) else draw(_topic)
    return Publish(
        topic,
        draw(_payload(max_payload)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(_pid) if qos else None,
        properties,
    )


def _acks(level: int) -> list[st.SearchStrategy[Packet]]:
    return [st.builds(cls, _pid, _reason(level), props(level, "ack")) for cls in (Puback, Pubrec, Pubrel, Pubcomp)]


def client_packet(level: int, max_payload: int = 64) -> st.SearchStrategy[Packet]:
    """Anything a client sends after CONNECT."""
    v5 = level == 5
    request = st.builds(
        SubscriptionRequest,
        _filter,
        st.integers(0, 2),
        st.booleans() if v5 else st.just(False),
        st.booleans() if v5 else st.just(False),
        st.integers(0, 2) if v5 else st.just(0),
    )
    options: list[st.SearchStrategy[Packet]] = [
        publish_packet(level, False, max_payload),
        *_acks(level),
        st.builds(Subscribe, _pid, st.lists(request, min_size=1, max_size=4), props(level, "subscribe")),
        st.builds(Unsubscribe, _pid, st.lists(_filter, min_size=1, max_size=4), props(level, "unsubscribe")),
        st.just(Pingreq()),
        st.builds(Disconnect, _reason(level), props(level, "disconnect")),
    ]
    if v5:
        options.append(st.builds(Auth, _reason(level), props(level, "auth")))
    return st.one_of(options)


def server_packet(level: int, max_payload: int = 64) -> st.SearchStrategy[Packet]:
    """Anything a server sends."""
    v5 = level == 5
    codes = st.lists(st.integers(0, 255) if v5 else st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=5)
    options: list[st.SearchStrategy[Packet]] = [
        st.builds(Connack, st.booleans() if level != 3 else st.just(False), st.integers(0, 255), props(level, "connack")),
        publish_packet(level, True, max_payload),
        *_acks(level),
        st.builds(Suback, _pid, codes, props(level, "ack")),
        st.builds(
            Unsuback,
            _pid,
            st.lists(st.integers(0, 255), min_size=1, max_size=5) if v5 else st.just([]),
            props(level, "ack"),
        ),
        st.just(Pingresp()),
        st.builds(Disconnect, _reason(level), props(level, "disconnect")),
    ]
    if v5:
        options.append(st.builds(Auth, _reason(level), props(level, "auth")))
    return st.one_of(options)


@dataclass
class GenStream:
    """Packets of one level in one direction, their bytes, and how to decode them."""

    level: int
    server: bool  # True: client packets, read by the broker's decoder
    packets: list[Packet]
    wire: bytes

    def decoder(self, max_packet_size: int = MAX_PACKET_SIZE) -> MqttDecoder:
        # The broker's decoder learns the level from CONNECT; a client's knows it.
        if self.server:
            return MqttDecoder(max_packet_size, level=None, server=True)
        return MqttDecoder(max_packet_size, level=self.level, server=False)


@st.composite
def gen_stream(draw: Callable[..., Any], max_packets: int = 5, max_payload: int = 64) -> GenStream:
    level = draw(st.sampled_from(LEVELS))
    server = draw(st.booleans())
    if server:
        packets: list[Packet] = [draw(connect_packet(level))]
        packets += draw(st.lists(client_packet(level, max_payload), max_size=max_packets))
    else:
        packets = draw(st.lists(server_packet(level, max_payload), min_size=1, max_size=max_packets))
    return GenStream(level, server, packets, b"".join(encode(p, level) for p in packets))


# --------------------------------------------------------------------------- driving the decoder


@dataclass
class Outcome:
    """Everything a session could observe from feeding one byte stream."""

    packets: list[Packet] = field(default_factory=list)
    error: MqttProtocolError | None = None
    buffered: int = 0
    level: int | None = None

    def same_as(self, other: "Outcome") -> bool:
        return (
            self.packets == other.packets
            and (self.error is None) == (other.error is None)
            and (self.error is None or self.error.reason_code == other.error.reason_code)  # type: ignore[union-attr]
            and (self.error is not None or self.buffered == other.buffered)
        )


def feed_all(dec: MqttDecoder, chunks: list[bytes]) -> Outcome:
    """Feed ``chunks``; anything but an MqttProtocolError escapes and fails the test."""
    out = Outcome()
    try:
        for chunk in chunks:
            out.packets += dec.feed(chunk)
    except MqttProtocolError as exc:
        out.packets += exc.packets
        out.error = exc
    else:
        out.buffered = dec.buffered
    out.level = dec.level
    return out


def check_outcome(out: Outcome, server: bool, max_packet_size: int) -> None:
    """What any decoded input must look like to a session."""
    allowed = FROM_CLIENT if server else FROM_SERVER
    for packet in out.packets:
        assert isinstance(packet, allowed), packet
        if isinstance(packet, Connect):
            level = packet.level
            again = MqttDecoder(server=True)
        else:
            level = out.level  # type: ignore[assignment]
            assert level in LEVELS, (level, packet)
            again = MqttDecoder(level=level, server=server)
        # What decodes can be sent on as it is: it encodes, and means the same again.
        assert again.feed(encode(packet, level)) == [packet]
    if out.error is not None:
        event(f"error 0x{out.error.reason_code:02X}")  # shown by --hypothesis-show-statistics
        assert out.error.reason_code in ERROR_REASONS, out.error
        assert isinstance(out.error.message, str) and out.error.message
    else:
        event("packets only" if not out.buffered else "packets and an incomplete packet")
        # An incomplete packet is never held past the limit.
        assert 0 <= out.buffered <= max_packet_size


# --------------------------------------------------------------------------- valid input


@fuzz_settings(200)
@given(stream=gen_stream(max_payload=300))
def test_generated_packets_round_trip(stream: GenStream) -> None:
    """Every packet of every level and direction decodes to itself, and re-encodes to the same bytes."""
    out = feed_all(stream.decoder(), [stream.wire])
    assert out.error is None, out.error
    assert out.packets == stream.packets
    assert out.buffered == 0
    assert b"".join(encode(p, stream.level) for p in out.packets) == stream.wire


@fuzz_settings(50)
@given(stream=gen_stream(max_packets=3, max_payload=8))
def test_valid_stream_cut_at_any_single_point_decodes_the_same(stream: GenStream) -> None:
    for cut in range(len(stream.wire) + 1):
        out = feed_all(stream.decoder(), [stream.wire[:cut], stream.wire[cut:]])
        assert out.error is None, (cut, out.error)
        assert out.packets == stream.packets, cut
        assert out.buffered == 0, cut


@fuzz_settings(100)
@given(stream=gen_stream(max_packets=6, max_payload=600), data=st.data())
def test_valid_stream_in_random_chunks_decodes_the_same(stream: GenStream, data: st.DataObject) -> None:
    out = feed_all(stream.decoder(), split(data.draw, stream.wire, max_cuts=12))
    assert out.error is None, out.error
    assert out.packets == stream.packets
    assert out.buffered == 0


@fuzz_settings(30)
@given(stream=gen_stream(max_packets=3, max_payload=8))
def test_valid_stream_byte_by_byte_decodes_the_same(stream: GenStream) -> None:
    wire = stream.wire
    out = feed_all(stream.decoder(), [wire[i : i + 1] for i in range(len(wire))])
    assert out.error is None, out.error
    assert out.packets == stream.packets
    assert out.buffered == 0


# --------------------------------------------------------------------------- remaining length


def _fixed_header(packet: bytes) -> bytes:
    """The first byte and the remaining length of an encoded packet."""
    i = 1
    while packet[i] & 0x80:
        i += 1
    return packet[: i + 1]


@fuzz_settings(200)
@given(value=st.sampled_from([0, 127, 128, 16383, 16384, 2097151, 2097152, MAX_PACKET_SIZE]) | st.integers(0, MAX_PACKET_SIZE))
def test_remaining_length_decodes_to_the_value_that_was_encoded(value: int) -> None:
    """The decoder reads exactly the remaining length that was written, at every width.

    Observed through the size limit: a PINGREQ header announcing ``value`` is
    accepted (a body is awaited, or for 0 the PINGREQ is complete) with a limit
    of exactly its total size, and refused with 0x95 one byte below, fed whole
    or one byte at a time.
    """
    vbi = encode_variable_byte_integer(value)
    assert len(vbi) == 1 + (value > 127) + (value > 16383) + (value > 2097151)
    header = b"\xc0" + vbi
    total = len(header) + value
    for chunks in ([header], [header[i : i + 1] for i in range(len(header))]):
        dec = MqttDecoder(total, level=4)
        out = feed_all(dec, chunks)
        assert out.error is None, out.error
        assert (out.packets, out.buffered) == (([Pingreq()], 0) if value == 0 else ([], len(header)))
        refused = feed_all(MqttDecoder(total - 1, level=4), chunks)
        assert refused.error is not None and refused.error.reason_code == ReasonCode.PACKET_TOO_LARGE


@pytest.mark.parametrize("value", [-1, MAX_PACKET_SIZE + 1, 2**32])
def test_values_a_variable_byte_integer_cannot_hold_are_refused(value: int) -> None:
    with pytest.raises(ValueError):
        encode_variable_byte_integer(value)


@fuzz_settings(50)
@given(
    continuation=st.lists(st.integers(0x80, 0xFF), min_size=4, max_size=4),
    tail=st.binary(max_size=4),
    level=st.sampled_from(LEVELS),
    bytewise=st.booleans(),
)
def test_a_five_byte_remaining_length_is_malformed(
    continuation: list[int], tail: bytes, level: int, bytewise: bool
) -> None:
    """Four continuation bytes can only be followed by a fifth: Malformed Packet, not a wait."""
    wire = b"\x30" + bytes(continuation) + b"\x01" + tail
    chunks = [wire[i : i + 1] for i in range(len(wire))] if bytewise else [wire]
    out = feed_all(MqttDecoder(level=level), chunks)
    assert out.error is not None and out.error.reason_code == ReasonCode.MALFORMED_PACKET


@pytest.mark.parametrize("remaining", [4, 127, 128, 16383, 16384, 2097151, 2097152])
@pytest.mark.parametrize("level", LEVELS)
def test_publish_at_every_remaining_length_width(remaining: int, level: int) -> None:
    """A PUBLISH whose remaining length sits on each side of each VBI width boundary."""
    overhead = 2 + 1 + (1 if level == 5 else 0)  # topic length, topic "t", property length
    packet = Publish("t", b"\xa5" * (remaining - overhead), 0, False, False, None, {})
    wire = encode(packet, level)
    assert wire[1:].startswith(encode_variable_byte_integer(remaining))
    assert feed_all(MqttDecoder(level=level), [wire]).packets == [packet]
    half = len(wire) // 2
    assert feed_all(MqttDecoder(level=level), [wire[:3], wire[3:half], wire[half:]]).packets == [packet]


@fuzz_settings(100)
@given(ident=_vbi, data=st.data())
def test_subscription_identifiers_round_trip_at_every_width(ident: int, data: st.DataObject) -> None:
    """Subscription identifiers are the Variable Byte Integers inside (5.0) properties."""
    sub = Subscribe(7, [SubscriptionRequest("a/#", 1)], {"subscription_identifier": ident})
    pub = Publish("a/b", b"x", 1, False, False, 9, {"subscription_identifier": [ident, 1]})
    up = MqttDecoder(level=5, server=True)
    assert feed_all(up, split(data.draw, encode(sub, 5))).packets == [sub]
    down = MqttDecoder(level=5, server=False)
    assert feed_all(down, split(data.draw, encode(pub, 5))).packets == [pub]


@fuzz_settings(150)
@given(stream=gen_stream(max_packets=1, max_payload=400), data=st.data())
def test_a_packet_over_the_maximum_is_refused_from_its_fixed_header(stream: GenStream, data: st.DataObject) -> None:
    """A packet larger than ``max_packet_size`` is refused with 0x95 before its body is buffered;
    one that fits is decoded."""
    last = stream.packets[-1]
    packet = encode(last, stream.level)
    prefix = stream.wire[: len(stream.wire) - len(packet)]  # the CONNECT, for the broker's decoder
    low = max(2, len(prefix))  # the CONNECT before it must fit
    limit = data.draw(st.integers(low, max(low, len(packet) + 8)) | st.just(max(low, len(packet))))
    dec = stream.decoder(limit)
    assert feed_all(dec, [prefix]).error is None
    if len(packet) > limit:
        out = feed_all(dec, [_fixed_header(packet)])
        assert out.error is not None and out.error.reason_code == ReasonCode.PACKET_TOO_LARGE, out
        assert out.packets == []
    else:
        out = feed_all(dec, split(data.draw, packet))
        assert out.error is None, out.error
        assert out.packets == [last]


# --------------------------------------------------------------------------- hostile input


@fuzz_settings(300)
@given(stream=gen_stream(max_packets=4, max_payload=48), limit=st.sampled_from([MAX_PACKET_SIZE, 64]), data=st.data())
def test_mutated_packets_give_packets_or_a_protocol_error_however_they_are_cut(
    stream: GenStream, limit: int, data: st.DataObject
) -> None:
    """Flipped, cut, duplicated or spliced bytes: packets or MqttProtocolError, never another
    exception; what decodes is valid, and chunking does not change the outcome."""
    wire = data.draw(mutate(stream.wire))
    whole = feed_all(stream.decoder(limit), [wire])
    check_outcome(whole, stream.server, limit)
    chunked = feed_all(stream.decoder(limit), split(data.draw, wire))
    check_outcome(chunked, stream.server, limit)
    assert chunked.same_as(whole), (whole, chunked)


def _connect_prefix(level: int | None) -> bytes:
    if level is None:
        return b""
    return encode(Connect(PROTOCOL_NAME[level], level, True, 60, "fuzz"), level)


@fuzz_settings(300)
@given(
    raw=st.binary(max_size=160),
    level=st.sampled_from([None, 3, 4, 5]),
    server=st.booleans(),
    limit=st.sampled_from([MAX_PACKET_SIZE, 64]),
    data=st.data(),
)
@example(raw=b"\x30\xff\xff\xff\x7f", level=4, server=True, limit=MAX_PACKET_SIZE, data=None)
@example(raw=b"\x10\xff\xff\xff\x7f", level=None, server=True, limit=MAX_PACKET_SIZE, data=None)
def test_random_bytes_give_packets_or_a_protocol_error_however_they_are_cut(
    raw: bytes, level: int | None, server: bool, limit: int, data: st.DataObject | None
) -> None:
    """Random bytes to the broker's decoder (after a CONNECT of ``level``, or as the first
    bytes for None) or to a client's decoder of ``level``."""
    if level is None:
        server = True
    prefix = _connect_prefix(level) if server else b""
    wire = prefix + raw

    def decoder() -> MqttDecoder:
        return MqttDecoder(limit, level=None if server else level, server=server)

    whole = feed_all(decoder(), [wire])
    check_outcome(whole, server, limit)
    if data is not None:
        chunked = feed_all(decoder(), split(data.draw, wire))
        check_outcome(chunked, server, limit)
        assert chunked.same_as(whole), (whole, chunked)
