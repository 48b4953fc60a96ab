"""How queues and durable subscriptions lay out their persistent entries in a Store.

A queue's messages are its own range (destination, seq).  A message on a
topic is stored once, under the topic, however many durable subscribers hold
it; each subscriber keeps a small reference record, and the message is
deleted when the last reference goes (one copy, a position per subscriber).
"""
from __future__ import annotations

from core.entry import Entry
from core.message import encode_message
from persistence.store import Store

DURABLE_KIND = "durable"          # key: durable key -> subscription definition (JSON)
DURABLE_REF_KIND = "durable-ref"  # key: durable key \0 seq -> topic destination
SCHEDULED_KIND = "scheduled"      # key: due ms : seq -> encoded message
RETAINED_KIND = "retained"        # key: topic name -> encoded message
DELIVERED_KIND = "delivered"      # key: storage key -> highest seq ever delivered (8 bytes)
STATE_KIND = "state"              # key: protocol state name -> opaque bytes (MQTT sessions)


def seq_key(seq: int) -> str:
    return f"{seq:020d}"


class QueueStorage:
    __slots__ = ("store", "destination", "key")
    # Its entries are one key range, so a queue can leave them there and page them in.
    pageable = True

    def __init__(self, store: Store, destination: str) -> None:
        self.store = store
        self.destination = destination
        self.key = destination

    def add(self, entry: Entry) -> None:
        self.store.put_message(self.destination, entry.seq, encode_message(entry.message))

    def remove(self, entry: Entry) -> None:
        self.store.delete_message(self.destination, entry.seq)


class TopicMessages:
    """Reference counts of stored topic messages, shared by all durable subscriptions."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.refs: dict[int, int] = {}

    def retain(self, entry: Entry) -> None:
        count = self.refs.get(entry.seq, 0)
        if count == 0:
            self.store.put_message(entry.message.destination, entry.seq, encode_message(entry.message))
        self.refs[entry.seq] = count + 1

    def release(self, entry: Entry) -> None:
        count = self.refs.get(entry.seq, 0) - 1
        if count <= 0:
            self.refs.pop(entry.seq, None)
            self.store.delete_message(entry.message.destination, entry.seq)
        else:
            self.refs[entry.seq] = count


class DurableStorage:
    __slots__ = ("store", "key", "messages")
    # References to topic messages: not paged (yet); a durable backlog stays in memory.
    pageable = False

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
