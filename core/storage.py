"""How queues and durable subscriptions lay out their persistent entries in a Store.

A queue's messages are its own range (destination, seq).  A message on a
topic is stored once, under the topic, however many durable subscribers hold
it; each subscriber keeps a small reference record, and the message is
deleted when the last reference goes (one copy, a position per subscriber).
"""
from __future__ import annotations

from typing import Callable, Iterator

from core.entry import Entry
from core.message import Message, decode_message, encode_message
from core.via import ViaMarker
from persistence.store import Store

DURABLE_KIND = "durable"          # key: durable key -> subscription definition (JSON)
DURABLE_REF_KIND = "durable-ref"  # key: durable key \0 seq -> topic destination
SCHEDULED_KIND = "scheduled"      # key: due ms : seq -> encoded message
RETAINED_KIND = "retained"        # key: topic name -> encoded message
DELIVERED_KIND = "delivered"      # key: storage key -> highest seq ever delivered (8 bytes)
STATE_KIND = "state"              # key: protocol state name -> opaque bytes (MQTT sessions)
META_KIND = "broker"              # key "seq": the first sequence number not yet reserved


def seq_key(seq: int) -> str:
    return f"{seq:020d}"


# Bytes a stored message counts for beyond its body (key, headers, record framing).
RECORD_OVERHEAD = 64


def stored_size(entry: Entry) -> int:
    return len(entry.message.body) + RECORD_OVERHEAD


class StoreUsage:
    """Bytes of messages the core keeps in the store, against the store limit, and the store's alarm.

    Counted by the core as it writes and deletes, so it is exact and O(1) to
    read, unlike a database's size figures that lag behind its compactions.
    ``alarm`` says why the store should take nothing more whatever the bytes:
    the disk's free space under its floor, or writes that failed (set by the
    gateway, which watches the disk).  Producers held back while ``full`` wait
    in ``when_space`` and are resumed once there is no alarm and consumers
    have brought usage under 90% of the limit.
    """

    __slots__ = ("bytes", "limit", "waiters", "alarm", "alarm_title", "disk_free", "disk_free_limit", "faulted", "faults")

    def __init__(self, limit: int = 0) -> None:
        self.bytes = 0
        self.limit = limit
        self.waiters: list[Callable[[], None]] = []
        self.alarm: str | None = None
        self.alarm_title = ""
        # What the gateway last read of the disk (-1: not watched) and the floor, for
        # /metrics and $SYS; whether the store is in a fault now, and how many it had.
        self.disk_free = -1
        self.disk_free_limit = 0
        self.faulted = False
        self.faults = 0

    @property
    def full(self) -> bool:
        return self.alarm is not None or (self.limit > 0 and self.bytes >= self.limit)

    def refusal(self) -> tuple[str, str]:
        """What a refused producer is told: a short title and the reason, naming the free space where that is why."""
        if self.alarm is not None:
            return self.alarm_title, self.alarm
        return "Store limit reached", "the broker's store is full (store_limit); retry once consumers have caught up"

    def set_alarm(self, title: str, reason: str | None) -> None:
        """Raise (``reason``) or clear (None) the alarm; clearing resumes held producers if there is room."""
        self.alarm_title = title if reason is not None else ""
        self.alarm = reason
        if reason is None:
            self._resume()

    def add(self, n: int) -> None:
        self.bytes += n

    def sub(self, n: int) -> None:
        self.bytes = max(0, self.bytes - n)
        if self.waiters:
            self._resume()

    def _resume(self) -> None:
        if self.waiters and self.alarm is None and (self.limit <= 0 or self.bytes < self.limit * 0.9):
            waiters, self.waiters = self.waiters, []
            for resume in waiters:
                resume()

    def when_space(self, resume: Callable[[], None]) -> None:
        if self.full:
            self.waiters.append(resume)
        else:
            resume()


def entry_record(entry: Entry) -> bytes:
    """A queue entry as it is stored or spilled: its message, and what its ``via`` marker must keep."""
    via = entry.via
    # "is not None" first: isinstance() of an interpreted class costs a compiled caller
    # about 400 instructions, and most stored entries (a queue's) have no via at all.
    if via is not None and isinstance(via, ViaMarker) and via.STORED_HEADER is not None:
        message = entry.message  # shared with other queues: the stored copy gets the header, not it
        return encode_message(message.copy(headers={**message.headers, via.STORED_HEADER: "1"}))
    return encode_message(entry.message)


class QueueStorage:
    __slots__ = ("store", "destination", "key", "usage", "bytes")
    # Its entries are one key range, so a queue can leave them there and page them in.
    pageable = True

    def __init__(self, store: Store, destination: str, usage: StoreUsage) -> None:
        self.store = store
        self.destination = destination
        self.key = destination
        self.usage = usage
        # This queue's share of the usage, for operators (the admin API): the same estimate.
        self.bytes = 0

    def add(self, entry: Entry) -> None:
        self.store.put_message(self.destination, entry.seq, entry_record(entry))
        size = stored_size(entry)
        self.bytes += size
        self.usage.add(size)

    def restored(self, size: int) -> None:
        """Count a message found in the store at recovery."""
        self.bytes += size
        self.usage.add(size)

    def remove(self, entry: Entry) -> None:
        self.store.delete_message(self.destination, entry.seq)
        size = stored_size(entry)
        left = self.bytes - size
        self.bytes = left if left > 0 else 0  # estimates: recovery counts encoded sizes
        self.usage.sub(size)

    def page(self, start_seq: int) -> Iterator[tuple[int, Message]]:
        """Stored entries from start_seq on, oldest first (a queue paging back in)."""
        for seq, data in self.store.iter_messages(self.destination, start_seq):
            yield seq, decode_message(data)


class TopicMessages:
    """Reference counts of stored topic messages, shared by all durable subscriptions."""

    def __init__(self, store: Store, usage: StoreUsage) -> None:
        self.store = store
        self.usage = usage
        self.refs: dict[int, int] = {}

    def retain(self, entry: Entry) -> None:
        count = self.refs.get(entry.seq, 0)
        if count == 0:
            self.store.put_message(entry.message.destination, entry.seq, entry_record(entry))
            self.usage.add(stored_size(entry))
        self.refs[entry.seq] = count + 1

    def restore_ref(self, seq: int) -> bool:
        """Count a reference found in the store at recovery; True for the message's first."""
        refs = self.refs
        first = seq not in refs
        refs[seq] = refs.get(seq, 0) + 1
        return first

    def release(self, entry: Entry) -> None:
        count = self.refs.get(entry.seq, 0) - 1
        if count <= 0:
            self.refs.pop(entry.seq, None)
            self.store.delete_message(entry.message.destination, entry.seq)
            self.usage.sub(stored_size(entry))
        else:
            self.refs[entry.seq] = count


class DurableStorage:
    __slots__ = ("store", "key", "messages")
    pageable = True

    def __init__(self, store: Store, key: str, messages: TopicMessages) -> None:
        self.store = store
        self.key = key
        self.messages = messages

    def add(self, entry: Entry) -> None:
        self.messages.retain(entry)
        self.store.put_record(DURABLE_REF_KIND, f"{self.key}\0{seq_key(entry.seq)}", entry.message.destination.encode())

    def remove(self, entry: Entry) -> None:
        self.store.delete_record(DURABLE_REF_KIND, f"{self.key}\0{seq_key(entry.seq)}")
        self.messages.release(entry)

    def page(self, start_seq: int) -> Iterator[tuple[int, Message]]:
        """Referenced topic messages from start_seq on: the reference, then the one stored copy."""
        for key, raw in self.store.iter_records(DURABLE_REF_KIND, f"{self.key}\0", seq_key(start_seq)):
            seq = int(key.rsplit("\0", 1)[1])
            data = self.store.get_message(raw.decode(), seq)
            if data is not None:
                yield seq, decode_message(data)
