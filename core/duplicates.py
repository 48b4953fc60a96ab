"""Duplicate detection on producer-supplied ids (ActiveMQ Artemis's duplicate-id cache).

A producer that may send a message twice (a retried Spark micro-batch, a
client that resends after a lost receipt) gives it an id in the
``_AMQ_DUPL_ID`` header or MQTT 5 user property; the broker routes an id
only the first time it sees it for that destination.  The cache keeps the
last ``size`` ids in arrival order.  Each id is persisted in the same store
batch as the message it came with, so after a crash the message and its id
are both there or both gone, and a resend after a restart is still caught.

Ids are kept as 16-byte BLAKE2b digests of destination and id: about 100
bytes each in memory, whatever the producer's ids look like.
"""
from __future__ import annotations

import hashlib

from typing import TYPE_CHECKING

from persistence.store import Store

if TYPE_CHECKING:
    from core.message import Message

DUPLICATE_ID_HEADER = "_AMQ_DUPL_ID"
# The brokers a forwarded message has crossed, comma-separated (ActiveMQ's BrokerPath): a broker
# drops a message that names it, so no loop of bridges or network links carries one round twice.
BROKER_PATH_HEADER = "gateway-path"
DUPLICATE_KIND = "dupl"  # key: slot (arrival number modulo the size) -> arrival number (8 bytes) + digest
_LEGACY_DIGEST = 16  # before 2026-11: key arrival number (20 digits) -> digest alone


def _digest(destination: str, dup_id: str) -> bytes:
    raw = f"{destination}\0{dup_id}".encode("utf-8", "surrogateescape")
    return hashlib.blake2b(raw, digest_size=16).digest()


def _slot_key(slot: int) -> str:
    return str(slot).zfill(10)  # as f"{slot:010d}", at half the cost compiled


class DuplicateCache:
    """The last ``size`` ids, in a ring of slots as Artemis's duplicate-id cache keeps them.

    Each id overwrites the record of the slot it takes (its arrival number
    modulo ``size``), so remembering an id is one put in the store's batch,
    where keying records by arrival number took a put and a delete: a fifth
    of a receiving gateway's reactor thread went to this cache, profiled.
    """

    __slots__ = ("store", "size", "_ids", "_ring", "_next", "dropped")

    def __init__(self, store: Store, size: int) -> None:
        self.store = store
        self.size = size
        self._ids: set[bytes] = set()
        # Slot -> the digest in it; grows to ``size``, then each new id replaces the oldest.
        self._ring: list[bytes] = []
        self._next = 0  # the next id's arrival number
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._ids)

    def seen(self, destination: str, dup_id: str) -> bool:
        """True for an id already seen on this destination; otherwise remember it and say False."""
        size = self.size
        if size <= 0:
            return False
        digest = _digest(destination, dup_id)
        ids = self._ids
        if digest in ids:
            self.dropped += 1
            return True
        n = self._next
        self._next = n + 1
        slot = n % size
        ring = self._ring
        if slot < len(ring):
            ids.discard(ring[slot])
            ring[slot] = digest
        else:
            ring.append(digest)
        ids.add(digest)
        self.store.put_record(DUPLICATE_KIND, _slot_key(slot), n.to_bytes(8, "big") + digest)
        return False

    def recover(self) -> None:
        """The ids from the store, the newest ``size`` of them; records of another size or layout are rewritten."""
        found: list[tuple[int, bytes, str]] = []
        for key, value in self.store.iter_records(DUPLICATE_KIND):
            value = bytes(value)
            if len(value) == _LEGACY_DIGEST:
                found.append((int(key), value, key))
            else:
                found.append((int.from_bytes(value[:8], "big"), value[8:], key))
        found.sort()
        size = max(self.size, 0)
        keep = found[len(found) - size:] if size else []
        for n, _, key in found[: len(found) - len(keep)]:
            self.store.delete_record(DUPLICATE_KIND, key)
        if not keep:
            return
        last = keep[-1][0]
        if all(key == _slot_key(n % size) for n, _, key in keep) and (
            len(keep) == size or last == len(keep) - 1
        ):
            # As written: each in its slot.
            ring = [b""] * len(keep)
            for n, digest, _ in keep:
                ring[n % size] = digest
            self._next = last + 1
        else:
            # Another size or the old layout: renumbered from 0, so slots follow arrival order again.
            ring = [digest for _, digest, _ in keep]
            for i, (n, digest, key) in enumerate(keep):
                if key != _slot_key(i):
                    self.store.delete_record(DUPLICATE_KIND, key)
            for i, digest in enumerate(ring):
                self.store.put_record(DUPLICATE_KIND, _slot_key(i), i.to_bytes(8, "big") + digest)
            self._next = len(ring)
        self._ring = ring
        self._ids = set(ring)


def forwarding_headers(message: Message, node_name: str) -> list[tuple[str, str]]:
    """What a message takes to another broker: its duplicate-detection id (the message id, stored
    with it, so a resend after a restart carries the same one) and the path with this broker on it."""
    extra = []
    if DUPLICATE_ID_HEADER not in message.headers:
        extra.append((DUPLICATE_ID_HEADER, message.id))
    path = message.headers.get(BROKER_PATH_HEADER)
    extra.append((BROKER_PATH_HEADER, f"{path},{node_name}" if path else node_name))
    return extra
