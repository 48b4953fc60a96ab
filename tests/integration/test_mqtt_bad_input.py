"""Bad MQTT input over a real socket: 3.1.1 gets a plain close, 5.0 a DISCONNECT with the
right reason code first; either way nobody else is hurt.

Every case runs against a broker with a 1024-byte packet limit that already holds
a QoS 1 message for an offline persistent session.  After the bad client is thrown
out, that message must still be delivered and a fresh client must still be able to
publish and receive.
"""
from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from protocols.mqtt import codec as mq
from protocols.mqtt.codec import encode_variable_byte_integer
from tests.support import BrokerHandle, RawMqtt, make_config, mqtt_close, mqtt_connect, wait_until

MAX_PACKET = 1024

MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
TOPIC_NAME_INVALID = 0x90
PACKET_TOO_LARGE = 0x95


# -- raw packet building ---------------------------------------------------------


def packet(b0: int, body: bytes) -> bytes:
    return bytes([b0]) + encode_variable_byte_integer(len(body)) + body


def s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("!H", len(data)) + data


def no_props(level: int) -> bytes:
    return b"\x00" if level == 5 else b""


def publish_bytes(level: int, topic: str | bytes, payload: bytes = b"p", qos: int = 0, packet_id: int = 1) -> bytes:
    pid = struct.pack("!H", packet_id) if qos else b""
    return packet(0x30 | qos << 1, s(topic) + pid + no_props(level) + payload)


def connect_bytes(level: int, client_id: str) -> bytes:
    return mq.encode(mq.Connect("MQTT", level, True, 60, client_id), level)


# -- the broker under attack and what must survive ---------------------------------


def detached(handle: BrokerHandle, client_id: str) -> bool:
    def check() -> bool:
        client = handle.gateway.mqtt_hub.clients.get(client_id)
        return client is not None and client.live is None
    return handle.inspect(check)


@pytest.fixture
def small(tmp_path: Any) -> Iterator[BrokerHandle]:
    """A broker with max_packet_size=1024 holding one QoS 1 message for the offline session 'keeper'."""
    config = make_config(tmp_path)
    config.mqtt_settings.max_packet_size = MAX_PACKET
    handle = BrokerHandle(config)
    keeper, got = mqtt_connect(handle, "keeper", version=4, clean=False)
    keeper.subscribe("keep/t", 1)
    got.wait_for(1, what="subacks")
    mqtt_close(keeper)
    wait_until(lambda: detached(handle, "keeper"), what="keeper offline")
    pub, _ = mqtt_connect(handle, "keep-pub", version=4)
    info = pub.publish("keep/t", b"kept", 1)
    info.wait_for_publish(5)
    mqtt_close(pub)
    yield handle
    handle.stop()


def assert_still_serving(handle: BrokerHandle) -> None:
    """A fresh client can publish and receive, and the stored message is still delivered."""
    probe, got = mqtt_connect(handle, "probe", version=4)
    try:
        probe.subscribe("probe/t", 1)
        got.wait_for(1, what="subacks")
        probe.publish("probe/t", b"ping", 1)
        (message,) = got.wait_for(1)
        assert message.payload == b"ping"
    finally:
        mqtt_close(probe)
    keeper, got = mqtt_connect(handle, "keeper", version=4, clean=False)
    try:
        assert got.connacks[0][0].session_present
        (message,) = got.wait_for(1)
        assert (message.payload, message.qos) == (b"kept", 1)
    finally:
        mqtt_close(keeper)


def connected(handle: BrokerHandle, level: int, client_id: str = "bad") -> RawMqtt:
    r = RawMqtt(handle, level=level)
    connack = r.connect(client_id)
    assert isinstance(connack, mq.Connack) and connack.reason_code == 0, connack
    return r


def expect_rejection(r: RawMqtt, level: int, reason: int) -> None:
    """5.0: DISCONNECT with ``reason`` then a close; 3.1.1: a close and nothing else."""
    if level == 5:
        reply = r.read()
        assert isinstance(reply, mq.Disconnect), reply
        assert reply.reason_code == reason, f"expected 0x{reason:02X}, got 0x{reply.reason_code:02X} {reply.properties}"
        assert reply.properties.get("reason_string")
    assert r.closed_by_peer(), "the broker kept the connection open"
    assert r.packets == [], f"unexpected packets before the close: {r.packets}"


# -- the cases ----------------------------------------------------------------------------

CASES: dict[str, tuple[Callable[[int], bytes], int]] = {
    # name: (bytes sent after a successful CONNECT, 5.0 reason code)
    "remaining-length-5-bytes": (lambda lv: b"\x30" + b"\xff" * 5 + b"\x01", MALFORMED),
    "subscribe-flags-0": (lambda lv: packet(0x80, b"\x00\x01" + no_props(lv) + s("a/b") + b"\x01"), MALFORMED),
    "pubrel-flags-0": (lambda lv: packet(0x60, b"\x00\x01"), MALFORMED),
    "unsubscribe-flags-0": (lambda lv: packet(0xA0, b"\x00\x01" + no_props(lv) + s("a/b")), MALFORMED),
    "pingreq-flags-set": (lambda lv: b"\xc1\x00", MALFORMED),
    "publish-qos-3": (lambda lv: packet(0x36, s("a") + b"\x00\x01" + no_props(lv) + b"p"), MALFORMED),
    "invalid-utf8-topic": (lambda lv: publish_bytes(lv, b"a/\xc3\x28"), MALFORMED),
    "surrogate-in-topic": (lambda lv: publish_bytes(lv, b"a/\xed\xa0\x80"), MALFORMED),
    "nul-in-topic": (lambda lv: publish_bytes(lv, "a/\0/b"), MALFORMED),
    "plus-in-publish-topic": (lambda lv: publish_bytes(lv, "a/+/b"), TOPIC_NAME_INVALID),
    "hash-in-publish-topic": (lambda lv: publish_bytes(lv, "a/#", qos=1), TOPIC_NAME_INVALID),
    "second-connect": (lambda lv: connect_bytes(lv, "bad"), PROTOCOL_ERROR),
    "packet-id-0-qos1": (lambda lv: publish_bytes(lv, "a/b", qos=1, packet_id=0), PROTOCOL_ERROR),
    "subscribe-packet-id-0": (lambda lv: packet(0x82, b"\x00\x00" + no_props(lv) + s("a/b") + b"\x01"), PROTOCOL_ERROR),
    "oversize-publish": (lambda lv: publish_bytes(lv, "a/b", b"x" * 2000, qos=1), PACKET_TOO_LARGE),
    "oversize-announced-only": (lambda lv: b"\x30" + encode_variable_byte_integer(10_000_000), PACKET_TOO_LARGE),
    "packet-type-0": (lambda lv: b"\x00\x00", MALFORMED),
    "connack-from-client": (lambda lv: packet(0x20, b"\x00\x00" + no_props(lv)), PROTOCOL_ERROR),
    "string-past-the-end": (lambda lv: packet(0x30, b"\x00\x50ab"), MALFORMED),
}


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_packet_after_connect(small, case, level):
    build, reason = CASES[case]
    r = connected(small, level)
    try:
        r.send(build(level))
        expect_rejection(r, level, reason)
    finally:
        r.close()
    assert_still_serving(small)


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
def test_packet_size_limit_is_exact(small, level):
    """The limit counts the whole packet, fixed header included: 1024 bytes pass, 1025 do not."""
    watcher, got = mqtt_connect(small, "watch", version=4)
    try:
        watcher.subscribe("edge/t", 0)
        got.wait_for(1, what="subacks")
        r = connected(small, level)
        try:
            head = len(publish_bytes(level, "edge/t", b""))  # grows by one byte of length past 127: both are 3 here
            exact = publish_bytes(level, "edge/t", b"x" * (MAX_PACKET - head - 1))
            assert len(exact) == MAX_PACKET
            r.send(exact)
            got.wait_for(1)
            r.send(publish_bytes(level, "edge/t", b"x" * (MAX_PACKET - head)))
            expect_rejection(r, level, PACKET_TOO_LARGE)
        finally:
            r.close()
        assert len(got.settle(0.2)) == 1
    finally:
        mqtt_close(watcher)
    assert_still_serving(small)


def test_packet_type_15_is_malformed_for_3_1_1(small):
    r = connected(small, 4)
    try:
        r.send(b"\xf0\x00")  # AUTH exists only in 5.0
        expect_rejection(r, 4, MALFORMED)
    finally:
        r.close()
    assert_still_serving(small)


@pytest.mark.parametrize("first", [
    pytest.param(lambda: publish_bytes(4, "a/b"), id="publish"),
    pytest.param(lambda: b"\xc0\x00", id="pingreq"),
    pytest.param(lambda: packet(0x82, b"\x00\x01" + s("a/#") + b"\x01"), id="subscribe"),
    pytest.param(lambda: b"\x00\x00", id="type-0"),
])
def test_packet_before_connect_is_just_a_close(small, first):
    r = RawMqtt(small, level=4)
    try:
        r.send(first())
        assert r.closed_by_peer()
        assert r.packets == []
    finally:
        r.close()
    assert_still_serving(small)


def test_good_packets_before_the_bad_one_take_effect(small):
    """A PUBLISH coalesced in front of bad bytes is still routed; the bad bytes then close."""
    watcher, got = mqtt_connect(small, "watch", version=4)
    try:
        watcher.subscribe("co/t", 0)
        got.wait_for(1, what="subacks")
        r = connected(small, 5)
        try:
            r.send(publish_bytes(5, "co/t", b"before") + b"\x00\x00")
            expect_rejection(r, 5, MALFORMED)
        finally:
            r.close()
        assert [m.payload for m in got.wait_for(1)] == [b"before"]
    finally:
        mqtt_close(watcher)
    assert_still_serving(small)


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
def test_abrupt_disconnect_mid_packet(small, level):
    watcher, got = mqtt_connect(small, "watch", version=4)
    try:
        watcher.subscribe("mid/#", 0)
        got.wait_for(1, what="subacks")
        r = RawMqtt(small, level=level)
        r.packet(mq.Connect("MQTT", level, True, 60, "mid", will=mq.Will("mid/will", b"lost")))
        assert r.read().reason_code == 0
        whole = publish_bytes(level, "mid/t", b"half a message" * 10, qos=1)
        r.send(whole[: len(whole) // 2])
        wait_until(lambda: len(whole) // 2 in small.unfinished(), what="the broker to hold the half PUBLISH")
        r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        r.close()
        # An abnormal loss: the will goes out; the half PUBLISH does not.
        (message,) = got.wait_for(1)
        assert (message.topic, message.payload) == ("mid/will", b"lost")
        assert len(got.settle(0.2)) == 1
    finally:
        mqtt_close(watcher)
    assert_still_serving(small)


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
def test_bad_connect_packets(small, level):
    """A malformed CONNECT: 5.0 gets a CONNACK with the reason, 3.1.1 a close."""
    # Client id with invalid UTF-8.
    body = s("MQTT") + bytes([level, 0x02]) + b"\x00\x3c" + no_props(level) + s(b"\xc3\x28")
    r = RawMqtt(small, level=level)
    try:
        r.send(packet(0x10, body))
        if level == 5:
            reply = r.read()
            assert isinstance(reply, mq.Connack) and reply.reason_code == MALFORMED, reply
        assert r.closed_by_peer()
    finally:
        r.close()
    assert_still_serving(small)


@pytest.mark.parametrize("level", [4, 5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("flags", [
    pytest.param(0x03, id="reserved-flag"),
    pytest.param(0x0A, id="will-qos-without-will"),
    pytest.param(0x22, id="will-retain-without-will"),
    pytest.param(0x1E, id="will-qos-3"),
])
def test_connect_with_bad_flags(small, level, flags):
    will = (no_props(level) + s("w/t") + s(b"w")) if flags & 0x04 else b""
    body = s("MQTT") + bytes([level, flags]) + b"\x00\x3c" + no_props(level) + s("cid") + will
    r = RawMqtt(small, level=level)
    try:
        r.send(packet(0x10, body))
        if level == 5:
            reply = r.read()
            assert isinstance(reply, mq.Connack) and reply.reason_code == MALFORMED, reply
        assert r.closed_by_peer()
        assert r.packets == []
    finally:
        r.close()
    assert_still_serving(small)


@pytest.mark.parametrize("name,level", [("MQTT", 6), ("MQTT", 3), ("MQIsdp", 4), ("HTTP", 4)])
def test_unsupported_protocol_gets_return_code_1(small, name, level):
    body = s(name) + bytes([level, 0x02]) + b"\x00\x3c" + s("cid")
    sock = socket.create_connection((small.host, small.mqtt_port), timeout=5)
    try:
        sock.sendall(packet(0x10, body))
        data = b""
        while True:
            chunk = sock.recv(100)
            if not chunk:
                break
            data += chunk
        assert data == b"\x20\x02\x00\x01"  # CONNACK "unacceptable protocol version", then a close
    finally:
        sock.close()
    assert_still_serving(small)


def test_will_with_a_wildcard_topic_is_refused(small):
    r = RawMqtt(small, level=5)
    try:
        body = s("MQTT") + bytes([5, 0x06]) + b"\x00\x3c" + b"\x00" + s("cid") + b"\x00" + s("w/#") + s(b"x")
        r.send(packet(0x10, body))
        reply = r.read()
        assert isinstance(reply, mq.Connack) and reply.reason_code == TOPIC_NAME_INVALID, reply
        assert r.closed_by_peer()
    finally:
        r.close()
    assert_still_serving(small)


V5_CASES: dict[str, tuple[bytes, int]] = {
    # PUBLISH properties: a property not allowed in PUBLISH, a duplicate, a client's subscription identifier.
    "publish-session-expiry-property": (packet(0x30, s("a/b") + b"\x05\x11\x00\x00\x00\x01" + b"p"), MALFORMED),
    "publish-unknown-property": (packet(0x30, s("a/b") + b"\x02\x7f\x00" + b"p"), MALFORMED),
    "publish-duplicate-content-type": (packet(0x30, s("a/b") + b"\x08\x03" + s("x") + b"\x03" + s("y") + b"p"),
                                       PROTOCOL_ERROR),
    "publish-subscription-identifier": (packet(0x30, s("a/b") + b"\x02\x0b\x01" + b"p"), PROTOCOL_ERROR),
    "publish-topic-alias-0": (packet(0x30, s("a/b") + b"\x03\x23\x00\x00" + b"p"), PROTOCOL_ERROR),
    "publish-user-property-bad-utf8": (packet(0x30, s("a/b") + b"\x07\x26" + s(b"\xff") + s("v") + b"p"), MALFORMED),
    "publish-properties-past-the-end": (packet(0x30, s("a/b") + b"\x40\x03"), MALFORMED),
    "publish-empty-topic-no-alias": (packet(0x30, s("") + b"\x00p"), PROTOCOL_ERROR),
    "publish-format-indicator-2": (packet(0x30, s("a/b") + b"\x02\x01\x02" + b"p"), PROTOCOL_ERROR),
    "subscribe-reserved-option-bits": (packet(0x82, b"\x00\x01\x00" + s("a/b") + b"\xc1"), MALFORMED),
    "subscribe-subscription-identifier-0": (packet(0x82, b"\x00\x01\x02\x0b\x00" + s("a/b") + b"\x01"),
                                            PROTOCOL_ERROR),
    "disconnect-bad-property": (packet(0xE0, b"\x00\x02\x23\x01"), MALFORMED),
}


@pytest.mark.parametrize("case", list(V5_CASES))
def test_bad_mqtt5_properties(small, case):
    data, reason = V5_CASES[case]
    r = connected(small, 5)
    try:
        r.send(data)
        expect_rejection(r, 5, reason)
    finally:
        r.close()
    assert_still_serving(small)


def test_connection_that_never_sends_connect_is_closed(tmp_path):
    config = make_config(tmp_path)
    config.mqtt_settings.connect_timeout = 0.5
    handle = BrokerHandle(config)
    try:
        silent = socket.create_connection((handle.host, handle.mqtt_port), timeout=5)
        partial = socket.create_connection((handle.host, handle.mqtt_port), timeout=5)
        try:
            start = time.monotonic()
            partial.sendall(connect_bytes(4, "slow")[:5])  # a CONNECT that never completes
            for sock in (silent, partial):
                sock.settimeout(max(0.1, start + 10 - time.monotonic()))
                try:
                    assert sock.recv(100) == b""
                except ConnectionResetError:
                    pass
            # Not before the 0.5 s connect timeout: a lower bound no slow machine can break.
            assert time.monotonic() - start >= 0.4
        finally:
            silent.close()
            partial.close()
        # A prompt client is not affected.
        client, got = mqtt_connect(handle, "prompt", version=4)
        time.sleep(0.7)  # waiting for an absence: past the 0.5 s connect timeout, no disconnect
        assert got.disconnects == []
        mqtt_close(client)
    finally:
        handle.stop()


def test_a_client_still_sending_when_it_is_disconnected_reads_the_reason(small):
    """Eclipse Paho's test_flow_control2: past the receive maximum the broker answers
    DISCONNECT 0x93 while the client is still busy answering PUBRECs.  A socket closed
    with unread input is reset, and the client's kernel dropped the DISCONNECT (a broken
    pipe in 4 runs of 5): the broker now shuts its side and reads until the client closes."""
    for attempt in range(5):
        raw = RawMqtt(small, level=5)
        maximum = raw.connect(f"flood-{attempt}").properties.get("receive_maximum", 65535)
        raw.send(b"".join(mq.encode(mq.Publish("flood/t", b"m", qos=2, packet_id=i), 5) for i in range(1, maximum + 2)))
        while True:
            packet = raw.read(10)
            if isinstance(packet, mq.Pubrec):
                raw.packet(mq.Pubrel(packet.packet_id))  # as a client does, into a connection being closed
                continue
            assert isinstance(packet, mq.Disconnect), packet
            assert packet.reason_code == mq.ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
            break
        assert raw.closed_by_peer(5)
        raw.close()
