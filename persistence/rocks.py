"""The RocksDB store (rocksdict): one database, a column family per destination group.

Layout
  ``meta`` holds records (key ``kind \\0 key``) and the destination index;
  ``default`` holds messages of destinations no group claims; ``group.<name>``
  holds those matching the group's patterns (mKahaDB-style, but all families
  share one write-ahead log, so a batch spanning groups stays atomic).  A
  message key is the destination, NUL, and the sequence as 8 big-endian bytes,
  so a destination is one ordered key range.  Each stream log has a family of
  its own, ``stream.<name>``, keyed by partition and base offset (big-endian),
  so retention deletes and range reads never touch other data.

Which family a destination lives in is recorded the first time it is written
and kept: adding a group later sends new destinations to it, while
destinations already stored stay readable where they are.

Group commit
  Writes go into one WriteBatch; ``when_durable`` callbacks wait for it.  The
  batch is written once per reactor turn (``schedule`` arranges the call), or
  at once when it reaches ``max_batch`` operations.  A synced write holds the
  GIL for the whole fsync (rocksdict), so with a ``background`` runner the
  turn writes without syncing and the WAL's fsync (``flush_wal``, which lets
  the GIL go) runs on a worker thread, one at a time: turns go on reading and
  writing while the disk syncs, the next sync covers everything written
  meanwhile, and callbacks are released in order once a sync that began after
  their batch was written has finished.  An explicit ``flush()`` still writes
  and syncs at once (shutdown, and readers that want every callback released).

Inline syncs
  Handing a sync to a worker thread and its end back to the reactor costs the
  reactor thread more than a fast disk's fsync takes (the GIL passed back and
  forth, a wake-up of each thread, one more reactor turn before the release).
  So with ``inline_sync_below`` set, while the syncs' moving average stays
  under it, a sync that a client waits for (``when_durable(urgent=True)``: a
  receipt, a PUBACK) runs on the reactor thread (``flush_wal`` lets the GIL
  go) and its callbacks are released in the same turn.  A sync only the
  broker's own bookkeeping waits for (a stream's readable end) is started one
  turn later, so that a client's wait coming in the same turn makes it inline,
  and otherwise on the worker thread, where it does not stop the reactor: a
  QoS 0 flood into a stream keeps reading while the disk syncs.  Once the
  inline syncs' average passes the bound (a slower disk, or a moment of
  contention), every sync goes to the worker thread, and one a second is
  tried inline again; a fast one brings the inline syncs back.  (The worker's
  syncs cannot measure the disk: their time includes waiting for the GIL.)

A failed write or sync (a full disk)
  confirms nothing from that batch on.  rocksdict consumes a WriteBatch when
  it writes it, failed or not, so each batch's operations are also kept in a
  list until a sync covers them.  From the failure on the store has a
  ``fault``: later batches are not written (a batch must never land before
  one that failed), only kept, and every callback waits.  ``recover`` writes
  everything kept again, in order, and syncs; writing a batch that RocksDB
  had applied already puts the same keys in the same order, so the end state
  is the same.  RocksDB itself stops taking writes after such an error and
  clears it once space returns (its SstFileManager polls the disk), flushing
  every memtable to a new write-ahead log first, so nothing depends on the
  log file that failed.  Errors other than a lack of space leave the fault
  unrecoverable: the process must stop and recover from its log at start.
"""
from __future__ import annotations

import fnmatch
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, cast, overload

from rocksdict import (
    AccessType,
    ColumnFamily,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)
from twisted.logger import Logger

from persistence.disk import disk_space, human
from persistence.stats import BATCH_OPS_BOUNDS, WRITE_SECONDS_BOUNDS, Buckets
from persistence.store import Store, StoreError, StoreFault, StoreUnavailable, is_space_error

log = Logger(namespace="gateway.persistence")

_SEQ = struct.Struct(">Q")
_CHUNK_KEY = struct.Struct(">IQ")  # partition, base offset
_PARTITION = struct.Struct(">I")
_META = "meta"
_DEFAULT = "default"
_DEST_INDEX = b"dest\x00"


# Runs ``work`` on a worker thread, then ``done`` on the reactor thread with the error it raised, if any.
Background = Callable[[Callable[[], None], Callable[[BaseException | None], None]], None]

# One operation of a batch, kept to write it again: (family handle, key, value; None for a delete).
Op = tuple["ColumnFamily | None", bytes, "bytes | None"]

# Bytes of written batches kept for a sync after which a sync starts though nobody waits for one.
KEEP_SYNC_BYTES = 4 * 1024 * 1024
# Seconds after which a store whose inline syncs were too slow tries one again (see "Inline syncs").
INLINE_RETRY_SECONDS = 1.0


class StoreLocked(StoreError):
    """Another broker holds the data directory (shared-store master/slave)."""


@dataclass
class GroupConfig:
    name: str
    # Destination patterns in canonical form: "queue://orders.>" (">" the rest,
    # "*" one level), as ActiveMQ's filtered mKahaDB adapters.
    patterns: list[str] = field(default_factory=list)


def _pattern_matches(pattern: str, destination: str) -> bool:
    scheme, _, name = pattern.partition("://")
    d_scheme, _, d_name = destination.partition("://")
    if scheme != d_scheme:
        return False
    p_levels = name.split(".")
    levels = d_name.split(".")
    for i, p in enumerate(p_levels):
        if p == ">":
            return True
        if i >= len(levels):
            return False
        if p != "*" and not fnmatch.fnmatchcase(levels[i], p):
            return False
    return len(p_levels) == len(levels)


def _raw_items(table: Rdict, from_key: bytes, bound: ReadOptions) -> Iterator[tuple[bytes, bytes]]:
    """``table.items(...)`` of a raw-mode database, whose keys and values are bytes.

    rocksdict's stubs type every key as ``str | int | float | bytes | bool``
    (whatever its pickling mode could give back); raw mode only gives bytes,
    which the stubs cannot say, hence the cast.
    """
    return cast("Iterator[tuple[bytes, bytes]]", table.items(from_key=from_key, read_opt=bound))


def _options(raw: bool = True) -> Options:
    options = Options(raw_mode=raw)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    # Smaller memtables than the default 64 MiB: a broker's data is short-lived,
    # and deleted ranges are given back sooner.
    options.set_write_buffer_size(16 * 1024 * 1024)
    # A write-ahead log file is deleted only once every family has flushed what it holds,
    # and the meta family fills its memtable slowly: without a bound, logs of
    # long-acknowledged messages held hundreds of MiB (4 x every family's memtables).
    options.set_max_total_wal_size(64 * 1024 * 1024)
    return options


class RocksStore(Store):
    def __init__(
        self,
        path: str,
        groups: list[GroupConfig] | None = None,
        *,
        sync: bool = True,
        schedule: Callable[[Callable[[], None]], None] | None = None,
        max_batch: int = 2000,
        background: Background | None = None,
        inline_sync_below: float = 0.0,
        later: Callable[[float, Callable[[], None]], object] | None = None,
        unwaited_sync_gap: float = 0.0,
    ) -> None:
        self.path = path
        self.groups = list(groups or [])
        self.sync = sync
        self._schedule = schedule
        self.max_batch = max_batch
        self._background = background if sync else None
        # Seconds: syncs a client waits for run on the reactor thread while the
        # disk's average sync (``sync_seconds``) stays below this; 0: never.
        self.inline_sync_below = inline_sync_below if self._background is not None else 0.0
        # A moving average of the inline syncs' durations (a worker's would count its
        # wait for the GIL too); past the bound, one is tried again every INLINE_RETRY_SECONDS.
        self.sync_seconds = 0.0
        self.inline_syncs = 0
        self.worker_syncs = 0
        self._retry_inline_at = 0.0
        os.makedirs(path, exist_ok=True)
        self._open()
        self._dest_family: dict[str, str] = {}
        bound = self._bounded(_DEST_INDEX)
        for key, value in _raw_items(self._meta, _DEST_INDEX, bound):
            self._dest_family[key[len(_DEST_INDEX):].decode()] = value.decode()
        self._write_opt = WriteOptions()
        self._write_opt.sync = sync and background is None
        # Pipelined sync (with ``background``): batches written but not yet synced, as
        # (write number, their callbacks), oldest first; one sync runs at a time.
        self._written = 0
        # The last write a completed sync covers.  A batch written while no callback
        # waited is not synced at once: a callback that comes after it (a session
        # hands its receipts over after the turn's flush) must still wait for a sync.
        self._synced_to = 0
        self._unsynced: deque[tuple[int, list[Callable[[], None]]]] = deque()
        self._syncing = False
        self._sync_lock = threading.Lock()
        # The last write a callback that a client waits for needs synced, and whether
        # the pending batch has such a callback (see "Inline syncs").
        self._urgent_to = 0
        self._urgent_pending = False
        self._sync_deferred = False
        # Seconds: a sync that no client waits for (only a stream's records, which readers
        # see once synced) starts no sooner than this after the last sync ended, so that
        # many turns share it; 0: at once.  A client's wait starts one at once, as before.
        self._later = later
        self.unwaited_sync_gap = unwaited_sync_gap if later is not None else 0.0
        self._last_sync_end = 0.0
        self._gap_timer = False
        self._releasing = False  # callbacks are being released (_synced)
        self._batch = WriteBatch(raw_mode=True)
        self._ops = 0
        # The pending batch's operations, and each batch's since the last completed sync
        # (write number, operations): what a failed write or sync must write again.
        self._log: list[Op] = []
        self._kept: deque[tuple[int, list[Op], int]] = deque()  # (write number, operations, bytes)
        self._kept_bytes = 0  # of the batches written and kept for a sync: one starts past KEEP_SYNC_BYTES
        self._fault: StoreFault | None = None
        # Told when a fault begins (the fault) and when the store is healthy again (None).
        self.on_fault: Callable[[StoreFault | None], None] | None = None
        self._nosync = WriteOptions()
        self._nosync.sync = False
        # Bytes of the batches written (RocksDB's count); once past check_after, on_large_write is told
        # after the batch (the disk's free space is checked there, not only on a timer).
        self.bytes_written = 0
        self.check_after = 0
        self.on_large_write: Callable[[], None] | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._hooks: list[Callable[[], None]] = []
        self._flush_scheduled = False
        self._flushing = False
        self._closed = False
        self.batches_written = 0
        # Group commit as operators graph it: operations per batch, seconds per (synced) write.
        self.batch_ops = Buckets(BATCH_OPS_BOUNDS)
        self.write_seconds = Buckets(WRITE_SECONDS_BOUNDS)
        self.deletes_since_compaction = 0

    def _open(self) -> None:
        path = self.path
        existing = set(Rdict.list_cf(path, _options())) if os.path.exists(os.path.join(path, "CURRENT")) else set()
        wanted = {_META, _DEFAULT} | {f"group.{g.name}" for g in self.groups} | existing
        families = {name: _options() for name in wanted if name != _DEFAULT}
        try:
            self.db = Rdict(path, _options(), column_families=families, access_type=AccessType.read_write())
        except Exception as exc:  # rocksdict raises a plain Exception
            if "LOCK" in str(exc) or "lock hold" in str(exc):
                raise StoreLocked(f"{path} is locked by another broker") from None
            raise StoreError(f"cannot open {path}: {exc}") from None
        self._families = {name: self.db.get_column_family_handle(name) for name in wanted}
        self._meta_handle: ColumnFamily | None = self._families[_META]
        # Families to read through, made once: rocksdict flushes a family's memtable to a
        # new SST file whenever an Rdict of it is dropped, so one made per read (a range
        # read, a page-in, a merge, a usage check) wrote a small file each time.
        self._readers: dict[str, Rdict] = {}
        self._meta = self._reader(_META)

    # -- keys and families --------------------------------------------------

    def _reader(self, family: str) -> Rdict:
        reader = self._readers.get(family)
        if reader is None:
            reader = self._readers[family] = self.db.get_column_family(family)
        return reader

    @staticmethod
    def _bounded(prefix: bytes) -> ReadOptions:
        """Read options that stop at the end of ``prefix``'s range.

        Keep the returned object referenced for as long as the iterator runs:
        the iterator points into it, and an inline temporary is freed under it.
        """
        options = ReadOptions()
        options.set_iterate_upper_bound(prefix[:-1] + bytes([prefix[-1] + 1]))
        return options

    @overload
    def _family_for(self, destination: str, create: Literal[True]) -> str: ...

    @overload
    def _family_for(self, destination: str, create: Literal[False]) -> str | None: ...

    def _family_for(self, destination: str, create: bool) -> str | None:
        family = self._dest_family.get(destination)
        if family is None and create:
            family = _DEFAULT
            for group in self.groups:
                if any(_pattern_matches(p, destination) for p in group.patterns):
                    family = f"group.{group.name}"
                    break
            self._dest_family[destination] = family
            self._put(self._meta_handle, _DEST_INDEX + destination.encode(), family.encode())
        return family

    @staticmethod
    def _message_key(destination: str, seq: int) -> bytes:
        return destination.encode() + b"\x00" + _SEQ.pack(seq)

    # -- batching -----------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise StoreError("store is closed")

    def _put(self, handle: ColumnFamily | None, key: bytes, value: bytes) -> None:
        if self._closed:  # _check(), inline: a put per message and per duplicate id
            raise StoreError("store is closed")
        self._batch.put(key, value, handle)
        self._log.append((handle, key, value))
        self._grew()

    def _delete(self, handle: ColumnFamily | None, key: bytes, counted: bool = True) -> None:
        if self._closed:
            raise StoreError("store is closed")
        self._batch.delete(key, handle)
        self._log.append((handle, key, None))
        if counted:
            self.deletes_since_compaction += 1
        self._grew()

    def _grew(self) -> None:
        self._ops += 1
        # Not from inside flush's hooks: a batch written half way through them
        # would release callbacks before the rest of their writes (stream records).
        if self._ops >= self.max_batch and not self._flushing:
            self._flush(wait=False)
        elif not self._flush_scheduled:
            self._arrange_flush()

    def _arrange_flush(self) -> None:
        if self._schedule is None:
            return
        self._flush_scheduled = True
        self._schedule(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        if not self._closed:
            self._flush(wait=False)

    # -- Store interface ------------------------------------------------------

    def put_message(self, destination: str, seq: int, data: bytes) -> None:
        family = self._dest_family.get(destination) or self._family_for(destination, create=True)
        self._put(self._families[family], self._message_key(destination, seq), data)

    def delete_message(self, destination: str, seq: int) -> None:
        family = self._dest_family.get(destination)  # as put_message: an ack per message
        if family is not None:
            self._delete(self._families[family], self._message_key(destination, seq))

    def iter_messages(self, destination: str, start_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        self._check()
        family = self._family_for(destination, create=False)
        if family is None:
            return
        prefix = destination.encode() + b"\x00"
        cf = self._reader(family)
        bound = self._bounded(prefix)
        for key, value in _raw_items(cf, prefix + _SEQ.pack(start_seq), bound):
            yield _SEQ.unpack(key[len(prefix):])[0], value

    def get_message(self, destination: str, seq: int) -> bytes | None:
        self._check()
        family = self._family_for(destination, create=False)
        if family is None:
            return None
        return self._reader(family).get(self._message_key(destination, seq))

    def destinations(self) -> list[str]:
        self._check()
        return sorted(self._dest_family)

    def forget_destination(self, destination: str) -> None:
        """Drop an empty destination from the index (its family may change at the next write)."""
        if self._dest_family.pop(destination, None) is not None:
            self._delete(self._meta_handle, _DEST_INDEX + destination.encode())

    def put_record(self, kind: str, key: str, data: bytes) -> None:
        self._put(self._meta_handle, kind.encode() + b"\x00" + key.encode("utf-8", "surrogateescape"), data)

    def delete_record(self, kind: str, key: str) -> None:
        self._delete(self._meta_handle, kind.encode() + b"\x00" + key.encode("utf-8", "surrogateescape"))

    def get_record(self, kind: str, key: str) -> bytes | None:
        self._check()
        return self._meta.get(kind.encode() + b"\x00" + key.encode("utf-8", "surrogateescape"))

    def iter_records(self, kind: str, prefix: str = "", start: str = "") -> Iterator[tuple[str, bytes]]:
        self._check()
        head = kind.encode() + b"\x00"
        first = head + prefix.encode("utf-8", "surrogateescape")
        bound = self._bounded(head)
        for key, value in _raw_items(self._meta, first + start.encode("utf-8", "surrogateescape"), bound):
            if not key.startswith(first):
                break
            yield key[len(head):].decode("utf-8", "surrogateescape"), value

    def when_durable(self, callback: Callable[[], None], urgent: bool = True) -> None:
        if not self._ops and not self._callbacks and not self._hooks:
            # Immediate only when nothing is waiting or being released: acknowledgements keep their order.
            if not self._unsynced and self._synced_to >= self._written and not self._releasing:
                callback()
                return
            # Everything is written, not all of it synced: behind what waits already,
            # for a sync begun now (or the one running, begun after the last write).
            self._unsynced.append((self._written, [callback]))
            if urgent:
                self._urgent_to = self._written
            if not self._syncing:
                self._start_sync()
            return
        self._callbacks.append(callback)
        if urgent:
            self._urgent_pending = True
        if not self._flush_scheduled:
            self._arrange_flush()

    def before_flush(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)
        if not self._flush_scheduled:
            self._arrange_flush()

    def flush(self) -> None:
        if self._fault is not None:
            self.recover()  # space may have come back since the last attempt
        self._flush(wait=True)

    def _flush(self, wait: bool) -> None:
        """Write the pending batch; ``wait``: also sync now and release every callback."""
        hooks, self._hooks = self._hooks, []
        self._flushing = True
        try:
            for hook in hooks:
                hook()
        finally:
            self._flushing = False
        if self._ops:
            batch, self._batch = self._batch, WriteBatch(raw_mode=True)
            log, self._log = self._log, []
            ops, self._ops = self._ops, 0
            size = batch.size_in_bytes()  # once a batch, not per operation: rocksdict consumes it on write
            self.bytes_written += size
            self._written += 1
            if self._fault is None:
                started = time.perf_counter()
                try:
                    self.db.write(batch, self._write_opt)
                except Exception as exc:  # rocksdict raises a plain Exception
                    self._kept.append((self._written, log, size))
                    self._failed(exc)
                else:
                    self.write_seconds.observe(time.perf_counter() - started)
                    self.batch_ops.observe(ops)
                    self.batches_written += 1
                    if self._background is not None:
                        self._kept.append((self._written, log, size))
                        self._kept_bytes += size
                        if self._kept_bytes >= KEEP_SYNC_BYTES and not self._syncing:
                            # Writes nobody waits for (no receipts) are kept until a sync
                            # covers them: bound that memory with a sync of their own.
                            self._start_sync()
                    if self.bytes_written >= self.check_after and self.on_large_write is not None:
                        self.on_large_write()
            else:
                # Never written ahead of the batch that failed: kept, in order, for recover().
                self._kept.append((self._written, log, size))
        callbacks, self._callbacks = self._callbacks, []
        if self._urgent_pending:
            self._urgent_pending = False
            self._urgent_to = self._written
        if self._fault is not None:
            if callbacks:
                self._unsynced.append((self._written, callbacks))
            if wait:
                raise StoreUnavailable(self.describe_fault())
            return
        if self._background is None:
            # Synced by the write itself (or never promised: sync = false).
            if callbacks:
                self._unsynced.append((self._written, callbacks))
            self._synced(self._written)
            return
        if callbacks:
            self._unsynced.append((self._written, callbacks))
        if wait:
            if self._unsynced or self._synced_to < self._written:
                try:
                    with self._sync_lock:
                        self.db.flush_wal(True)
                except Exception as exc:
                    self._failed(exc)
                    raise StoreUnavailable(self.describe_fault()) from None
                self._synced(self._written)
        elif self._unsynced and not self._syncing:
            self._start_sync()

    def _start_sync(self) -> None:
        assert self._background is not None
        if self._fault is not None:
            return  # see _flush: nothing is confirmed until recover() has written it all again
        if self._releasing or self._syncing:
            return  # started once the release or the running sync is done (see _synced)
        if self._gap_timer and self._waits_for_gap():
            return  # its start is arranged already: no turn needs to look again
        if self.inline_sync_below and self._inline_allowed():
            if self._urgent_to > self._synced_to:
                self._sync_inline()
                return
            if self._schedule is not None:
                # Only bookkeeping waits: a client's wait may still come this turn (its
                # receipts are handed over after the flush), and make the sync inline.
                if not self._sync_deferred:
                    self._sync_deferred = True
                    self._schedule(self._deferred_sync)
                return
        self._sync_on_worker()

    def _deferred_sync(self) -> None:
        self._sync_deferred = False
        if self._closed or self._syncing or self._fault is not None or self._synced_to >= self._written:
            return
        if self._urgent_pending:
            return  # a client's wait in the pending batch: its flush starts the sync, inline
        if self._urgent_to > self._synced_to and self._inline_allowed():
            self._sync_inline()
            return
        self._sync_on_worker()

    def _waits_for_gap(self) -> bool:
        """Whether this sync, which no client waits for, should wait for the gap (its start is arranged)."""
        if not self.unwaited_sync_gap or self._urgent_to > self._synced_to or self._urgent_pending:
            return False
        if self._kept_bytes >= KEEP_SYNC_BYTES:
            return False  # what is kept for it is bounded: no waiting past that
        due = self._last_sync_end + self.unwaited_sync_gap - time.monotonic()
        if due <= 0:
            return False
        if not self._gap_timer:
            self._gap_timer = True
            assert self._later is not None
            self._later(due, self._gap_over)
        return True

    def _gap_over(self) -> None:
        self._gap_timer = False
        if self._closed or self._syncing or self._releasing or self._fault is not None or self._synced_to >= self._written:
            return  # synced meanwhile (a client's wait), or one is running: it starts the next
        self._worker_sync()

    def _sync_on_worker(self) -> None:
        if not self._waits_for_gap():
            self._worker_sync()

    def _worker_sync(self) -> None:
        assert self._background is not None
        self._syncing = True
        target = self._written
        self._background(self._sync_wal, lambda error: self._sync_done(target, error))

    def _inline_allowed(self) -> bool:
        return self.sync_seconds < self.inline_sync_below or time.monotonic() >= self._retry_inline_at

    def _sync_inline(self) -> None:
        """On the reactor thread: fsync, then release what waited, in this turn."""
        self._syncing = True  # callbacks that ask for more while released wait for the next sync
        target = self._written
        started = time.perf_counter()
        try:
            with self._sync_lock:
                self.db.flush_wal(True)
        except Exception as exc:
            self._syncing = False
            # As a failed sync on the worker thread: see _sync_done.
            self._failed(exc)
            return
        self._measured(time.perf_counter() - started)
        self._last_sync_end = time.monotonic()
        self.inline_syncs += 1
        try:
            self._synced(target)
        finally:
            self._syncing = False
        if self._unsynced and self._fault is None:
            self._start_sync()  # waits that came with writes made during the release

    def _measured(self, seconds: float) -> None:
        bound = self.inline_sync_below
        if self.sync_seconds >= bound:
            # A retry after a slow spell: this sync alone says whether the disk is fast again.
            self.sync_seconds = seconds
        else:
            self.sync_seconds += (seconds - self.sync_seconds) / 8
        if self.sync_seconds >= bound:
            self._retry_inline_at = time.monotonic() + INLINE_RETRY_SECONDS

    def _sync_wal(self) -> None:
        """On a worker thread: fsync the write-ahead log (every write made so far)."""
        with self._sync_lock:
            if not self._closed:
                self.db.flush_wal(True)

    def _sync_done(self, target: int, error: BaseException | None) -> None:
        self._syncing = False
        self._last_sync_end = time.monotonic()
        if self._closed:
            return
        if error is not None:
            # What the kernel could not write may be gone (fsync does not report it twice):
            # a later sync proves nothing of it, so it is written again before anything is confirmed.
            self._failed(error)
            return
        # Everything up to target was written before this sync began: on disk, whatever failed since.
        self.worker_syncs += 1
        self._synced(target)

    def _synced(self, target: int) -> None:
        """Everything up to write ``target`` is on disk: release what waited for it, in order.

        A callback may ask for more while released.  Its wait joins the queue
        (released by this loop if nothing was written since), and no sync starts
        until the loop is done: one started inside it could release later
        batches' callbacks ahead of the rest of this one.
        """
        if target > self._synced_to:
            self._synced_to = target
        kept = self._kept
        while kept and kept[0][0] <= target:
            self._kept_bytes -= kept.popleft()[2]
        unsynced = self._unsynced
        releasing, self._releasing = self._releasing, True  # (a callback's explicit flush() nests)
        try:
            while unsynced and unsynced[0][0] <= self._synced_to:
                self._release(unsynced.popleft()[1])
        finally:
            self._releasing = releasing
        if unsynced and not self._syncing and self._fault is None and self._background is not None:
            self._start_sync()

    # -- faults ---------------------------------------------------------------

    @property
    def fault(self) -> StoreFault | None:
        return self._fault

    @property
    def closed(self) -> bool:
        return self._closed

    def reopen(self) -> bool:
        """Close the database and open it again, then write what was kept: True once healthy.

        RocksDB's own recovery (``recover``) sometimes gives up: a sync of the
        log that failed after a write had failed leaves its log writer broken
        for good ("Writer has previous error"; "DB resume requested but failed
        due to Fatal/Unrecoverable error" in its LOG).  Opening the database
        again recovers it from its log, as a restart would, without one.  The
        kept batches name their families by handle, which a reopen replaces:
        they are carried over by family name.  False when the database cannot
        be opened again (the caller then stops the broker); on success the
        fault is over, as with ``recover``.
        """
        fault = self._fault
        if fault is None:
            return True
        if self._closed or self._syncing or not fault.space:
            return False
        names = {id(handle): name for name, handle in self._families.items()}

        def by_name(ops: list[Op]) -> list[tuple[str, bytes, bytes | None]]:
            return [(names[id(handle)], key, value) for handle, key, value in ops]

        kept = [(number, by_name(ops), size) for number, ops, size in self._kept]
        pending = by_name(self._log)
        with self._sync_lock:
            self._close_database()
            try:
                self._open()
            except StoreError as exc:
                log.critical("store {path} could not be opened again: {error}", path=self.path, error=str(exc))
                self._closed = True
                return False

        def by_handle(ops: list[tuple[str, bytes, bytes | None]]) -> list[Op]:
            return [(self._families[name], key, value) for name, key, value in ops]

        self._kept = deque((number, by_handle(ops), size) for number, ops, size in kept)
        self._log = by_handle(pending)
        for handle, key, value in self._log:
            if value is None:
                self._batch.delete(key, handle)
            else:
                self._batch.put(key, value, handle)
        log.info("store {path} opened again after its log writer failed for good", path=self.path)
        return self.recover()

    def describe_fault(self) -> str:
        fault = self._fault
        if fault is None:
            return "the store is healthy"
        return f"the store could not write to {self.path}: {fault.error}"

    def _failed(self, error: BaseException) -> None:
        if self._fault is not None:
            self._fault.last_error = str(error)
            return
        self._fault = StoreFault(str(error), is_space_error(error), time.monotonic())
        kept_ops = sum(len(log) for _, log, _ in self._kept)
        try:
            free = human(disk_space(self.path)[0])
        except OSError:
            free = "unknown"
        # Once, not per batch: the broker reports the fault's progress itself (health, metrics, $SYS).
        log.error(
            "store write failed at {path} ({free} free): {error}; nothing more is confirmed until "
            "every kept write ({ops} operations) is written again and synced",
            path=self.path, free=free, error=str(error), ops=kept_ops,
        )
        if self.on_fault is not None:
            self.on_fault(self._fault)

    def recover(self) -> bool:
        """Write everything kept since the last sync again, in order, and sync: True once healthy.

        Only a fault for want of space is tried (RocksDB refuses writes until its own
        recovery has found room again, so an early attempt fails at once and costs
        nothing); after any other error the process cannot vouch for its log.
        """
        fault = self._fault
        if fault is None:
            return True
        if self._closed or self._syncing or not fault.space:
            return False  # a sync still running on its worker thread reports first
        fault.attempts += 1
        try:
            for _, ops, _ in self._kept:
                batch = WriteBatch(raw_mode=True)
                for handle, key, value in ops:
                    if value is None:
                        batch.delete(key, handle)
                    else:
                        batch.put(key, value, handle)
                self.db.write(batch, self._nosync)
            if self.sync:
                with self._sync_lock:
                    self.db.flush_wal(True)
        except Exception as exc:
            fault.last_error = str(exc)
            return False
        batches = len(self._kept)
        self._fault = None
        self._kept.clear()
        self._kept_bytes = 0
        self.batches_written += batches
        log.info(
            "store at {path} writes again after {s:.1f}s: {n} kept batches written and synced",
            path=self.path, s=time.monotonic() - fault.since, n=batches,
        )
        self._synced(self._written)
        if self.on_fault is not None:
            self.on_fault(None)
        return True

    @staticmethod
    def _release(callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:
                # A failing callback (one client's write) must not keep the others' receipts back.
                log.failure("a when_durable callback failed")

    # -- stream logs --------------------------------------------------------

    @overload
    def _log_family(self, log: str, create: Literal[True]) -> str: ...

    @overload
    def _log_family(self, log: str, create: Literal[False]) -> str | None: ...

    def _log_family(self, log: str, create: bool) -> str | None:
        name = f"stream.{log}"
        if name not in self._families:
            if not create:
                return None
            self._check()
            self.db.create_column_family(name, _options())
            self._families[name] = self.db.get_column_family_handle(name)
        return name

    def put_chunk(self, log: str, partition: int, base: int, data: bytes) -> None:
        family = self._log_family(log, create=True)
        self._put(self._families[family], _CHUNK_KEY.pack(partition, base), data)

    def delete_chunk(self, log: str, partition: int, base: int) -> None:
        family = self._log_family(log, create=False)
        if family is not None:
            # Not counted for compact(): chunks are removed from the head of a log, whole
            # files' worth at a time, which RocksDB's own background compaction reclaims.
            self._delete(self._families[family], _CHUNK_KEY.pack(partition, base), counted=False)

    def iter_chunks(self, log: str, partition: int, start: int = 0) -> Iterator[tuple[int, bytes]]:
        self._check()
        family = self._log_family(log, create=False)
        if family is None:
            return
        prefix = _PARTITION.pack(partition)
        bound = self._bounded(prefix)
        it = self._reader(family).iter(bound)
        it.seek_for_prev(_CHUNK_KEY.pack(partition, start))
        if not it.valid() or not it.key().startswith(prefix):
            it.seek(prefix)  # every chunk starts after ``start`` (or there are none)
        while it.valid():
            yield _CHUNK_KEY.unpack(it.key())[1], it.value()
            it.next()

    # -- housekeeping -------------------------------------------------------

    def usage_bytes(self) -> int:
        """Disk the data takes (SST files plus memtables), for the store usage limit."""
        total = 0
        for name in self._families:
            cf = self._reader(name)
            for prop in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
                total += cf.property_int_value(prop) or 0
        return total

    def family_sizes(self) -> dict[str, tuple[int, int]]:
        """Column family -> (bytes in SST files, bytes in memtables): RocksDB's own figures, read at once.

        For operators' graphs; they lag behind deletes until compaction, so the
        store limit counts bytes itself (core.storage.StoreUsage).
        """
        self._check()
        sizes: dict[str, tuple[int, int]] = {}
        for name in self._families:
            cf = self._reader(name)
            sizes[name] = (
                cf.property_int_value("rocksdb.total-sst-files-size") or 0,
                cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0,
            )
        return sizes

    def compact(self) -> None:
        """Give the space of deleted ranges back (tombstones are dropped by compaction).

        Stream logs are left out: a full compaction rewrites every byte of a
        family while holding the reactor (rocksdict keeps the GIL), and a
        stream of millions of records would stall every client for seconds.
        """
        for name in self._families:
            if not name.startswith("stream."):
                self._reader(name).compact_range(None, None)
        self.deletes_since_compaction = 0

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        except StoreUnavailable as exc:
            # Never confirmed, so nothing promised is lost; but say what is dropped.
            log.error(
                "closing with {n} operations never written ({why}): the messages among them were never confirmed",
                n=sum(len(ops) for _, ops, _ in self._kept) + self._ops, why=str(exc),
            )
        with self._sync_lock:  # a sync still running on its worker thread finishes first
            if self._background is not None and self._fault is None:
                self.db.flush_wal(True)  # writes no callback waited for, too
            self._closed = True
        self._close_database()

    def _close_database(self) -> None:
        """Close RocksDB and drop every handle into it, kept operations' included.

        The LOCK is only released once no column-family handle is alive, and
        RocksDB refuses to open a database twice in one process (``reopen``).
        """
        self._kept.clear()
        self._log = []
        self._batch = WriteBatch(raw_mode=True)
        self._families.clear()
        # Dropped, not set to None: every method checks _closed (or the fault) before it would use them.
        self._meta_handle = None
        del self._meta
        self._readers.clear()
        try:
            self.db.close()
        except Exception as exc:  # RocksDB reports its background error again (a full disk): the files stay as synced
            log.error("store {path} closed with an error: {error}", path=self.path, error=str(exc))
        del self.db
