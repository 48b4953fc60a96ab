"""MQTT 3.1.1 sessions: persistent and clean sessions, QoS 1/2 across reconnects,
takeover by client id, wills, STOMP <-> MQTT on one topic space, and MQTT topics
configured to map to queues."""
from __future__ import annotations

import socket
import struct

import pytest

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


def session_present(got, index=-1):
    return got.connacks[index][0].session_present


def crash(client):
    """Lose a paho client's connection without DISCONNECT (the network thread stopped first)."""
    client.loop_stop()
    client._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client._sock.close()


def raw(broker, client_id, clean=True, keep_alive=60):
    r = RawMqtt(broker)
    ack = r.connect(client_id, clean=clean, keep_alive=keep_alive)
    assert isinstance(ack, mq.Connack) and ack.reason_code == 0, ack
    return r, ack


def raw_drop(r):
    r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    r.close()


def raw_subscribe(r, pid, *filters):
    r.packet(mq.Subscribe(pid, [mq.SubscriptionRequest(f, q) for f, q in filters]))
    ack = r.read()
    assert isinstance(ack, mq.Suback) and ack.packet_id == pid, ack
    return ack.reason_codes


def expect_nothing(r):
    """Nothing is waiting for a raw client: the next packet is the answer to a PINGREQ."""
    r.packet(mq.Pingreq())
    packet = r.read()
    assert isinstance(packet, mq.Pingresp), f"unexpected {packet!r}"


@pytest.fixture
def mqtt(broker):
    made = []

    def make(client_id="", **kwargs):
        client, got = mqtt_connect(broker, client_id, **kwargs)
        # A client the broker drops must not reconnect by itself and steal the id back.
        client.reconnect_delay_set(60, 120)
        made.append(client)
        return client, got

    yield make
    for client in made:
        mqtt_close(client)


# -- persistent and clean sessions --------------------------------------------


def test_persistent_session_keeps_subscriptions_and_queues_qos1_and_qos2(mqtt):
    sub, got = mqtt("keeper", clean=False)
    assert not session_present(got)
    assert subscribe(sub, got, ("p/#", 2)) == [2]
    mqtt_close(sub)

    pub, _ = mqtt("keeper-pub")
    publish(pub, "p/one", b"one", qos=1)
    publish(pub, "p/two", b"two", qos=2)

    sub, got = mqtt("keeper", clean=False)
    assert session_present(got)
    received = got.wait_for(2)
    assert sorted((m.topic, m.payload, m.qos) for m in received) == [("p/one", b"one", 1), ("p/two", b"two", 2)]
    # The subscription is still there: no SUBSCRIBE needed for live messages.
    publish(pub, "p/live", b"live", qos=1)
    got.wait_for(3)
    assert sorted(got.payloads()) == [b"live", b"one", b"two"]
    assert got.subacks == []


def test_qos0_messages_are_not_queued_for_an_absent_client(mqtt):
    sub, got = mqtt("no-q0", clean=False)
    assert subscribe(sub, got, ("z/#", 1)) == [1]
    mqtt_close(sub)

    pub, _ = mqtt("no-q0-pub")
    publish(pub, "z/zero", b"zero", qos=0)
    publish(pub, "z/one", b"one", qos=1)
    publish(pub, "z/zero", b"zero-again", qos=0)

    sub, got = mqtt("no-q0", clean=False)
    assert session_present(got)
    got.wait_for(1)
    publish(pub, "z/marker", b"marker", qos=1)
    got.wait_for(2)
    assert got.payloads() == [b"one", b"marker"]


def test_qos1_to_a_qos0_subscription_is_not_queued_for_an_absent_client(mqtt):
    """What is delivered at QoS 0 (min of publish and subscription) is not kept either."""
    sub, got = mqtt("no-q0-sub", clean=False)
    assert subscribe(sub, got, ("z0/a", 0), ("z0/b", 1)) == [0, 1]
    mqtt_close(sub)
    pub, _ = mqtt("no-q0-sub-pub")
    publish(pub, "z0/a", b"a", qos=1)
    publish(pub, "z0/b", b"b", qos=1)
    sub, got = mqtt("no-q0-sub", clean=False)
    assert session_present(got)
    assert got.wait_for(1)[0].payload == b"b"
    publish(pub, "z0/a", b"a-live", qos=1)
    got.wait_for(2)
    assert got.payloads() == [b"b", b"a-live"]


def test_clean_session_discards_the_old_one(mqtt):
    sub, got = mqtt("cleaner", clean=False)
    assert subscribe(sub, got, ("c/t", 1)) == [1]
    mqtt_close(sub)
    pub, _ = mqtt("cleaner-pub")
    publish(pub, "c/t", b"while-away", qos=1)

    sub, got = mqtt("cleaner", clean=True)
    assert not session_present(got)
    # Neither the queued message nor the old subscription survived.
    assert subscribe(sub, got, ("c/marker", 1)) == [1]
    publish(pub, "c/t", b"after", qos=1)
    publish(pub, "c/marker", b"marker", qos=1)
    got.wait_for(1)
    assert got.payloads() == [b"marker"]
    mqtt_close(sub)

    # A clean session ends with its connection: nothing to resume.
    sub, got = mqtt("cleaner", clean=False)
    assert not session_present(got)


def test_persistent_session_in_flight_qos1_is_redelivered_after_crash(mqtt, broker):
    r, _ = raw(broker, "inflight", clean=False)
    raw_subscribe(r, 1, ("if/t", 1))
    pub, _ = mqtt("inflight-pub")
    for i in range(3):
        publish(pub, "if/t", f"m{i}".encode(), qos=1)
    first = [r.read() for _ in range(3)]
    assert [p.payload for p in first] == [b"m0", b"m1", b"m2"]
    r.packet(mq.Puback(first[0].packet_id))  # only the first is acknowledged
    expect_nothing(r)
    raw_drop(r)

    r, ack = raw(broker, "inflight", clean=False)
    assert ack.session_present
    again = [r.read() for _ in range(2)]
    assert [(p.payload, p.dup, p.packet_id) for p in again] == [
        (b"m1", True, first[1].packet_id), (b"m2", True, first[2].packet_id),
    ]
    for p in again:
        r.packet(mq.Puback(p.packet_id))
    publish(pub, "if/t", b"m3", qos=1)
    fresh = r.read()
    assert fresh.payload == b"m3" and not fresh.dup
    assert fresh.packet_id not in {p.packet_id for p in again}
    r.packet(mq.Puback(fresh.packet_id))
    r.packet(mq.Disconnect())
    assert r.closed_by_peer()

    r, ack = raw(broker, "inflight", clean=False)
    assert ack.session_present
    expect_nothing(r)
    r.close()


def test_inbound_qos2_state_survives_a_reconnect(mqtt, broker):
    """A QoS 2 PUBLISH resent after a reconnect (before PUBREL) is not routed a second time."""
    watcher, got = mqtt("in2-watch")
    assert subscribe(watcher, got, ("in2/#", 2)) == [2]
    r, _ = raw(broker, "in2", clean=False)
    r.packet(mq.Publish("in2/t", b"once", qos=2, packet_id=5))
    assert isinstance(r.read(), mq.Pubrec)
    raw_drop(r)

    r, ack = raw(broker, "in2", clean=False)
    assert ack.session_present
    r.packet(mq.Publish("in2/t", b"once", qos=2, dup=True, packet_id=5))
    rec = r.read()
    assert isinstance(rec, mq.Pubrec) and rec.packet_id == 5
    r.packet(mq.Pubrel(5))
    assert isinstance(r.read(), mq.Pubcomp)
    r.packet(mq.Publish("in2/marker", b"marker", qos=2, packet_id=6))
    assert isinstance(r.read(), mq.Pubrec)
    r.packet(mq.Pubrel(6))
    assert isinstance(r.read(), mq.Pubcomp)
    got.wait_for(2)
    assert got.payloads() == [b"once", b"marker"]
    r.close()


def test_overlapping_filters_deliver_once_at_the_highest_qos(mqtt):
    sub, got = mqtt("overlap")
    assert subscribe(sub, got, ("ov/#", 0), ("ov/+", 2), ("ov/t", 1)) == [0, 2, 1]
    pub, _ = mqtt("overlap-pub")
    publish(pub, "ov/t", b"x", qos=2)
    publish(pub, "ov/a/b", b"deep", qos=2)  # only ov/# matches: QoS 0
    got.wait_for(2)
    assert sorted((m.payload, m.qos) for m in got.settle(0.1)) == [(b"deep", 0), (b"x", 2)]


def test_persistent_session_unsubscribe_and_resubscribe_are_kept(mqtt):
    sub, got = mqtt("resub", clean=False)
    assert subscribe(sub, got, ("rs/a", 1), ("rs/b", 1)) == [1, 1]
    sub.unsubscribe("rs/a")
    assert subscribe(sub, got, ("rs/b", 0)) == [0]  # same filter, new QoS: replaces it
    mqtt_close(sub)
    pub, _ = mqtt("resub-pub")
    publish(pub, "rs/a", b"a", qos=1)
    publish(pub, "rs/b", b"b", qos=1)  # delivered at QoS 0 now: not kept while away
    sub, got = mqtt("resub", clean=False)
    assert session_present(got)
    publish(pub, "rs/a", b"a-live", qos=1)
    publish(pub, "rs/b", b"b-live", qos=1)
    (msg,) = got.wait_for(1)
    assert (msg.payload, msg.qos) == (b"b-live", 0)
    assert got.settle(0.1) == [msg]


def test_many_queued_messages_keep_their_order(mqtt):
    sub, got = mqtt("order", clean=False)
    assert subscribe(sub, got, ("ord/t", 1)) == [1]
    mqtt_close(sub)
    pub, _ = mqtt("order-pub")
    expected = [f"m{i:03d}".encode() for i in range(200)]
    for p in expected:
        pub.publish("ord/t", p, 1)
    publish(pub, "ord/t", b"last", qos=1)
    sub, got = mqtt("order", clean=False)
    got.wait_for(201)
    assert got.payloads() == [*expected, b"last"]
    assert {m.qos for m in got.messages} == {1}


def test_persistent_session_survives_a_broker_restart(tmp_path):
    from persistence.memory import MemoryStore

    store = MemoryStore()
    config = make_config(tmp_path)
    handle = BrokerHandle(config, store)
    try:
        sub, got = mqtt_connect(handle, "restart", clean=False)
        assert subscribe(sub, got, ("rst/#", 1)) == [1]
        mqtt_close(sub)
        pub, _ = mqtt_connect(handle, "restart-pub")
        publish(pub, "rst/kept", b"kept", qos=1)
        publish(pub, "rst/retained", b"ret", qos=1, retain=True)
        mqtt_close(pub)
    finally:
        handle.stop()

    handle = BrokerHandle(config, store.reopen())
    try:
        sub, got = mqtt_connect(handle, "restart", clean=False)
        try:
            assert session_present(got)
            got.wait_for(2)
            # Recovered entries keep the QoS of the subscription that matched them.
            assert sorted((m.payload, m.qos) for m in got.messages) == [(b"kept", 1), (b"ret", 1)]
            # The subscription came back with the session.
            pub, _ = mqtt_connect(handle, "restart-pub")
            publish(pub, "rst/live", b"live", qos=1)
            mqtt_close(pub)
            got.wait_for(3)
            # The retained message outlived the restart too.
            other, got_other = mqtt_connect(handle, "restart-late")
            assert subscribe(other, got_other, ("rst/retained", 1)) == [1]
            (kept,) = got_other.wait_for(1)
            assert kept.retain and kept.payload == b"ret"
            mqtt_close(other)
        finally:
            mqtt_close(sub)
    finally:
        handle.stop()


def _restart(handle, config, store):
    handle.stop()
    return BrokerHandle(config, store.reopen())


def test_unacked_qos2_after_a_restart_is_resent_at_qos2(tmp_path):
    from persistence.memory import MemoryStore

    store = MemoryStore()
    config = make_config(tmp_path)
    handle = BrokerHandle(config, store)
    try:
        r, _ = raw(handle, "rs2", clean=False)
        raw_subscribe(r, 1, ("rs2/#", 2))
        p, _ = raw(handle, "rs2-pub")
        p.packet(mq.Publish("rs2/t", b"two", qos=2, packet_id=1))
        assert isinstance(p.read(), mq.Pubrec)
        p.packet(mq.Pubrel(1))
        assert isinstance(p.read(), mq.Pubcomp)
        first = r.read()
        assert first.qos == 2
        handle = _restart(handle, config, store)
        r, ack = raw(handle, "rs2", clean=False)
        assert ack.session_present
        again = r.read()
        assert (again.topic, again.payload, again.qos) == ("rs2/t", b"two", 2)
        r.packet(mq.Pubrec(again.packet_id))
        assert isinstance(r.read(), mq.Pubrel)
        r.packet(mq.Pubcomp(again.packet_id))
        r.packet(mq.Disconnect())
        assert r.closed_by_peer()
    finally:
        handle.stop()


def test_unacked_qos1_after_a_restart_keeps_dup_and_packet_id(tmp_path):
    from persistence.memory import MemoryStore

    store = MemoryStore()
    config = make_config(tmp_path)
    handle = BrokerHandle(config, store)
    try:
        r, _ = raw(handle, "rs1", clean=False)
        raw_subscribe(r, 1, ("rs1/#", 1))
        p, _ = raw(handle, "rs1-pub")
        for i in range(1, 4):
            p.packet(mq.Publish("rs1/t", b"m%d" % i, qos=1, packet_id=i))
            assert isinstance(p.read(), mq.Puback)
        first = [r.read() for _ in range(3)]
        r.packet(mq.Puback(first[0].packet_id))
        r.packet(mq.Puback(first[1].packet_id))
        expect_nothing(r)
        handle = _restart(handle, config, store)
        r, ack = raw(handle, "rs1", clean=False)
        assert ack.session_present
        again = r.read()
        assert (again.payload, again.qos) == (b"m3", 1)
        assert (again.dup, again.packet_id) == (True, first[2].packet_id)
    finally:
        handle.stop()


def test_a_retained_message_sent_on_subscribe_and_unacked_comes_back_after_a_restart_with_retain_1(tmp_path):
    """MQTT-3.3.1-8 across a restart: the resent PUBLISH is the one sent because of the SUBSCRIBE.

    Why: the entry's reason lived only in memory, so an entry read back from the
    store went out as a live forward would (RETAIN 0).  A live forward of a
    retained publish, stored for the same session, still goes out with RETAIN 0.
    """
    from persistence.memory import MemoryStore

    store = MemoryStore()
    config = make_config(tmp_path)
    handle = BrokerHandle(config, store)
    try:
        p, _ = raw(handle, "rr-pub")
        p.packet(mq.Publish("rr/kept", b"retained before", qos=1, packet_id=1, retain=True))
        assert isinstance(p.read(), mq.Puback)
        r, _ = raw(handle, "rr", clean=False)
        raw_subscribe(r, 1, ("rr/#", 1))
        on_subscribe = r.read()
        assert (on_subscribe.payload, on_subscribe.retain) == (b"retained before", True)
        p.packet(mq.Publish("rr/kept", b"retained live", qos=1, packet_id=2, retain=True))
        assert isinstance(p.read(), mq.Puback)
        live = r.read()
        assert (live.payload, live.retain) == (b"retained live", False)
        # Neither is acknowledged: both are in the session's store when the broker stops.
        handle = _restart(handle, config, store)
        r, ack = raw(handle, "rr", clean=False)
        assert ack.session_present
        again = [r.read(), r.read()]
        assert [(m.payload, m.retain, m.dup) for m in again] == [
            (b"retained before", True, True), (b"retained live", False, True),
        ]
        assert all("mqtt-retained-send" not in m.properties for m in again)
    finally:
        handle.stop()


def test_pubrel_is_resent_after_a_restart(tmp_path):
    from persistence.memory import MemoryStore

    store = MemoryStore()
    config = make_config(tmp_path)
    handle = BrokerHandle(config, store)
    try:
        r, _ = raw(handle, "rel", clean=False)
        raw_subscribe(r, 1, ("rel/#", 2))
        p, _ = raw(handle, "rel-pub")
        p.packet(mq.Publish("rel/t", b"two", qos=2, packet_id=1))
        p.read()
        p.packet(mq.Pubrel(1))
        p.read()
        first = r.read()
        r.packet(mq.Pubrec(first.packet_id))
        assert isinstance(r.read(), mq.Pubrel)
        handle = _restart(handle, config, store)
        r, ack = raw(handle, "rel", clean=False)
        assert ack.session_present
        rel = r.read(1)
        assert isinstance(rel, mq.Pubrel) and rel.packet_id == first.packet_id
    finally:
        handle.stop()


# -- takeover ----------------------------------------------------------------


def test_second_connection_with_the_same_id_takes_over(mqtt):
    first, got1 = mqtt("twin", clean=False)
    assert subscribe(first, got1, ("tw/t", 1)) == [1]
    second, got2 = mqtt("twin", clean=False)
    assert session_present(got2)
    got1.wait_for(1, what="disconnects")
    assert not first.is_connected()
    pub, _ = mqtt("twin-pub")
    publish(pub, "tw/t", b"to-second", qos=1)
    (msg,) = got2.wait_for(1)
    assert msg.payload == b"to-second" and msg.qos == 1
    assert got1.messages == []
    assert second.is_connected()


def test_takeover_hands_in_flight_messages_over_and_their_acks_count(mqtt, broker):
    old, _ = raw(broker, "handover", clean=False)
    raw_subscribe(old, 1, ("ho/t", 1))
    pub, _ = mqtt("handover-pub")
    publish(pub, "ho/t", b"held", qos=1)
    held = old.read()
    assert held.payload == b"held"

    new, ack = raw(broker, "handover", clean=False)  # the old socket is still open
    assert ack.session_present
    assert old.closed_by_peer(), "the old connection was not closed on takeover"
    again = new.read()
    assert (again.payload, again.dup, again.packet_id) == (b"held", True, held.packet_id)
    new.packet(mq.Puback(again.packet_id))
    expect_nothing(new)
    new.packet(mq.Disconnect())
    assert new.closed_by_peer()

    # Acknowledged on the connection that took over: never sent again.
    last, ack = raw(broker, "handover", clean=False)
    assert ack.session_present
    expect_nothing(last)
    last.close()


# -- wills -------------------------------------------------------------------


def test_will_is_published_on_abnormal_disconnect(mqtt):
    watcher, got = mqtt("will-watch")
    assert subscribe(watcher, got, ("will/#", 2)) == [2]
    dying, _ = mqtt("dying", will=("will/dying", b"gone", 1, False))
    crash(dying)
    (msg,) = got.wait_for(1)
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("will/dying", b"gone", 1, False)


def test_will_is_not_published_on_clean_disconnect(mqtt):
    watcher, got = mqtt("will-watch2")
    assert subscribe(watcher, got, ("will2/#", 1)) == [1]
    polite, _ = mqtt("polite", will=("will2/polite", b"gone", 1, False))
    mqtt_close(polite)
    other, _ = mqtt("will2-marker")
    publish(other, "will2/marker", b"marker", qos=1)
    got.wait_for(1)
    assert got.payloads() == [b"marker"]


def test_retained_will_is_retained(mqtt):
    watcher, got = mqtt("rw-watch")
    assert subscribe(watcher, got, ("rw/#", 1)) == [1]
    dying, _ = mqtt("rw-dying", will=("rw/status", b"offline", 1, True))
    crash(dying)
    (live,) = got.wait_for(1)
    assert live.payload == b"offline" and live.qos == 1 and not live.retain
    late, got_late = mqtt("rw-late")
    assert subscribe(late, got_late, ("rw/status", 1)) == [1]
    (kept,) = got_late.wait_for(1)
    assert (kept.payload, kept.qos, kept.retain) == (b"offline", 1, True)


def test_raw_will_at_qos2_on_a_dropped_socket(mqtt, broker):
    watcher, got = mqtt("raw-will-watch")
    assert subscribe(watcher, got, ("rwill/+", 2)) == [2]
    r = RawMqtt(broker)
    r.packet(mq.Connect("MQTT", 4, True, 60, "raw-will", will=mq.Will("rwill/x", b"\x00bye\xff", 2, False)))
    assert r.read().reason_code == 0
    raw_drop(r)
    (msg,) = got.wait_for(1)
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("rwill/x", b"\x00bye\xff", 2, False)


def test_will_is_published_when_the_broker_closes_for_a_protocol_error(mqtt, broker):
    watcher, got = mqtt("pe-watch")
    assert subscribe(watcher, got, ("pe/#", 1)) == [1]
    r = RawMqtt(broker)
    r.packet(mq.Connect("MQTT", 4, True, 60, "pe-client", will=mq.Will("pe/will", b"broken", 1, False)))
    assert r.read().reason_code == 0
    r.packet(mq.Connect("MQTT", 4, True, 60, "pe-client"))  # a second CONNECT
    assert r.closed_by_peer()
    (msg,) = got.wait_for(1)
    assert (msg.topic, msg.payload, msg.qos) == ("pe/will", b"broken", 1)


def test_will_is_published_on_keep_alive_timeout(mqtt, broker):
    watcher, got = mqtt("ka-watch")
    assert subscribe(watcher, got, ("ka/#", 0)) == [0]
    r = RawMqtt(broker)
    r.packet(mq.Connect("MQTT", 4, True, 1, "ka-client", will=mq.Will("ka/will", b"silent", 0, False)))
    assert r.read().reason_code == 0
    (msg,) = got.wait_for(1, timeout=4)
    assert (msg.topic, msg.payload) == ("ka/will", b"silent")
    assert r.closed_by_peer(1)


# -- MQTT and STOMP on one topic space ------------------------------------------


def test_mqtt_publish_reaches_a_stomp_subscriber(mqtt, broker):
    conn, got = connect(broker, auto_decode=False)
    try:
        conn.subscribe("/topic/a.b", id="s")
        sync(conn, got)
        pub, _ = mqtt("to-stomp")
        body = b"\x00\x01binary\xff\xfe"
        publish(pub, "a/b", body, qos=1)
        publish(pub, "a/b", b"plain", qos=0)
        first, second = got.wait_for(2)
        assert first.body == body
        assert first.headers["destination"] == "/topic/a.b"
        assert first.headers["mqtt-qos"] == "1"
        assert first.headers.get("persistent") == "true"
        assert second.body == b"plain" and second.headers["mqtt-qos"] == "0"
    finally:
        disconnect(conn)


def test_stomp_send_reaches_an_mqtt_subscriber(mqtt, broker):
    sub1, got1 = mqtt("from-stomp-1")
    sub0, got0 = mqtt("from-stomp-0")
    assert subscribe(sub1, got1, ("a/b", 1)) == [1]
    assert subscribe(sub0, got0, ("a/+", 0)) == [0]
    conn, got = connect(broker)
    try:
        conn.send("/topic/a.b", "persistent body \u00e9", headers={"persistent": "true"})
        conn.send("/topic/a.b", "transient body")
        sync(conn, got)
    finally:
        disconnect(conn)
    m1, m2 = got1.wait_for(2)
    assert (m1.topic, m1.payload, m1.qos) == ("a/b", "persistent body \u00e9".encode(), 1)
    assert (m2.topic, m2.payload, m2.qos) == ("a/b", b"transient body", 0)
    assert [m.qos for m in got0.wait_for(2)] == [0, 0]


# -- topics mapped to queues ----------------------------------------------------


def test_configured_queue_topics_go_to_a_queue(tmp_path):
    config = make_config(tmp_path)
    config.mqtt_settings.queue_topics = ["jobs/#"]
    handle = BrokerHandle(config)
    made = []
    try:
        watcher, got_watch = mqtt_connect(handle, "jobs-watch")
        made.append(watcher)
        assert subscribe(watcher, got_watch, ("#", 1)) == [1]
        pub, _ = mqtt_connect(handle, "jobs-pub")
        made.append(pub)
        for i in range(10):
            publish(pub, "jobs/x", f"job{i}".encode(), qos=1)
        assert handle.queue_depth("queue://jobs.x") == 10
        assert handle.queue_bodies("queue://jobs.x") == [f"job{i}".encode() for i in range(10)]

        consumers = [connect(handle) for _ in range(2)]
        try:
            for i, (conn, got) in enumerate(consumers):
                conn.subscribe("/queue/jobs.x", id=f"c{i}")
                sync(conn, got)
            wait_until(lambda: sum(len(g.messages) for _, g in consumers) >= 10, what="10 jobs consumed")
            bodies = [m.body for _, g in consumers for m in g.settle(0.1)]
            assert sorted(bodies) == sorted(f"job{i}" for i in range(10))  # each exactly once
            assert handle.queue_depth("queue://jobs.x") == 0
        finally:
            for conn, _ in consumers:
                disconnect(conn)
        # The topic subscriber saw none of it: a marker on a plain topic is all it got.
        publish(pub, "other/t", b"marker", qos=1)
        got_watch.wait_for(1)
        assert got_watch.payloads() == [b"marker"]
    finally:
        for client in made:
            mqtt_close(client)
        handle.stop()


def test_queue_topic_is_shared_by_two_stomp_consumers(tmp_path):
    config = make_config(tmp_path)
    config.mqtt_settings.queue_topics = ["jobs/#"]
    handle = BrokerHandle(config)
    consumers = []
    try:
        for i in range(2):
            conn, got = connect(handle)
            conn.subscribe("/queue/jobs.x", id="c")
            sync(conn, got)
            consumers.append((conn, got))
        pub, _ = mqtt_connect(handle, "jobs-pub2")
        try:
            for i in range(20):
                publish(pub, "jobs/x", f"j{i}".encode(), qos=1)
        finally:
            mqtt_close(pub)
        wait_until(lambda: sum(len(g.messages) for _, g in consumers) >= 20, what="20 jobs consumed")
        per_consumer = [[m.body for m in g.settle(0.1)] for _, g in consumers]
        assert sorted(per_consumer[0] + per_consumer[1]) == sorted(f"j{i}" for i in range(20))
        assert per_consumer[0] and per_consumer[1], "one consumer got everything"
        assert not set(per_consumer[0]) & set(per_consumer[1])
    finally:
        for conn, _ in consumers:
            disconnect(conn)
        handle.stop()
