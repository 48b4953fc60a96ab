"""A store in dictionaries, for tests and ``persistent = false`` runs.

It keeps the full Store contract (ordered ranges, records, durability
callbacks) so that a broker rebuilt over the same MemoryStore object recovers
exactly as it would from disk; only the disk is missing.
"""
from __future__ import annotations

import bisect
from typing import Callable, Iterator

from persistence.store import Store, StoreError


class MemoryStore(Store):
    def __init__(self) -> None:
        self._messages: dict[str, dict[int, bytes]] = {}
        self._records: dict[str, dict[str, bytes]] = {}
        # log -> partition -> (sorted bases, base -> chunk)
        self._chunks: dict[str, dict[int, tuple[list[int], dict[int, bytes]]]] = {}
        self._closed = False
        self.writes = 0  # how many puts and deletes; lets tests see what reached the store

    def _check(self) -> None:
        if self._closed:
            raise StoreError("store is closed")

    def put_message(self, destination: str, seq: int, data: bytes) -> None:
        self._check()
        self._messages.setdefault(destination, {})[seq] = data
        self.writes += 1

    def delete_message(self, destination: str, seq: int) -> None:
        self._check()
        messages = self._messages.get(destination)
        if messages is not None:
            messages.pop(seq, None)
            if not messages:
                del self._messages[destination]
        self.writes += 1

    def iter_messages(self, destination: str, start_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        self._check()
        messages = self._messages.get(destination, {})
        for seq in sorted(messages):
            if seq >= start_seq:
                yield seq, messages[seq]

    def get_message(self, destination: str, seq: int) -> bytes | None:
        self._check()
        return self._messages.get(destination, {}).get(seq)

    def destinations(self) -> list[str]:
        self._check()
        return sorted(self._messages)

    def put_record(self, kind: str, key: str, data: bytes) -> None:
        self._check()
        self._records.setdefault(kind, {})[key] = data
        self.writes += 1

    def delete_record(self, kind: str, key: str) -> None:
        self._check()
        self._records.get(kind, {}).pop(key, None)
        self.writes += 1

    def get_record(self, kind: str, key: str) -> bytes | None:
        self._check()
        return self._records.get(kind, {}).get(key)

    def iter_records(self, kind: str, prefix: str = "", start: str = "") -> Iterator[tuple[str, bytes]]:
        self._check()
        records = self._records.get(kind, {})
        keys = sorted(records)
        for key in keys[bisect.bisect_left(keys, prefix + start):]:
            if not key.startswith(prefix):
                break
            yield key, records[key]

    def put_chunk(self, log: str, partition: int, base: int, data: bytes) -> None:
        self._check()
        bases, chunks = self._chunks.setdefault(log, {}).setdefault(partition, ([], {}))
        if base not in chunks:
            bisect.insort(bases, base)
        chunks[base] = data
        self.writes += 1

    def delete_chunk(self, log: str, partition: int, base: int) -> None:
        self._check()
        found = self._chunks.get(log, {}).get(partition)
        if found is not None and base in found[1]:
            del found[1][base]
            found[0].remove(base)
        self.writes += 1

    def iter_chunks(self, log: str, partition: int, start: int = 0) -> Iterator[tuple[int, bytes]]:
        self._check()
        found = self._chunks.get(log, {}).get(partition)
        if found is None:
            return
        bases, chunks = found
        i = max(0, bisect.bisect_right(bases, start) - 1)
        for base in list(bases[i:]):
            data = chunks.get(base)
            if data is not None:
                yield base, data

    def when_durable(self, callback: Callable[[], None], urgent: bool = True) -> None:
        # Memory is as durable as it gets here: answer at once.
        callback()

    def before_flush(self, hook: Callable[[], None]) -> None:
        hook()  # nothing is batched here: "before the write" is now

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._closed = True

    def reopen(self) -> "MemoryStore":
        """The same contents as a fresh store object, as after a restart."""
        other = MemoryStore()
        other._messages = {d: dict(m) for d, m in self._messages.items()}
        other._records = {k: dict(r) for k, r in self._records.items()}
        other._chunks = {
            log: {p: (list(bases), dict(chunks)) for p, (bases, chunks) in parts.items()}
            for log, parts in self._chunks.items()
        }
        return other
