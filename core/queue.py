"""A queue of entries and the dispatch of them to consumers.

The same class serves queues, temporary queues and topic subscriptions
(a subscription is a queue with one consumer, a shared or durable one a queue
that outlives or is shared by its consumers), so acks, prefetch, redelivery,
expiry and groups behave the same everywhere.

Dispatch has two paths.  The common one (no selectors, no message groups)
pops the head and hands it to the next consumer with credit, round robin: O(1)
per message.  When selectors or groups are in play a pass looks through at
most ``max_page_size`` pending entries for ones some consumer can take,
leaving the rest in place and in order (ActiveMQ's page-in window).
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from core.consumer import Consumer
from core.entry import Entry
from core.message import Message, decode_message
from core.policy import Policy
from core.storage import entry_record
from persistence.store import Store, StoreUnavailable

PRIORITIES = 10
# What an entry costs in memory beyond its body (the Entry, Message and dicts), roughly.
ENTRY_OVERHEAD = 400


def cost(entry: Entry) -> int:
    return len(entry.message.body) + ENTRY_OVERHEAD


# Readers of paged messages.  Generator functions, not generator expressions: compiled
# (mypyc), a generator expression whose target is a tuple (`for seq, data in ...`) reads
# its whole source at once, which made every page-in read the entire paged backlog.
def _decoded(pairs: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, Message]]:
    for seq, data in pairs:
        yield seq, decode_message(data)


def _tagged(pairs: Iterator[tuple[int, Message]], stored: bool) -> Iterator[tuple[int, Message, bool]]:
    for seq, message in pairs:
        yield seq, message, stored


def _entries(pairs: Iterator[tuple[int, Message]], mark: int, spilled: bool) -> Iterator[tuple[Entry, bool]]:
    """(entry, spilled); a stored entry at or below the delivered mark was delivered before a restart."""
    for seq, message in pairs:
        if spilled:
            yield Entry(message, seq), True
        else:
            yield Entry(message, seq, redeliveries=1 if seq <= mark else 0, stored=True), False


class Storage(Protocol):
    """Where a queue keeps its persistent entries (queue range, or durable refs)."""

    key: str
    store: Store

    def add(self, entry: Entry) -> None: ...

    def remove(self, entry: Entry) -> None: ...

    def page(self, start_seq: int) -> Iterator[tuple[int, Message]]: ...


class Host(Protocol):
    """What a queue needs from its broker."""

    policy: Policy
    spill: Store | None  # where non-persistent messages beyond memory wait, if anywhere
    store: Store
    memory: "MemoryUsage"

    def delivered(self, queue: "MessageQueue", seq: int) -> None: ...

    def now_ms(self) -> int: ...

    def expired(self, queue: "MessageQueue", entry: Entry) -> None: ...


# A queue with a refill source asks for more below this many pending entries.
REFILL_BELOW = 128

# A queue with nothing in memory may always page this much back in, whatever the
# broker-wide usage, so its consumers never starve behind other queues' backlogs.
PAGE_FLOOR = 256 * 1024


class MemoryUsage:
    """Bytes of pending messages all queues hold in memory, against the broker-wide limit.

    The per-queue limit bounds one deep queue; this bounds a flood spread over
    many (ActiveMQ's systemUsage memoryUsage).  Over it, every pageable queue
    pages new arrivals (persistent ones stay in the store, others spill).
    """

    __slots__ = ("bytes", "limit")

    def __init__(self, limit: int = 0) -> None:
        self.bytes = 0
        self.limit = limit

    @property
    def over(self) -> bool:
        return self.limit > 0 and self.bytes >= self.limit


class Pending:
    """Entries waiting for a consumer: a deque per priority, highest served first."""

    __slots__ = ("levels", "size", "bytes", "usage")

    def __init__(self, usage: MemoryUsage | None = None) -> None:
        self.usage = usage if usage is not None else MemoryUsage()
        # A deque is ~760 bytes even when empty and most queues only ever see one
        # priority (an idle MQTT client has a queue of its own): levels start as
        # None and get a deque on first use.
        self.levels: list[deque[Entry] | None] = [None] * PRIORITIES
        self.size = 0
        self.bytes = 0  # what the entries cost in memory, for the queue's memory limit

    def append(self, entry: Entry) -> None:
        p = entry.message.priority
        level = self.levels[p]
        if level is None:
            level = self.levels[p] = deque()
        level.append(entry)
        self.size += 1
        c = cost(entry)
        self.bytes += c
        self.usage.bytes += c

    def push_front(self, entries: list[Entry]) -> None:
        """Put entries back ahead of everything of their priority, keeping their order."""
        levels = self.levels
        for entry in reversed(entries):
            p = entry.message.priority
            level = levels[p]
            if level is None:
                level = levels[p] = deque()
            level.appendleft(entry)
            c = cost(entry)
            self.bytes += c
            self.usage.bytes += c
        self.size += len(entries)

    def taken(self, entry: Entry) -> None:
        """Account for an entry removed from a level directly."""
        self.size -= 1
        c = cost(entry)
        self.bytes -= c
        self.usage.bytes -= c

    def popleft(self) -> Entry:
        levels = self.levels
        for p in range(PRIORITIES - 1, -1, -1):
            level = levels[p]
            if level:
                entry = level.popleft()
                self.taken(entry)
                return entry
        raise IndexError("pop from empty Pending")

    def __iter__(self) -> Iterator[Entry]:
        for p in range(PRIORITIES - 1, -1, -1):
            level = self.levels[p]
            if level:
                yield from level

    def __len__(self) -> int:
        return self.size

    def clear(self) -> list[Entry]:
        out = list(self)
        self.levels = [None] * PRIORITIES
        self.size = 0
        self.usage.bytes -= self.bytes
        self.bytes = 0
        return out


class MessageQueue:
    # One per queue and per clean MQTT session: slots keep an idle one small (a dict of 24 attributes is 1 KB).
    __slots__ = (
        "name", "host", "storage", "pending", "consumers", "groups", "enqueued", "dequeued", "expired",
        "dead_lettered", "max_redeliveries", "delivered_mark", "memory_limit", "paged", "spilled", "page_from",
        "_rr", "_selectors", "_exclusives", "_remotes", "_uses_groups", "_may_expire", "_busy", "_again", "refill",
    )

    def __init__(
        self, name: str, host: Host, storage: Storage | None = None, *, max_redeliveries: int | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.storage = storage
        self.pending = Pending(host.memory)
        self.consumers: list[Consumer] = []
        self.groups: dict[str, Consumer] = {}
        self.enqueued = 0
        self.dequeued = 0
        # Of the dequeued: entries that expired here, and that the broker gave up on (dead
        # letters, expired ones moved to the DLQ included); counted by the broker, off the hot path.
        self.expired = 0
        self.dead_lettered = 0
        # Overrides the policy's max_redeliveries for this queue (-1: never dead-letter);
        # MQTT session queues use it, since a reconnect is not a failed delivery there.
        self.max_redeliveries = max_redeliveries
        # Highest stored seq ever handed to a consumer: after a crash, entries up to
        # it may have been seen and come back flagged redelivered (JMS's hint).
        self.delivered_mark = 0
        # Paging: entries beyond the memory limit live only in the store, from
        # page_from on (every stored entry after it is paged too, keeping FIFO).
        pageable = getattr(storage, "pageable", False) or host.spill is not None
        self.memory_limit = host.policy.queue_memory_limit if pageable else 0
        self.paged = 0
        self.spilled = 0  # how many of the paged entries are in the spill store
        self.page_from = 0
        self._rr = 0
        self._selectors = 0
        self._exclusives = 0
        self._remotes = 0  # consumers for other brokers of the network (they always filter: _selectors too)
        self._uses_groups = False
        self._may_expire = False
        self._busy = False
        self._again = False
        # Called after a dispatch pass leaves fewer than REFILL_BELOW pending (a stream feed tops it up).
        self.refill: Callable[[], None] | None = None

    # -- state ----------------------------------------------------------

    def __len__(self) -> int:
        return self.pending.size + self.paged

    @property
    def inflight(self) -> int:
        return sum(c.held() for c in self.consumers)

    def messages(self) -> list[Entry]:
        """Pending entries in the order they would be delivered (for browsing)."""
        return list(self.pending)

    # -- producers ------------------------------------------------------

    def enqueue(self, entry: Entry) -> None:
        message = entry.message
        if self.storage is not None and message.persistent and not entry.stored:
            self.storage.add(entry)
            entry.stored = True
        self.enqueued += 1
        if (
            self.consumers and not self.pending.size and not self.paged and not self._busy
            and not (self._selectors or self._exclusives or self._uses_groups)
            and message.group_id is None and not message.expiration
        ):
            # Nothing waits ahead of it and no rule applies: straight to the next
            # consumer with credit, without a trip through the pending deques.
            consumer = self._next_with_credit(self.consumers, entry)
            if consumer is not None:
                consumer.deliver(entry)
                return
        if self.memory_limit and self._page_out(entry):
            # Over the memory limit: it waits in the store until consumers catch up.
            return
        self.pending.append(entry)
        if message.group_id is not None:
            self._uses_groups = True
        if message.expiration:
            self._may_expire = True
        if self.consumers:
            self.dispatch()

    def restore(self, entry: Entry) -> None:
        """Add an entry recovered from the store (already stored, not counted again)."""
        entry.stored = True
        if self.over_memory():
            self.restore_paged(entry.seq)
            return
        self.pending.append(entry)
        if entry.message.group_id is not None:
            self._uses_groups = True
        if entry.message.expiration:
            self._may_expire = True

    def restore_mark(self, mark: int) -> None:
        """The delivered mark found in the store at recovery (the highest one wins)."""
        self.delivered_mark = max(self.delivered_mark, mark)

    def restore_paged(self, seq: int) -> None:
        """Count a stored entry left in the store at recovery (beyond the memory limit)."""
        if not self.paged:
            self.page_from = seq
        self.paged += 1

    def over_memory(self) -> bool:
        return bool(self.paged or (self.memory_limit and (
            self.pending.bytes >= self.memory_limit or self.pending.usage.over
        )))

    def _page_out(self, entry: Entry) -> bool:
        """Leave an arriving entry outside memory when the queue is over its limit.

        A stored entry stays where it is; a non-persistent one goes to the
        spill store.  Once paging starts every later entry is paged too, so
        the queue's order holds.
        """
        if not self.over_memory():
            return False
        if not entry.stored:
            spill = self.host.spill
            if spill is None:
                return False
            spill.put_message(self.name, entry.seq, entry_record(entry))
            self.spilled += 1
        if not self.paged:
            self.page_from = entry.seq
        self.paged += 1
        return True

    def _page_in(self) -> bool:
        """Bring paged entries back, oldest first, up to the memory limit: from the
        store and the spill store, merged by sequence.  False when a store cannot
        write its pending batch (a full disk): the paged entries may be in it, so
        they wait in place until the broker calls ``dispatch`` again on recovery."""
        sources: list[Iterator[tuple[int, Message, bool]]] = []
        # Reads see only written batches, and frames waiting for the store's sync
        # reach the socket: a consumer that cannot keep up is paused before more
        # is loaded for it (otherwise its backlog would move into its outbox).
        spill = self.host.spill
        try:
            self.host.store.flush()
            if self.spilled and spill is not None:
                spill.flush()
        except StoreUnavailable:
            return False
        if self.storage is not None:
            sources.append(_tagged(self.storage.page(self.page_from), True))
        if self.spilled and spill is not None:
            sources.append(_tagged(_decoded(spill.iter_messages(self.name, self.page_from)), False))
        budget = self.memory_limit - self.pending.bytes
        usage = self.pending.usage
        if usage.limit:
            budget = min(budget, usage.limit - usage.bytes)
        if not self.pending.size:
            budget = max(budget, min(PAGE_FLOOR, self.memory_limit))
        mark = self.delivered_mark
        loaded = 0
        exhausted = True
        for seq, message, stored in heapq.merge(*sources, key=lambda item: item[0]):
            if budget <= 0:
                self.page_from = seq
                exhausted = False
                break
            entry = Entry(message, seq, redeliveries=1 if stored and seq <= mark else 0, stored=stored)
            if not stored and spill is not None:  # not stored: it came from the spill store
                spill.delete_message(self.name, seq)
                self.spilled -= 1
            self.pending.append(entry)
            if message.group_id is not None:
                self._uses_groups = True
            if message.expiration:
                self._may_expire = True
            budget -= cost(entry)
            loaded += 1
        self.paged = 0 if exhausted else max(0, self.paged - loaded)
        if exhausted:
            self.spilled = 0
        return True

    def push_front(self, entries: list[Entry]) -> None:
        """Return entries for redelivery, ahead of newer ones, in their original order."""
        if not entries:
            return
        self.pending.push_front(entries)
        for entry in entries:
            if entry.message.group_id is not None:
                self._uses_groups = True
            if entry.message.expiration:
                self._may_expire = True
        self.dispatch()

    def refilled(self, entries: Iterable[Entry]) -> None:
        """Entries a refill source (a stream feed) adds behind the pending ones; not dispatched yet."""
        append = self.pending.append
        for entry in entries:
            append(entry)

    def refill_from(self, refill: Callable[[], None]) -> None:
        """Call ``refill`` whenever a dispatch pass leaves fewer than REFILL_BELOW pending."""
        self.refill = refill

    def note_delivered(self, entry: Entry) -> None:
        """A stored entry goes out: raise the delivered mark, which the broker writes with the batch."""
        seq = entry.seq
        if seq > self.delivered_mark:
            self.delivered_mark = seq
            self.host.delivered(self, seq)

    def settle(self, entry: Entry) -> None:
        """An entry is done with (acked, dead-lettered, expired): drop it from the store."""
        if entry.stored and self.storage is not None:
            self.storage.remove(entry)
            entry.stored = False
        self.dequeued += 1

    # -- consumers ------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        if consumer.selector is not None:
            self._selectors += 1
        if consumer.exclusive:
            self._exclusives += 1
        if consumer.remote:
            self._remotes += 1
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> list[Entry]:
        """Detach a consumer; returns its unacked entries, oldest first, for redelivery."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if consumer.selector is not None:
                self._selectors -= 1
            if consumer.exclusive:
                self._exclusives -= 1
            if consumer.remote:
                self._remotes -= 1
        groups, unacked = consumer.detach()
        for group in groups:
            if self.groups.get(group) is consumer:
                del self.groups[group]
        return unacked

    def active_consumers(self) -> list[Consumer]:
        """Who may receive now: the first exclusive consumer alone if there is one; consumers
        here before other brokers' while any of them has credit."""
        if self._exclusives:
            for consumer in self.consumers:
                if consumer.exclusive:
                    return [consumer]
        if self._remotes:
            local = [c for c in self.consumers if not c.remote]
            if any(c.has_credit() for c in local):
                return local
        return self.consumers

    # -- dispatch -------------------------------------------------------

    def dispatch(self) -> None:
        if self._busy:
            # A delivery led back here (an ack, a redelivery): finish in the outer pass.
            self._again = True
            return
        if not self.consumers or not (self.pending.size or self.paged):
            if self.refill is not None and self.consumers:
                self.refill()
            return
        self._busy = True
        try:
            again = True
            readable = True
            while again:
                self._again = False
                if self.paged and self.pending.bytes < self.memory_limit // 2:
                    readable = self._page_in()
                targets = self.active_consumers()
                if self._selectors or self._uses_groups:
                    self._dispatch_scan(targets)
                else:
                    self._dispatch_simple(targets)
                again = (self._again and self.pending.size > 0) or bool(
                    # Memory drained while the store still holds more: page in and go on.
                    readable and self.paged and self.pending.bytes < self.memory_limit // 2
                    and any(c.has_credit() for c in targets)
                )
        finally:
            self._busy = False
        if self.refill is not None and self.pending.size < REFILL_BELOW:
            self.refill()

    def _dispatch_simple(self, targets: list[Consumer]) -> None:
        pending = self.pending
        host = self.host
        n = len(targets)
        now = host.now_ms() if self._may_expire else 0
        misses = 0
        while pending.size and misses < n:
            consumer = targets[self._rr % n]
            self._rr += 1
            if not consumer.has_credit():
                misses += 1
                continue
            misses = 0
            entry = pending.popleft()
            expiration = entry.message.expiration
            if expiration and expiration <= now:
                host.expired(self, entry)
                continue
            consumer.deliver(entry)
            if len(targets) != n:  # a delivery closed a consumer (e.g. its socket failed)
                return

    def _next_with_credit(self, targets: list[Consumer], entry: Entry) -> Consumer | None:
        n = len(targets)
        for _ in range(n):
            consumer = targets[self._rr % n]
            self._rr += 1
            if consumer.has_credit() and consumer.accepts(entry):
                return consumer
        return None

    def _choose(self, targets: list[Consumer], entry: Entry) -> Consumer | None:
        group = entry.message.group_id
        if group is None:
            return self._next_with_credit(targets, entry)
        owner = self.groups.get(group)
        if owner is not None:
            if owner in targets and owner.has_credit() and owner.accepts(entry):
                return owner
            if owner in targets:
                return None  # the group waits for its owner, in order
            # The owner is a standby now (an exclusive consumer arrived): regroup.
            del self.groups[group]
            owner.release_group(group)
        consumer = self._next_with_credit(targets, entry)
        if consumer is not None and entry.message.group_seq != -1:
            self.groups[group] = consumer
            consumer.own_group(group)
        return consumer

    def _dispatch_scan(self, targets: list[Consumer]) -> None:
        host = self.host
        budget = host.policy.max_page_size
        now = host.now_ms() if self._may_expire else 0
        pending = self.pending
        for p in range(PRIORITIES - 1, -1, -1):
            level = pending.levels[p]
            if not level:
                continue
            kept: list[Entry] = []
            while level and budget > 0:
                if not any(c.has_credit() for c in targets):
                    budget = 0
                    break
                entry = level.popleft()
                budget -= 1
                message = entry.message
                if message.expiration and message.expiration <= now:
                    pending.taken(entry)
                    host.expired(self, entry)
                    continue
                consumer = self._choose(targets, entry)
                if consumer is None:
                    kept.append(entry)
                    continue
                pending.taken(entry)
                if message.group_seq == -1 and message.group_id is not None:
                    # The last message of a group closes it: the next one starts afresh.
                    owner = self.groups.pop(message.group_id, None)
                    if owner is not None:
                        owner.release_group(message.group_id)
                consumer.deliver(entry)
            level.extendleft(reversed(kept))
            if budget <= 0:
                break
        if not pending.size and not self.groups:
            self._uses_groups = False

    # -- housekeeping ---------------------------------------------------

    def sweep_expired(self, now_ms: int) -> int:
        """Move expired entries out even when no consumer is asking (idle queues)."""
        if not self._may_expire:
            return 0
        expired = 0
        still_expiring = False
        for level in self.pending.levels:
            if not level:
                continue
            kept: deque[Entry] = deque()
            for entry in level:
                expiration = entry.message.expiration
                if expiration and expiration <= now_ms:
                    expired += 1
                    self.pending.taken(entry)
                    self.host.expired(self, entry)
                else:
                    if expiration:
                        still_expiring = True
                    kept.append(entry)
            level.clear()
            level.extend(kept)
        self._may_expire = still_expiring
        return expired

    def remove_seqs(self, seqs: set[int]) -> list[Entry]:
        """Take pending entries out by sequence (rare: MQTT flows finished before a restart)."""
        removed: list[Entry] = []
        for level in self.pending.levels:
            if not level:
                continue
            kept = [e for e in level if e.seq not in seqs]
            if len(kept) != len(level):
                removed.extend(e for e in level if e.seq in seqs)
                level.clear()
                level.extend(kept)
        for entry in removed:
            self.pending.taken(entry)
        return removed

    def paged_entries(self, start_seq: int = 0) -> Iterator[tuple[Entry, bool]]:
        """Entries beyond memory (store and spill store), from ``start_seq`` on, in sequence
        order, read one by one: (entry, whether it waits in the spill store).

        For operators (browse, purge, move): a deep queue is looked at a page at
        a time, never loaded.  Reads see written batches only: flush both stores first.
        """
        if not self.paged:
            return
        start = max(start_seq, self.page_from)
        mark = self.delivered_mark
        sources: list[Iterator[tuple[Entry, bool]]] = []
        if self.storage is not None:
            sources.append(_entries(self.storage.page(start), mark, False))
        spill = self.host.spill
        if self.spilled and spill is not None:
            sources.append(_entries(_decoded(spill.iter_messages(self.name, start)), 0, True))
        yield from heapq.merge(*sources, key=lambda item: item[0].seq)

    def remove_paged(self, entry: Entry, spilled: bool) -> None:
        """Drop an entry that waits beyond memory (from ``paged_entries``): an operator's purge or move."""
        if spilled:
            spill = self.host.spill
            if spill is not None:
                spill.delete_message(self.name, entry.seq)
            self.spilled = max(0, self.spilled - 1)
            self.dequeued += 1
        else:
            self.settle(entry)
        self.paged = max(0, self.paged - 1)
        if not self.paged:
            self.spilled = 0

    def purge(self) -> int:
        entries = self.pending.clear()
        for entry in entries:
            self.settle(entry)
        purged = len(entries)
        if self.paged:
            if self.storage is not None:
                self.storage.store.flush()
                for seq, message in list(self.storage.page(self.page_from)):
                    self.settle(Entry(message, seq, stored=True))
                    purged += 1
            spill = self.host.spill
            if self.spilled and spill is not None:
                spill.flush()
                for seq, _ in list(spill.iter_messages(self.name, self.page_from)):
                    spill.delete_message(self.name, seq)
                    purged += 1
            self.paged = self.spilled = 0
        return purged

    def __repr__(self) -> str:
        return f"<MessageQueue {self.name} pending={self.pending.size} consumers={len(self.consumers)}>"
