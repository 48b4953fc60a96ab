"""Duplicate detection on ``_AMQ_DUPL_ID``: per destination, bounded, and kept across restarts."""
from __future__ import annotations

from twisted.internet.task import Clock

from core.broker import Broker
from core.duplicates import DUPLICATE_ID_HEADER
from core.message import Message
from core.policy import Policy
from persistence.memory import MemoryStore


def make(store=None, size=100_000):
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(store or MemoryStore(), clock, Policy(duplicate_cache_size=size))
    broker.start()
    return broker


def send(broker, destination, body, dup_id=None, persistent=True):
    headers = {DUPLICATE_ID_HEADER: dup_id} if dup_id is not None else {}
    conn = broker.connect()
    conn.send(Message(broker.new_message_id(), destination, body, headers, persistent=persistent))
    conn.close()


def bodies(broker, queue):
    return [e.message.body for e in broker.queues[queue].messages()]


def test_an_id_is_routed_once_per_destination():
    broker = make()
    send(broker, "queue://a", b"1", "id-1")
    send(broker, "queue://a", b"1 again", "id-1")
    send(broker, "queue://b", b"same id, other queue", "id-1")
    send(broker, "queue://a", b"no id")
    send(broker, "queue://a", b"no id")
    assert bodies(broker, "queue://a") == [b"1", b"no id", b"no id"]
    assert bodies(broker, "queue://b") == [b"same id, other queue"]
    assert broker.duplicates.dropped == 1
    # Consumers see the id, as Artemis's do.
    assert broker.queues["queue://a"].messages()[0].message.headers[DUPLICATE_ID_HEADER] == "id-1"


def test_topics_too_and_the_duplicate_is_not_fanned_out():
    broker = make()
    got = []
    conn = broker.connect("c")
    conn.subscribe("topic://t", lambda c, e, t: got.append(e.message.body))
    send(broker, "topic://t", b"x", "k")
    send(broker, "topic://t", b"x", "k")
    assert got == [b"x"]


def test_ids_survive_a_restart():
    store = MemoryStore()
    broker = make(store)
    send(broker, "queue://a", b"before", "id-1")
    broker.stop()
    again = make(store.reopen())
    send(again, "queue://a", b"resent after the restart", "id-1")
    assert bodies(again, "queue://a") == [b"before"]


def test_the_cache_keeps_the_last_n_ids_in_arrival_order():
    store = MemoryStore()
    broker = make(store, size=3)
    for i in range(5):
        send(broker, "queue://a", b"%d" % i, f"id-{i}")
    assert len(broker.duplicates) == 3
    assert len(list(store.iter_records("dupl"))) == 3  # evicted ids leave the store too
    send(broker, "queue://a", b"0 again", "id-0")  # forgotten: accepted
    send(broker, "queue://a", b"4 again", "id-4")  # remembered: dropped
    assert bodies(broker, "queue://a")[-1] == b"0 again"
    again = make(store.reopen(), size=3)
    send(again, "queue://a", b"4 third time", "id-4")
    assert b"4 third time" not in bodies(again, "queue://a")


def test_size_zero_turns_detection_off():
    broker = make(size=0)
    send(broker, "queue://a", b"1", "same")
    send(broker, "queue://a", b"2", "same")
    assert bodies(broker, "queue://a") == [b"1", b"2"]
