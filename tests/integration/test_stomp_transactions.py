"""STOMP transactions (BEGIN/COMMIT/ABORT) over stomp.py and raw sockets: sends, acks, nacks, errors, disconnects."""
from __future__ import annotations

import pytest

from tests.support import RawStomp, bodies, drop, leave, sync

# -- transactional sends -----------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_commit_delivers_all_sends_at_once(broker, client, version):
    consumer, got = client()
    consumer.subscribe("/queue/tx", id="s1")
    sync(consumer, got)
    producer, gotp = client(version)
    tx = producer.begin()
    for i in range(3):
        producer.send("/queue/tx", f"m{i}", headers={"transaction": tx})
    sync(producer, gotp)
    assert got.settle(0.3) == [], "a transactional send arrived before COMMIT"
    assert broker.queue_depth("queue://tx") == 0
    producer.commit(tx, headers={"receipt": "committed"})
    gotp.wait_receipt("committed")
    assert bodies(got.wait_for(3)) == ["m0", "m1", "m2"]
    assert bodies(got.settle(0.2)) == ["m0", "m1", "m2"]


def test_commit_spans_queues_and_topics(broker, client):
    listener, got_topic = client()
    listener.subscribe("/topic/tx.events", id="t")
    sync(listener, got_topic)
    producer, gotp = client()
    tx = producer.begin()
    producer.send("/queue/tx.a", "to-a", headers={"transaction": tx})
    producer.send("/topic/tx.events", "to-topic", headers={"transaction": tx})
    producer.send("/queue/tx.b", "to-b", headers={"transaction": tx})
    producer.send("/queue/tx.a", "untransacted")
    sync(producer, gotp)
    assert broker.queue_bodies("queue://tx.a") == [b"untransacted"]
    assert broker.queue_depth("queue://tx.b") == 0
    assert got_topic.settle(0.2) == []
    producer.commit(tx)
    sync(producer, gotp)
    assert broker.queue_bodies("queue://tx.a") == [b"untransacted", b"to-a"]
    assert broker.queue_bodies("queue://tx.b") == [b"to-b"]
    assert bodies(got_topic.wait_for(1)) == ["to-topic"]


def test_abort_drops_the_sends(broker, client):
    consumer, got = client()
    consumer.subscribe("/queue/aborted", id="s1")
    sync(consumer, got)
    producer, gotp = client()
    tx = producer.begin()
    producer.send("/queue/aborted", "never-1", headers={"transaction": tx})
    producer.send("/queue/aborted", "never-2", headers={"transaction": tx})
    producer.abort(tx)
    producer.send("/queue/aborted", "after")
    sync(producer, gotp)
    assert bodies(got.wait_for(1)) == ["after"]
    assert bodies(got.settle(0.2)) == ["after"]
    assert gotp.errors == []
    # The aborted transaction is gone: committing it now is an error.
    producer.commit(tx)
    (error,) = gotp.wait_for(1, what="errors")
    assert tx in error.body or "transaction" in error.headers["message"].lower()


# -- transactional acks ------------------------------------------------------


def test_acks_in_transaction_take_effect_at_commit(broker, client):
    conn, got = client()
    conn.subscribe("/queue/tx-ack", id="s1", ack="client-individual")
    for i in range(3):
        conn.send("/queue/tx-ack", f"m{i}")
    messages = got.wait_for(3)
    tx = conn.begin()
    conn.ack(messages[0].headers["ack"], transaction=tx)
    conn.ack(messages[2].headers["ack"], transaction=tx)
    conn.commit(tx)
    sync(conn, got)
    leave(conn)
    assert broker.queue_bodies("queue://tx-ack") == [b"m1"]

    again, got2 = client()
    again.subscribe("/queue/tx-ack", id="s2")
    back = got2.wait_for(1)
    assert got2.settle(0.2) == back
    assert bodies(back) == ["m1"]
    assert back[0].headers["redelivered"] == "true"


def test_abort_redelivers_the_acked_messages(broker, client):
    conn, got = client()
    conn.subscribe("/queue/tx-abort", id="s1", ack="client-individual")
    for i in range(3):
        conn.send("/queue/tx-abort", f"m{i}")
    messages = got.wait_for(3)
    tx = conn.begin()
    conn.ack(messages[0].headers["ack"], transaction=tx)
    conn.ack(messages[1].headers["ack"], transaction=tx)
    sync(conn, got)
    assert len(got.settle(0.2)) == 3, "something was redelivered before ABORT"
    conn.abort(tx)
    again = got.wait_for(5)[3:]
    assert bodies(again) == ["m0", "m1"]
    assert [m.headers.get("redelivered") for m in again] == ["true", "true"]
    for m in again + [messages[2]]:
        conn.ack(m.headers["ack"])
    sync(conn, got)
    assert got.errors == []
    assert broker.queue_depth("queue://tx-abort") == 0
    assert broker.inspect(lambda: broker.broker.queues["queue://tx-abort"].inflight) == 0


def test_client_mode_ack_in_transaction_is_cumulative_at_commit(broker, client):
    conn, got = client()
    conn.subscribe("/queue/tx-cumulative", id="s1", ack="client")
    for i in range(4):
        conn.send("/queue/tx-cumulative", f"m{i}")
    messages = got.wait_for(4)
    tx = conn.begin()
    conn.ack(messages[2].headers["ack"], transaction=tx)
    conn.commit(tx)
    sync(conn, got)
    leave(conn)
    assert broker.queue_bodies("queue://tx-cumulative") == [b"m3"]


def test_nack_in_transaction_redelivers_at_commit(broker, client):
    conn, got = client()
    conn.subscribe("/queue/tx-nack", id="s1", ack="client-individual")
    conn.send("/queue/tx-nack", "m0")
    (first,) = got.wait_for(1)
    tx = conn.begin()
    conn.nack(first.headers["ack"], transaction=tx)
    sync(conn, got)
    assert got.settle(0.3) == [first], "NACK took effect before COMMIT"
    conn.commit(tx)
    again = got.wait_for(2)[1]
    assert again.body == "m0"
    assert again.headers["redelivered"] == "true"
    assert again.headers["redelivery-count"] == "1"


def test_nack_in_aborted_transaction_leaves_message_redelivered(broker, client):
    conn, got = client()
    conn.subscribe("/queue/tx-nack-abort", id="s1", ack="client-individual")
    conn.send("/queue/tx-nack-abort", "m0")
    (first,) = got.wait_for(1)
    tx = conn.begin()
    conn.nack(first.headers["ack"], transaction=tx)
    conn.abort(tx)
    again = got.wait_for(2)[1]
    assert again.body == "m0"
    assert again.headers["redelivered"] == "true"
    conn.ack(again.headers["ack"])
    sync(conn, got)
    assert got.errors == []
    assert len(got.settle(0.2)) == 2


# -- errors ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["SEND", "COMMIT", "ABORT"])
def test_unknown_transaction_is_an_error_and_closes(broker, client, command):
    raw = RawStomp(broker)
    raw.connect()
    headers = {"transaction": "no-such-tx", "receipt": "r"}
    if command == "SEND":
        headers["destination"] = "/queue/tx-unknown"
    raw.frame(command, headers, b"body" if command == "SEND" else b"")
    error = raw.expect_error_and_close()
    assert "no-such-tx" in error.body.decode() or "transaction" in error.headers["message"].lower()
    assert error.headers.get("receipt-id") == "r"
    assert broker.queue_depth("queue://tx-unknown") == 0
    # Other connections are unaffected.
    conn, got = client()
    conn.subscribe("/queue/tx-unknown", id="s")
    conn.send("/queue/tx-unknown", "fine")
    assert bodies(got.wait_for(1)) == ["fine"]


def test_begin_twice_and_begin_without_id_are_errors(broker):
    raw = RawStomp(broker)
    raw.connect()
    raw.frame("BEGIN", {"transaction": "t1"})
    raw.frame("BEGIN", {"transaction": "t1"})
    error = raw.expect_error_and_close()
    assert "t1" in error.body.decode() or "t1" in error.headers["message"]

    raw = RawStomp(broker)
    raw.connect()
    raw.frame("BEGIN", {})
    error = raw.expect_error_and_close()
    assert "transaction" in error.headers["message"].lower()


@pytest.mark.parametrize("verb", ["ack", "nack"])
def test_ack_with_unknown_transaction_does_not_lose_the_message(broker, client, verb):
    conn, got = client()
    conn.subscribe("/queue/tx-lost", id="s1", ack="client-individual")
    conn.send("/queue/tx-lost", "precious")
    (message,) = got.wait_for(1)
    getattr(conn, verb)(message.headers["ack"], transaction="no-such-tx")
    (error,) = got.wait_for(1, what="errors")
    assert got.disconnected.wait(5)
    # The ACK was refused, so the message is still unacknowledged and must come back.
    other, got2 = client()
    other.subscribe("/queue/tx-lost", id="s2")
    back = got2.wait_for(1, timeout=1.0)
    assert bodies(back) == ["precious"]
    assert back[0].headers["redelivered"] == "true"


# -- disconnect with an open transaction -------------------------------------


@pytest.mark.parametrize("how", ["disconnect", "crash"])
def test_disconnect_with_open_transaction_aborts_it(broker, client, how):
    watcher, got_w = client()
    watcher.subscribe("/queue/tx-open.out", id="w")
    sync(watcher, got_w)

    conn, got = client()
    conn.send("/queue/tx-open.in", "held")
    conn.subscribe("/queue/tx-open.in", id="s1", ack="client-individual")
    (held,) = got.wait_for(1)
    tx = conn.begin()
    conn.ack(held.headers["ack"], transaction=tx)
    conn.send("/queue/tx-open.out", "uncommitted", headers={"transaction": tx})
    sync(conn, got)
    if how == "disconnect":
        leave(conn)
    else:
        drop(conn, got)

    assert got_w.settle(0.3) == [], "a send of an uncommitted transaction was delivered"
    assert broker.queue_depth("queue://tx-open.out") == 0
    assert broker.queue_bodies("queue://tx-open.in") == [b"held"]
    again, got2 = client()
    again.subscribe("/queue/tx-open.in", id="s2")
    (back,) = got2.wait_for(1)
    assert back.body == "held"
    assert back.headers["redelivered"] == "true"
