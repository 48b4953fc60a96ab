"""Queues over STOMP with stomp.py: delivery, acks, prefetch, redelivery, DLQ, priority, expiry."""
from __future__ import annotations

import threading
from collections import Counter

import pytest

from tests.support import connect, disconnect, sync, wait_until


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_send_and_receive_every_version(broker, version):
    conn, got = connect(broker, version)
    conn.subscribe("/queue/greet", id="s1", ack="auto")
    conn.send("/queue/greet", "hello", headers={"x-trace": "abc", "reply-to": "/queue/back", "correlation-id": "c-1"})
    (message,) = got.wait_for(1)
    assert message.body == "hello"
    assert message.headers["destination"] == "/queue/greet"
    assert message.headers["x-trace"] == "abc"
    assert message.headers["reply-to"] == "/queue/back"
    assert message.headers["correlation-id"] == "c-1"
    assert message.headers["subscription"] == "s1"
    assert message.headers["message-id"].startswith("ID:")
    disconnect(conn)


def test_ten_thousand_messages_three_consumers_each_exactly_once(broker):
    consumers = []
    for i in range(3):
        conn, got = connect(broker, "1.2")
        conn.subscribe("/queue/work", id=f"c{i}", ack="client-individual", headers={"activemq.prefetchSize": "100"})
        consumers.append((conn, got))
    producer, _ = connect(broker, "1.2")
    total = 10_000
    for i in range(total):
        producer.send("/queue/work", str(i))

    # Each consumer acks what it receives, from its own thread, as a real worker would.
    def drain(conn, got, stop):
        acked = 0
        while not stop.is_set():
            batch = got.wait_more(acked)
            for message in batch:
                conn.ack(message.headers["ack"])
            acked += len(batch)

    stop = threading.Event()
    workers = [threading.Thread(target=drain, args=(c, g, stop)) for c, g in consumers]
    for w in workers:
        w.start()
    wait_until(lambda: sum(len(g.messages) for _, g in consumers) >= total, 60,
               lambda: f"{total} deliveries, {sum(len(g.messages) for _, g in consumers)} so far")

    def settled() -> bool:  # every message acked: the broker has nothing left to deliver (again)
        queue = broker.broker.queues.get("queue://work")
        return len(queue) == 0 and queue.inflight == 0

    wait_until(lambda: broker.inspect(settled), 10, "every delivery acked")
    stop.set()
    for w in workers:
        w.join()
    for c, g in consumers:
        sync(c, g)  # whatever the broker sent each consumer before (a duplicate) has arrived
    counts = Counter(m.body for _, g in consumers for m in g.messages)
    assert len(counts) == total
    assert set(counts.values()) == {1}, "some message was delivered twice"
    assert all(len(g.messages) > 1000 for _, g in consumers), [len(g.messages) for _, g in consumers]
    assert broker.queue_depth("queue://work") == 0
    for c, _ in consumers:
        disconnect(c)
    disconnect(producer)


def test_a_send_repeated_with_the_same_duplicate_id_is_queued_once(broker):
    """Artemis's _AMQ_DUPL_ID: a producer that resends after a lost receipt does not duplicate."""
    conn, got = connect(broker)
    for body, dup_id in (("order 1", "o-1"), ("order 1 again", "o-1"), ("order 2", "o-2")):
        conn.send("/queue/orders", body, headers={"_AMQ_DUPL_ID": dup_id, "persistent": "true"}, receipt=body)
    got.wait_for(3, what="receipts")  # every send is confirmed, the duplicate too
    assert broker.queue_bodies("queue://orders") == [b"order 1", b"order 2"]
    disconnect(conn)
