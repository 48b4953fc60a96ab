"""MQTT 3.1.1 (and 3.1) with paho-mqtt and raw sockets: CONNECT rules, keep-alive,
QoS 0/1/2 flows in both directions, SUBSCRIBE/UNSUBSCRIBE, retained messages,
wildcards and ``$SYS`` topics."""
from __future__ import annotations

import socket
import time

import pytest

from protocols.mqtt import codec as mq
from tests.support import RawMqtt, mqtt_close, mqtt_connect, mqtt_unsubscribe, wait_until
from tests.support import mqtt_publish as publish
from tests.support import mqtt_subscribe as subscribe

# -- helpers -----------------------------------------------------------------


def raw(broker, client_id="raw", clean=True, level=4, keep_alive=60):
    r = RawMqtt(broker, level=level)
    ack = r.connect(client_id, clean=clean, keep_alive=keep_alive)
    assert isinstance(ack, mq.Connack) and ack.reason_code == 0, ack
    return r


def raw_subscribe(r, pid, *filters):
    r.packet(mq.Subscribe(pid, [mq.SubscriptionRequest(f, q) for f, q in filters]))
    ack = r.read()
    assert isinstance(ack, mq.Suback) and ack.packet_id == pid, ack
    return ack.reason_codes


def topics(messages):
    return [m.topic for m in messages]


@pytest.fixture
def mqtt(broker):
    """mqtt_connect() to the test's broker; closes whatever the test left connected."""
    made = []

    def make(client_id="", **kwargs):
        client, got = mqtt_connect(broker, client_id, **kwargs)
        made.append(client)
        return client, got

    yield make
    for client in made:
        mqtt_close(client)


# -- CONNECT -----------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 3])
def test_connect_is_accepted_for_311_and_31(mqtt, version):
    client, got = mqtt("plain-" + str(version), version=version)
    flags, reason, _ = got.connacks[0]
    assert reason.value == 0
    assert flags.session_present is False
    # The connection works: a message round-trips at QoS 1.
    assert subscribe(client, got, ("v/check", 1)) == [1]
    publish(client, "v/check", b"hi", qos=1)
    assert got.wait_for(1)[0].payload == b"hi"


def test_raw_31_connect_with_mqisdp_name(broker):
    r = RawMqtt(broker, level=3)
    ack = r.connect("old-timer")
    assert isinstance(ack, mq.Connack) and ack.reason_code == 0 and not ack.session_present
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp)
    r.close()


def test_empty_client_id_with_clean_session_is_assigned_one(broker, mqtt):
    r = RawMqtt(broker)
    ack = r.connect("", clean=True)
    assert isinstance(ack, mq.Connack) and ack.reason_code == 0 and not ack.session_present
    assert raw_subscribe(r, 1, ("anon/t", 0)) == [0]
    pub, _ = mqtt("anon-pub")
    publish(pub, "anon/t", b"to-anon", qos=1)
    msg = r.read()
    assert isinstance(msg, mq.Publish) and msg.topic == "anon/t" and msg.payload == b"to-anon"
    r.close()


def test_empty_client_id_with_paho_is_accepted(mqtt):
    _, got = mqtt("")
    assert got.connacks[0][1].value == 0


def test_empty_client_id_without_clean_session_is_refused(broker):
    r = RawMqtt(broker)
    ack = r.connect("", clean=False)
    assert isinstance(ack, mq.Connack)
    assert ack.reason_code == 2  # identifier rejected
    assert not ack.session_present
    assert r.closed_by_peer(), "the broker kept a refused connection open"


@pytest.mark.parametrize("client_id", ["", "x" * 24])
def test_31_client_id_must_be_1_to_23_characters(broker, client_id):
    r = RawMqtt(broker, level=3)
    ack = r.connect(client_id, clean=True)
    assert isinstance(ack, mq.Connack) and ack.reason_code == 2, ack
    assert r.closed_by_peer()


def test_unsupported_protocol_level_gets_connack_1_and_close(broker):
    r = RawMqtt(broker)
    body = b"\x00\x04MQTT" + bytes([6, 0x02, 0x00, 0x3C]) + b"\x00\x01x"
    r.send(bytes([0x10, len(body)]) + body)
    ack = r.read()
    assert isinstance(ack, mq.Connack) and ack.reason_code == 1, ack
    assert r.closed_by_peer()


def test_second_connect_closes_the_connection(broker):
    r = raw(broker, "twice")
    r.packet(mq.Connect("MQTT", 4, True, 60, "twice"))
    assert r.closed_by_peer()
    # The broker is fine and the id is free again.
    again = raw(broker, "twice")
    again.packet(mq.Pingreq())
    assert isinstance(again.read(), mq.Pingresp)
    again.close()


def test_pingreq_gets_pingresp(broker):
    r = raw(broker, "pinger")
    for _ in range(3):
        r.packet(mq.Pingreq())
        assert isinstance(r.read(), mq.Pingresp)
    r.close()


def test_keep_alive_silence_disconnects_on_the_reactors_clock(broker):
    """The wiring: a silent client is closed over a real socket by the running reactor's timer.

    When (1.5 keep-alive periods, not sooner, not half a period later) is
    tests/unit/test_mqtt_session.py's test_keep_alive_silence_closes_and_publishes_the_will
    on a virtual clock, for 3.1.1 and 5.0; here only the lower bound, which no
    slow machine can break: nothing closes a client within its keep-alive period.
    """
    r = RawMqtt(broker)
    start = time.monotonic()
    ack = r.connect("sleepy", keep_alive=1)
    assert ack.reason_code == 0
    assert r.closed_by_peer(10), "a silent client kept its connection long after 1.5 keep-alive periods"
    assert time.monotonic() - start >= 1.0, "closed within the keep-alive period"
    assert r.received == [], "3.1.1 has no DISCONNECT from the server: the socket just closes"


def test_keep_alive_pings_keep_the_connection(broker):
    r = raw(broker, "awake", keep_alive=1)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        r.packet(mq.Pingreq())
        assert isinstance(r.read(), mq.Pingresp)
        time.sleep(0.5)  # the broker's own timer under test: pings 0.5 s apart, over 1.5 keep-alive periods of 1 s
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp)
    r.close()


# -- QoS ---------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 3])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_qos_end_to_end(mqtt, qos, version):
    sub, got = mqtt("sub-q", version=version)
    assert subscribe(sub, got, ("qos/t", qos)) == [qos]
    pub, _ = mqtt("pub-q", version=version)
    payloads = [f"m{i}".encode() for i in range(20)] + [b"\x00\xff binary \x80"]
    for p in payloads:
        publish(pub, "qos/t", p, qos=qos)
    received = got.wait_for(len(payloads))
    assert [m.payload for m in received] == payloads
    assert {m.qos for m in received} == {qos}
    assert {m.topic for m in received} == {"qos/t"}
    assert not any(m.retain for m in received)
    assert not any(m.dup for m in received)


@pytest.mark.parametrize("pub_qos,sub_qos,expected", [(2, 1, 1), (0, 2, 0), (1, 2, 1), (2, 0, 0), (1, 0, 0)])
def test_delivery_qos_is_the_lower_of_publish_and_subscription(mqtt, pub_qos, sub_qos, expected):
    sub, got = mqtt("sub-min")
    assert subscribe(sub, got, ("min/t", sub_qos)) == [sub_qos]
    pub, _ = mqtt("pub-min")
    publish(pub, "min/t", b"x", qos=pub_qos)
    (msg,) = got.wait_for(1)
    assert msg.qos == expected


def test_suback_grants_per_filter_and_refuses_invalid_filters(broker, mqtt):
    r = raw(broker, "filters")
    codes = raw_subscribe(r, 3, ("ok/0", 0), ("a/#/b", 1), ("ok/1", 1), ("a+", 1), ("ok/2", 2), ("#", 2))
    assert codes == [0, 0x80, 1, 0x80, 2, 2]
    pub, _ = mqtt("filters-pub")
    publish(pub, "ok/1", b"one", qos=1)
    msg = r.read()
    assert isinstance(msg, mq.Publish) and msg.topic == "ok/1" and msg.payload == b"one" and msg.qos == 1
    r.close()


def test_unsubscribe_gets_unsuback_and_stops_delivery(mqtt):
    sub, got = mqtt("unsub")
    assert subscribe(sub, got, ("u/a", 1), ("u/b", 1)) == [1, 1]
    pub, _ = mqtt("unsub-pub")
    publish(pub, "u/a", b"a1", qos=1)
    assert got.wait_for(1)[0].payload == b"a1"

    mqtt_unsubscribe(sub, got, "u/a")  # returns on the UNSUBACK

    publish(pub, "u/a", b"a2", qos=1)
    publish(pub, "u/b", b"b1", qos=1)  # a marker after the message that must not come
    got.wait_for(2)
    assert got.payloads() == [b"a1", b"b1"]


def test_raw_unsuback_has_the_packet_id(broker):
    r = raw(broker, "raw-unsub")
    raw_subscribe(r, 1, ("ru/x", 0))
    r.packet(mq.Unsubscribe(9, ["ru/x"]))
    ack = r.read()
    assert isinstance(ack, mq.Unsuback) and ack.packet_id == 9
    # A filter that was never subscribed is still acknowledged (3.1.1 3.10.4).
    r.packet(mq.Unsubscribe(10, ["never/subscribed"]))
    ack = r.read()
    assert isinstance(ack, mq.Unsuback) and ack.packet_id == 10
    r.close()


def test_qos2_inbound_retransmission_is_routed_once(broker, mqtt):
    sub, got = mqtt("once-sub")
    assert subscribe(sub, got, ("once/t", 2)) == [2]
    r = raw(broker, "once-pub")
    r.packet(mq.Publish("once/t", b"exactly", qos=2, packet_id=7))
    rec = r.read()
    assert isinstance(rec, mq.Pubrec) and rec.packet_id == 7
    r.packet(mq.Publish("once/t", b"exactly", qos=2, dup=True, packet_id=7))
    rec = r.read()
    assert isinstance(rec, mq.Pubrec) and rec.packet_id == 7
    r.packet(mq.Pubrel(7))
    comp = r.read()
    assert isinstance(comp, mq.Pubcomp) and comp.packet_id == 7
    # A marker from the same publisher arrives after anything the retransmission could have
    # routed (QoS 2 too: paho hands a QoS 2 message over at PUBREL, so mixed QoS would reorder).
    r.packet(mq.Publish("once/t", b"marker", qos=2, packet_id=8))
    assert isinstance(r.read(), mq.Pubrec)
    r.packet(mq.Pubrel(8))
    assert isinstance(r.read(), mq.Pubcomp)
    got.wait_for(2)
    assert got.payloads() == [b"exactly", b"marker"]
    # After PUBREL the id is free: the same id carries a new message.
    r.packet(mq.Publish("once/t", b"again", qos=2, packet_id=7))
    assert isinstance(r.read(), mq.Pubrec)
    r.packet(mq.Pubrel(7))
    assert isinstance(r.read(), mq.Pubcomp)
    got.wait_for(3)
    assert got.payloads() == [b"exactly", b"marker", b"again"]
    r.close()


def _raw_publish_from(broker, client_id, topic, payload, qos=1):
    p = raw(broker, client_id)
    p.packet(mq.Publish(topic, payload, qos=qos, packet_id=1))
    p.read()  # PUBACK/PUBREC: routed
    if qos == 2:
        p.packet(mq.Pubrel(1))
        p.read()
    p.packet(mq.Disconnect())
    p.close()


def _drop(r):
    """Lose the connection without DISCONNECT (a reset, as a crashed client)."""
    r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    r.close()


def test_unacked_qos1_is_resent_with_dup_and_same_packet_id(broker):
    r = raw(broker, "dup1", clean=False)
    raw_subscribe(r, 1, ("dup/t", 1))
    _raw_publish_from(broker, "dup1-pub", "dup/t", b"first")
    first = r.read()
    assert isinstance(first, mq.Publish) and first.qos == 1 and first.packet_id and not first.dup
    _drop(r)

    r = RawMqtt(broker)
    ack = r.connect("dup1", clean=False)
    assert ack.reason_code == 0 and ack.session_present
    again = r.read()
    assert isinstance(again, mq.Publish), again
    assert again.payload == b"first" and again.dup and again.qos == 1
    assert again.packet_id == first.packet_id
    r.packet(mq.Puback(again.packet_id))
    r.packet(mq.Disconnect())
    assert r.closed_by_peer()

    r = RawMqtt(broker)
    assert r.connect("dup1", clean=False).session_present
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp), "an acknowledged message was sent again"
    r.close()


def test_qos2_outbound_resends_publish_before_pubrec_and_pubrel_after(broker):
    r = raw(broker, "dup2", clean=False)
    raw_subscribe(r, 1, ("dup2/t", 2))
    _raw_publish_from(broker, "dup2-pub", "dup2/t", b"two", qos=2)
    first = r.read()
    assert isinstance(first, mq.Publish) and first.qos == 2 and not first.dup
    pid = first.packet_id
    _drop(r)

    # Before PUBREC: the PUBLISH again, DUP set, same id.
    r = RawMqtt(broker)
    assert r.connect("dup2", clean=False).session_present
    again = r.read()
    assert isinstance(again, mq.Publish) and again.dup and again.packet_id == pid and again.payload == b"two"
    r.packet(mq.Pubrec(pid))
    rel = r.read()
    assert isinstance(rel, mq.Pubrel) and rel.packet_id == pid
    _drop(r)

    # After PUBREC: PUBREL again, never the PUBLISH.
    r = RawMqtt(broker)
    assert r.connect("dup2", clean=False).session_present
    rel = r.read()
    assert isinstance(rel, mq.Pubrel) and rel.packet_id == pid
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp), "the PUBLISH was sent again after PUBREC"
    r.packet(mq.Pubcomp(pid))
    r.packet(mq.Disconnect())
    assert r.closed_by_peer()

    # After PUBCOMP: nothing left.
    r = RawMqtt(broker)
    assert r.connect("dup2", clean=False).session_present
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp)
    r.close()


# -- retained messages -------------------------------------------------------


def test_retained_message_goes_to_new_subscribers_with_retain_flag(mqtt):
    pub, _ = mqtt("ret-pub")
    live, got_live = mqtt("ret-live")
    assert subscribe(live, got_live, ("home/+/temp", 1)) == [1]
    publish(pub, "home/kitchen/temp", b"21", qos=1, retain=True)
    publish(pub, "home/hall/temp", b"19", qos=1, retain=True)
    publish(pub, "home/hall/temp", b"18", qos=1, retain=True)  # replaces 19
    publish(pub, "home/hall/humidity", b"40", qos=1, retain=True)
    # An existing subscriber gets a normal delivery: retain 0.
    received = got_live.wait_for(3)
    assert [m.payload for m in received] == [b"21", b"19", b"18"]
    assert not any(m.retain for m in received)

    late, got_late = mqtt("ret-late")
    assert subscribe(late, got_late, ("home/+/temp", 1)) == [1]
    received = got_late.wait_for(2)
    assert sorted((m.topic, m.payload) for m in received) == [("home/hall/temp", b"18"), ("home/kitchen/temp", b"21")]
    assert all(m.retain for m in received)
    assert got_late.settle(0.2) == received

    every, got_every = mqtt("ret-every")
    assert subscribe(every, got_every, ("home/#", 0)) == [0]
    received = got_every.wait_for(3)
    assert sorted(topics(received)) == ["home/hall/humidity", "home/hall/temp", "home/kitchen/temp"]
    assert all(m.retain and m.qos == 0 for m in received)

    exact, got_exact = mqtt("ret-exact")
    assert subscribe(exact, got_exact, ("home/hall/temp", 2)) == [2]
    (msg,) = got_exact.wait_for(1)
    assert msg.payload == b"18" and msg.retain


def test_empty_retained_payload_clears_and_is_still_delivered(mqtt):
    pub, _ = mqtt("clr-pub")
    publish(pub, "clr/t", b"keep", qos=1, retain=True)
    live, got_live = mqtt("clr-live")
    assert subscribe(live, got_live, ("clr/#", 1)) == [1]
    assert got_live.wait_for(1)[0].retain
    publish(pub, "clr/t", b"", qos=1, retain=True)
    msgs = got_live.wait_for(2)
    assert msgs[1].payload == b"" and msgs[1].topic == "clr/t" and not msgs[1].retain

    late, got_late = mqtt("clr-late")
    assert subscribe(late, got_late, ("clr/#", 1)) == [1]
    publish(pub, "clr/marker", b"m", qos=1)  # not retained: comes only because it is live
    (msg,) = got_late.wait_for(1)
    assert msg.topic == "clr/marker" and got_late.payloads() == [b"m"]


@pytest.mark.parametrize("sub_qos,expected", [(0, 0), (1, 1), (2, 1)])
def test_retained_qos1_arrives_at_the_lower_qos(mqtt, sub_qos, expected):
    pub, _ = mqtt("rq-pub")
    publish(pub, "rq/t", b"r", qos=1, retain=True)
    sub, got = mqtt("rq-sub")
    assert subscribe(sub, got, ("rq/t", sub_qos)) == [sub_qos]
    (msg,) = got.wait_for(1)
    assert msg.retain and msg.qos == expected and msg.payload == b"r"


def test_retained_message_is_not_sent_again_on_resubscribe_when_cleared(mqtt):
    pub, _ = mqtt("rr-pub")
    publish(pub, "rr/t", b"v1", qos=1, retain=True)
    sub, got = mqtt("rr-sub")
    subscribe(sub, got, ("rr/t", 1))
    assert got.wait_for(1)[0].payload == b"v1"
    # Subscribing again to the same filter sends the retained message again (3.1.1 3.8.4).
    subscribe(sub, got, ("rr/t", 1))
    msgs = got.wait_for(2)
    assert [m.payload for m in msgs] == [b"v1", b"v1"] and msgs[1].retain


# -- wildcards and topic names ------------------------------------------------


def test_wildcards(mqtt):
    pub, _ = mqtt("wc-pub")
    plus, got_plus = mqtt("wc-plus")
    hash_, got_hash = mqtt("wc-hash")
    mid, got_mid = mqtt("wc-mid")
    assert subscribe(plus, got_plus, ("sport/+", 1)) == [1]
    assert subscribe(hash_, got_hash, ("sport/#", 1)) == [1]
    assert subscribe(mid, got_mid, ("+/tennis/+", 1)) == [1]
    sent = ["sport", "sport/tennis", "sport/tennis/player1", "sport/tennis/player1/ranking", "news/tennis/x", "sports/x"]
    for t in sent:
        publish(pub, t, t.encode(), qos=1)
    publish(pub, "sport/end", b"end", qos=1)
    assert topics(got_hash.wait_for(5)) == sent[:4] + ["sport/end"]
    assert topics(got_plus.wait_for(2)) == ["sport/tennis", "sport/end"]
    assert topics(got_mid.wait_for(2)) == ["sport/tennis/player1", "news/tennis/x"]
    assert len(got_hash.settle(0.1)) == 5 and len(got_plus.messages) == 2 and len(got_mid.messages) == 2


def test_wildcards_do_not_match_dollar_topics(mqtt):
    pub, _ = mqtt("dl-pub")
    every, got_every = mqtt("dl-every")
    plus, got_plus = mqtt("dl-plus")
    dollar, got_dollar = mqtt("dl-dollar")
    assert subscribe(every, got_every, ("#", 1)) == [1]
    assert subscribe(plus, got_plus, ("+/info", 1)) == [1]
    assert subscribe(dollar, got_dollar, ("$app/+", 1)) == [1]
    publish(pub, "$app/info", b"hidden", qos=1)
    publish(pub, "app/info", b"visible", qos=1)
    assert got_every.wait_for(1)[0].topic == "app/info"
    assert got_plus.wait_for(1)[0].topic == "app/info"
    assert got_dollar.wait_for(1)[0].topic == "$app/info"
    # Every "#" delivery so far is from "app/info": neither retained $SYS figures nor $app.
    assert not any(t.startswith("$") for t in topics(got_every.settle(0.1)))
    assert topics(got_plus.messages) == ["app/info"]


def test_sys_topics_are_retained_figures(mqtt):
    sub, got = mqtt("sys")
    assert subscribe(sub, got, ("$SYS/#", 0)) == [0]
    wanted = {"$SYS/broker/uptime", "$SYS/broker/clients/connected", "$SYS/broker/messages/received", "$SYS/broker/version",
              "$SYS/broker/store/bytes"}
    wait_until(lambda: wanted <= set(topics(got.messages)), what=lambda: f"{sorted(wanted)} among {topics(got.messages)}")
    by_topic = {m.topic: m for m in got.messages}
    assert all(by_topic[t].retain for t in wanted)
    assert by_topic["$SYS/broker/uptime"].payload.decode().endswith("seconds")
    assert by_topic["$SYS/broker/clients/connected"].payload.decode().isdigit()
    assert by_topic["$SYS/broker/messages/received"].payload.decode().isdigit()
    assert by_topic["$SYS/broker/version"].payload
    for figure in ("retained messages/count", "queues/count", "queues/messages", "queues/consumers", "store/bytes"):
        assert by_topic[f"$SYS/broker/{figure}"].payload.decode().isdigit(), figure


def test_dot_in_a_topic_level_round_trips(mqtt):
    sub, got = mqtt("dot-sub")
    assert subscribe(sub, got, ("a/+", 1), ("b/temp.c/#", 1)) == [1, 1]
    pub, _ = mqtt("dot-pub")
    publish(pub, "a/temp.c", b"21.5", qos=1)
    publish(pub, "a/b.c.d", b"x", qos=1)
    publish(pub, "b/temp.c/x.y", b"y", qos=1)
    publish(pub, "b/temp/c", b"no", qos=1)  # a different topic: must not match b/temp.c/#
    publish(pub, "a/end", b"end", qos=1)
    msgs = got.wait_for(4)
    assert [(m.topic, m.payload) for m in msgs] == [
        ("a/temp.c", b"21.5"), ("a/b.c.d", b"x"), ("b/temp.c/x.y", b"y"), ("a/end", b"end"),
    ]
