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


def _ids_remembered(broker, destination, ids):
    """Which of ``ids`` the broker would drop, asked without sending (a probe is an id too)."""
    from core.duplicates import _digest

    return [i for i in ids if _digest(destination, i) in broker.duplicates._ids]


def test_a_new_id_overwrites_the_oldest_slot_without_a_delete():
    store = MemoryStore()
    broker = make(store, size=4)
    for i in range(4):
        send(broker, "queue://a", b"%d" % i, f"id-{i}")
    deletes_before = store.writes
    cache = broker.duplicates
    # Past the size: one put per id, over the slot of the id it forgets.
    puts = []
    real_delete, real_put = store.delete_record, store.put_record
    store.delete_record = lambda kind, key: puts.append(("delete", kind)) or real_delete(kind, key)
    store.put_record = lambda kind, key, data: puts.append(("put", kind)) or real_put(kind, key, data)
    for i in range(4, 10):
        assert not cache.seen("queue://a", f"id-{i}")
    assert [p for p in puts if p[1] == "dupl"] == [("put", "dupl")] * 6
    assert store.writes > deletes_before
    assert len(list(store.iter_records("dupl"))) == 4
    store.delete_record, store.put_record = real_delete, real_put
    again = make(store.reopen(), size=4)
    assert _ids_remembered(again, "queue://a", [f"id-{i}" for i in range(10)]) == ["id-6", "id-7", "id-8", "id-9"]


def test_a_smaller_or_larger_size_after_a_restart_keeps_the_newest():
    store = MemoryStore()
    broker = make(store, size=5)
    for i in range(8):
        send(broker, "queue://a", b"%d" % i, f"id-{i}")
    smaller = make(store.reopen(), size=3)
    assert len(list(smaller.store.iter_records("dupl"))) == 3
    assert _ids_remembered(smaller, "queue://a", ["id-4", "id-5", "id-6", "id-7"]) == ["id-5", "id-6", "id-7"]
    send(smaller, "queue://a", b"5 again", "id-5")
    assert smaller.duplicates.dropped == 1
    larger = make(smaller.store.reopen(), size=10)
    assert _ids_remembered(larger, "queue://a", ["id-4", "id-5", "id-6", "id-7"]) == ["id-5", "id-6", "id-7"]
    for i in range(9):
        send(larger, "queue://a", b"n", f"n-{i}")
    # 3 + 9 ids in 10 slots: the two oldest went.
    assert _ids_remembered(larger, "queue://a", ["id-5", "id-6", "id-7", "n-0", "n-8"]) == ["id-7", "n-0", "n-8"]
    assert len(list(larger.store.iter_records("dupl"))) == 10


def test_records_of_the_old_layout_are_read_and_rewritten():
    from core.duplicates import _digest

    store = MemoryStore()
    # Before the ring: key = arrival number (20 digits), value = the digest alone.
    for n in range(1, 6):
        store.put_record("dupl", f"{n:020d}", _digest("queue://a", f"old-{n}"))
    broker = make(store, size=3)
    assert sorted(len(k) for k, _ in store.iter_records("dupl")) == [10, 10, 10]
    assert _ids_remembered(broker, "queue://a", [f"old-{n}" for n in range(1, 6)]) == ["old-3", "old-4", "old-5"]
