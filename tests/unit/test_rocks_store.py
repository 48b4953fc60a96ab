"""The RocksDB store on a real disk: ranges, records, groups, group commit, the lock."""
from __future__ import annotations

import errno
import gc
import os

import pytest
from twisted.internet.task import Clock

from persistence import rocks
from persistence.rocks import INLINE_RETRY_SECONDS, KEEP_SYNC_BYTES, GroupConfig, RocksStore, StoreLocked, _pattern_matches
from persistence.store import StoreError, StoreUnavailable
from tests.support import resize_filesystem, small_filesystem, wait_until


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
    # Nothing new is written, but "third" still waits behind "second", for the sync under way
    # (begun after the last write): no batch to flush for it.
    store.when_durable(lambda: answered.append("third"))
    assert answered == ["first"] and turns == []
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


def stored_after_reopening(store: RocksStore, path) -> list[int]:
    """Close the store and open it again: the sequences of queue://q it still has."""
    store.close()
    gc.collect()
    reopened = RocksStore(path)
    try:
        return [seq for seq, _ in reopened.iter_messages("queue://q")]
    finally:
        reopened.close()


def inline_store(path, bound: float = 1.0):
    """A pipelined store that syncs inline what clients wait for while its syncs average under ``bound``."""
    turns, worker = [], Worker()
    store = RocksStore(path, schedule=turns.append, background=worker, inline_sync_below=bound)
    return store, turns, worker


def test_a_sync_a_client_waits_for_runs_inline_and_releases_in_the_same_turn(path):
    store, turns, worker = inline_store(path)
    answered = []
    store.put_message("queue://q", 1, b"a")
    turns.pop()()  # the turn's flush: written, nobody waits yet
    store.when_durable(lambda: answered.append("receipt"))  # handed over after the flush, as sessions do
    assert answered == ["receipt"] and worker.jobs == [] and store.inline_syncs == 1
    assert 0 < store.sync_seconds < 1.0  # measured
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append("in the batch"))
    turns.pop()()
    assert answered == ["receipt", "in the batch"] and worker.jobs == [] and store.inline_syncs == 2
    assert stored_after_reopening(store, path) == [1, 2]


def test_a_sync_only_bookkeeping_waits_for_goes_to_the_worker_a_turn_later(path):
    store, turns, worker = inline_store(path)
    answered = []
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: answered.append("stream end"), urgent=False)
    turns.pop()()  # the flush: written; the sync waits a turn for a client's wait to come
    assert answered == [] and worker.jobs == [] and len(turns) == 1
    turns.pop()()  # none came: on the worker thread, the reactor goes on meanwhile
    assert answered == [] and len(worker.jobs) == 1
    worker.finish()
    assert answered == ["stream end"] and store.inline_syncs == 0
    store.close()


def test_syncs_nobody_waits_for_keep_a_gap_that_a_clients_wait_does_not(path):
    """A stream's records alone: one sync per gap, however many turns; a receipt: at once."""
    turns, worker, clock = [], Worker(), Clock()
    store = RocksStore(path, schedule=turns.append, background=worker, inline_sync_below=1.0,
                       later=clock.callLater, unwaited_sync_gap=60.0)
    answered = []

    def turn(seq: int, label: str, urgent: bool) -> None:
        store.put_message("queue://q", seq, b"x")
        store.when_durable(lambda: answered.append(label), urgent=urgent)
        while turns:
            turns.pop(0)()

    turn(1, "records 1", urgent=False)
    assert len(worker.jobs) == 1  # no sync before it: no gap to keep
    worker.finish()
    assert answered == ["records 1"]
    turn(2, "records 2", urgent=False)
    turn(3, "records 3", urgent=False)
    assert worker.jobs == [] and answered == ["records 1"]  # within the gap: waiting
    assert [round(call.getTime()) for call in clock.getDelayedCalls()] == [60]
    clock.advance(60)
    assert len(worker.jobs) == 1  # one sync for both turns
    worker.finish()
    assert answered == ["records 1", "records 2", "records 3"]
    turn(4, "records 4", urgent=False)
    assert worker.jobs == [] and len(clock.getDelayedCalls()) == 1
    turn(5, "receipt", urgent=True)  # a client waits: synced now, the records before it too
    assert answered == ["records 1", "records 2", "records 3", "records 4", "receipt"] and store.inline_syncs == 1
    clock.advance(60)  # the gap's timer finds nothing left to sync
    assert worker.jobs == []
    store._last_sync_end -= 60  # a quiet spell as long as the gap: the next record is synced at once
    turn(6, "records 6", urgent=False)
    assert len(worker.jobs) == 1 and clock.getDelayedCalls() == []
    worker.finish()
    assert answered[-1] == "records 6" and stored_after_reopening(store, path) == [1, 2, 3, 4, 5, 6]


def test_a_clients_wait_in_the_same_turn_makes_the_bookkeepings_sync_inline_and_order_holds(path):
    store, turns, worker = inline_store(path)
    answered = []
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: answered.append("stream end"), urgent=False)
    turns.pop()()
    store.when_durable(lambda: answered.append("puback"))
    assert answered == ["stream end", "puback"] and worker.jobs == [] and store.inline_syncs == 1
    turns.pop()()  # the deferred start finds nothing left to sync
    assert worker.jobs == [] and store.inline_syncs == 1
    store.close()


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "on-the-worker"])
def test_callbacks_asking_for_more_while_released_keep_their_order(path, inline):
    store, turns, worker = inline_store(path, bound=1.0 if inline else 0.0)
    answered = []

    def sync() -> None:
        if not inline:
            worker.finish()

    def first():
        answered.append("first")
        store.when_durable(lambda: answered.append("nothing new, asked by first"))
        store.put_message("queue://q", 2, b"b")
        store.when_durable(lambda: answered.append("its own write"))

    store.put_message("queue://q", 1, b"a")
    store.when_durable(first)
    store.when_durable(lambda: answered.append("second"))
    turns.pop()()
    sync()
    assert answered == ["first", "second", "nothing new, asked by first"]
    turns.pop()()  # the write made inside the release: its own batch and sync
    sync()
    assert answered[-1] == "its own write" and worker.jobs == []
    assert store.inline_syncs == (2 if inline else 0)
    store.close()


def test_a_slow_disk_moves_syncs_to_the_worker_and_one_is_tried_inline_again_later(path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(rocks.time, "monotonic", lambda: clock[0])
    store, turns, worker = inline_store(path, bound=1e-9)  # every real sync is "slow" against this
    answered = []
    store.put_message("queue://q", 1, b"a")
    turns.pop()()
    store.when_durable(lambda: answered.append(1))
    assert answered == [1] and store.inline_syncs == 1 and store.sync_seconds > store.inline_sync_below
    store.put_message("queue://q", 2, b"b")
    turns.pop()()
    store.when_durable(lambda: answered.append(2))
    assert answered == [1] and len(worker.jobs) == 1  # too slow: the worker thread now
    worker.finish()
    assert answered == [1, 2]
    clock[0] += INLINE_RETRY_SECONDS
    store.put_message("queue://q", 3, b"c")
    turns.pop()()
    store.inline_sync_below = 1.0  # the disk is fast again
    store.when_durable(lambda: answered.append(3))
    assert answered == [1, 2, 3] and store.inline_syncs == 2 and worker.jobs == []
    assert store.sync_seconds < 1.0  # the retry alone stands for the disk again
    store.close()


def test_inline_syncs_need_a_worker_to_fall_back_to(path):
    # Without a background runner every write syncs itself; the bound changes nothing.
    store = RocksStore(path, inline_sync_below=1.0)
    assert store.inline_sync_below == 0.0
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
    assert stored_after_reopening(store, path) == [1, 2]


def test_a_failed_sync_confirms_nothing_and_an_error_other_than_space_is_never_recovered(path):
    store, worker, answered = one_batch_awaiting_its_sync(path)
    worker.finish(OSError(errno.EIO, "Input/output error"))
    assert answered == []
    assert store.fault is not None and not store.fault.space and "Input/output error" in store.fault.error
    # Writes are still taken (kept, in order), but a later confirmation starts no sync that
    # could succeed and release the lost batch's callbacks (fsync does not report twice).
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append("later"))
    store._scheduled_flush()
    assert answered == [] and worker.jobs == []
    with pytest.raises(StoreUnavailable, match="could not write .*Input/output error"):
        store.flush()
    assert store.recover() is False and answered == []
    store.close()  # says what it could not write; does not raise


def test_after_a_sync_failed_for_space_recover_writes_everything_again_in_order(path):
    store, worker, answered = one_batch_awaiting_its_sync(path)
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append(2))
    store._scheduled_flush()  # written; waits for the next sync
    worker.finish(OSError(errno.ENOSPC, "No space left on device"))
    assert store.fault is not None and store.fault.space and answered == []
    # After the fault nothing more is written (it would land before what must be written
    # again), so a delete of message 1 and a new message 3 wait in order.
    store.delete_message("queue://q", 1)
    store.put_message("queue://q", 3, b"c")
    store.when_durable(lambda: answered.append(3))
    store._scheduled_flush()
    assert store.get_message("queue://q", 3) is None and answered == [] and worker.jobs == []
    assert store.recover() is True
    assert store.fault is None and answered == [1, 2, 3]
    assert [seq for seq, _ in store.iter_messages("queue://q")] == [2, 3]
    store.when_durable(lambda: answered.append("after"))  # healthy again: nothing waits
    assert answered[-1] == "after"
    store.close()
    gc.collect()
    reopened = RocksStore(path)
    assert [(seq, data) for seq, data in reopened.iter_messages("queue://q")] == [(2, b"b"), (3, b"c")]
    reopened.close()


def test_reopen_carries_kept_and_pending_writes_over_and_confirms_them_in_order(path):
    """When RocksDB will not resume (its log writer broken for good), the store is opened
    again: what was kept and what is pending survive the new handles, in order."""
    store, worker, answered = one_batch_awaiting_its_sync(path)
    store.put_record("durable", "sub", b"definition")
    store.when_durable(lambda: answered.append("record"))
    store._scheduled_flush()
    worker.finish(OSError(errno.ENOSPC, "No space left on device"))  # the sync of message 1 fails
    store.delete_message("queue://q", 1)
    store.put_message("queue://q", 2, b"b")
    store.when_durable(lambda: answered.append(2))
    store._scheduled_flush()  # kept, not written
    store.put_message("queue://q", 3, b"c")  # pending: not even flushed when the store reopens
    assert store.fault is not None and answered == []
    assert store.reopen() is True
    assert store.fault is None and answered == [1, "record", 2]
    store.when_durable(lambda: answered.append(3))
    store.flush()
    assert answered == [1, "record", 2, 3]
    assert [(seq, data) for seq, data in store.iter_messages("queue://q")] == [(2, b"b"), (3, b"c")]
    assert store.get_record("durable", "sub") == b"definition"
    store.close()
    gc.collect()
    reopened = RocksStore(path)
    assert [seq for seq, _ in reopened.iter_messages("queue://q")] == [2, 3]
    reopened.close()


@pytest.mark.parametrize("inline_below", [0.0, 1.0], ids=["worker-only", "inline-allowed"])
def test_writes_nobody_waits_for_are_synced_once_their_kept_copies_pass_a_bound(path, inline_below):
    # A batch's operations are kept until a sync covers them (a failed sync writes them
    # again); without receipts no sync would come, and a flood would be kept whole.
    # With inline syncs allowed, that sync still comes (a turn later, on the worker).
    turns, worker = [], Worker()
    store = RocksStore(path, schedule=turns.append, background=worker, inline_sync_below=inline_below)
    body = b"x" * (64 * 1024)
    seq = 0
    while not worker.jobs:
        assert seq * len(body) < 2 * KEEP_SYNC_BYTES, "no sync came for the kept writes"
        store.put_message("queue://q", seq, body)
        while turns:
            turns.pop(0)()
        seq += 1
    assert seq * len(body) >= KEEP_SYNC_BYTES > (seq - 1) * len(body)
    worker.finish()
    assert store._kept_bytes == 0 and not store._kept
    store.close()


def test_a_full_disk_confirms_only_what_is_on_it_and_the_rest_once_space_returns(tmp_path):
    """The data loss of issue 24, at the store: a write that failed had its callback released
    by the next turn's sync (one receipt per lost message).  A real disk fills here."""
    with small_filesystem(tmp_path / "disk", "24m") as disk:
        path = os.path.join(disk, "store")
        turns, worker = [], Worker()
        store = RocksStore(path, schedule=turns.append, background=worker)
        confirmed: list[int] = []
        body = os.urandom(4000)

        def turn() -> None:
            # As the reactor runs a turn: a failing call is logged, and the next turn comes.
            while turns:
                try:
                    turns.pop(0)()
                except Exception:
                    pass
            while worker.jobs:
                worker.finish()

        seq = 0
        while seq < 12_000 and seq - len(confirmed) < 50:  # 48 MB cannot fit: confirmations must stop
            store.put_message("queue://q", seq, body)
            store.when_durable(lambda seq=seq: confirmed.append(seq))
            turn()
            seq += 1
        written = list(confirmed)
        assert written == list(range(len(written))) and len(written) < seq - 1, "the disk never filled"
        # Turns with nothing to write, and a receipt that arrives after them: no sync may release anything now.
        for _ in range(3):
            store.when_durable(lambda: confirmed.append(-1))
            turn()
        assert confirmed == written, f"{len(confirmed) - len(written)} confirmed that are not on the disk"
        assert store.fault is not None and store.fault.space
        resize_filesystem(disk, "200m")
        wait_until(store.recover, 30, lambda: f"the store to recover once the disk has room ({store.fault})", interval=0.25)
        assert confirmed[:len(written)] == written
        assert sorted(s for s in confirmed if s >= 0) == list(range(seq)) and confirmed.count(-1) == 3
        store.close()
        gc.collect()
        reopened = RocksStore(path)
        assert [s for s, data in reopened.iter_messages("queue://q") if data == body] == list(range(seq))
        reopened.close()


def test_close_waits_for_a_sync_on_its_worker_thread(path):
    import threading
    import time

    started, results, worker = threading.Event(), [], []

    def slow_worker(work, done):
        def run():
            store._sync_lock.acquire()
            started.set()
            time.sleep(0.2)  # a slow disk, simulated: close must not pull the database from under the sync
            results.append("sync ended")
            store._sync_lock.release()
            work()  # after close: does nothing
        worker.append(threading.Thread(target=run))
        worker[0].start()

    turns = []
    store = RocksStore(path, schedule=turns.append, background=slow_worker)
    store.put_message("queue://q", 1, b"a")
    store.when_durable(lambda: None)
    turns.pop()()
    started.wait(5)
    store.close()
    results.append("closed")
    worker[0].join(5)  # a close that did not wait: "sync ended" comes after "closed"
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


def test_a_log_writer_broken_for_good_is_mended_by_opening_the_store_again(tmp_path):
    """A sync that was under way when a write failed for want of space leaves RocksDB's log
    writer broken ("Writer has previous error"): RocksDB then never resumes by itself (1 run
    in 3 to 10 of the full-disk system test, compiled).  reopen() recovers it from its log.

    Whether a fill ends that way depends on where the disk runs out (about 2 fills in 3
    here; otherwise the write itself fails and the writer stays whole, which
    ``recover()`` handles, tested above): each attempt is a new fill of a new disk.
    """
    for attempt in range(8):
        with small_filesystem(tmp_path / f"disk{attempt}", "24m") as disk:
            path = os.path.join(disk, "store")
            turns: list = []

            def at_once(work, done):
                try:
                    work()
                except Exception as exc:
                    done(exc)
                else:
                    done(None)

            store = RocksStore(path, schedule=turns.append, background=at_once)
            confirmed: list[int] = []
            body = os.urandom(4000)
            seq = 0
            while store.fault is None:
                store.put_message("queue://q", seq, body)
                store.when_durable(lambda seq=seq: confirmed.append(seq))
                while turns:
                    turns.pop(0)()
                seq += 1
            try:
                store.db.flush_wal(True)  # the sync that was under way on its worker thread
            except Exception as exc:
                assert "Writer has previous error" in str(exc), exc
            else:
                resize_filesystem(disk, "200m")  # this fill left the writer whole: another one
                store.close()
                gc.collect()
                continue
            resize_filesystem(disk, "200m")
            assert store.recover() is False  # RocksDB refuses, and will go on refusing
            assert store.reopen() is True
            assert confirmed == list(range(seq))  # the write that failed was kept and is now on disk too
            store.close()
            gc.collect()
            reopened = RocksStore(path)
            assert [s for s, data in reopened.iter_messages("queue://q") if data == body] == list(range(seq))
            reopened.close()
            return
    pytest.fail("none of 8 fills of a small disk left RocksDB's log writer broken")


def test_reads_leave_recent_writes_in_the_memtable(path):
    # rocksdict flushes a family's memtable into a new SST file when an Rdict of it is
    # dropped: reading through a fresh one per call wrote a small file per read.
    store = RocksStore(path)
    for seq in range(3):
        store.put_message("queue://q", seq, b"m%d" % seq)
        store.put_chunk("s", 0, seq, b"c%d" % seq)
    store.flush()
    for _ in range(5):
        assert [seq for seq, _ in store.iter_messages("queue://q")] == [0, 1, 2]
        assert store.get_message("queue://q", 1) == b"m1"
        assert next(store.iter_chunks("s", 0, 1)) == (1, b"c1")  # a read left unfinished
        assert [base for base, _ in store.iter_chunks("s", 0)] == [0, 1, 2]
        store.usage_bytes()
    gc.collect()
    sizes = store.family_sizes()
    assert sizes["default"][0] == 0 and sizes["stream.s"][0] == 0  # no SST file yet
    assert sizes["default"][1] > 0 and sizes["stream.s"][1] > 0  # all in memtables
    store.close()
    store = RocksStore(path)
    assert [base for base, _ in store.iter_chunks("s", 0)] == [0, 1, 2]
    store.close()
