"""Duplicate detection on producer-supplied ids (ActiveMQ Artemis's duplicate-id cache).

A producer that may send a message twice (a retried Spark micro-batch, a
client that resends after a lost receipt) gives it an id in the
``_AMQ_DUPL_ID`` header or MQTT 5 user property; the broker routes an id
only the first time it sees it for that destination.  The cache keeps the
last ``size`` ids in arrival order.  Each id is persisted in the same store
batch as the message it came with, so after a crash the message and its id
are both there or both gone, and a resend after a restart is still caught.

Ids are kept as 16-byte BLAKE2b digests of destination and id: about 120
bytes each in memory, whatever the producer's ids look like.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

from typing import TYPE_CHECKING

from persistence.store import Store

if TYPE_CHECKING:
    from core.message import Message

DUPLICATE_ID_HEADER = "_AMQ_DUPL_ID"
# The brokers a forwarded message has crossed, comma-separated (ActiveMQ's BrokerPath): a broker
# drops a message that names it, so no loop of bridges or network links carries one round twice.
BROKER_PATH_HEADER = "gateway-path"
DUPLICATE_KIND = "dupl"  # key: arrival number (20 digits) -> digest


def _digest(destination: str, dup_id: str) -> bytes:
    raw = f"{destination}\0{dup_id}".encode("utf-8", "surrogateescape")
    return hashlib.blake2b(raw, digest_size=16).digest()


class DuplicateCache:
    __slots__ = ("store", "size", "_ids", "_next", "dropped")

    def __init__(self, store: Store, size: int) -> None:
        self.store = store
        self.size = size
        self._ids: OrderedDict[bytes, int] = OrderedDict()
        self._next = 1
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._ids)

    def seen(self, destination: str, dup_id: str) -> bool:
        """True for an id already seen on this destination; otherwise remember it and say False."""
        if self.size <= 0:
            return False
        digest = _digest(destination, dup_id)
        ids = self._ids
        if digest in ids:
            self.dropped += 1
            return True
        n = self._next
        self._next = n + 1
        ids[digest] = n
        self.store.put_record(DUPLICATE_KIND, f"{n:020d}", digest)
        while len(ids) > self.size:
            _, old = ids.popitem(last=False)
            self.store.delete_record(DUPLICATE_KIND, f"{old:020d}")
        return False

    def recover(self) -> None:
        ids = self._ids
        for key, digest in self.store.iter_records(DUPLICATE_KIND):
            n = int(key)
            ids[bytes(digest)] = n
            self._next = max(self._next, n + 1)
        while len(ids) > max(self.size, 0):
            _, old = ids.popitem(last=False)
            self.store.delete_record(DUPLICATE_KIND, f"{old:020d}")


def forwarding_headers(message: Message, node_name: str) -> list[tuple[str, str]]:
    """What a message takes to another broker: its duplicate-detection id (the message id, stored
    with it, so a resend after a restart carries the same one) and the path with this broker on it."""
    extra = []
    if DUPLICATE_ID_HEADER not in message.headers:
        extra.append((DUPLICATE_ID_HEADER, message.id))
    path = message.headers.get(BROKER_PATH_HEADER)
    extra.append((BROKER_PATH_HEADER, f"{path},{node_name}" if path else node_name))
    return extra
