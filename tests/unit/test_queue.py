"""core/queue.py: a deep queue pages back in a page at a time, and operators walk it lazily.

These hold on both paths; they were written for the compiled one, where a generator
expression with a tuple target once read the whole paged backlog at each page-in.
"""
from __future__ import annotations

from twisted.internet.task import Clock

from core.broker import Broker
from core.entry import Entry
from core.message import Message
from core.policy import Policy
from persistence.memory import MemoryStore

DEPTH = 5_000
LIMIT = 64 * 1024  # bytes of a queue kept in memory: most of DEPTH pages out


class CountingStore(MemoryStore):
    """Counts the messages read back, as a deep queue's page-ins and walks do."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    def iter_messages(self, destination, start_seq=0):
        for item in super().iter_messages(destination, start_seq):
            self.read += 1
            yield item


def deep_queue(name: str = "queue://deep"):
    store = CountingStore()
    broker = Broker(store, Clock(), Policy(queue_memory_limit=LIMIT))
    broker.start()
    queue = broker.queue(name)
    for i in range(DEPTH):
        message = Message(broker.new_message_id(), name, b"%05d" % i + b"." * 59, {}, persistent=True)
        queue.enqueue(Entry(message, broker.next_seq()))
    store.flush()
    assert queue.paged > DEPTH // 2
    return broker, store, queue


def test_paged_entries_are_read_as_they_are_asked_for():
    _, store, queue = deep_queue()
    walk = queue.paged_entries(0)
    first = [next(walk) for _ in range(3)]
    assert [entry.message.body[:5] for entry, _ in first] == [b"%05d" % (DEPTH - queue.paged + i) for i in range(3)]
    assert all(spilled is False and entry.stored for entry, spilled in first)
    assert store.read <= 3


def test_a_page_in_reads_about_what_fits_not_the_whole_backlog():
    _, store, queue = deep_queue()
    paged = queue.paged
    queue.pending.clear()  # memory drained (as if consumed): the next page-in refills it
    store.read = 0
    queue._page_in()
    loaded = len(queue.pending)
    assert 0 < loaded < paged
    assert store.read <= loaded + 1, (store.read, loaded, paged)  # one read ahead at most, not the whole backlog
    assert queue.paged == paged - loaded
