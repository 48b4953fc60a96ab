"""Stream chunks in both stores: one contract, checked on a real RocksDB and in memory."""
from __future__ import annotations

import gc

import pytest

from persistence.memory import MemoryStore
from persistence.rocks import RocksStore


@pytest.fixture(params=["rocks", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        yield MemoryStore()
        return
    s = RocksStore(str(tmp_path / "store"))
    yield s
    s.close()


def _fill(store):
    for partition in (0, 1, 2):
        for base in (0, 100, 250):
            store.put_chunk("sensors", partition, base, b"p%d@%d" % (partition, base))
    store.put_chunk("other", 1, 0, b"not sensors")
    store.flush()


def test_a_read_starts_in_the_chunk_holding_the_offset(store):
    _fill(store)
    assert [b for b, _ in store.iter_chunks("sensors", 1, 0)] == [0, 100, 250]
    assert [b for b, _ in store.iter_chunks("sensors", 1, 99)] == [0, 100, 250]
    assert [b for b, _ in store.iter_chunks("sensors", 1, 100)] == [100, 250]
    assert [b for b, _ in store.iter_chunks("sensors", 1, 10**9)] == [250]
    assert dict(store.iter_chunks("sensors", 2, 260)) == {250: b"p2@250"}


def test_partitions_and_logs_do_not_leak_into_each_other(store):
    _fill(store)
    assert [v for _, v in store.iter_chunks("sensors", 0)] == [b"p0@0", b"p0@100", b"p0@250"]
    assert list(store.iter_chunks("other", 1)) == [(0, b"not sensors")]
    assert list(store.iter_chunks("other", 0)) == []
    assert list(store.iter_chunks("never-written", 0)) == []
    assert list(store.iter_chunks("sensors", 7)) == []


def test_a_read_before_the_first_chunk_starts_at_the_first(store):
    store.put_chunk("s", 3, 40, b"a")
    store.put_chunk("s", 2, 90, b"previous partition")
    store.flush()
    assert list(store.iter_chunks("s", 3, 5)) == [(40, b"a")]


def test_overwrite_and_delete(store):
    _fill(store)
    store.put_chunk("sensors", 0, 0, b"merged")
    store.delete_chunk("sensors", 0, 100)
    store.delete_chunk("sensors", 0, 555)  # not there: nothing happens
    store.delete_chunk("unknown", 0, 0)
    store.flush()
    assert list(store.iter_chunks("sensors", 0)) == [(0, b"merged"), (250, b"p0@250")]


def test_chunks_survive_a_reopen(tmp_path):
    path = str(tmp_path / "store")
    store = RocksStore(path)
    store.put_chunk("sensors", 0, 0, b"first")
    store.put_chunk("sensors", 0, 7, b"second")
    store.close()
    gc.collect()
    again = RocksStore(path)
    assert list(again.iter_chunks("sensors", 0, 8)) == [(7, b"second")]
    again.close()


def test_chunks_wait_for_the_batch_like_every_write(tmp_path):
    store = RocksStore(str(tmp_path / "store"))
    store.put_chunk("s", 0, 0, b"pending")
    assert list(store.iter_chunks("s", 0)) == []  # reads see written batches only
    done = []
    store.when_durable(lambda: done.append(True))
    assert done == []
    store.flush()
    assert done == [True] and list(store.iter_chunks("s", 0)) == [(0, b"pending")]
    store.close()


def test_memory_store_reopen_keeps_chunks():
    store = MemoryStore()
    store.put_chunk("s", 0, 0, b"x")
    assert list(store.reopen().iter_chunks("s", 0)) == [(0, b"x")]
