"""MQTT 5 over a real socket: paho-mqtt in MQTTv5 mode, and raw packets where paho cannot go.

CONNACK properties, reason codes, session and message expiry, will delay, topic
aliases both ways, receive maximum and maximum packet size, properties across
MQTT 5 and STOMP, subscription options, shared subscriptions, and the server's
DISCONNECT on takeover and shutdown.
"""
from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from protocols.mqtt import codec as mq
from tests.support import (
    BrokerHandle,
    RawMqtt,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
    wait_until,
)
from tests.support import mqtt_publish as publish
from tests.support import mqtt_subscribe as subscribe

# -- helpers -----------------------------------------------------------------


def props(packet: str, **values: Any) -> Properties:
    """paho Properties for a packet type, e.g. props("CONNECT", SessionExpiryInterval=5)."""
    p = Properties(getattr(PacketTypes, packet))
    for name, value in values.items():
        setattr(p, name, value)
    return p


def code(reason: Any) -> int:
    """A paho ReasonCode (or int) as an int."""
    return reason if isinstance(reason, int) else reason.value


@pytest.fixture
def v5(broker: BrokerHandle) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """Connected paho MQTTv5 clients on the test's broker, closed at the end."""
    made: list[Any] = []

    def make(client_id: str = "", handle: BrokerHandle | None = None, expiry: int | None = None,
             clean: bool = True, **kwargs: Any) -> tuple[Any, Any]:
        properties = kwargs.pop("properties", None)
        if expiry is not None:
            properties = properties or props("CONNECT")
            properties.SessionExpiryInterval = expiry
        client, got = mqtt_connect(handle or broker, client_id, version=5, clean=clean, properties=properties, **kwargs)
        made.append(client)
        return client, got

    yield make
    for client in made:
        with contextlib.suppress(Exception):
            mqtt_close(client)


@pytest.fixture
def raw(broker: BrokerHandle) -> Iterator[Callable[..., RawMqtt]]:
    made: list[RawMqtt] = []

    def make(handle: BrokerHandle | None = None, level: int = 5) -> RawMqtt:
        r = RawMqtt(handle or broker, level=level)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


class OwnBroker:
    """A broker with its own MQTT settings (beside the per-test ``broker``), stopped at the end."""

    def __init__(self, tmp_path: Any) -> None:
        self.tmp_path = tmp_path
        self.handles: list[BrokerHandle] = []

    def __call__(self, **mqtt_settings: Any) -> BrokerHandle:
        config = make_config(self.tmp_path / f"own{len(self.handles)}")
        for key, value in mqtt_settings.items():
            setattr(config.mqtt_settings, key, value)
        handle = BrokerHandle(config)
        self.handles.append(handle)
        return handle


@pytest.fixture
def own(tmp_path: Any) -> Iterator[OwnBroker]:
    factory = OwnBroker(tmp_path)
    yield factory
    for handle in factory.handles:
        with contextlib.suppress(Exception):
            handle.stop()


def ping(r: RawMqtt) -> None:
    """A barrier: the broker has handled everything this raw client sent before."""
    r.packet(mq.Pingreq())
    packet = r.read()
    assert isinstance(packet, mq.Pingresp), f"unexpected {packet!r} before PINGRESP"


def no_packet(r: RawMqtt, wait: float = 0.3) -> None:
    try:
        packet = r.read(wait)
    except (AssertionError, TimeoutError):
        return
    raise AssertionError(f"unexpected {packet!r}")


def expect_disconnect(r: RawMqtt, reason: int) -> mq.Disconnect:
    """The broker's DISCONNECT with this reason code (and a reason string), then a closed socket."""
    packet = r.read()
    assert isinstance(packet, mq.Disconnect), packet
    assert packet.reason_code == reason, f"got 0x{packet.reason_code:02X} {packet.properties}"
    assert packet.properties.get("reason_string"), packet
    assert r.closed_by_peer(), "the broker kept the connection open after DISCONNECT"
    return packet


def drop(r: RawMqtt) -> None:
    """Lose the connection abruptly (RST, no DISCONNECT)."""
    r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    r.sock.close()


def offline(broker: BrokerHandle, client_id: str) -> bool:
    """The broker has seen the connection of ``client_id``'s session lost (the session lives on)."""
    def check() -> bool:
        client = broker.gateway.mqtt_hub.clients.get(client_id)
        return client is not None and client.live is None
    return broker.inspect(check)


def session_gone(broker: BrokerHandle, client_id: str) -> bool:
    return broker.inspect(lambda: client_id not in broker.gateway.mqtt_hub.clients)


# -- CONNACK ---------------------------------------------------------------------


def test_connack_carries_limits_assigned_id_and_response_information(broker, v5):
    client, got = v5("", properties=props("CONNECT", RequestResponseInformation=1))
    flags, reason, p = got.connacks[0]
    assert code(reason) == 0
    assert not flags.session_present
    assert p.ReceiveMaximum == broker.config.mqtt_settings.receive_maximum
    assert p.MaximumPacketSize == broker.config.mqtt_settings.max_packet_size
    assert p.TopicAliasMaximum == broker.config.mqtt_settings.topic_alias_maximum
    assigned = p.AssignedClientIdentifier
    assert assigned
    assert p.ResponseInformation
    assert not hasattr(p, "ServerKeepAlive")  # no limit configured
    # The assigned id is the session's id: a subscription made now works.
    assert [code(c) for c in subscribe(client, got, "assigned/t", 1)] == [1]


def test_connack_without_request_has_no_response_information_or_assigned_id(v5):
    _, got = v5("named")
    _, _, p = got.connacks[0]
    assert not hasattr(p, "ResponseInformation")
    assert not hasattr(p, "AssignedClientIdentifier")


def test_server_keep_alive_caps_the_clients(own, v5):
    handle = own(server_keep_alive=5)
    _, got = v5("ka-long", handle=handle, keepalive=60)
    assert got.connacks[0][2].ServerKeepAlive == 5
    r = RawMqtt(handle, level=5)
    try:
        connack = r.connect("ka-zero", keep_alive=0)  # 0 = "no keep-alive": the server's limit applies
        assert connack.properties.get("server_keep_alive") == 5
    finally:
        r.close()
    _, got = v5("ka-short", handle=handle, keepalive=3)
    assert not hasattr(got.connacks[0][2], "ServerKeepAlive")  # within the limit: the client's own stands


def test_server_keep_alive_refuses_311_clients_over_it(own):
    """3.1.1 has no server keep-alive to be told: paho gets CONNACK 2 (Mosquitto's max_keepalive), not a drop later."""
    handle = own(server_keep_alive=5)
    client, got = mqtt_connect(handle, "ka-311-long", version=4, keepalive=60)
    try:
        ((_, reason, _),) = got.connacks
        assert str(reason) == "Client identifier not valid"  # paho's name for 3.1.1's return code 2
        got.wait_for(1, what="disconnects")
    finally:
        mqtt_close(client)
    client, got = mqtt_connect(handle, "ka-311-ok", version=4, keepalive=5)
    try:
        assert code(got.connacks[0][1]) == 0
    finally:
        mqtt_close(client)


def test_disconnect_with_an_error_reason_publishes_the_will(v5):
    """Only a normal disconnection (0x00) deletes the will (MQTT-3.1.2-10)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

    watcher, got = v5("err-will-watch")
    subscribe(watcher, got, "ew/will", 1)
    client, _ = v5("err-will", will=("ew/will", b"went wrong", 1, False))
    client.disconnect(reasoncode=PahoReasonCode(PacketTypes.DISCONNECT, identifier=0x80))
    assert [m.payload for m in got.wait_for(1)] == [b"went wrong"]
    polite, _ = v5("ok-will", will=("ew/will", b"never", 1, False))
    polite.disconnect()
    assert got.settle(0.5)[1:] == []


# -- reason codes ------------------------------------------------------------------


def test_suback_grants_qos_and_refuses_invalid_filters(raw):
    r = raw()
    assert r.connect("sub-codes").reason_code == 0
    r.packet(mq.Subscribe(1, [
        mq.SubscriptionRequest("a/+", 1),
        mq.SubscriptionRequest("a/#/b", 0),
        mq.SubscriptionRequest("x/y", 2),
        mq.SubscriptionRequest("a+/b", 1),
        mq.SubscriptionRequest("$share/g/s/#", 0),
        mq.SubscriptionRequest("$share//s", 0),
    ]))
    suback = r.read()
    assert isinstance(suback, mq.Suback)
    assert suback.packet_id == 1
    assert suback.reason_codes == [1, 0x8F, 2, 0x8F, 0, 0x8F]


def test_unsuback_says_no_subscription_existed(raw):
    r = raw()
    r.connect("unsub-codes")
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("u/+", 1)]))
    assert r.read().reason_codes == [1]
    r.packet(mq.Unsubscribe(2, ["never/subscribed", "u/+"]))
    unsuback = r.read()
    assert isinstance(unsuback, mq.Unsuback)
    assert unsuback.reason_codes == [0x11, 0]
    r.packet(mq.Unsubscribe(3, ["u/+"]))
    assert r.read().reason_codes == [0x11]


def test_puback_0x99_for_a_payload_that_is_not_utf8_as_its_format_says(raw, v5):
    sub, got = v5("pfi-sub")
    subscribe(sub, got, "pfi/t", 1)
    r = raw()
    r.connect("pfi-pub")
    r.packet(mq.Publish("pfi/t", b"\xff\xfe bad", 1, packet_id=5, properties={"payload_format_indicator": 1}))
    ack = r.read()
    assert isinstance(ack, mq.Puback) and ack.packet_id == 5
    assert ack.reason_code == 0x99
    r.packet(mq.Publish("pfi/t", b"\xff\xfe bad", 2, packet_id=6, properties={"payload_format_indicator": 1}))
    rec = r.read()
    assert isinstance(rec, mq.Pubrec) and rec.packet_id == 6 and rec.reason_code == 0x99
    # The connection stays usable, and valid UTF-8 goes through.
    r.packet(mq.Publish("pfi/t", "ok \u00e9".encode(), 1, packet_id=7, properties={"payload_format_indicator": 1}))
    assert r.read() == mq.Puback(7)
    (message,) = got.wait_for(1)
    assert message.payload == "ok \u00e9".encode()
    assert got.settle(0.2) == [message]


def test_unknown_packet_ids_get_0x92(raw):
    r = raw()
    r.connect("pid-codes")
    r.packet(mq.Pubrel(77))
    pubcomp = r.read()
    assert isinstance(pubcomp, mq.Pubcomp) and pubcomp.packet_id == 77
    assert pubcomp.reason_code == 0x92
    r.packet(mq.Pubrec(78))
    pubrel = r.read()
    assert isinstance(pubrel, mq.Pubrel) and pubrel.packet_id == 78
    assert pubrel.reason_code == 0x92
    r.packet(mq.Pubcomp(78))
    ping(r)


def test_qos2_inbound_flow_answers_each_step_with_success(raw, v5):
    sub, got = v5("q2-sub")
    subscribe(sub, got, "q2/t", 2)
    r = raw()
    r.connect("q2-pub")
    r.packet(mq.Publish("q2/t", b"once", 2, packet_id=9))
    assert r.read() == mq.Pubrec(9)
    r.packet(mq.Publish("q2/t", b"once", 2, dup=True, packet_id=9))  # a retransmission: not routed twice
    assert r.read() == mq.Pubrec(9)
    r.packet(mq.Pubrel(9))
    assert r.read() == mq.Pubcomp(9)
    got.wait_for(1)
    assert got.payloads() == [b"once"]
    assert [m.payload for m in got.settle(0.2)] == [b"once"]


def test_protocol_error_gets_disconnect_with_reason_string(raw):
    r = raw()
    r.connect("perr")
    # No Local on a shared subscription is a Protocol Error (MQTT-3.8.3-4).
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("$share/g/p/t", 0, no_local=True)]))
    packet = expect_disconnect(r, 0x82)
    assert "local" in packet.properties["reason_string"].lower()


def test_no_reason_string_when_problem_information_is_not_requested(raw):
    r = raw()
    r.connect("perr-quiet", properties={"request_problem_information": 0})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("$share/g/p/t", 0, no_local=True)]))
    packet = r.read()
    assert isinstance(packet, mq.Disconnect) and packet.reason_code == 0x82
    assert "reason_string" not in packet.properties
    assert r.closed_by_peer()


def test_auth_packet_is_refused_with_0x8c(raw):
    r = raw()
    r.connect("auth-pkt")
    r.packet(mq.Auth(0x19, {"authentication_method": "SCRAM-SHA-1"}))
    expect_disconnect(r, 0x8C)


def test_connect_with_authentication_method_gets_connack_0x8c(raw, broker):
    r = raw()
    connack = r.connect("auth-connect", properties={"authentication_method": "SCRAM-SHA-1"})
    assert isinstance(connack, mq.Connack)
    assert connack.reason_code == 0x8C
    assert not connack.session_present
    assert r.closed_by_peer()
    assert broker.inspect(lambda: "auth-connect" in broker.gateway.mqtt_hub.clients) is False


# -- session expiry -------------------------------------------------------------------


def test_session_resumes_within_its_expiry_with_offline_messages(v5):
    sub, got = v5("se-keep", expiry=2)
    subscribe(sub, got, "se/t", 1)
    mqtt_close(sub)
    pub, _ = v5("se-pub")
    for i in range(3):
        publish(pub, "se/t", f"off-{i}".encode())
    _, got2 = v5("se-keep", expiry=2, clean=False)
    flags, reason, _ = got2.connacks[0]
    assert code(reason) == 0 and flags.session_present
    got2.wait_for(3)
    assert got2.payloads() == [b"off-0", b"off-1", b"off-2"]
    assert all(m.qos == 1 for m in got2.messages)


def test_session_is_gone_after_its_expiry(v5, broker):
    sub, got = v5("se-gone", expiry=1)
    subscribe(sub, got, "sg/t", 1)
    mqtt_close(sub)
    pub, _ = v5("sg-pub")
    publish(pub, "sg/t", b"stored-then-expired")
    wait_until(lambda: session_gone(broker, "se-gone"), what="the session to end 1 s after its connection")
    _, got2 = v5("se-gone", expiry=1, clean=False)
    flags, _, _ = got2.connacks[0]
    assert not flags.session_present
    assert got2.settle(0.3) == []
    publish(pub, "sg/t", b"after")  # the old subscription went with the session
    assert got2.settle(0.3) == []


def test_expiry_zero_ends_the_session_at_disconnect(v5):
    sub, got = v5("se-zero")  # no Session Expiry Interval: 0
    subscribe(sub, got, "sz/t", 1)
    mqtt_close(sub)
    pub, _ = v5("sz-pub")
    publish(pub, "sz/t", b"nobody-home")
    _, got2 = v5("se-zero", clean=False)
    assert not got2.connacks[0][0].session_present
    assert got2.settle(0.3) == []


def test_disconnect_may_not_set_an_expiry_after_connect_with_zero(raw, v5, broker):
    watcher, got = v5("se-will-watch")
    subscribe(watcher, got, "sp/will", 0)
    r = raw()
    r.packet(mq.Connect("MQTT", 5, True, 60, "se-proto", will=mq.Will("sp/will", b"gone")))
    assert r.read().reason_code == 0
    r.packet(mq.Disconnect(0, {"session_expiry_interval": 30}))
    expect_disconnect(r, 0x82)
    # Not a normal disconnection: the session ends (expiry stays 0) and the will is sent.
    assert [m.payload for m in got.wait_for(1)] == [b"gone"]
    assert broker.inspect(lambda: "se-proto" in broker.gateway.mqtt_hub.clients) is False


def test_disconnect_may_change_a_nonzero_expiry(raw, v5, broker):
    r = raw()
    r.connect("se-change", clean=True, properties={"session_expiry_interval": 60})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("sc/t", 1)]))
    r.read()
    r.packet(mq.Disconnect(0, {"session_expiry_interval": 0}))
    assert r.closed_by_peer()
    # Expiry 0 from the DISCONNECT: the session ended with the connection.
    wait_until(lambda: session_gone(broker, "se-change"), what="session end")


# -- message expiry ---------------------------------------------------------------------


def test_message_expiry_interval_counts_down(v5):
    sub, got = v5("me-sub")
    subscribe(sub, got, "me/t", 1)
    pub, _ = v5("me-pub")
    publish(pub, "me/t", b"ten", properties=props("PUBLISH", MessageExpiryInterval=10))
    publish(pub, "me/t", b"forever")
    first, second = got.wait_for(2)
    assert 9 <= first.properties.MessageExpiryInterval <= 10
    assert not hasattr(second.properties, "MessageExpiryInterval")


def test_expired_message_is_not_delivered_to_a_returning_subscriber(v5):
    sub, got = v5("me-away", expiry=60)
    subscribe(sub, got, "ma/t", 1)
    mqtt_close(sub)
    pub, _ = v5("ma-pub")
    publish(pub, "ma/t", b"short-lived", properties=props("PUBLISH", MessageExpiryInterval=1))
    publish(pub, "ma/t", b"lasting", properties=props("PUBLISH", MessageExpiryInterval=60))
    publish(pub, "ma/t", b"forever")
    time.sleep(1.5)  # a real clock window: message expiry counts whole seconds (1 s), checked when delivered
    _, got2 = v5("me-away", expiry=60, clean=False)
    assert got2.connacks[0][0].session_present
    got2.wait_for(2)
    assert [m.payload for m in got2.settle(0.2)] == [b"lasting", b"forever"]
    assert 58 <= got2.messages[0].properties.MessageExpiryInterval <= 59


# -- will delay -----------------------------------------------------------------------------


def will_connect(r: RawMqtt, client_id: str, delay: int, expiry: int, topic: str = "wd/will", clean: bool = True) -> mq.Connack:
    will = mq.Will(topic, b"will-" + client_id.encode(), 0, False, {"will_delay_interval": delay})
    r.packet(mq.Connect("MQTT", 5, clean, 60, client_id, will=will, properties={"session_expiry_interval": expiry}))
    connack = r.read()
    assert isinstance(connack, mq.Connack) and connack.reason_code == 0, connack
    return connack


def test_will_is_sent_after_its_delay(broker, v5):
    watcher, got = v5("wd-watch")
    subscribe(watcher, got, "wd/will", 0)
    r = RawMqtt(broker, level=5)
    will_connect(r, "wd-1", delay=1, expiry=10)
    lost = time.monotonic()
    drop(r)
    (message,) = got.wait_for(1, timeout=10)
    assert message.payload == b"will-wd-1"
    # Not before its delay (the lower bound no slow machine can break; the delay to the tick is
    # tests/unit/test_mqtt_session.py's, on a virtual clock).
    assert time.monotonic() - lost >= 0.9, "the will did not wait for its delay"


def test_reconnecting_within_the_will_delay_cancels_the_will(broker, v5):
    watcher, got = v5("wd-watch2")
    subscribe(watcher, got, "wd/will", 0)
    r = RawMqtt(broker, level=5)
    will_connect(r, "wd-2", delay=1, expiry=10)
    drop(r)
    wait_until(lambda: offline(broker, "wd-2"), what="the broker to see the connection lost (its will delay running)")
    r2 = RawMqtt(broker, level=5)
    try:
        connack = will_connect(r2, "wd-2", delay=1, expiry=10, clean=False)
        assert connack.session_present
        time.sleep(1.2)  # waiting for an absence: past the 1 s will delay, when a will not cancelled goes out
        assert got.messages == []
        r2.packet(mq.Disconnect(0))  # a normal disconnection: no will either
        assert r2.closed_by_peer()
        assert got.settle(0.3) == []
    finally:
        r2.close()


def test_will_is_sent_at_once_when_the_session_ends_first(broker, v5):
    watcher, got = v5("wd-watch3")
    subscribe(watcher, got, "wd/will", 0)
    r = RawMqtt(broker, level=5)
    will_connect(r, "wd-3", delay=30, expiry=1)
    lost = time.monotonic()
    drop(r)
    got.wait_for(1, timeout=10)  # well before its 30 s delay
    assert time.monotonic() - lost >= 0.7, "the will went out before the session ended"


# -- topic aliases ---------------------------------------------------------------------------


def test_inbound_topic_alias_maps_to_the_real_topic(raw, v5):
    sub, got = v5("alias-sub")
    subscribe(sub, got, "al/#", 0)
    r = raw()
    r.connect("alias-pub")
    r.packet(mq.Publish("al/t", b"first", properties={"topic_alias": 1}))
    r.packet(mq.Publish("", b"second", properties={"topic_alias": 1}))
    r.packet(mq.Publish("al/u", b"third", properties={"topic_alias": 1}))  # re-pointed
    r.packet(mq.Publish("", b"fourth", properties={"topic_alias": 1}))
    got.wait_for(4)
    assert [(m.topic, m.payload) for m in got.messages] == [
        ("al/t", b"first"), ("al/t", b"second"), ("al/u", b"third"), ("al/u", b"fourth"),
    ]
    assert all(not hasattr(m.properties, "TopicAlias") for m in got.messages)


def test_inbound_topic_alias_above_the_maximum_is_0x94(raw, broker):
    r = raw()
    connack = r.connect("alias-big")
    maximum = connack.properties["topic_alias_maximum"]
    r.packet(mq.Publish("ab/t", b"x", properties={"topic_alias": maximum + 1}))
    expect_disconnect(r, 0x94)


def test_inbound_unknown_topic_alias_is_a_protocol_error(raw):
    r = raw()
    r.connect("alias-unknown")
    r.packet(mq.Publish("", b"x", properties={"topic_alias": 3}))
    expect_disconnect(r, 0x82)


def test_outbound_topic_alias_for_a_client_that_allows_them(raw, v5):
    r = raw()
    r.connect("alias-out", properties={"topic_alias_maximum": 5})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("ao/#", 0)]))
    r.read()
    pub, _ = v5("ao-pub")
    for topic, payload in (("ao/t", b"1"), ("ao/t", b"2"), ("ao/u", b"3"), ("ao/t", b"4")):
        publish(pub, topic, payload, qos=0)
    p1, p2, p3, p4 = (r.read() for _ in range(4))
    assert (p1.topic, p1.payload) == ("ao/t", b"1")
    alias = p1.properties["topic_alias"]
    assert 1 <= alias <= 5
    assert (p2.topic, p2.payload, p2.properties.get("topic_alias")) == ("", b"2", alias)
    assert p3.topic == "ao/u" and p3.properties["topic_alias"] not in (None, alias)
    assert (p4.topic, p4.properties.get("topic_alias")) == ("", alias)


def test_no_outbound_topic_alias_without_a_maximum(raw, v5):
    r = raw()
    r.connect("alias-none")
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("an/t", 0)]))
    r.read()
    pub, _ = v5("an-pub")
    publish(pub, "an/t", b"1", qos=0)
    publish(pub, "an/t", b"2", qos=0)
    for packet in (r.read(), r.read()):
        assert packet.topic == "an/t" and "topic_alias" not in packet.properties


# -- flow control and packet size ---------------------------------------------------------------


def test_receive_maximum_bounds_unacknowledged_deliveries(raw, v5):
    r = raw()
    r.connect("rm-sub", properties={"receive_maximum": 2})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("rm/t", 1)]))
    r.read()
    pub, _ = v5("rm-pub")
    for i in range(5):
        publish(pub, "rm/t", f"m{i}".encode())
    first, second = r.read(), r.read()
    assert [first.payload, second.payload] == [b"m0", b"m1"]
    assert first.qos == 1 and second.qos == 1
    no_packet(r)
    r.packet(mq.Puback(first.packet_id))
    third = r.read()
    assert third.payload == b"m2"
    no_packet(r)
    r.packet(mq.Puback(second.packet_id))
    r.packet(mq.Puback(third.packet_id))
    assert [r.read().payload, r.read().payload] == [b"m3", b"m4"]


def test_client_maximum_packet_size_skips_what_is_too_large(raw, v5):
    r = raw()
    r.connect("mp-sub", properties={"maximum_packet_size": 100})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("mp/t", 1)]))
    r.read()
    pub, _ = v5("mp-pub")
    publish(pub, "mp/t", b"small-1")
    publish(pub, "mp/t", b"x" * 500)
    publish(pub, "mp/t", b"small-2")
    first = r.read()
    assert first.payload == b"small-1"
    r.packet(mq.Puback(first.packet_id))
    second = r.read()
    assert second.payload == b"small-2"
    r.packet(mq.Puback(second.packet_id))
    no_packet(r)


def test_client_maximum_packet_size_is_exact(raw, v5):
    r = raw()
    r.connect("mp-edge", properties={"maximum_packet_size": 100})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("mpe/t", 0)]))
    r.read()
    size = len(mq.encode_publish("mpe/t", b"", 0, False, False, None, {}, 5))
    pub, _ = v5("mpe-pub")
    publish(pub, "mpe/t", b"a" * (100 - size), qos=0)      # exactly 100 bytes
    publish(pub, "mpe/t", b"b" * (100 - size + 1), qos=0)  # 101 bytes
    publish(pub, "mpe/t", b"c", qos=0)
    first, second = r.read(), r.read()
    assert first.payload == b"a" * (100 - size)
    assert second.payload == b"c"
    no_packet(r)


def test_subscription_quota_gets_0x97(own):
    handle = own(max_subscriptions=2)
    r = RawMqtt(handle, level=5)
    try:
        r.connect("quota")
        r.packet(mq.Subscribe(1, [mq.SubscriptionRequest(f"q/{i}", 0) for i in range(3)]))
        assert r.read().reason_codes == [0, 0, 0x97]
        r.packet(mq.Subscribe(2, [mq.SubscriptionRequest("q/0", 1)]))  # a replacement is not a new one
        assert r.read().reason_codes == [1]
    finally:
        r.close()


def test_packet_above_the_broker_maximum_gets_0x95(own):
    handle = own(max_packet_size=1024)
    r = RawMqtt(handle, level=5)
    try:
        connack = r.connect("too-big")
        assert connack.properties["maximum_packet_size"] == 1024
        r.packet(mq.Publish("big/t", b"x" * 1000, 1, packet_id=1))
        assert r.read() == mq.Puback(1)
        r.packet(mq.Publish("big/t", b"x" * 2000, 1, packet_id=2))
        expect_disconnect(r, 0x95)
    finally:
        r.close()


# -- properties across clients and protocols -----------------------------------------------------


def full_properties() -> Properties:
    return props(
        "PUBLISH", UserProperty=[("colour", "red"), ("size", "L")], ContentType="application/json",
        ResponseTopic="rp/reply", CorrelationData=b"\x00corr\xff", PayloadFormatIndicator=1,
    )


def test_properties_round_trip_mqtt5_to_mqtt5(v5):
    sub, got = v5("rt-sub")
    subscribe(sub, got, "rt/t", 1)
    pub, _ = v5("rt-pub")
    publish(pub, "rt/t", b'{"a": 1}', properties=full_properties())
    (message,) = got.wait_for(1)
    p = message.properties
    assert message.payload == b'{"a": 1}'
    assert p.UserProperty == [("colour", "red"), ("size", "L")]
    assert p.ContentType == "application/json"
    assert p.ResponseTopic == "rp/reply"
    assert p.CorrelationData == b"\x00corr\xff"
    assert p.PayloadFormatIndicator == 1


def test_no_properties_for_a_plain_message(v5):
    sub, got = v5("plain-sub")
    subscribe(sub, got, "pl/t", 1)
    pub, _ = v5("plain-pub")
    publish(pub, "pl/t", b"bare")
    (message,) = got.wait_for(1)
    p = message.properties
    for name in ("UserProperty", "ContentType", "ResponseTopic", "CorrelationData", "PayloadFormatIndicator"):
        assert not hasattr(p, name), name


def test_repeated_user_property_names_are_all_forwarded(v5):
    sub, got = v5("dup-sub")
    subscribe(sub, got, "dup/t", 0)
    pub, _ = v5("dup-pub")
    publish(pub, "dup/t", b"x", qos=0, properties=props("PUBLISH", UserProperty=[("k", "1"), ("k", "2")]))
    (message,) = got.wait_for(1)
    assert message.properties.UserProperty == [("k", "1"), ("k", "2")]


def test_mqtt5_properties_reach_a_stomp_subscriber(broker, v5):
    conn, got_stomp = connect(broker)
    try:
        conn.subscribe("/topic/xp.t", id="s", ack="auto")
        sync(conn, got_stomp)
        pub, _ = v5("xp-pub")
        publish(pub, "xp/t", b"body", properties=props(
            "PUBLISH", UserProperty=[("colour", "red"), ("size", "L")], ContentType="text/plain",
            CorrelationData=b"corr-1"))
        (frame,) = got_stomp.wait_for(1)
        assert frame.body == "body"
        assert frame.headers["destination"] == "/topic/xp.t"
        assert frame.headers["colour"] == "red"
        assert frame.headers["size"] == "L"
        assert frame.headers["content-type"] == "text/plain"
        assert frame.headers["correlation-id"] == "corr-1"
    finally:
        disconnect(conn)


def test_mqtt5_response_topic_is_a_stomp_reply_to(broker, v5):
    conn, got_stomp = connect(broker)
    try:
        conn.subscribe("/topic/xr.t", id="s", ack="auto")
        sync(conn, got_stomp)
        pub, _ = v5("xr-pub")
        publish(pub, "xr/t", b"body", properties=props("PUBLISH", ResponseTopic="xp/reply"))
        (frame,) = got_stomp.wait_for(1)
        assert frame.headers["reply-to"] == "/topic/xp.reply"
    finally:
        disconnect(conn)


def test_stomp_headers_reach_an_mqtt5_subscriber_as_user_properties(broker, v5):
    sub, got = v5("sx-sub")
    subscribe(sub, got, "sx/t", 1)
    conn, _ = connect(broker)
    try:
        conn.send("/topic/sx.t", "from stomp", headers={"colour": "blue", "x-num": "7"}, content_type="text/plain")
        (message,) = got.wait_for(1)
        assert message.topic == "sx/t"
        assert message.payload == b"from stomp"
        users = dict(message.properties.UserProperty)
        assert users["colour"] == "blue" and users["x-num"] == "7"
        assert message.properties.ContentType == "text/plain"
    finally:
        disconnect(conn)


def test_stomp_reply_to_is_an_mqtt5_response_topic(broker, v5):
    sub, got = v5("sr-sub")
    subscribe(sub, got, "sr/t", 1)
    conn, _ = connect(broker)
    try:
        conn.send("/topic/sr.t", "q", headers={"reply-to": "/topic/sr.answers", "correlation-id": "c-9"})
        (message,) = got.wait_for(1)
        assert message.properties.CorrelationData == b"c-9"
        assert message.properties.ResponseTopic == "sr/answers"
    finally:
        disconnect(conn)


# -- subscription options --------------------------------------------------------------------------


def test_no_local(v5):
    a, got_a = v5("nl-a")
    subscribe(a, got_a, "nl/t", options=SubscribeOptions(qos=1, noLocal=True))
    b, got_b = v5("nl-b")
    subscribe(b, got_b, "nl/t", options=SubscribeOptions(qos=1))
    publish(a, "nl/t", b"from-a")
    other, _ = v5("nl-other")
    publish(other, "nl/t", b"from-other")
    got_a.wait_for(1)
    got_b.wait_for(2)
    assert [m.payload for m in got_a.settle(0.2)] == [b"from-other"]
    assert got_b.payloads() == [b"from-a", b"from-other"]


def test_retain_as_published(v5):
    keep, got_keep = v5("rap-keep")
    subscribe(keep, got_keep, "rap/t", options=SubscribeOptions(qos=0, retainAsPublished=True))
    plain, got_plain = v5("rap-plain")
    subscribe(plain, got_plain, "rap/t", options=SubscribeOptions(qos=0))
    pub, _ = v5("rap-pub")
    publish(pub, "rap/t", b"retained", retain=True)
    publish(pub, "rap/t", b"normal")
    got_keep.wait_for(2)
    got_plain.wait_for(2)
    assert [(m.payload, m.retain) for m in got_keep.messages] == [(b"retained", True), (b"normal", False)]
    assert [(m.payload, m.retain) for m in got_plain.messages] == [(b"retained", False), (b"normal", False)]
    # A retained message sent because of a SUBSCRIBE always has the flag set.
    late, got_late = v5("rap-late")
    subscribe(late, got_late, "rap/t", options=SubscribeOptions(qos=0))
    (message,) = got_late.wait_for(1)
    assert (message.payload, message.retain) == (b"retained", True)


def test_retain_handling(v5):
    pub, _ = v5("rh-pub")
    publish(pub, "rh/t", b"kept", retain=True)

    always, got_always = v5("rh-0")
    subscribe(always, got_always, "rh/t", options=SubscribeOptions(qos=1, retainHandling=0))
    got_always.wait_for(1)
    subscribe(always, got_always, "rh/t", options=SubscribeOptions(qos=1, retainHandling=0))
    got_always.wait_for(2)  # 0: on every subscribe

    never, got_never = v5("rh-2")
    subscribe(never, got_never, "rh/t", options=SubscribeOptions(qos=1, retainHandling=2))

    new_only, got_new = v5("rh-1")
    subscribe(new_only, got_new, "rh/t", options=SubscribeOptions(qos=1, retainHandling=1))
    got_new.wait_for(1)
    subscribe(new_only, got_new, "rh/t", options=SubscribeOptions(qos=1, retainHandling=1))

    assert got_never.settle(0.3) == []
    assert [m.payload for m in got_new.settle(0.1)] == [b"kept"]
    assert [m.payload for m in got_always.settle(0.1)] == [b"kept", b"kept"]
    # Live publishes still reach every one of them.
    before = {id(g): len(g.messages) for g in (got_always, got_never, got_new)}
    publish(pub, "rh/t", b"live")
    for got in (got_always, got_never, got_new):
        assert got.wait_for(before[id(got)] + 1)[-1].payload == b"live"


def test_subscription_identifiers(v5):
    sub, got = v5("sid")
    subscribe(sub, got, "si/+", 1, properties=props("SUBSCRIBE", SubscriptionIdentifier=7))
    subscribe(sub, got, "si/#", 1, properties=props("SUBSCRIBE", SubscriptionIdentifier=9))
    subscribe(sub, got, "si/only/deep", 0)  # no identifier
    pub, _ = v5("sid-pub")
    publish(pub, "si/a", b"both")
    publish(pub, "si/a/b", b"hash-only")
    publish(pub, "si/only/deep", b"hash-and-none")
    got.wait_for(3)
    messages = got.settle(0.3)
    assert [m.payload for m in messages] == [b"both", b"hash-only", b"hash-and-none"]
    assert sorted(messages[0].properties.SubscriptionIdentifier) == [7, 9]
    assert messages[1].properties.SubscriptionIdentifier == [9]
    assert messages[2].properties.SubscriptionIdentifier == [9]
    assert messages[0].qos == 1


# -- shared subscriptions -----------------------------------------------------------------------------


def test_shared_subscription_spreads_messages_over_members(broker, v5):
    members = []
    for i in range(3):
        client, got = v5(f"share-{i}")
        assert [code(c) for c in subscribe(client, got, "$share/g/sh/#", 1)] == [1]
        subscribe(client, got, f"mark/{i}", 1)  # its own topic, for the marker barrier below
        members.append((client, got))
    plain, got_plain = v5("share-plain")
    subscribe(plain, got_plain, "sh/#", 1)
    pub, _ = v5("share-pub")

    def shared(got: Any) -> list[bytes]:
        return [m.payload for m in got.messages if m.topic.startswith("sh/")]

    def marks(i: int) -> int:
        return sum(m.topic == f"mark/{i}" for m in members[i][1].messages)

    def caught_up(indexes: range) -> None:
        """A marker on each member's own topic, published after the shared messages, has arrived: the
        broker delivers a session's messages in the order it routed them, so any copy (a duplicate)
        of a shared message routed before is in ``messages`` by now."""
        before = {i: marks(i) for i in indexes}
        for i in indexes:
            publish(pub, f"mark/{i}", b"mark")
        for i in indexes:
            wait_until(lambda: marks(i) > before[i], what=f"the marker to member {i}")

    for i in range(30):
        publish(pub, f"sh/{i % 3}", f"s{i}".encode())
    got_plain.wait_for(30)
    caught_up(range(3))
    received = [shared(g) for _, g in members]
    flat = [p for r in received for p in r]
    assert sorted(flat) == sorted(f"s{i}".encode() for i in range(30))  # each exactly once
    assert all(r for r in received), [len(r) for r in received]
    assert sorted(got_plain.payloads()) == sorted(flat)

    # One member leaves: the two others get the rest, each message once.
    mqtt_close(members[2][0])
    wait_until(lambda: session_gone(broker, "share-2"), what="the leaving member's session to end")
    for i in range(30, 45):
        publish(pub, "sh/x", f"s{i}".encode())
    caught_up(range(2))
    after = [p for _, g in members[:2] for p in shared(g) if int(p[1:]) >= 30]
    assert sorted(after) == sorted(f"s{i}".encode() for i in range(30, 45))
    assert len(shared(members[2][1])) == len(received[2])
    got_plain.wait_for(45)


# -- server DISCONNECTs -----------------------------------------------------------------------------------


def test_takeover_disconnects_the_first_client_with_0x8e(v5):
    first, got_first = v5("taken", expiry=30)
    _, got_second = v5("taken", expiry=30, clean=False)
    (reason,) = got_first.wait_for(1, what="disconnects")
    mqtt_close(first)  # before paho's automatic reconnect takes it back
    assert code(reason) == 0x8E
    assert got_second.connacks[0][0].session_present


def test_shutdown_disconnects_with_0x8b(own, v5):
    handle = own()
    client, got = v5("bye", handle=handle)
    own.handles.remove(handle)
    handle.stop()
    (reason,) = got.wait_for(1, what="disconnects")
    mqtt_close(client)
    assert code(reason) == 0x8B


# -- further probes --------------------------------------------------------------------------------------


def test_broker_receive_maximum_is_enforced_inbound(own):
    handle = own(receive_maximum=2)
    r = RawMqtt(handle, level=5)
    try:
        assert r.connect("rm-in").properties["receive_maximum"] == 2
        for pid in (1, 2):
            r.packet(mq.Publish("ri/t", b"x", 2, packet_id=pid))
            assert r.read() == mq.Pubrec(pid)
        r.packet(mq.Publish("ri/t", b"x", 2, packet_id=3))
        expect_disconnect(r, 0x93)
    finally:
        r.close()


def test_receive_maximum_counts_qos2_until_pubcomp(raw, v5):
    r = raw()
    r.connect("rm2-sub", properties={"receive_maximum": 2})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("rm2/t", 2)]))
    r.read()
    pub, _ = v5("rm2-pub")
    for i in range(4):
        publish(pub, "rm2/t", f"m{i}".encode(), qos=2)
    first, second = r.read(), r.read()
    assert (first.qos, second.qos) == (2, 2)
    r.packet(mq.Pubrec(first.packet_id))
    r.packet(mq.Pubrec(second.packet_id))
    seen = []
    try:
        while True:
            seen.append(r.read(0.3))
    except (AssertionError, TimeoutError):
        pass
    assert sorted(p.packet_id for p in seen if isinstance(p, mq.Pubrel)) == sorted([first.packet_id, second.packet_id])
    # Two QoS 2 flows are unfinished (no PUBCOMP yet): no third PUBLISH may come.
    assert [p.payload for p in seen if isinstance(p, mq.Publish)] == []
    r.packet(mq.Pubcomp(first.packet_id))
    assert r.read().payload == b"m2"


def test_outbound_alias_not_spent_on_a_discarded_publish(raw, v5):
    r = raw()
    r.connect("alias-size", properties={"topic_alias_maximum": 5, "maximum_packet_size": 100})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("as/t", 0)]))
    r.read()
    pub, _ = v5("as-pub")
    publish(pub, "as/t", b"x" * 500, qos=0)
    publish(pub, "as/t", b"small", qos=0)
    packet = r.read()
    assert packet.payload == b"small"
    assert packet.topic == "as/t"  # the first one the client sees must name the topic


def test_persistent_session_may_change_no_local_on_resubscribe(raw):
    r = raw()
    r.connect("nl-change", properties={"session_expiry_interval": 60})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("nlc/t", 1)]))
    assert r.read().reason_codes == [1]
    r.packet(mq.Subscribe(2, [mq.SubscriptionRequest("nlc/t", 1, no_local=True)]))
    reply = r.read()
    assert isinstance(reply, mq.Suback) and reply.reason_codes == [1], reply


def test_persistent_session_resubscribe_replaces_qos_and_identifier(v5):
    sub, got = v5("resub", expiry=60)
    subscribe(sub, got, "rs/t", 0, properties=props("SUBSCRIBE", SubscriptionIdentifier=3))
    subscribe(sub, got, "rs/t", 1, properties=props("SUBSCRIBE", SubscriptionIdentifier=4))
    pub, _ = v5("rs-pub")
    publish(pub, "rs/t", b"x")
    (message,) = got.wait_for(1)
    assert message.qos == 1
    assert message.properties.SubscriptionIdentifier == [4]


def test_unacked_deliveries_are_resent_with_dup_after_reconnect(raw, v5, broker):
    r = raw()
    r.connect("dup-sub", properties={"session_expiry_interval": 60})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("du/t", 1)]))
    r.read()
    pub, _ = v5("du-pub")
    publish(pub, "du/t", b"a")
    publish(pub, "du/t", b"b")
    first, second = r.read(), r.read()
    assert not first.dup and not second.dup
    drop(r)
    wait_until(lambda: broker.inspect(lambda: broker.gateway.mqtt_hub.clients["dup-sub"].live is None), what="offline")
    r2 = raw()
    assert r2.connect("dup-sub", clean=False, properties={"session_expiry_interval": 60}).session_present
    again = [r2.read(), r2.read()]
    assert [(p.payload, p.dup, p.packet_id) for p in again] == [
        (b"a", True, first.packet_id), (b"b", True, second.packet_id),
    ]
    for p in again:
        r2.packet(mq.Puback(p.packet_id))
    no_packet(r2)


def test_disconnect_with_will_message_sends_the_will(raw, v5):
    watcher, got = v5("dw-watch")
    subscribe(watcher, got, "dw/will", 0)
    r = raw()
    r.packet(mq.Connect("MQTT", 5, True, 60, "dw", will=mq.Will(
        "dw/will", b"asked-for", 0, False, {"content_type": "text/plain", "user_properties": [("why", "0x04")]})))
    assert r.read().reason_code == 0
    r.packet(mq.Disconnect(0x04))
    assert r.closed_by_peer()
    (message,) = got.wait_for(1)
    assert message.payload == b"asked-for"
    assert message.properties.ContentType == "text/plain"
    assert message.properties.UserProperty == [("why", "0x04")]


def test_normal_disconnect_discards_the_will(raw, v5):
    watcher, got = v5("dn-watch")
    subscribe(watcher, got, "dn/will", 0)
    r = raw()
    r.packet(mq.Connect("MQTT", 5, True, 60, "dn", will=mq.Will("dn/will", b"no")))
    assert r.read().reason_code == 0
    r.packet(mq.Disconnect(0))
    assert r.closed_by_peer()
    assert got.settle(0.3) == []


def test_keep_alive_timeout_is_0x8d(raw):
    r = raw()
    r.connect("ka-quiet", keep_alive=1)
    start = time.monotonic()
    packet = r.read(timeout=10)
    assert isinstance(packet, mq.Disconnect) and packet.reason_code == 0x8D, packet
    # Not within the keep-alive period (1.5 periods to the tick: tests/unit/test_mqtt_session.py, virtual clock).
    assert time.monotonic() - start >= 1.0
    assert r.closed_by_peer()


def test_retained_message_expires(v5):
    pub, _ = v5("rx-pub")
    publish(pub, "rx/short", b"gone-soon", retain=True, properties=props("PUBLISH", MessageExpiryInterval=1))
    publish(pub, "rx/long", b"stays", retain=True, properties=props("PUBLISH", MessageExpiryInterval=30))
    time.sleep(1.2)  # a real clock window: message expiry counts whole seconds (1 s), checked when read
    sub, got = v5("rx-sub")
    subscribe(sub, got, "rx/#", 1)
    (message,) = got.wait_for(1)
    assert message.payload == b"stays" and message.retain
    assert 28 <= message.properties.MessageExpiryInterval <= 29
    assert len(got.settle(0.2)) == 1


def test_shared_subscription_deliveries_carry_the_members_identifier(v5):
    member, got = v5("sh-id")
    subscribe(member, got, "$share/g/shid/#", 1, properties=props("SUBSCRIBE", SubscriptionIdentifier=12))
    pub, _ = v5("sh-id-pub")
    publish(pub, "shid/a", b"x")
    (message,) = got.wait_for(1)
    assert message.topic == "shid/a"
    assert message.properties.SubscriptionIdentifier == [12]


def test_user_properties_cannot_forge_stomp_framing_headers(broker, v5):
    conn, got_stomp = connect(broker)
    try:
        conn.subscribe("/topic/forge.t", id="s", ack="client-individual")
        sync(conn, got_stomp)
        pub, _ = v5("forge-pub")
        publish(pub, "forge/t", b"hello world", properties=props("PUBLISH", UserProperty=[
            ("content-length", "1"), ("ack", "bogus"), ("subscription", "other"), ("message-id", "forged"),
            ("weird:name", "line\nbreak"),
        ]))
        (frame,) = got_stomp.wait_for(1)
        assert frame.body == "hello world"
        assert frame.headers["subscription"] == "s"
        assert frame.headers["message-id"] != "forged"
        assert frame.headers["ack"] != "bogus"
        assert frame.headers["weird:name"] == "line\nbreak"
        conn.ack(frame.headers["ack"])
    finally:
        disconnect(conn)


def test_takeover_publishes_the_old_connections_will(v5, broker):
    watcher, got = v5("tw-watch")
    subscribe(watcher, got, "tw/will", 0)
    r = RawMqtt(broker, level=5)
    try:
        r.packet(mq.Connect("MQTT", 5, True, 60, "tw", will=mq.Will("tw/will", b"taken-over")))
        assert r.read().reason_code == 0
        r2 = RawMqtt(broker, level=5)
        try:
            assert r2.connect("tw").reason_code == 0
            expect_disconnect(r, 0x8E)
            assert [m.payload for m in got.wait_for(1)] == [b"taken-over"]
        finally:
            r2.close()
    finally:
        r.close()


def test_dollar_topics_do_not_match_leading_wildcards(v5):
    everything, got_all = v5("dollar-all")
    subscribe(everything, got_all, "#", 0)
    plus, got_plus = v5("dollar-plus")
    subscribe(plus, got_plus, "+/x", 0)
    dollar, got_dollar = v5("dollar-own")
    subscribe(dollar, got_dollar, "$app/#", 0)
    pub, _ = v5("dollar-pub")
    publish(pub, "$app/x", b"dollar", qos=0)
    publish(pub, "app/x", b"plain", qos=0)
    got_dollar.wait_for(1)
    got_all.wait_for(1)
    got_plus.wait_for(1)
    assert [m.payload for m in got_dollar.settle(0.2)] == [b"dollar"]
    assert [m.payload for m in got_all.messages if m.topic.endswith("x")] == [b"plain"]
    assert [m.payload for m in got_plus.messages] == [b"plain"]


def test_takeover_keeps_inflight_deliveries_for_the_new_connection(raw, v5, broker):
    a = raw()
    a.connect("tk", properties={"session_expiry_interval": 60, "receive_maximum": 2})
    a.packet(mq.Subscribe(1, [mq.SubscriptionRequest("tk/t", 1)]))
    a.read()
    pub, _ = v5("tk-pub")
    for i in range(4):
        publish(pub, "tk/t", f"m{i}".encode())
    assert [a.read().payload for _ in range(2)] == [b"m0", b"m1"]
    b = raw()
    assert b.connect("tk", clean=False, properties={"session_expiry_interval": 60, "receive_maximum": 2}).session_present
    expect_disconnect(a, 0x8E)
    again = [b.read(), b.read()]
    assert [(p.payload, p.dup) for p in again] == [(b"m0", True), (b"m1", True)]
    # The old connection's loss handled (its session object gone): it must not touch the new one's state.
    wait_until(lambda: broker.sessions() == 2, what="the taken-over connection's session to go (b and tk-pub left)")
    for p in again:
        b.packet(mq.Puback(p.packet_id))
    assert [b.read().payload, b.read().payload] == [b"m2", b"m3"]


def test_receive_maximum_spans_shared_and_plain_subscriptions(raw, v5):
    r = raw()
    r.connect("rm-shared", properties={"receive_maximum": 2})
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("rms/a", 1), mq.SubscriptionRequest("$share/g/rms/b", 1)]))
    assert r.read().reason_codes == [1, 1]
    pub, _ = v5("rms-pub")
    for i in range(3):
        publish(pub, "rms/a", f"a{i}".encode())
        publish(pub, "rms/b", f"b{i}".encode())
    seen = []
    try:
        while True:
            seen.append(r.read(0.4))
    except (AssertionError, TimeoutError):
        pass
    assert len(seen) == 2, [p.payload for p in seen]


def test_topic_aliases_do_not_survive_the_connection(raw, v5):
    r = raw()
    r.connect("alias-conn", properties={"session_expiry_interval": 60})
    r.packet(mq.Publish("ac/t", b"1", properties={"topic_alias": 2}))
    r.packet(mq.Disconnect(0))
    assert r.closed_by_peer()
    r2 = raw()
    assert r2.connect("alias-conn", clean=False, properties={"session_expiry_interval": 60}).session_present
    r2.packet(mq.Publish("", b"2", properties={"topic_alias": 2}))
    expect_disconnect(r2, 0x82)


def test_retained_message_on_subscribe_carries_the_subscription_identifier(v5):
    pub, _ = v5("rsi-pub")
    publish(pub, "rsi/t", b"kept", retain=True)
    sub, got = v5("rsi-sub")
    subscribe(sub, got, "rsi/#", 1, properties=props("SUBSCRIBE", SubscriptionIdentifier=5))
    (message,) = got.wait_for(1)
    assert message.retain and message.properties.SubscriptionIdentifier == [5]


def test_session_that_never_expires(v5, broker):
    sub, got = v5("forever", expiry=0xFFFFFFFF)
    subscribe(sub, got, "fe/t", 1)
    mqtt_close(sub)
    wait_until(lambda: broker.inspect(lambda: broker.gateway.mqtt_hub.clients["forever"].live is None), what="offline")
    assert broker.inspect(lambda: broker.gateway.mqtt_hub.clients["forever"].expiry_timer) is None
    pub, _ = v5("fe-pub")
    publish(pub, "fe/t", b"later")
    _, got2 = v5("forever", expiry=0xFFFFFFFF, clean=False)
    assert got2.connacks[0][0].session_present
    assert [m.payload for m in got2.wait_for(1)] == [b"later"]


def test_a_publish_resent_with_the_same_duplicate_id_is_routed_once(broker, v5):
    """Artemis's _AMQ_DUPL_ID as a user property: a device resending after a lost PUBACK."""
    sub, got = v5("dedup-sub")
    subscribe(sub, got, "dedup/t", qos=1)
    pub, _ = v5("dedup-pub")
    for payload in (b"first", b"resent", b"other id"):
        dup_id = "reading-7" if payload != b"other id" else "reading-8"
        publish(pub, "dedup/t", payload, qos=1, properties=props("PUBLISH", UserProperty=[("_AMQ_DUPL_ID", dup_id)]))
    got.wait_for(2)
    assert got.settle() and got.payloads() == [b"first", b"other id"]
