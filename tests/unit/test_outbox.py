"""The outbox: frames of one turn gathered into one write, never ahead of the store's sync."""
from __future__ import annotations

from core.turn import TurnEnd
from protocols.outbox import HAND_OVER_BYTES, HOLD_BYTES, Outbox


class Store:
    """when_durable as the RocksStore keeps it: at once when nothing waits, else after flush();
    and the connection's hold on its consumers, as the outbox sets it."""

    def __init__(self) -> None:
        self.dirty = False
        self.waiting: list = []
        self.held = False

    def hold_output(self) -> None:
        self.held = True

    def release_output(self) -> None:
        self.held = False

    def when_durable(self, callback) -> None:
        if not self.dirty and not self.waiting:
            callback()
        else:
            self.waiting.append(callback)

    def flush(self) -> None:
        self.dirty = False
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback()


class Writes:
    """The session's side: what the outbox wrote, in order."""

    def __init__(self, writes: list[bytes]) -> None:
        self.writes = writes

    def write_out(self, data: bytes) -> None:
        self.writes.append(data)


def setup():
    deferred: list = []
    store = Store()
    writes: list[bytes] = []
    return deferred, store, writes, Outbox(TurnEnd(deferred.append), store, Writes(writes))


def test_one_write_per_turn_in_order():
    deferred, _, writes, box = setup()
    for frame in (b"a", b"b", b"c"):
        box.add(frame)
    assert writes == []
    deferred.pop()()
    assert writes == [b"abc"]


def test_nothing_goes_out_before_the_batch_is_synced():
    deferred, store, writes, box = setup()
    store.dirty = True  # this turn wrote to the store
    box.add(b"receipt")
    deferred.pop()()
    assert writes == []
    box.add(b"next turn")
    deferred.pop()()
    assert writes == []
    store.flush()
    assert writes == [b"receipt", b"next turn"]


def test_a_large_turn_is_handed_over_as_it_grows():
    """Back-pressure: a consumer draining a deep queue meets the transport's buffer limit."""
    deferred, _, writes, box = setup()
    frame = b"x" * 1000
    for _ in range(HAND_OVER_BYTES // 1000 + 1):
        box.add(frame)
    assert len(writes) == 1 and len(writes[0]) >= HAND_OVER_BYTES
    box.add(b"tail")
    for run in deferred:
        run()
    assert writes[-1] == b"tail"
    assert sum(map(len, writes)) == (HAND_OVER_BYTES // 1000 + 1) * 1000 + 4


def test_submit_hands_over_at_once_before_an_error_frame():
    deferred, _, writes, box = setup()
    box.add(b"MESSAGE")
    box.submit()
    writes.append(b"ERROR")
    for run in deferred:
        run()  # the turn's own call finds nothing left
    assert writes == [b"MESSAGE", b"ERROR"]


def test_unstored_deliveries_do_not_wait_for_a_sync_they_do_not_need():
    """A topic's message to a non-durable subscriber goes out while other clients' fsync runs."""
    deferred, store, writes, box = setup()
    store.dirty = True  # someone else's batch (or the stream's records) awaits its fsync
    box.add(b"m1", durable=False)
    box.add(b"m2", durable=False)
    deferred.pop()()
    assert writes == [b"m1m2"]


def test_an_unstored_delivery_never_overtakes_what_waits_for_the_disk():
    deferred, store, writes, box = setup()
    store.dirty = True
    box.add(b"puback")                    # must wait for the sync
    box.add(b"m1", durable=False)         # gathered with it: waits with it
    deferred.pop()()
    box.add(b"m2", durable=False)         # a later turn: still behind the PUBACK
    deferred.pop()()
    assert writes == []
    store.flush()
    assert writes == [b"pubackm1", b"m2"]
    box.add(b"m3", durable=False)         # nothing waits any more: at once
    store.dirty = True
    deferred.pop()()
    assert writes == [b"pubackm1", b"m2", b"m3"]


def test_deliveries_stop_while_a_bound_of_bytes_waits_for_the_disk():
    """Twisted pauses a session only for bytes it was given: what waits for the sync is bounded here."""
    deferred, store, writes, box = setup()
    store.dirty = True
    frame = b"x" * 1000
    sent = 0
    while not store.held:
        box.add(frame)
        sent += len(frame)
    # Held at the hand-over that crossed the mark: nothing of it written yet.
    assert writes == [] and HOLD_BYTES <= sent < HOLD_BYTES + HAND_OVER_BYTES + len(frame)
    store.flush()
    assert sum(map(len, writes)) == sent
    assert store.held  # given back at the turn's end, not inside the store's release
    deferred.pop()()
    assert not store.held


def test_the_hold_stays_while_the_bytes_are_still_waiting():
    deferred, store, writes, box = setup()
    store.dirty = True
    box.add(b"x" * HOLD_BYTES)
    assert store.held
    box.add(b"receipt")
    deferred.pop()()                  # the turn's hand-over: still nothing synced
    assert store.held
    store.flush()
    deferred.pop()()
    assert not store.held and sum(map(len, writes)) == HOLD_BYTES + len(b"receipt")
