import pytest

from persistence.memory import MemoryStore
from persistence.store import StoreError


def test_messages_are_ordered_ranges_per_destination():
    store = MemoryStore()
    for seq in (5, 1, 3):
        store.put_message("queue://a", seq, b"%d" % seq)
    store.put_message("queue://b", 2, b"b")
    assert list(store.iter_messages("queue://a")) == [(1, b"1"), (3, b"3"), (5, b"5")]
    store.delete_message("queue://a", 3)
    assert [s for s, _ in store.iter_messages("queue://a")] == [1, 5]
    assert store.destinations() == ["queue://a", "queue://b"]


def test_records_by_prefix_and_reopen():
    store = MemoryStore()
    store.put_record("k", "a\x001", b"1")
    store.put_record("k", "a\x002", b"2")
    store.put_record("k", "b\x001", b"3")
    assert [v for _, v in store.iter_records("k", "a\x00")] == [b"1", b"2"]
    again = store.reopen()
    store.delete_record("k", "a\x001")
    assert [v for _, v in again.iter_records("k")] == [b"1", b"2", b"3"]


def test_durable_callback_and_close():
    store = MemoryStore()
    seen = []
    store.when_durable(lambda: seen.append(1))
    assert seen == [1]
    store.close()
    with pytest.raises(StoreError):
        store.put_message("queue://a", 1, b"")
