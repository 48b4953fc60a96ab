"""What operators do to a queue's messages: browse, purge, move, replay dead letters.

These walk a whole queue, which message flow never does, and a queue may
hold millions of messages, most of them paged out to the store
(core/queue.py).  So every walk goes in sequence order and a bounded piece
at a time: a browse page reads from the store only what it shows, and a
purge, move or replay does one chunk per reactor turn, so clients keep being
served while 100,000 dead letters go home.

A chunk starts with the store's batch written and stays well below its
``max_batch``, so its writes are one batch: a moved or replayed message is
added to its target and removed from its queue atomically (the add comes
first in the batch, so even a batch split by something else could only
duplicate, never lose).  An action covers what was ready when it started:
messages that arrive later, and messages in flight to consumers, are left
alone (as ActiveMQ's purge and move leave dispatched messages).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from twisted.logger import Logger

from core.entry import Entry
from core.errors import BrokerError
from core.message import Message
from core.queue import MessageQueue

if TYPE_CHECKING:
    from core.broker import Broker

log = Logger(namespace="gateway.core")

# Where an entry of a walk waits.
MEMORY, STORED, SPILLED = 0, 1, 2
# Messages one chunk acts on at most, and how many it may look at to find them (a rare selector).
CHUNK = 1000
SCAN = 10_000
# Skipped messages an outcome names one by one; beyond that they are only counted.
MAX_SKIPPED_LISTED = 1000


class Matcher(Protocol):
    def matches(self, lookup: Callable[[str], object]) -> bool: ...


class Selection:
    """Which ready messages an action takes: all, these ids, a selector's matches; at most ``limit``."""

    __slots__ = ("ids", "limit", "selector")

    def __init__(self, ids: set[str] | None = None, selector: Matcher | None = None, limit: int | None = None) -> None:
        self.ids = ids
        self.selector = selector
        self.limit = limit

    def wants(self, message: Message) -> bool:
        if self.ids is not None and message.id not in self.ids:
            return False
        return self.selector is None or self.selector.matches(message.lookup)


class Browsed:
    """A message as a browse shows it: its delivery state beside it."""

    __slots__ = ("entry", "in_flight")

    def __init__(self, entry: Entry, in_flight: bool) -> None:
        self.entry = entry
        self.in_flight = in_flight


def _seq_of(item: Browsed) -> int:
    return item.entry.seq


def browse(queue: MessageQueue, start_seq: int, limit: int) -> tuple[list[Browsed], int | None]:
    """A page of the queue in sequence order from ``start_seq``, ready and in-flight messages
    alike, and the sequence number the next page starts at (None: this is the last).

    Memory is looked at in place; paged messages are read from the store,
    at most a page of them, so browsing a deep queue costs what it shows.
    """
    want = limit + 1
    near = [Browsed(e, False) for e in queue.pending if e.seq >= start_seq]
    for consumer in queue.consumers:
        near.extend(Browsed(e, True) for e in consumer.unacked.values() if e.seq >= start_seq)
    near = heapq.nsmallest(want, near, key=_seq_of)
    _flush(queue)
    far = (Browsed(entry, False) for entry, _ in queue.paged_entries(start_seq))
    page = list(itertools.islice(heapq.merge(near, far, key=_seq_of), want))
    following = page[limit].entry.seq if len(page) > limit else None
    return page[:limit], following


def _flush(queue: MessageQueue) -> None:
    """Reads see written batches only (persistence/store.py): write both stores' first."""
    host = queue.host
    host.store.flush()
    if queue.spilled and host.spill is not None:
        host.spill.flush()


def chunk_size(broker: Broker) -> int:
    """Messages per chunk: a move writes up to three operations for one, and a chunk
    must fit in one store batch (RocksStore writes at ``max_batch`` operations)."""
    max_batch = getattr(broker.store, "max_batch", 0)
    if not isinstance(max_batch, int) or max_batch <= 0:
        return CHUNK
    return max(1, min(CHUNK, (max_batch - 64) // 3))


class Walk:
    """One purge, move or replay over a queue's ready messages, a chunk per reactor turn.

    ``check`` may refuse a message with a reason (it stays where it is);
    ``act`` sends the message elsewhere before it leaves the queue (None: a purge).
    ``finished`` is called once, after the last chunk's batch is on disk.
    """

    def __init__(
        self, broker: Broker, queue: MessageQueue, selection: Selection, finished: Callable[[Walk], None],
        act: Callable[[Message], None] | None = None, check: Callable[[Message], str | None] | None = None,
    ) -> None:
        self.broker = broker
        self.queue = queue
        self.selection = selection
        self.act = act
        self.check = check
        self.finished = finished
        self.size = chunk_size(broker)
        self.cursor = 0
        self.bound = 0
        self.matched = 0
        self.done = 0
        self.skipped: list[tuple[str, str]] = []
        self.skipped_count = 0
        self.chunks = 0
        self.error: Exception | None = None

    def start(self) -> None:
        """The first chunk now; the walk covers the messages that exist at this moment."""
        self.bound = self.broker.next_seq()
        self._step()

    def _step(self) -> None:
        try:
            more = self._chunk()
        except Exception as exc:  # noqa: BLE001 - whatever it was, the waiting request must be answered
            log.failure("{queue}: an operator's action stopped part way", queue=self.queue.name)
            self.error = exc
            self.finished(self)
            return
        if more:
            self.broker.clock.callLater(0, self._step)
        else:
            self.broker.when_durable(lambda: self.finished(self))

    def _chunk(self) -> bool:
        """Act on the next chunk; whether there may be more."""
        queue = self.queue
        if queue.storage is not None and self.broker.queues.get(queue.name) is not queue:
            return False  # the queue was deleted meanwhile
        self.chunks += 1
        _flush(queue)  # and this chunk's writes start an empty batch
        low, high = self.cursor, self.bound
        near = sorted((e for e in queue.pending if low <= e.seq < high), key=_entry_seq)
        sources = (
            ((e, MEMORY) for e in near),
            ((e, SPILLED if spilled else STORED) for e, spilled in queue.paged_entries(low)),
        )
        selection = self.selection
        taken: list[tuple[Entry, int]] = []
        more = False
        for examined, (entry, where) in enumerate(heapq.merge(*sources, key=_item_seq)):
            if entry.seq >= high:
                break
            if examined >= SCAN or len(taken) >= self.size:
                more = True
                break
            self.cursor = entry.seq + 1
            if selection.wants(entry.message):
                taken.append((entry, where))
                self.matched += 1
                if selection.limit is not None and self.matched >= selection.limit:
                    break
        self._apply(taken)
        return more

    def _apply(self, taken: list[tuple[Entry, int]]) -> None:
        queue = self.queue
        accepted: list[tuple[Entry, int]] = []
        for entry, where in taken:
            reason = self.check(entry.message) if self.check is not None else None
            if reason is None:
                accepted.append((entry, where))
            else:
                self._skip(entry.message, reason)
        in_memory = {e.seq for e, where in accepted if where == MEMORY}
        if in_memory:
            queue.remove_seqs(in_memory)
        for entry, where in accepted:
            if self.act is not None:
                try:
                    self.act(entry.message)
                except BrokerError as exc:  # its target went away since the check: it stays
                    if where == MEMORY:
                        queue.push_front([entry])
                    self._skip(entry.message, str(exc))
                    continue
            if where == MEMORY:
                queue.settle(entry)
            else:
                queue.remove_paged(entry, spilled=where == SPILLED)
            self.done += 1

    def _skip(self, message: Message, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < MAX_SKIPPED_LISTED:
            self.skipped.append((message.id, reason))


class DeliveryOrderWalk(Walk):
    """A walk that takes messages in the order a consumer is served them, for ``get``.

    ``Walk`` goes in sequence (arrival) order, which is right for purge, move
    and replay (they take all, or a selection, and the order is not seen) but
    made ``gateway consume`` hand out a priority-0 message before the
    priority-9 one a STOMP consumer gets first.  A consumer is served from
    memory, highest priority first and arrival order within one
    (core/queue.py ``Pending``); messages paged out to the store come after,
    in arrival order, as they are paged back in ("priority order holds within
    what is in memory", core/policy.py).  So this walk first takes the
    entries in memory when it starts, in the order ``Pending`` yields them,
    then carries on as a plain walk from the start of the queue, which finds
    the paged ones (and any a consumer gave back meanwhile).  Entries of the
    first part that were left (a selector's non-matches, expired ones) are
    looked at again by the second: wasted reads, not wrong answers, since
    they are refused again.
    """

    def start(self) -> None:
        self.bound = self.broker.next_seq()
        self.head = [entry.seq for entry in self.queue.pending if entry.seq < self.bound]
        self.head_index = 0
        self._step()

    def _chunk(self) -> bool:
        if self.head_index >= len(self.head):
            return super()._chunk()
        queue = self.queue
        if queue.storage is not None and self.broker.queues.get(queue.name) is not queue:
            return False  # the queue was deleted meanwhile
        self.chunks += 1
        _flush(queue)  # this chunk's removals start an empty batch, as Walk's do
        waiting = {entry.seq: entry for entry in queue.pending}  # a consumer may have taken some since the last chunk
        taken: list[tuple[Entry, int]] = []
        examined = 0
        limit = self.selection.limit
        while self.head_index < len(self.head) and examined < SCAN and len(taken) < self.size:
            entry = waiting.get(self.head[self.head_index])
            self.head_index += 1
            if entry is None:
                continue
            examined += 1
            if self.selection.wants(entry.message):
                taken.append((entry, MEMORY))
                self.matched += 1
                if limit is not None and self.matched >= limit:
                    self._apply(taken)
                    return False
        self._apply(taken)
        return True


def _entry_seq(entry: Entry) -> int:
    return entry.seq


def _item_seq(item: tuple[Entry, int]) -> int:
    return item[0].seq


def purge(broker: Broker, queue: MessageQueue, finished: Callable[[Walk], None]) -> Walk:
    """Remove the queue's ready messages from memory and store (not those in flight, as ActiveMQ)."""
    walk = Walk(broker, queue, Selection(), finished)
    walk.start()
    return walk


def move(
    broker: Broker, queue: MessageQueue, target: str, selection: Selection, finished: Callable[[Walk], None],
) -> Walk:
    """Move selected ready messages to another queue, each keeping its id, headers and persistence.

    The target is checked as a producer's would be (no ``queue://a.*``), before any message moves.
    """
    broker.check_destination(target)

    def act(message: Message) -> None:
        broker.reroute(message.copy(destination=target), append=True)

    walk = Walk(broker, queue, selection, finished, act=act)
    walk.start()
    return walk


def replay(
    broker: Broker, queue: MessageQueue, selection: Selection, allowed: Callable[[str], bool],
    finished: Callable[[Walk], None],
) -> Walk:
    """Send dead letters back to where they failed, as new deliveries (redelivery count 0).

    The destination is the ``originalDestination`` header the broker wrote
    (core/broker.py ``dead_letter``); it and ``dlqDeliveryFailureCause`` are
    taken off.  A message without one, or to a destination ``allowed``
    refuses, stays in the DLQ with the reason.  A topic's dead letter goes to
    the topic, so every subscription matching now gets it (ActiveMQ's retry).
    """
    from core.broker import DEAD_LETTER_CAUSE, ORIGINAL_DESTINATION

    def check(message: Message) -> str | None:
        original = message.headers.get(ORIGINAL_DESTINATION)
        if not original:
            return f"no {ORIGINAL_DESTINATION} header: not a dead letter of this broker"
        if not original.startswith(("queue://", "topic://", "temp-queue://")):
            return f"{ORIGINAL_DESTINATION} {original!r} is not a queue or topic"
        try:
            broker.check_destination(original)
        except BrokerError as exc:
            return f"{ORIGINAL_DESTINATION} {original}: {exc}"
        if broker.is_dead_letter_queue(original):
            return f"{ORIGINAL_DESTINATION} {original} is a dead-letter queue"
        if original.startswith("temp-queue://") and broker.temp_queue_owner(original) is None:
            return f"temporary queue {original} is gone (its connection closed)"
        if not allowed(original):
            return f"not allowed: replaying to {original} needs admin on it"
        return None

    def act(message: Message) -> None:
        headers = {k: v for k, v in message.headers.items() if k not in (ORIGINAL_DESTINATION, DEAD_LETTER_CAUSE)}
        broker.reroute(message.copy(destination=message.headers[ORIGINAL_DESTINATION], headers=headers))

    walk = Walk(broker, queue, selection, finished, act=act, check=check)
    walk.start()
    return walk
