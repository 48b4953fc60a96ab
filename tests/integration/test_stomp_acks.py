"""Acknowledgement over STOMP with stomp.py: ack modes, NACK, consumer loss, prefetch, DLQ, priority, expiry."""
from __future__ import annotations

import time

import pytest

from tests.support import RawStomp, bodies, drop, leave, sync, wait_past, wait_until

# -- helpers -----------------------------------------------------------------


def send_all(conn, got, destination, items, **headers):
    for item in items:
        conn.send(destination, item, headers=dict(headers))
    sync(conn, got)


# -- ack modes ---------------------------------------------------------------


def test_auto_ack_settles_on_delivery(broker, client):
    conn, got = client()
    conn.subscribe("/queue/auto", id="s1", ack="auto")
    send_all(conn, got, "/queue/auto", ["a", "b", "c"])
    assert bodies(got.wait_for(3)) == ["a", "b", "c"]
    assert all("ack" not in m.headers for m in got.messages)
    leave(conn)
    assert broker.queue_depth("queue://auto") == 0
    again, got2 = client()
    again.subscribe("/queue/auto", id="s1", ack="auto")
    assert got2.settle() == [], "an auto-acked message came back"


def test_client_ack_is_cumulative(broker, client):
    conn, got = client()
    conn.subscribe("/queue/cumulative", id="s1", ack="client")
    send_all(conn, got, "/queue/cumulative", ["1", "2", "3", "4", "5"])
    messages = got.wait_for(5)
    assert bodies(messages) == ["1", "2", "3", "4", "5"]
    conn.ack(messages[2].headers["ack"])
    sync(conn, got)
    assert broker.inspect(lambda: broker.broker.queues["queue://cumulative"].inflight) == 2
    leave(conn)
    assert broker.queue_bodies("queue://cumulative") == [b"4", b"5"]

    again, got2 = client()
    again.subscribe("/queue/cumulative", id="s2", ack="client")
    back = got2.wait_for(2)
    assert got2.settle() == back
    assert bodies(back) == ["4", "5"]
    assert [m.headers.get("redelivered") for m in back] == ["true", "true"]
    assert [m.headers.get("redelivery-count") for m in back] == ["1", "1"]


def test_client_individual_ack_settles_only_that_message(broker, client):
    conn, got = client()
    conn.subscribe("/queue/individual", id="s1", ack="client-individual")
    send_all(conn, got, "/queue/individual", ["1", "2", "3", "4", "5"])
    messages = got.wait_for(5)
    conn.ack(messages[1].headers["ack"])
    conn.ack(messages[3].headers["ack"])
    sync(conn, got)
    leave(conn)
    assert broker.queue_bodies("queue://individual") == [b"1", b"3", b"5"]

    again, got2 = client()
    again.subscribe("/queue/individual", id="s2", ack="client-individual")
    back = got2.wait_for(3)
    assert got2.settle() == back
    assert bodies(back) == ["1", "3", "5"]
    assert all(m.headers.get("redelivered") == "true" for m in back)


def test_ack_of_unknown_id_is_an_error(broker, client):
    conn, got = client()
    conn.subscribe("/queue/unknown-ack", id="s1", ack="client-individual")
    conn.send("/queue/unknown-ack", "x")
    (message,) = got.wait_for(1)
    conn.ack(message.headers["ack"])
    conn.ack(message.headers["ack"])  # the second one names nothing outstanding
    (error,) = got.wait_for(1, what="errors")
    assert "ack" in error.headers["message"].lower() or "unknown" in error.headers["message"].lower()
    assert got.disconnected.wait(5)


# -- NACK --------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_redelivers_with_flag_and_count(broker, client, version):
    conn, got = client(version)
    conn.subscribe("/queue/nack", id="s1", ack="client-individual")
    conn.send("/queue/nack", "only", headers={"x-keep": "yes"})
    first = got.wait_for(1)[0]
    assert "redelivered" not in first.headers
    assert "redelivery-count" not in first.headers

    def nack(message):
        if version == "1.2":
            conn.nack(message.headers["ack"])
        else:
            conn.nack(message.headers["message-id"], "s1")

    nack(first)
    second = got.wait_for(2)[1]
    assert second.body == "only"
    assert second.headers["message-id"] == first.headers["message-id"]
    assert second.headers["redelivered"] == "true"
    assert second.headers["redelivery-count"] == "1"
    assert second.headers["x-keep"] == "yes"
    nack(second)
    third = got.wait_for(3)[2]
    assert third.headers["redelivery-count"] == "2"
    if version == "1.2":
        conn.ack(third.headers["ack"])
    else:
        conn.ack(third.headers["message-id"], "s1")
    sync(conn, got)
    assert got.settle() == got.messages[:3]
    assert broker.queue_depth("queue://nack") == 0


def test_nack_in_client_mode_is_cumulative_and_keeps_order(broker, client):
    conn, got = client()
    conn.subscribe("/queue/nack-cumulative", id="s1", ack="client", headers={"activemq.prefetchSize": "3"})
    send_all(conn, got, "/queue/nack-cumulative", ["1", "2", "3"])
    messages = got.wait_for(3)
    conn.nack(messages[1].headers["ack"])  # covers 1 and 2, not 3
    back = got.wait_for(5)[3:]
    assert got.settle()[3:] == back
    assert bodies(back) == ["1", "2"]
    assert all(m.headers["redelivered"] == "true" for m in back)


# -- consumer loss -----------------------------------------------------------


def test_unacked_messages_return_in_order_when_consumer_crashes(broker, client):
    first, got1 = client()
    first.subscribe("/queue/crash", id="s1", ack="client-individual")
    send_all(first, got1, "/queue/crash", [f"m{i}" for i in range(5)])
    assert bodies(got1.wait_for(5)) == [f"m{i}" for i in range(5)]
    first.ack(got1.messages[0].headers["ack"])
    sync(first, got1)

    second, got2 = client()
    second.subscribe("/queue/crash", id="s2", ack="client-individual")
    sync(second, got2)
    assert got2.settle(0.2) == [], "a message held by the first consumer went to the second"

    drop(first, got1)
    back = got2.wait_for(4)
    assert got2.settle() == back
    assert bodies(back) == ["m1", "m2", "m3", "m4"]
    assert [m.headers.get("redelivered") for m in back] == ["true"] * 4
    assert [m.headers.get("redelivery-count") for m in back] == ["1"] * 4


def test_unacked_messages_return_when_raw_socket_is_closed(broker, client):
    raw = RawStomp(broker)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": "/queue/raw-crash", "id": "r", "ack": "client"})
    producer, got = client()
    send_all(producer, got, "/queue/raw-crash", ["a", "b", "c"])
    received = [raw.read() for _ in range(3)]
    assert [f.body for f in received] == [b"a", b"b", b"c"]
    raw.close()  # no DISCONNECT, no ACK

    producer.subscribe("/queue/raw-crash", id="p", ack="auto")
    back = got.wait_for(3)
    assert bodies(back) == ["a", "b", "c"]
    assert all(m.headers.get("redelivered") == "true" for m in back)


@pytest.mark.policy(max_redeliveries=1)
def test_repeated_consumer_loss_dead_letters(broker, client):
    producer, gotp = client()
    send_all(producer, gotp, "/queue/poison", ["boom"])
    for attempt in range(2):
        conn, got = client()
        conn.subscribe("/queue/poison", id="s", ack="client-individual")
        got.wait_for(1)
        drop(conn, got)
    producer.subscribe("/queue/DLQ", id="dlq")
    (dead,) = gotp.wait_for(1)
    assert dead.body == "boom"
    assert dead.headers["originalDestination"] == "queue://poison"
    assert dead.headers["dlqDeliveryFailureCause"]
    assert broker.queue_depth("queue://poison") == 0


# -- prefetch ----------------------------------------------------------------


def test_prefetch_holds_exactly_that_many_until_acked(broker, client):
    conn, got = client()
    conn.subscribe("/queue/prefetch", id="s1", ack="client", headers={"activemq.prefetchSize": "2"})
    send_all(conn, got, "/queue/prefetch", ["1", "2", "3", "4", "5"])
    assert bodies(got.settle()) == ["1", "2"]
    assert broker.queue_depth("queue://prefetch") == 3

    conn.ack(got.messages[1].headers["ack"])  # cumulative: 1 and 2, two credits back
    assert bodies(got.wait_for(4)) == ["1", "2", "3", "4"]
    assert len(got.settle()) == 4
    assert broker.queue_depth("queue://prefetch") == 1

    conn.ack(got.messages[3].headers["ack"])
    assert bodies(got.wait_for(5))[4] == "5"
    assert broker.queue_depth("queue://prefetch") == 0


def test_prefetch_spreads_over_two_consumers(broker, client):
    a, got_a = client()
    a.subscribe("/queue/prefetch2", id="a", ack="client-individual", headers={"activemq.prefetchSize": "2"})
    sync(a, got_a)
    b, got_b = client()
    b.subscribe("/queue/prefetch2", id="b", ack="client-individual", headers={"activemq.prefetchSize": "2"})
    send_all(b, got_b, "/queue/prefetch2", [str(i) for i in range(6)])
    got_a.settle()
    got_b.settle()
    assert len(got_a.messages) == 2 and len(got_b.messages) == 2
    assert broker.queue_depth("queue://prefetch2") == 2


# -- dead letters ------------------------------------------------------------


def _nack_until_gone(conn, got, limit):
    """NACK every delivery of the one message until the broker stops redelivering it."""
    seen = 0
    while True:
        try:
            got.wait_for(seen + 1, timeout=0.4)
        except AssertionError:
            return seen
        message = got.messages[seen]
        seen += 1
        assert seen <= limit, "redelivered beyond max_redeliveries"
        conn.nack(message.headers["ack"])


@pytest.mark.policy(max_redeliveries=2)
def test_max_redeliveries_moves_message_to_dlq(broker, client):
    conn, got = client()
    conn.subscribe("/queue/orders", id="s1", ack="client-individual")
    conn.send("/queue/orders", "poison", headers={"x-order": "42"})
    deliveries = _nack_until_gone(conn, got, limit=3)
    assert deliveries == 3  # first delivery and two redeliveries
    assert [m.headers.get("redelivery-count") for m in got.messages] == [None, "1", "2"]
    assert broker.queue_depth("queue://orders") == 0
    assert broker.queue_depth("queue://DLQ") == 1

    watcher, got_dlq = client()
    watcher.subscribe("/queue/DLQ", id="dlq", ack="client-individual")
    (dead,) = got_dlq.wait_for(1)
    assert dead.body == "poison"
    assert dead.headers["destination"] == "/queue/DLQ"
    assert dead.headers["originalDestination"] == "queue://orders"
    cause = dead.headers["dlqDeliveryFailureCause"]
    assert "2" in cause or "NACK" in cause or "redeliver" in cause.lower(), cause
    assert dead.headers["x-order"] == "42"


@pytest.mark.policy(max_redeliveries=2, individual_dlq=True)
def test_individual_dlq_per_destination(broker, client):
    conn, got = client()
    conn.subscribe("/queue/payments", id="s1", ack="client-individual")
    conn.send("/queue/payments", "bad")
    assert _nack_until_gone(conn, got, limit=3) == 3
    assert broker.queue_depth("queue://DLQ") == 0
    conn.subscribe("/queue/DLQ.payments", id="dlq")
    dead = got.wait_for(4)[3]
    assert dead.body == "bad"
    assert dead.headers["destination"] == "/queue/DLQ.payments"
    assert dead.headers["originalDestination"] == "queue://payments"
    assert dead.headers["dlqDeliveryFailureCause"]


# -- priority ----------------------------------------------------------------


def test_priority_highest_first_fifo_within_priority(broker, client):
    conn, got = client()
    plan = [(0, "a"), (9, "b"), (4, "c"), (9, "d"), (0, "e"), (5, "f"), (4, "g"), (1, "h"), (8, "i"),
            (2, "j"), (3, "k"), (6, "l"), (7, "m"), (5, "n"), (9, "o")]
    for priority, body in plan:
        conn.send("/queue/prio", body, headers={"priority": str(priority)})
    sync(conn, got)
    conn.subscribe("/queue/prio", id="s1")
    received = got.wait_for(len(plan))
    expected = [body for _, body in sorted(plan, key=lambda pb: -pb[0])]  # stable sort keeps FIFO
    assert bodies(received) == expected
    assert [int(m.headers["priority"]) for m in received] == sorted((p for p, _ in plan), reverse=True)


# -- expiry ------------------------------------------------------------------


def now_ms():
    return int(time.time() * 1000)


def test_expired_messages_never_delivered_and_go_to_dlq(broker, client):
    conn, got = client()
    soon = now_ms() + 200
    conn.send("/queue/expiry", "past", headers={"expires": str(now_ms() - 1000)})
    conn.send("/queue/expiry", "soon", headers={"expires": str(soon)})
    conn.send("/queue/expiry", "forever")
    sync(conn, got)
    wait_past(soon, "'soon' to expire while stored")
    conn.subscribe("/queue/expiry", id="s1")
    assert bodies(got.wait_for(1)) == ["forever"]
    assert bodies(got.settle(0.2)) == ["forever"]
    assert broker.queue_bodies("queue://DLQ") == [b"past", b"soon"]
    conn.subscribe("/queue/DLQ", id="dlq")
    dead = got.wait_for(3)[1:]
    assert [m.headers["originalDestination"] for m in dead] == ["queue://expiry"] * 2
    assert all("expire" in m.headers["dlqDeliveryFailureCause"].lower() for m in dead)
    assert all("expires" not in m.headers or m.headers["expires"] == "0" for m in dead)


def test_message_expiring_while_consumer_busy_is_skipped(broker, client):
    conn, got = client()
    conn.subscribe("/queue/busy", id="s1", ack="client-individual", headers={"activemq.prefetchSize": "1"})
    short = now_ms() + 200
    conn.send("/queue/busy", "first")
    conn.send("/queue/busy", "short-lived", headers={"expires": str(short)})
    conn.send("/queue/busy", "last")
    (first,) = got.wait_for(1)
    wait_past(short, "'short-lived' to expire while the consumer holds 'first'")
    conn.ack(first.headers["ack"])
    second = got.wait_for(2)[1]
    assert second.body == "last"
    assert broker.queue_bodies("queue://DLQ") == [b"short-lived"]


@pytest.mark.policy(expiry_check_interval=0.05)
def test_expired_messages_leave_an_idle_queue(broker, client):
    conn, got = client()
    conn.send("/queue/idle", "soon", headers={"expires": str(now_ms() + 100)})
    sync(conn, got)
    assert broker.queue_depth("queue://idle") == 1
    wait_until(lambda: broker.queue_depth("queue://idle") == 0, what="the expiry check to empty the idle queue")
    assert broker.queue_bodies("queue://DLQ") == [b"soon"]


@pytest.mark.policy(expired_to_dlq=False)
def test_expired_messages_dropped_when_policy_says_so(broker, client):
    conn, got = client()
    soon = now_ms() + 200
    conn.send("/queue/drop", "past", headers={"expires": str(now_ms() - 1000)})
    conn.send("/queue/drop", "soon", headers={"expires": str(soon)})
    conn.send("/queue/drop", "forever")
    sync(conn, got)
    wait_past(soon, "'soon' to expire while stored")
    conn.subscribe("/queue/drop", id="s1")
    assert bodies(got.wait_for(1)) == ["forever"]
    assert bodies(got.settle(0.2)) == ["forever"]
    assert broker.queue_depth("queue://drop") == 0
    assert broker.queue_depth("queue://DLQ") == 0


# -- ack styles per STOMP version --------------------------------------------


def _ack_by_version(conn, version, message, sub_id):
    if version == "1.0":
        conn.ack(message.headers["message-id"])
    elif version == "1.1":
        conn.ack(message.headers["message-id"], sub_id)
    else:
        conn.ack(message.headers["ack"])


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_client_ack_style_of_each_version(broker, client, version):
    conn, got = client(version)
    conn.subscribe("/queue/styles", id="s1", ack="client")
    send_all(conn, got, "/queue/styles", ["1", "2", "3"])
    messages = got.wait_for(3)
    if version == "1.2":
        assert all(m.headers.get("ack") for m in messages)
        assert len({m.headers["ack"] for m in messages}) == 3
    _ack_by_version(conn, version, messages[1], "s1")
    sync(conn, got)
    assert got.errors == []
    leave(conn)
    assert broker.queue_bodies("queue://styles") == [b"3"]


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_client_individual_ack_style_of_each_version(broker, client, version):
    conn, got = client(version)
    conn.subscribe("/queue/styles-ind", id="s1", ack="client-individual")
    send_all(conn, got, "/queue/styles-ind", ["1", "2", "3"])
    messages = got.wait_for(3)
    _ack_by_version(conn, version, messages[1], "s1")
    sync(conn, got)
    assert got.errors == []
    leave(conn)
    assert broker.queue_bodies("queue://styles-ind") == [b"1", b"3"]


def test_stomp_11_ack_without_subscription_is_an_error(broker):
    raw = RawStomp(broker, "1.1")
    raw.connect("1.1")
    raw.frame("SUBSCRIBE", {"destination": "/queue/raw11", "id": "s1", "ack": "client"})
    raw.frame("SEND", {"destination": "/queue/raw11"}, b"x")
    message = raw.read()
    assert message.command == "MESSAGE"
    raw.frame("ACK", {"message-id": message.headers["message-id"]})
    error = raw.expect_error_and_close()
    assert "subscription" in error.headers["message"].lower()


def test_stomp_10_ack_by_message_id_raw(broker):
    raw = RawStomp(broker, "1.0")
    raw.frame("CONNECT", {})
    assert raw.read().command == "CONNECTED"
    raw.frame("SUBSCRIBE", {"destination": "/queue/raw10", "ack": "client"})
    raw.frame("SEND", {"destination": "/queue/raw10"}, b"one")
    raw.frame("SEND", {"destination": "/queue/raw10"}, b"two")
    first, second = raw.read(), raw.read()
    assert "ack" not in first.headers
    raw.frame("ACK", {"message-id": first.headers["message-id"], "receipt": "r1"})
    receipt = raw.read()
    assert receipt.command == "RECEIPT" and receipt.headers["receipt-id"] == "r1"
    raw.frame("DISCONNECT", {"receipt": "bye"})
    assert raw.read().command == "RECEIPT"
    raw.close()
    assert broker.queue_bodies("queue://raw10") == [b"two"]
