"""The interface the core stores through.

The store deals in bytes and names only: the core encodes messages itself, so
this package knows nothing of protocols or of the core's classes.  Two kinds of
data pass through it:

- messages, keyed by destination and a broker-wide increasing sequence, so a
  destination is one ordered range (a queue's FIFO order is its key order);
- records: small keyed values grouped by kind (durable subscriptions, their
  references to stored topic messages, scheduled messages, sessions);
- chunks of stream logs, keyed by log, partition and the offset of their first
  record, so a partition is one ordered range and the chunk holding any
  offset is found with one seek.

Writes are not durable when the call returns.  They join the current batch;
``when_durable(callback)`` runs the callback once every write issued before it
is on disk.  That is the group-commit contract receipts and PUBACKs rely on:
answer only from such a callback.  Reads (``iter_*``) see what has been
written, not the pending batch: call ``flush`` first where that matters.

A write or sync that fails (a full disk) confirms nothing: no callback that
waits for that batch or any later one runs until the store has written them
all again and synced.  The store then has a ``fault`` and goes on taking
writes, in order, while ``recover`` is tried; ``flush`` raises
``StoreUnavailable`` meanwhile.
"""
from __future__ import annotations

import abc
import errno
from dataclasses import dataclass
from typing import Callable, Iterator


class StoreError(Exception):
    """The store cannot do what was asked (closed, locked, corrupt)."""


class StoreUnavailable(StoreError):
    """The store cannot write now (a full disk, a failed write): what waits for the disk waits on.

    Raised by ``flush`` where a caller needs the pending writes readable, so it
    can put off what it meant to read (a page-in, a browse) until the store
    is healthy again.  Writes are still accepted meanwhile: they are kept, in
    order, and written once the store recovers.
    """


@dataclass
class StoreFault:
    """Why a store stopped confirming: the first error of a run of failed writes or syncs.

    ``space``: the disk ran out of space, which the store waits out (writing
    everything it kept once space returns); any other error is one the process
    cannot trust itself to recover from.
    """

    error: str
    space: bool
    since: float  # time.monotonic() of the first failure
    attempts: int = 0  # recoveries tried since
    last_error: str = ""


def is_space_error(error: BaseException) -> bool:
    """A write that failed for want of disk space (RocksDB's NoSpace, ENOSPC, a space limit)."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    text = str(error)
    return "No space left on device" in text or "NoSpace" in text or "Max allowed space was reached" in text


class Store(abc.ABC):
    @abc.abstractmethod
    def put_message(self, destination: str, seq: int, data: bytes) -> None: ...

    @abc.abstractmethod
    def delete_message(self, destination: str, seq: int) -> None: ...

    @abc.abstractmethod
    def iter_messages(self, destination: str, start_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        """The destination's messages from ``start_seq`` on, in sequence order."""

    @abc.abstractmethod
    def get_message(self, destination: str, seq: int) -> bytes | None: ...

    @abc.abstractmethod
    def destinations(self) -> list[str]:
        """Every destination that has stored messages."""

    def forget_destination(self, destination: str) -> None:
        """A deleted destination: it need not be listed by ``destinations`` any more.

        Only for stores that index destinations apart from their messages;
        the messages themselves are deleted one by one before this is called.
        """

    @abc.abstractmethod
    def put_record(self, kind: str, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def delete_record(self, kind: str, key: str) -> None: ...

    @abc.abstractmethod
    def get_record(self, kind: str, key: str) -> bytes | None:
        """One record, as written (not from the pending batch)."""

    @abc.abstractmethod
    def iter_records(self, kind: str, prefix: str = "", start: str = "") -> Iterator[tuple[str, bytes]]:
        """Records of a kind whose key starts with prefix, in key order, from prefix + start on."""

    @abc.abstractmethod
    def put_chunk(self, log: str, partition: int, base: int, data: bytes) -> None:
        """Write (or overwrite) the chunk of ``log``'s ``partition`` whose first offset is ``base``."""

    @abc.abstractmethod
    def delete_chunk(self, log: str, partition: int, base: int) -> None: ...

    @abc.abstractmethod
    def iter_chunks(self, log: str, partition: int, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """Chunks in base order, from the one that may hold offset ``start`` on.

        That is the last chunk whose base is at or below ``start`` (or the
        first chunk, when every base is above it): a reader looking for an
        offset starts inside the chunk that holds it.
        """

    @abc.abstractmethod
    def when_durable(self, callback: Callable[[], None], urgent: bool = True) -> None:
        """Run callback once all writes issued so far are on disk.

        ``urgent``: a client waits for it (a receipt, a PUBACK); False for the
        broker's own bookkeeping, which a store may let ride on a later sync.
        """

    @abc.abstractmethod
    def before_flush(self, hook: Callable[[], None]) -> None:
        """Run hook once, just before the pending batch is written (it may add writes to it).

        Until then the batch counts as pending, so when_durable callbacks wait for it.
        """

    @abc.abstractmethod
    def flush(self) -> None:
        """Write the pending batch now (and run the callbacks waiting on it)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    def fault(self) -> StoreFault | None:
        """Set while the store confirms nothing (writes failed); None when healthy."""
        return None

    def recover(self) -> bool:
        """Try to write what a fault held back; True once healthy (at once for a store that cannot fail)."""
        return True
