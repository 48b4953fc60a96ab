"""What survives a broker restart on a real RocksDB store, as a client sees it.

Each test runs a broker on ``<tmp>/data``, does something with real clients
(stomp.py, paho-mqtt, raw MQTT sockets), stops the broker the way SIGTERM
does (``Gateway.stop``: clients told, store flushed and closed), starts a new
one on the same data directory (other ports) and checks what came back:
queues in order and priority, durable subscriptions and what they held, MQTT
sessions and retained messages, the DLQ, scheduled messages, transactions,
delivered-but-unacked messages, destination groups, ``sync = false`` and the
``memory`` backend that keeps nothing.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from protocols.mqtt import codec as mq
from tests.support import (
    BrokerHandle,
    HeldSyncs,
    RawMqtt,
    bodies,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    mqtt_publish,
    mqtt_subscribe,
    mqtt_unsubscribe,
    sync,
    wait_past,
    wait_until,
)

pytestmark = pytest.mark.timeout(30)

_receipts = itertools.count(1)


# -- brokers on one data directory ---------------------------------------------


class Brokers:
    """Starts brokers on one data directory; the fixture stops whatever is still running."""

    def __init__(self, tmp_path: Any) -> None:
        self.tmp_path = tmp_path
        self.live: list[BrokerHandle] = []

    def start(self, configure: Callable[[Any], None] | None = None, **policy: Any) -> BrokerHandle:
        config = make_config(self.tmp_path, **policy)  # a fresh Config every time
        if configure is not None:
            configure(config)
        handle = BrokerHandle(config)
        self.live.append(handle)
        return handle

    def stop(self, handle: BrokerHandle) -> None:
        self.live.remove(handle)
        handle.stop()

    def restart(self, handle: BrokerHandle, configure: Callable[[Any], None] | None = None, **policy: Any) -> BrokerHandle:
        self.stop(handle)
        return self.start(configure, **policy)


@pytest.fixture
def brokers(tmp_path: Any) -> Iterator[Brokers]:
    made = Brokers(tmp_path)
    yield made
    for handle in list(made.live):
        made.stop(handle)


@pytest.fixture
def clients() -> Iterator[Callable[..., Any]]:
    """connect() that disconnects every STOMP client it made at the end."""
    made: list[Any] = []

    def make(handle: BrokerHandle, client_id: str | None = None) -> tuple[Any, Any]:
        conn, got = connect(handle, "1.2", client_id)
        made.append(conn)
        return conn, got

    yield make
    for conn in made:
        disconnect(conn)


@pytest.fixture
def paho() -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(handle: BrokerHandle, client_id: str = "", **kwargs: Any) -> tuple[Any, Any]:
        client, got = mqtt_connect(handle, client_id, **kwargs)
        client.reconnect_delay_set(60, 120)  # never reconnect by itself to a stopped broker
        made.append(client)
        return client, got

    yield make
    for client in made:
        with contextlib.suppress(OSError, RuntimeError):
            mqtt_close(client)


# -- helpers -------------------------------------------------------------------


def send(conn: Any, got: Any, destination: str, body: str, **headers: str) -> None:
    """A SEND whose RECEIPT (sent once the message is on disk) is waited for."""
    receipt = f"r-{next(_receipts)}"
    conn.send(destination, body, headers={**headers, "receipt": receipt})
    got.wait_receipt(receipt)


def ack(conn: Any, got: Any, message: Any) -> None:
    receipt = f"a-{next(_receipts)}"
    conn.ack(message.headers["ack"], receipt=receipt)
    got.wait_receipt(receipt)


def frame(conn: Any, got: Any, command: str, **headers: str) -> None:
    receipt = f"f-{next(_receipts)}"
    conn.send_frame(command, {**headers, "receipt": receipt})
    got.wait_receipt(receipt)


def durable_sub(conn: Any, destination: str, name: str, ack_mode: str = "auto", sub_id: str = "d") -> None:
    conn.subscribe(destination, id=sub_id, ack=ack_mode, headers={"activemq.subscriptionName": name})


def stored(handle: BrokerHandle, destination: str) -> list[bytes]:
    """The message bodies the store holds for a destination (pending batch written first)."""
    from core.message import decode_message

    def read() -> list[bytes]:
        store = handle.broker.store
        store.flush()
        return [decode_message(data).body for _, data in store.iter_messages(destination)]

    return handle.inspect(read)


def records(handle: BrokerHandle, kind: str) -> list[str]:
    def read() -> list[str]:
        store = handle.broker.store
        store.flush()
        return [key for key, _ in store.iter_records(kind)]

    return handle.inspect(read)


def read_until_pingresp(r: RawMqtt) -> list[Any]:
    """Everything the broker sends before answering a PINGREQ sent now."""
    r.packet(mq.Pingreq())
    packets = []
    while True:
        packet = r.read()
        if isinstance(packet, mq.Pingresp):
            return packets
        packets.append(packet)


def raw_mqtt(handle: BrokerHandle, client_id: str, clean: bool = True) -> tuple[RawMqtt, Any]:
    r = RawMqtt(handle)
    connack = r.connect(client_id, clean=clean)
    assert isinstance(connack, mq.Connack) and connack.reason_code == 0, connack
    return r, connack


# -- queues ----------------------------------------------------------------------


def test_persistent_queue_messages_survive_in_priority_then_fifo_order(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    for body, priority in [("a1", 4), ("b1", 9), ("a2", 4), ("c1", 0), ("b2", 9), ("a3", 4)]:
        send(conn, got, "/queue/restart.order", body, persistent="true", priority=str(priority))
    send(conn, got, "/queue/restart.order", "transient", persistent="false", priority="9")
    send(conn, got, "/queue/restart.order", "default-transient")  # default_persistent = false
    assert h.queue_depth("queue://restart.order") == 8
    disconnect(conn)

    h2 = brokers.restart(h)
    assert h2.queue_depth("queue://restart.order") == 6
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.order", id="1", ack="auto")
    got.wait_for(6)
    messages = got.settle()
    # Higher priority first, FIFO within a priority; the non-persistent ones are gone.
    assert bodies(messages) == ["b1", "b2", "a1", "a2", "a3", "c1"]
    assert [m.headers["priority"] for m in messages] == ["9", "9", "4", "4", "4", "0"]
    assert all(m.headers.get("persistent") == "true" for m in messages)
    # Never handed out before the restart: not flagged as redelivered.
    assert all("redelivered" not in m.headers for m in messages)


def test_queue_survives_two_restarts_and_keeps_new_messages_after_old_ones(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    send(conn, got, "/queue/restart.twice", "first", persistent="true")
    disconnect(conn)
    h = brokers.restart(h)
    conn, got = clients(h)
    # The sequence continues after the recovered messages: FIFO holds across restarts.
    send(conn, got, "/queue/restart.twice", "second", persistent="true")
    disconnect(conn)
    h = brokers.restart(h)
    conn, got = clients(h)
    conn.subscribe("/queue/restart.twice", id="1")
    got.wait_for(2)
    assert bodies(got.settle()) == ["first", "second"]


# -- STOMP durable topic subscriptions ---------------------------------------------


def test_durable_subscription_and_what_it_held_survive_a_restart(brokers, clients):
    h = brokers.start()
    sub, sub_got = clients(h, "restart-durable")
    durable_sub(sub, "/topic/restart.news", "feed")
    sync(sub, sub_got)  # a receipt barrier: the SUBSCRIBE is done
    disconnect(sub)
    pub, pub_got = clients(h)
    send(pub, pub_got, "/topic/restart.news", "away-1", persistent="true")
    send(pub, pub_got, "/topic/restart.news", "away-transient")
    send(pub, pub_got, "/topic/restart.news", "away-2", persistent="true")
    disconnect(pub)

    h2 = brokers.restart(h)
    # The subscription itself came back: a message published now, with the
    # subscriber still away, is kept for it.
    pub, pub_got = clients(h2)
    send(pub, pub_got, "/topic/restart.news", "after-restart", persistent="true")
    sub, sub_got = clients(h2, "restart-durable")
    durable_sub(sub, "/topic/restart.news", "feed")
    sub_got.wait_for(3)
    assert bodies(sub_got.settle()) == ["away-1", "away-2", "after-restart"]
    # And it is still live.
    send(pub, pub_got, "/topic/restart.news", "live")
    assert bodies(sub_got.wait_for(4))[-1] == "live"


def test_topic_message_with_two_durable_subscribers_is_stored_once_and_deleted_after_both_acks(brokers, clients):
    h = brokers.start()
    subs = []
    for name in ("one", "two"):
        conn, got = clients(h, f"restart-pair-{name}")
        durable_sub(conn, "/topic/restart.pair", "pair", ack_mode="client-individual")
        sync(conn, got)  # a receipt barrier: the SUBSCRIBE is done
        subs.append((conn, got))
    pub, pub_got = clients(h)
    send(pub, pub_got, "/topic/restart.pair", "shared", persistent="true")
    received = [got.wait_for(1)[0] for _, got in subs]
    assert [m.body for m in received] == ["shared", "shared"]
    # One copy in the store, one reference per subscriber.
    assert stored(h, "topic://restart.pair") == [b"shared"]
    assert len(records(h, "durable-ref")) == 2

    ack(subs[0][0], subs[0][1], received[0])
    assert stored(h, "topic://restart.pair") == [b"shared"], "deleted while a subscriber still holds it"
    assert len(records(h, "durable-ref")) == 1
    ack(subs[1][0], subs[1][1], received[1])
    assert stored(h, "topic://restart.pair") == []
    assert records(h, "durable-ref") == []
    for conn, _ in subs:
        disconnect(conn)
    disconnect(pub)

    h2 = brokers.restart(h)
    assert stored(h2, "topic://restart.pair") == []
    for name in ("one", "two"):
        conn, got = clients(h2, f"restart-pair-{name}")
        durable_sub(conn, "/topic/restart.pair", "pair", ack_mode="client-individual")
        assert got.settle() == [], f"an acked message came back to {name}"


def test_topic_message_acked_by_one_of_two_durable_subscribers_comes_back_to_the_other_only(brokers, clients):
    h = brokers.start()
    subs = []
    for name in ("one", "two"):
        conn, got = clients(h, f"restart-half-{name}")
        durable_sub(conn, "/topic/restart.half", "half", ack_mode="client-individual")
        sync(conn, got)  # a receipt barrier: the SUBSCRIBE is done
        subs.append((conn, got))
    pub, pub_got = clients(h)
    send(pub, pub_got, "/topic/restart.half", "m", persistent="true")
    first = subs[0][1].wait_for(1)[0]
    subs[1][1].wait_for(1)
    ack(subs[0][0], subs[0][1], first)
    for conn, _ in subs:
        disconnect(conn)
    disconnect(pub)

    h2 = brokers.restart(h)
    assert stored(h2, "topic://restart.half") == [b"m"]
    one, got_one = clients(h2, "restart-half-one")
    durable_sub(one, "/topic/restart.half", "half", ack_mode="client-individual")
    two, got_two = clients(h2, "restart-half-two")
    durable_sub(two, "/topic/restart.half", "half", ack_mode="client-individual")
    (back,) = got_two.wait_for(1)
    assert back.body == "m" and back.headers.get("redelivered") == "true"
    assert got_one.settle() == []
    ack(two, got_two, back)
    assert stored(h2, "topic://restart.half") == []


# -- MQTT sessions and retained messages ---------------------------------------------


def test_mqtt_311_persistent_session_and_retained_message_survive_a_restart(brokers, paho):
    h = brokers.start()
    sub, got = paho(h, "restart-311", clean=False)
    assert not got.connacks[-1][0].session_present
    assert mqtt_subscribe(sub, got, ("rst311/#", 2)) == [2]
    mqtt_close(sub)
    pub, _ = paho(h, "restart-311-pub")
    mqtt_publish(pub, "rst311/q1", b"q1", qos=1)
    mqtt_publish(pub, "rst311/q0", b"q0", qos=0)  # not queued for an absent client
    mqtt_publish(pub, "rst311/q2", b"q2", qos=2)
    mqtt_publish(pub, "retained311/state", b"on", qos=1, retain=True)
    mqtt_close(pub)

    h2 = brokers.restart(h)
    sub, got = paho(h2, "restart-311", clean=False)
    assert got.connacks[-1][0].session_present, "session present = 0 after the restart"
    got.wait_for(2)
    assert [(m.topic, m.payload, m.qos) for m in got.settle()] == [("rst311/q1", b"q1", 1), ("rst311/q2", b"q2", 2)]
    # The subscription survived with the session.
    pub, _ = paho(h2, "restart-311-pub")
    mqtt_publish(pub, "rst311/live", b"live", qos=1)
    assert got.wait_for(3)[-1].payload == b"live"
    # The retained message is delivered on subscribe, flagged retained.
    late, late_got = paho(h2, "restart-311-late")
    assert mqtt_subscribe(late, late_got, ("retained311/+", 1)) == [1]
    (retained,) = late_got.wait_for(1)
    assert (retained.topic, retained.payload, retained.retain, retained.qos) == ("retained311/state", b"on", True, 1)


def test_mqtt_cleared_retained_message_stays_cleared_after_a_restart(brokers, paho):
    h = brokers.start()
    pub, _ = paho(h, "restart-clear-pub")
    mqtt_publish(pub, "cleared/t", b"x", qos=1, retain=True)
    mqtt_publish(pub, "cleared/t", b"", qos=1, retain=True)
    mqtt_close(pub)
    h2 = brokers.restart(h)
    late, got = paho(h2, "restart-clear-late")
    assert mqtt_subscribe(late, got, ("cleared/#", 1)) == [1]
    assert got.settle() == []


def test_mqtt_v5_session_expiry_survives_a_restart(brokers, paho):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    def expiring(seconds: int) -> Properties:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = seconds
        return props

    h = brokers.start()
    sub, got = paho(h, "restart-v5", version=5, clean=False, properties=expiring(300))
    assert mqtt_subscribe(sub, got, ("rst5/#", 1)) == [1]
    mqtt_close(sub)
    # A 5.0 session without expiry ends with its connection: nothing to restore.
    gone, gone_got = paho(h, "restart-v5-gone", version=5, clean=False)
    assert mqtt_subscribe(gone, gone_got, ("rst5/#", 1)) == [1]
    mqtt_close(gone)
    pub, _ = paho(h, "restart-v5-pub", version=5)
    mqtt_publish(pub, "rst5/a", b"a", qos=1)
    mqtt_publish(pub, "rst5/b", b"b", qos=1)
    mqtt_close(pub)

    h2 = brokers.restart(h)
    sub, got = paho(h2, "restart-v5", version=5, clean=False, properties=expiring(300))
    assert got.connacks[-1][0].session_present
    got.wait_for(2)
    assert [(m.payload, m.qos) for m in got.settle()] == [(b"a", 1), (b"b", 1)]
    gone, gone_got = paho(h2, "restart-v5-gone", version=5, clean=False)
    assert not gone_got.connacks[-1][0].session_present
    assert gone_got.settle() == []


def test_mqtt_unacked_qos1_is_resent_after_a_restart_with_dup_and_the_same_packet_id(brokers):
    h = brokers.start()
    r, _ = raw_mqtt(h, "restart-raw1", clean=False)
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("rraw/#", 1)]))
    assert isinstance(r.read(), mq.Suback)
    p, _ = raw_mqtt(h, "restart-raw1-pub")
    for i in range(1, 4):
        p.packet(mq.Publish("rraw/t", b"m%d" % i, qos=1, packet_id=i))
        assert isinstance(p.read(), mq.Puback)
    first = [r.read() for _ in range(3)]
    assert [(f.payload, f.dup) for f in first] == [(b"m1", False), (b"m2", False), (b"m3", False)]
    r.packet(mq.Puback(first[0].packet_id))  # m1 acked; m2 and m3 held, unacked
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp)
    p.close()

    h2 = brokers.restart(h)
    r.close()
    r, connack = raw_mqtt(h2, "restart-raw1", clean=False)
    assert connack.session_present
    again = [r.read() for _ in range(2)]
    assert [(a.payload, a.qos, a.dup, a.packet_id) for a in again] == [
        (b"m2", 1, True, first[1].packet_id), (b"m3", 1, True, first[2].packet_id),
    ]
    for a in again:
        r.packet(mq.Puback(a.packet_id))
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp), "the acked m1 came back"
    r.packet(mq.Disconnect())
    assert r.closed_by_peer()

    # Acked before and after: nothing comes back after one more restart.
    h3 = brokers.restart(h2)
    r, connack = raw_mqtt(h3, "restart-raw1", clean=False)
    assert connack.session_present
    r.packet(mq.Pingreq())
    assert isinstance(r.read(), mq.Pingresp)
    r.close()


# -- dead letters, scheduling, transactions ------------------------------------------


def test_dead_lettered_message_is_in_the_dlq_after_a_restart(brokers, clients):
    h = brokers.start(max_redeliveries=0)
    conn, got = clients(h)
    send(conn, got, "/queue/restart.poison", "poison", persistent="true")
    conn.subscribe("/queue/restart.poison", id="1", ack="client-individual")
    (message,) = got.wait_for(1)
    receipt = "nack-1"
    conn.nack(message.headers["ack"], receipt=receipt)
    got.wait_receipt(receipt)
    assert h.queue_bodies("queue://DLQ") == [b"poison"]
    disconnect(conn)

    h2 = brokers.restart(h, max_redeliveries=0)
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.poison", id="1", ack="auto")
    conn.subscribe("/queue/DLQ", id="2", ack="auto")
    (dead,) = got.wait_for(1)
    assert got.settle() == [dead], "the dead-lettered message came back to its queue too"
    assert dead.body == "poison"
    assert dead.headers["destination"] == "/queue/DLQ"
    assert dead.headers["originalDestination"] in ("/queue/restart.poison", "queue://restart.poison")
    assert "dlqDeliveryFailureCause" in dead.headers


def test_scheduled_message_is_delivered_after_its_delay_across_a_restart(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    sent_at = time.monotonic()
    send(conn, got, "/queue/restart.later", "later", persistent="true", AMQ_SCHEDULED_DELAY="1500")
    send(conn, got, "/queue/restart.later", "later-transient", AMQ_SCHEDULED_DELAY="1500")
    disconnect(conn)

    h2 = brokers.restart(h)
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.later", id="1", ack="auto")
    (message,) = got.wait_for(1, timeout=5)
    arrived = time.monotonic() - sent_at
    assert message.body == "later"
    assert arrived >= 1.45, f"delivered {arrived:.2f}s after the send, before its 1.5s delay"
    assert arrived < 4.0
    assert bodies(got.settle()) == ["later"], "the non-persistent scheduled message survived"


def test_only_committed_transactions_survive_a_restart(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    frame(conn, got, "BEGIN", transaction="open")
    conn.send("/queue/restart.tx", "uncommitted", headers={"persistent": "true", "transaction": "open"})
    frame(conn, got, "BEGIN", transaction="done")
    conn.send("/queue/restart.tx", "committed", headers={"persistent": "true", "transaction": "done"})
    frame(conn, got, "COMMIT", transaction="done")  # its RECEIPT: the commit is on disk
    assert h.queue_bodies("queue://restart.tx") == [b"committed"]
    # The broker stops with "open" still open (the client does not disconnect first).
    h2 = brokers.restart(h)
    assert h2.queue_bodies("queue://restart.tx") == [b"committed"]
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.tx", id="1")
    got.wait_for(1)
    assert bodies(got.settle()) == ["committed"]


# -- delivered but unacknowledged --------------------------------------------------


def test_delivered_unacked_message_comes_back_redelivered_and_acked_ones_do_not(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    for body in ("m1", "m2", "m3"):
        send(conn, got, "/queue/restart.unacked", body, persistent="true")
    conn.subscribe("/queue/restart.unacked", id="1", ack="client-individual", headers={"activemq.prefetchSize": "1"})
    (first,) = got.wait_for(1)
    ack(conn, got, first)  # m1 acked: its credit brings m2
    got.wait_for(2)
    assert bodies(got.settle()) == ["m1", "m2"]
    # m2 is held, unacked, when the broker stops; m3 was never handed out.
    h2 = brokers.restart(h)
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.unacked", id="1", ack="client-individual")
    got.wait_for(2)
    back = got.settle()
    assert bodies(back) == ["m2", "m3"], "an acked message came back or an unacked one was lost"
    assert back[0].headers.get("redelivered") == "true"
    assert "redelivered" not in back[1].headers
    for message in back:
        ack(conn, got, message)
    disconnect(conn)
    h3 = brokers.restart(h2)
    assert h3.queue_depth("queue://restart.unacked") == 0


def test_auto_acked_durable_messages_do_not_come_back(brokers, clients):
    h = brokers.start()
    sub, sub_got = clients(h, "restart-auto")
    durable_sub(sub, "/topic/restart.auto", "auto")
    sync(sub, sub_got)  # a receipt barrier: the SUBSCRIBE is done
    pub, pub_got = clients(h)
    for body in ("x", "y"):
        send(pub, pub_got, "/topic/restart.auto", body, persistent="true")
    sub_got.wait_for(2)
    disconnect(sub)
    disconnect(pub)
    h2 = brokers.restart(h)
    assert stored(h2, "topic://restart.auto") == []
    sub, sub_got = clients(h2, "restart-auto")
    durable_sub(sub, "/topic/restart.auto", "auto")
    assert sub_got.settle() == []


# -- store configuration -------------------------------------------------------------


def test_destination_group_survives_restarts_with_and_without_the_group_configured(brokers, clients, tmp_path):
    from rocksdict import Rdict

    def with_group(config: Any) -> None:
        config.persistence.groups = {"orders": ["queue://orders.>"]}

    h = brokers.start(with_group)
    conn, got = clients(h)
    send(conn, got, "/queue/orders.eu", "eu-1", persistent="true")
    send(conn, got, "/queue/orders.eu", "eu-2", persistent="true")
    send(conn, got, "/queue/restart.plain", "plain", persistent="true")
    disconnect(conn)
    brokers.stop(h)
    assert "group.orders" in Rdict.list_cf(str(tmp_path / "data" / "store"))

    h2 = brokers.start(with_group)
    assert h2.queue_bodies("queue://orders.eu") == [b"eu-1", b"eu-2"]
    assert h2.queue_bodies("queue://restart.plain") == [b"plain"]
    brokers.stop(h2)

    h3 = brokers.start()  # a fresh Config: no groups at all
    assert h3.config.persistence.groups == {}
    conn, got = clients(h3)
    conn.subscribe("/queue/orders.eu", id="1", ack="auto")
    conn.subscribe("/queue/restart.plain", id="2", ack="auto")
    got.wait_for(3)
    assert sorted(bodies(got.settle())) == ["eu-1", "eu-2", "plain"]
    assert [m.body for m in got.messages if m.headers["destination"] == "/queue/orders.eu"] == ["eu-1", "eu-2"]
    disconnect(conn)
    brokers.stop(h3)

    h4 = brokers.start(with_group)
    assert h4.queue_depth("queue://orders.eu") == 0, "messages consumed without the group came back"


def test_sync_false_still_persists_across_a_clean_restart(brokers, clients):
    def no_sync(config: Any) -> None:
        config.persistence.sync = False

    h = brokers.start(no_sync)
    assert h.inspect(lambda: h.broker.store.sync) is False
    conn, got = clients(h)
    for i in range(20):
        send(conn, got, "/queue/restart.nosync", f"n{i}", persistent="true")
    sub, sub_got = clients(h, "restart-nosync")
    durable_sub(sub, "/topic/restart.nosync", "ns")
    sync(sub, sub_got)  # a receipt barrier: the SUBSCRIBE is done
    disconnect(sub)
    send(conn, got, "/topic/restart.nosync", "topic-msg", persistent="true")
    disconnect(conn)

    h2 = brokers.restart(h, no_sync)
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.nosync", id="1")
    got.wait_for(20)
    assert bodies(got.settle()) == [f"n{i}" for i in range(20)]
    sub, sub_got = clients(h2, "restart-nosync")
    durable_sub(sub, "/topic/restart.nosync", "ns")
    assert bodies(sub_got.wait_for(1)) == ["topic-msg"]


def test_memory_backend_keeps_nothing_across_a_restart(brokers, clients, paho, tmp_path):
    def in_memory(config: Any) -> None:
        config.persistence.backend = "memory"

    h = brokers.start(in_memory)
    conn, got = clients(h)
    send(conn, got, "/queue/restart.mem", "gone", persistent="true")
    sub, sub_got = clients(h, "restart-mem")
    durable_sub(sub, "/topic/restart.mem", "mem")
    sync(sub, sub_got)  # a receipt barrier: the SUBSCRIBE is done
    disconnect(sub)
    send(conn, got, "/topic/restart.mem", "gone-too", persistent="true")
    disconnect(conn)
    pub, _ = paho(h, "restart-mem-pub")
    mqtt_publish(pub, "mem/retained", b"r", qos=1, retain=True)
    mqtt_close(pub)

    h2 = brokers.restart(h, in_memory)
    assert not (tmp_path / "data" / "store").exists()
    assert h2.queue_depth("queue://restart.mem") == 0
    assert h2.inspect(lambda: sorted(h2.broker.durables)) == []
    conn, got = clients(h2, "restart-mem")
    conn.subscribe("/queue/restart.mem", id="1")
    durable_sub(conn, "/topic/restart.mem", "mem")
    late, late_got = paho(h2, "restart-mem-late")
    assert mqtt_subscribe(late, late_got, ("mem/#", 1)) == [1]
    assert got.settle() == []
    assert late_got.settle() == []


# -- more of what a restart must keep, or must not bring back -----------------------


def test_message_fields_survive_a_restart(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    expires = str(int(time.time() * 1000) + 60_000)
    send(
        conn, got, "/queue/restart.fields", "h\u00e9llo w\u00f6rld", persistent="true", priority="7",
        expires=expires, **{"correlation-id": "corr-1", "reply-to": "/queue/replies", "x-custom": "v:1",
                            "content-type": "text/plain;charset=utf-8", "JMSXGroupID": "g1"},
    )
    disconnect(conn)
    h2 = brokers.restart(h)
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.fields", id="1")
    (m,) = got.wait_for(1)
    assert m.body == "h\u00e9llo w\u00f6rld"
    for name, value in [("priority", "7"), ("expires", expires), ("correlation-id", "corr-1"), ("reply-to", "/queue/replies"),
                        ("x-custom", "v:1"), ("JMSXGroupID", "g1"), ("persistent", "true")]:
        assert m.headers.get(name) == value, (name, m.headers)
    assert m.headers["content-type"].startswith("text/plain")


def test_unsubscribed_durable_subscription_stays_removed_after_a_restart(brokers, clients):
    h = brokers.start()
    sub, got = clients(h, "restart-unsub")
    durable_sub(sub, "/topic/restart.unsub", "gone")
    sub.unsubscribe("d", headers={"activemq.subscriptionName": "gone"})
    sync(sub, got)  # a receipt barrier: the UNSUBSCRIBE is done
    disconnect(sub)
    h2 = brokers.restart(h)
    assert h2.inspect(lambda: sorted(h2.broker.durables)) == []
    pub, pub_got = clients(h2)
    send(pub, pub_got, "/topic/restart.unsub", "nobody", persistent="true")
    assert stored(h2, "topic://restart.unsub") == []


def test_durable_subscription_with_a_selector_keeps_its_messages_across_a_restart(brokers, clients):
    h = brokers.start()
    sub, got = clients(h, "restart-sel")
    sub.subscribe("/topic/restart.sel", id="d", headers={"activemq.subscriptionName": "sel", "selector": "kind = 'a'"})
    sync(sub, got)  # a receipt barrier: the SUBSCRIBE is done
    disconnect(sub)
    pub, pub_got = clients(h)
    send(pub, pub_got, "/topic/restart.sel", "a1", persistent="true", kind="a")
    send(pub, pub_got, "/topic/restart.sel", "b1", persistent="true", kind="b")
    disconnect(pub)
    h2 = brokers.restart(h)
    sub, got = clients(h2, "restart-sel")
    # The same definition: the subscription resumes with what it held.
    sub.subscribe("/topic/restart.sel", id="d", headers={"activemq.subscriptionName": "sel", "selector": "kind = 'a'"})
    got.wait_for(1)
    assert bodies(got.settle()) == ["a1"]


def test_acks_in_an_uncommitted_transaction_are_undone_by_a_restart(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    for body in ("keep", "take"):
        send(conn, got, "/queue/restart.txack", body, persistent="true")
    conn.subscribe("/queue/restart.txack", id="1", ack="client-individual")
    keep, take = got.wait_for(2)
    frame(conn, got, "BEGIN", transaction="open")
    conn.ack(keep.headers["ack"], transaction="open")
    frame(conn, got, "BEGIN", transaction="done")
    conn.ack(take.headers["ack"], transaction="done")
    frame(conn, got, "COMMIT", transaction="done")
    h2 = brokers.restart(h)
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.txack", id="1", ack="client-individual")
    got.wait_for(1)
    (back,) = got.settle()
    assert back.body == "keep" and back.headers.get("redelivered") == "true"
    assert back.headers["message-id"] == keep.headers["message-id"]


def test_message_expiring_while_the_broker_is_down_goes_to_the_dlq(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    expires = int(time.time() * 1000) + 300
    send(conn, got, "/queue/restart.expiring", "short", persistent="true", expires=str(expires))
    send(conn, got, "/queue/restart.expiring", "long", persistent="true")
    disconnect(conn)
    brokers.stop(h)
    wait_past(expires, "'short' to expire while the broker is down")
    h2 = brokers.start()
    conn, got = clients(h2)
    conn.subscribe("/queue/restart.expiring", id="1")
    conn.subscribe("/queue/DLQ", id="2")
    got.wait_for(2)
    by_dest = {m.headers["destination"]: m.body for m in got.settle()}
    assert by_dest == {"/queue/restart.expiring": "long", "/queue/DLQ": "short"}


def test_never_delivered_message_is_not_flagged_redelivered_after_an_earlier_queue_was_drained(brokers, clients):
    h = brokers.start()
    conn, got = clients(h)
    for body in ("old-1", "old-2", "old-3"):
        send(conn, got, "/queue/restart.marks", body, persistent="true")
    conn.subscribe("/queue/restart.marks", id="1", ack="client-individual")
    for message in got.wait_for(3):
        ack(conn, got, message)
    disconnect(conn)
    h2 = brokers.restart(h)  # the queue is empty in the store now
    conn, got = clients(h2)
    send(conn, got, "/queue/restart.marks", "new", persistent="true")
    disconnect(conn)
    h3 = brokers.restart(h2)
    conn, got = clients(h3)
    conn.subscribe("/queue/restart.marks", id="1", ack="client-individual")
    (m,) = got.wait_for(1)
    assert m.body == "new"
    assert "redelivered" not in m.headers, f"never delivered, yet flagged: {m.headers}"


def test_mqtt_v5_session_expiry_counts_from_the_disconnect_not_from_the_restart(brokers, paho):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 2
    h = brokers.start()
    sub, got = paho(h, "restart-v5-expiry", version=5, clean=False, properties=props)
    assert mqtt_subscribe(sub, got, ("exp5/#", 1)) == [1]
    mqtt_close(sub)
    left = time.monotonic()
    # Counting the 2 s from the restart would end them at 3 s or later, from the disconnect at 2 s.
    time.sleep(1.0)  # a real clock window: the restart comes 1 s after the disconnect
    h2 = brokers.restart(h)

    def session_kept() -> bool:
        return h2.inspect(lambda: "restart-v5-expiry" in h2.gateway.mqtt_hub.clients)

    assert session_kept(), "the session did not survive the restart"
    wait_until(lambda: not session_kept(), what="the session to expire on the new broker")
    assert time.monotonic() - left < 2.8, "the session expiry counted from the restart, not from the disconnect"
    _, again_got = paho(h2, "restart-v5-expiry", version=5, clean=False)
    assert not again_got.connacks[-1][0].session_present


def test_ended_mqtt_session_stays_ended_after_a_restart(brokers, paho):
    h = brokers.start()
    sub, got = paho(h, "restart-ended", clean=False)
    assert mqtt_subscribe(sub, got, ("ended/#", 1), ("kept/#", 1)) == [1, 1]
    mqtt_unsubscribe(sub, got, "ended/#")
    mqtt_close(sub)
    pub, _ = paho(h, "restart-ended-pub")
    mqtt_publish(pub, "ended/x", b"no", qos=1)
    mqtt_publish(pub, "kept/x", b"yes", qos=1)
    mqtt_close(pub)
    h2 = brokers.restart(h)
    sub, got = paho(h2, "restart-ended", clean=False)
    assert got.connacks[-1][0].session_present
    got.wait_for(1)
    assert [m.payload for m in got.settle()] == [b"yes"]
    mqtt_close(sub)
    # A clean session ends it: after another restart nothing is left.
    clean, _ = paho(h2, "restart-ended", clean=True)
    mqtt_close(clean)
    h3 = brokers.restart(h2)
    sub, got = paho(h3, "restart-ended", clean=False)
    assert not got.connacks[-1][0].session_present


def test_mqtt_messages_queued_after_a_pending_pubrel_survive_the_next_restart(brokers):
    h = brokers.start()
    r, _ = raw_mqtt(h, "restart-rel", clean=False)
    r.packet(mq.Subscribe(1, [mq.SubscriptionRequest("rrel/#", 2)]))
    assert isinstance(r.read(), mq.Suback)
    p, _ = raw_mqtt(h, "restart-rel-pub")
    p.packet(mq.Publish("rrel/t", b"first", qos=2, packet_id=1))
    assert isinstance(p.read(), mq.Pubrec)
    p.packet(mq.Pubrel(1))
    assert isinstance(p.read(), mq.Pubcomp)
    first = r.read()
    assert first.payload == b"first"
    r.packet(mq.Pubrec(first.packet_id))
    assert isinstance(r.read(), mq.Pubrel)  # no PUBCOMP: the flow stays open across restarts
    p.close()

    h2 = brokers.restart(h)
    r.close()
    p, _ = raw_mqtt(h2, "restart-rel-pub")
    for i in range(1, 6):
        p.packet(mq.Publish("rrel/t", b"second-%d" % i, qos=1, packet_id=i))
        assert isinstance(p.read(), mq.Puback)  # stored: must survive
    p.close()

    h3 = brokers.restart(h2)
    r, connack = raw_mqtt(h3, "restart-rel", clean=False)
    assert connack.session_present
    rel = r.read()
    assert isinstance(rel, mq.Pubrel) and rel.packet_id == first.packet_id
    r.packet(mq.Pubcomp(rel.packet_id))
    # Queued messages are sent on CONNECT, so all of them come before the PINGRESP.
    got = [p.payload for p in read_until_pingresp(r)]
    assert got == [b"second-%d" % i for i in range(1, 6)], "a PUBACKed message was lost"
    r.close()


# -- confirmed only once synced ---------------------------------------------------


def test_receipts_and_pubacks_of_stored_messages_wait_for_their_fsync(tmp_path):
    # The turn's batch is written before the sessions hand their confirmations over;
    # with nothing else pending they were once released at once, before any fsync.
    handle = BrokerHandle(make_config(tmp_path))
    try:
        syncs = HeldSyncs(handle)
        keeper, keeper_got = mqtt_connect(handle, "sync-keeper", clean=False)
        mqtt_subscribe(keeper, keeper_got, ("sync/#", 1))
        mqtt_close(keeper)  # its session stores QoS 1 messages while it is away
        wait_until(lambda: handle.inspect(lambda: handle.gateway.mqtt_hub.clients["sync-keeper"].live is None),
                   what="the keeper's session offline")
        assert syncs.waiting() == 0
        client, got = connect(handle)
        client.send("/queue/sync.check", "stored", headers={"persistent": "true"}, receipt="r1")
        # The barriers: each confirmation handed to the store, to go out once a sync covers its write.
        # One released at once, before any fsync (the bug), never waits there.
        wait_until(lambda: syncs.waiting() == 1, what="the RECEIPT waiting for the sync")
        publisher, _ = mqtt_connect(handle, "sync-publisher")
        info = publisher.publish("sync/x", b"stored for the keeper", qos=1)
        wait_until(lambda: syncs.waiting() == 2, what="the PUBACK waiting for the sync")
        assert got.receipts == [] and not info.is_published() and syncs.held() >= 1
        syncs.finish_all()
        got.wait_for(1, what="receipts")
        info.wait_for_publish(5)
        assert got.receipts == ["r1"] and info.is_published()
        syncs.stop_holding()
        disconnect(client)
        for c in (publisher, keeper):
            mqtt_close(c)
    finally:
        handle.stop()
