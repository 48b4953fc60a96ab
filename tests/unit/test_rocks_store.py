"""The RocksDB store on a real disk: ranges, records, groups, group commit, the lock."""
from __future__ import annotations

import gc

import pytest

from persistence.rocks import GroupConfig, RocksStore, StoreLocked, _pattern_matches
from persistence.store import StoreError


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "store")


def test_messages_are_ordered_ranges_and_survive_reopen(path):
    store = RocksStore(path)
    for seq in (300, 5, 70000):
        store.put_message("queue://a", seq, b"%d" % seq)
    store.put_message("queue://a.b", 1, b"other")  # a longer name sorting right after must not leak in
    store.put_message("queue://b", 2, b"b")
    store.flush()
    assert list(store.iter_messages("queue://a")) == [(5, b"5"), (300, b"300"), (70000, b"70000")]
    assert [s for s, _ in store.iter_messages("queue://a", start_seq=6)] == [300, 70000]
    store.delete_message("queue://a", 300)
    store.close()
    gc.collect()
    again = RocksStore(path)
    assert [s for s, _ in again.iter_messages("queue://a")] == [5, 70000]
    assert again.destinations() == ["queue://a", "queue://a.b", "queue://b"]
    again.close()


def test_records_by_kind_and_prefix(path):
    store = RocksStore(path)
    store.put_record("durable", "c1:x", b"1")
    store.put_record("durable", "c1:y", b"2")
    store.put_record("durable", "c2:x", b"3")
    store.put_record("durable-ref", "c1:x\x00001", b"4")
    store.flush()  # reads see what has been written, not the pending batch
    assert [k for k, _ in store.iter_records("durable")] == ["c1:x", "c1:y", "c2:x"]
    assert [v for _, v in store.iter_records("durable", "c1:")] == [b"1", b"2"]
    store.delete_record("durable", "c1:y")
    store.flush()
    assert [k for k, _ in store.iter_records("durable")] == ["c1:x", "c2:x"]
    store.close()


def test_groups_get_their_own_family_and_old_destinations_stay_readable(path):
    store = RocksStore(path)
    store.put_message("queue://orders.eu", 1, b"before the group existed")
    store.close()
    gc.collect()
    store = RocksStore(path, [GroupConfig("orders", ["queue://orders.>"])])
    store.put_message("queue://orders.us", 2, b"new")
    store.put_message("queue://orders.eu", 3, b"same family as before")
    store.flush()
    assert store._dest_family["queue://orders.us"] == "group.orders"
    assert store._dest_family["queue://orders.eu"] == "default"
    assert [v for _, v in store.iter_messages("queue://orders.eu")] == [b"before the group existed", b"same family as before"]
    store.close()
    gc.collect()
    # The group is gone from the configuration: its family and data are still there.
    store = RocksStore(path)
    assert [v for _, v in store.iter_messages("queue://orders.us")] == [b"new"]
    store.close()


@pytest.mark.parametrize("pattern, destination, expected", [
    ("queue://orders.>", "queue://orders.eu.fr", True),
    ("queue://orders.>", "queue://orders", True),
    ("queue://orders.*", "queue://orders.eu", True),
    ("queue://orders.*", "queue://orders.eu.fr", False),
    ("queue://orders.>", "topic://orders.eu", False),
    ("topic://sensors.>", "topic://sensors.t/c", True),
])
def test_group_patterns(pattern, destination, expected):
    assert _pattern_matches(pattern, destination) is expected


def test_group_commit_one_batch_per_turn_and_callbacks_in_order(path):
    turns = []
    store = RocksStore(path, schedule=turns.append)
    answered = []
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: answered.append("first"))
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append("second"))
    assert answered == [] and len(turns) == 1  # one flush arranged for the turn
    turns.pop()()
    assert answered == ["first", "second"] and store.batches_written == 1
    # Nothing pending: answered at once, still in order.
    store.when_durable(lambda: answered.append("third"))
    assert answered[-1] == "third"
    store.close()


def test_large_batches_are_written_without_waiting_for_the_turn(path):
    store = RocksStore(path, schedule=lambda f: None, max_batch=10)
    for seq in range(25):
        store.put_message("queue://q", seq, b"x")
    assert store.batches_written == 2
    store.close()


class Worker:
    """A background runner whose jobs run when the test says: a sync "still on the disk" is one not yet run."""

    def __init__(self) -> None:
        self.jobs = []

    def __call__(self, work, done) -> None:
        self.jobs.append((work, done))

    def finish(self, error: BaseException | None = None) -> None:
        work, done = self.jobs.pop(0)
        if error is None:
            work()
        done(error)


def test_pipelined_sync_releases_callbacks_only_after_a_sync_begun_after_their_write(path):
    turns, worker = [], Worker()
    store = RocksStore(path, schedule=turns.append, background=worker)
    answered = []
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: answered.append("first"))
    turns.pop()()
    # Written (readable) but not yet synced: nothing confirmed, one sync under way.
    assert store.get_message("queue://q", 1) == b"a" and answered == [] and len(worker.jobs) == 1
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append("second"))
    turns.pop()()
    assert answered == [] and len(worker.jobs) == 1  # one sync at a time; the next covers batch 2
    worker.finish()
    assert answered == ["first"] and len(worker.jobs) == 1
    # Nothing new is written, but "third" still waits behind "second".
    store.when_durable(lambda: answered.append("third"))
    assert answered == ["first"]
    turns.pop()()
    worker.finish()
    assert answered == ["first", "second", "third"] and worker.jobs == []
    store.when_durable(lambda: answered.append("fourth"))  # nothing waiting: at once
    assert answered[-1] == "fourth"
    store.close()


def test_a_callback_after_its_batch_was_written_still_waits_for_the_sync(path):
    # A turn's store batch is flushed before its sessions hand their receipts over:
    # the receipt then finds nothing pending, but its message is written and not synced.
    turns, worker = [], Worker()
    store = RocksStore(path, schedule=turns.append, background=worker)
    answered = []
    store.put_message("queue://q", 1, b"a")
    turns.pop()()  # the turn's flush: written, and no callback waited, so no sync yet
    store.when_durable(lambda: answered.append("receipt"))
    assert answered == [] and len(worker.jobs) == 1  # a sync for it, begun now
    worker.finish()
    assert answered == ["receipt"]
    store.when_durable(lambda: answered.append("nothing new"))
    assert answered == ["receipt", "nothing new"] and worker.jobs == []  # synced already: at once
    store.close()


def one_batch_awaiting_its_sync(path):
    """A pipelined store with message 1 written, its callback waiting for the sync under way."""
    worker = Worker()
    store = RocksStore(path, schedule=lambda flush: None, background=worker)
    answered = []
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: answered.append(1))
    store._scheduled_flush()
    assert answered == [] and len(worker.jobs) == 1
    return store, worker, answered


def test_explicit_flush_syncs_at_once_and_a_late_sync_changes_nothing(path):
    store, worker, answered = one_batch_awaiting_its_sync(path)
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append(2))
    store.flush()
    assert answered == [1, 2]
    worker.finish()
    assert answered == [1, 2] and worker.jobs == []
    store.close()
    gc.collect()
    reopened = RocksStore(path)
    assert [seq for seq, _ in reopened.iter_messages("queue://q")] == [1, 2]
    reopened.close()


def test_a_failed_sync_confirms_nothing_more_and_refuses_writes(path):
    store, worker, answered = one_batch_awaiting_its_sync(path)
    worker.finish(OSError(5, "Input/output error"))
    assert answered == []
    with pytest.raises(StoreError, match="could not be synced: .*Input/output error"):
        store.put_message("queue://q", 2, b"b")
    # A later confirmation starts no sync that could succeed and release the lost batch's
    # callbacks (a second fsync reports success for pages the kernel already dropped).
    store.when_durable(lambda: answered.append("later"))
    store._scheduled_flush()
    store.flush()
    assert answered == [] and worker.jobs == []
    store.close()


def test_close_waits_for_a_sync_on_its_worker_thread(path):
    import threading
    import time

    started, results = threading.Event(), []

    def slow_worker(work, done):
        def run():
            store._sync_lock.acquire()
            started.set()
            time.sleep(0.2)  # the disk is slow: close must not pull the database from under the sync
            results.append("sync ended")
            store._sync_lock.release()
            work()  # after close: does nothing
        threading.Thread(target=run).start()

    turns = []
    store = RocksStore(path, schedule=turns.append, background=slow_worker)
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: None)
    turns.pop()()
    started.wait(5)
    store.close()
    results.append("closed")
    time.sleep(0.05)
    assert results == ["sync ended", "closed"]


def test_second_opener_is_told_the_store_is_locked(path):
    store = RocksStore(path)
    with pytest.raises(StoreLocked):
        RocksStore(path)
    store.close()
    gc.collect()
    RocksStore(path).close()


def test_closed_store_refuses(path):
    store = RocksStore(path)
    store.close()
    with pytest.raises(StoreError):
        store.put_message("queue://q", 1, b"x")


def test_compaction_gives_deleted_space_back(path):
    store = RocksStore(path, max_batch=1000)
    body = b"x" * 1000
    for seq in range(20000):
        store.put_message("queue://q", seq, body)
    store.flush()
    store.db.flush()
    full = store.usage_bytes()
    for seq in range(20000):
        store.delete_message("queue://q", seq)
    store.flush()
    store.compact()
    assert store.usage_bytes() < full / 10
    store.close()
