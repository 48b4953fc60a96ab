"""Streams: durable, append-only, partitioned logs of what was routed to some destinations.

A stream names destination patterns (``topic://sensors.>``); every message
routed to a matching destination, from any protocol, is appended to one of
its partitions with the next offset of that partition.  Ordinary queue and
topic semantics do not change: the append is a copy beside the routing.

Partitioning is by destination (a stable CRC-32 of the canonical name), so
each destination's records stay in order in one partition.

Appends are gathered per partition during a reactor turn and written by a
``before_flush`` hook into the same store batch as the turn's persistent
messages: a receipt or PUBACK released after that batch covers the record
too.  Readers only ever see what is on disk (``Partition.end`` moves once
the batch is synced; ``written`` is where the next batch starts), so a
record once served is the same record after any crash, and offsets are
never reused.

Chunks: each flush writes one Arrow batch per partition (core/records.py).
Small ones are remembered (the "tail") and, once together they reach
``CHUNK_RECORDS`` or ``CHUNK_BYTES``, rewritten as one chunk under the
first one's key, so a stream fed one message per turn is still read in
large chunks.  A batch of ``FINAL_RECORDS`` or ``FINAL_BYTES`` is large
enough to read as it is, and is written once: under load, most records go
through RocksDB's log once, not twice.

Retention removes whole chunks from the head of a partition: by age
(``max_age_seconds``, never past what a registered reader still needs while
its lease lasts) and by bytes (``max_bytes`` for the whole stream, shared
evenly by its partitions; readers do not hold that back and find their
offsets out of range: data loss, as Kafka reports it).
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import Any, Callable, Iterator, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from twisted.logger import Logger

from core import destination as dest
from core.message import Message
from core.stream_config import (  # noqa: F401  (re-exported: the stream's errors and spec)
    OffsetOutOfRange,
    StreamError,
    StreamSpec,
    UnknownPartition,
    UnknownStream,
)
from core.record_writer import encode_records
from core.records import (
    ChunkHeader,
    chunk_batch,
    chunk_header,
    chunk_message,
    encode_chunk,
    serialize,
)
from core.trie import filter_matches
from persistence.store import Store, StoreUnavailable



class Follower(Protocol):
    """Whatever follows a stream's writes: a consumer's feed (core/stream_feed.py), a long poll."""

    def appended(self, partition: int, base: int, messages: list[Message] | None, timestamps: list[int]) -> None:
        """A batch of ``partition`` from offset ``base`` is on disk.

        ``messages`` is None when nothing followed the stream as the batch was
        written (its messages were let go then): a follower that wants the
        records reads them from the store, where they are by now.
        """

log = Logger(namespace="gateway.core.stream")

STREAM_STATE_KIND = "stream"          # key: stream \0 partition -> first, end, bytes (3 x u64)
STREAM_META_KIND = "stream-meta"      # key: stream -> {"partitions": N} (JSON)
STREAM_READER_KIND = "stream-reader"  # key: stream \0 reader -> {"offsets": {...}, "expires_ms": T}

_STATE = struct.Struct(">QQQ")

# Small chunks are merged once together they reach any of these: records, bytes
# of record data, or chunks (a trickle of one record a turn is read 256 at a time).
CHUNK_RECORDS = 4096
CHUNK_BYTES = 1024 * 1024
CHUNK_PIECES = 256
# A turn's batch of this many records or bytes is a chunk of its own from the start: merging
# it would write its records through RocksDB's log a second time (and a confirmed record
# must be on disk with its turn, so it cannot wait for more).  The price is paid by reads of
# streams fed 64-255 records a turn: a chunk costs a read (the broker's walk, the client's
# IPC parsing and joining) about 13 us, 0.2 us a record at 64 (0.28 against 0.075 us a
# record read in 4,096-record chunks, measured in-process).
FINAL_RECORDS = 64
FINAL_BYTES = 64 * 1024

# Destinations whose streams are remembered; beyond it the cache starts over.
ROUTE_CACHE_SIZE = 10_000


def message_from_record(
    destination: str, message_id: str, timestamp: int, headers: dict[str, str], body: bytes,
    extra: dict[str, str],
) -> Message:
    """A message rebuilt from a record for a stream consumer, with ``extra`` headers (its offset).

    Priority and expiry are not restored (``expires`` stays a header): a
    stream is read in offset order, and its records do not expire on the way out.
    """
    headers = dict(headers)
    fields: dict[str, Any] = {}
    if headers.pop("persistent", None) == "true":
        fields["persistent"] = True
    headers.pop("priority", None)
    for header, name in (("content-type", "content_type"), ("correlation-id", "correlation_id"),
                         ("reply-to", "reply_to"), ("JMSXGroupID", "group_id")):
        value = headers.pop(header, None)
        if value is not None:
            fields[name] = value
    seq = headers.pop("JMSXGroupSeq", None)
    if seq is not None:
        try:
            fields["group_seq"] = int(seq)
        except ValueError:
            pass
    headers.update(extra)
    return Message(message_id, destination, body, headers, timestamp=timestamp, **fields)


class _Small:
    """A small chunk already written, waiting to be merged with the ones after it."""

    __slots__ = ("base", "count", "size", "data", "first_ts", "last_ts")

    def __init__(self, base: int, count: int, size: int, data: int, first_ts: int, last_ts: int) -> None:
        self.base = base
        self.count = count
        self.size = size  # stored bytes
        self.data = data  # its records' bytes (Arrow buffers)
        self.first_ts = first_ts
        self.last_ts = last_ts


class Partition:
    __slots__ = (
        "stream", "index", "first", "end", "written", "bytes", "last_ts", "messages",
        "tail", "tail_records", "tail_bytes", "tail_data",
    )

    def __init__(self, stream: "Stream", index: int) -> None:
        self.stream = stream
        self.index = index
        self.first = 0   # earliest offset kept
        self.end = 0     # offsets below it are on disk (what readers may see)
        self.written = 0  # offsets below it are in the store's batches (synced or not)
        self.bytes = 0   # stored chunk bytes
        self.last_ts = 0
        # This turn's appends: only a reference each on the hot path; the
        # columns are built from them once, when the batch is written.
        self.messages: list[Message] = []
        self.tail: list[_Small] = []
        self.tail_records = 0
        self.tail_bytes = 0  # stored size of the small chunks
        self.tail_data = 0   # their records' bytes (Arrow buffers), what the merged chunk will hold

    @property
    def next(self) -> int:
        """The offset the next append gets: after the written records and this turn's."""
        return self.written + len(self.messages)

    def _timestamps(self, messages: list[Message], now_ms: int) -> list[int]:
        """Each message's broker timestamp (when it arrived), never below the one before."""
        last = self.last_ts
        out = []
        for message in messages:
            ts = message.timestamp or now_ms
            if ts < last:
                ts = last
            last = ts
            out.append(ts)
        self.last_ts = last
        return out

    def write(self, store: Store, now_ms: int) -> tuple[int, list[Message], list[int]] | None:
        """Put the turn's appends into the store's batch; returns (base, messages, timestamps)."""
        messages = self.messages
        if not messages:
            return None
        self.messages = []
        stream = self.stream.name
        base = self.written
        timestamps = self._timestamps(messages, now_ms)
        data, size = encode_records(base, messages, timestamps)
        n = len(messages)
        tail = self.tail
        if n >= FINAL_RECORDS or size >= FINAL_BYTES:
            # Large enough to read well as it is: written once, never rewritten by a merge.
            if len(tail) > 1:
                self._merge(store, None)
            self._forget_tail()
            store.put_chunk(stream, self.index, base, data)
            self.bytes += len(data)
        else:
            tail.append(_Small(base, n, len(data), size, timestamps[0], timestamps[-1]))
            self.tail_records += n
            self.tail_data += size
            full = self.tail_records >= CHUNK_RECORDS or self.tail_data >= CHUNK_BYTES or len(tail) >= CHUNK_PIECES
            if full and self._merge(store, data):  # this turn's chunk, not written yet, included
                self._forget_tail()
            else:
                if full:
                    self._forget_tail()  # not merged (see _merge): left as they are, a new tail after them
                else:
                    self.tail_bytes += len(data)
                store.put_chunk(stream, self.index, base, data)
                self.bytes += len(data)
        self.written = base + n
        self.save(store)
        return base, messages, timestamps

    def _merge(self, store: Store, last: bytes | None) -> bool:
        """The small chunks as one chunk under the first one's key, the others deleted.

        The written ones are read back from the store (recent, so from
        RocksDB's memtable) rather than kept in memory meanwhile; ``last`` is
        this turn's, which is in no store yet.  False, and nothing written,
        when they cannot all be read (a store refusing writes keeps them
        aside until it recovers): they stay as they are, readable, unmerged.
        """
        tail = self.tail
        name = self.stream.name
        written = tail if last is None else tail[:-1]
        batches: list[pa.RecordBatch] = []
        try:
            if written:
                end = written[-1].base + written[-1].count
                for base, data in store.iter_chunks(name, self.index, written[0].base):
                    if base >= end:
                        break
                    if base >= written[0].base:
                        batches.append(chunk_batch(data))
        except StoreUnavailable:
            return False
        if last is not None:
            batches.append(chunk_batch(last))
        if sum(b.num_rows for b in batches) != sum(t.count for t in tail):
            return False
        merged = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        data = encode_chunk(merged, tail[0].first_ts, tail[-1].last_ts)
        store.put_chunk(name, self.index, tail[0].base, data)
        for small in written[1:]:
            store.delete_chunk(name, self.index, small.base)
        self.bytes += len(data) - self.tail_bytes
        return True

    def _forget_tail(self) -> None:
        self.tail = []
        self.tail_records = self.tail_bytes = self.tail_data = 0

    def save(self, store: Store) -> None:
        store.put_record(STREAM_STATE_KIND, f"{self.stream.name}\0{self.index}", _STATE.pack(self.first, self.written, self.bytes))

    def forget_small(self, base: int) -> None:
        """Retention removed the chunk at ``base``: stop tracking it for merges."""
        if self.tail and self.tail[0].base == base:
            small = self.tail.pop(0)
            self.tail_records -= small.count
            self.tail_bytes -= small.size
            self.tail_data -= small.data

    def __repr__(self) -> str:
        return f"<Partition {self.stream.name}/{self.index} [{self.first}, {self.end})>"


class Reader:
    """A registered reader (a Spark query): the offsets it still needs, until its lease runs out."""

    __slots__ = ("name", "offsets", "expires_ms")

    def __init__(self, name: str, offsets: dict[int, int], expires_ms: int) -> None:
        self.name = name
        self.offsets = offsets
        self.expires_ms = expires_ms


class RangeRead:
    """What a range read found: IPC messages to send as they are, and where to go on from."""

    __slots__ = ("messages", "next", "count")

    def __init__(self, messages: list[bytes | memoryview], next: int, count: int) -> None:
        self.messages = messages
        self.next = next
        self.count = count


class Stream:
    def __init__(self, spec: StreamSpec, store: Store) -> None:
        self.spec = spec
        self.name = spec.name
        self.store = store
        self.partitions = [Partition(self, i) for i in range(spec.partitions)]
        self.filters = [(d.partition("://")[0], dest.topic_levels(dest.name_of(d))) for d in spec.destinations]
        self.readers: dict[str, Reader] = {}
        self.feeds: set[Follower] = set()

    def add_feed(self, feed: Follower) -> None:
        """Something following this stream: told of each written batch (``Follower.appended``)."""
        self.feeds.add(feed)

    def remove_feed(self, feed: Follower) -> None:
        self.feeds.discard(feed)

    def matches(self, destination: str) -> bool:
        scheme, _, name = destination.partition("://")
        levels: tuple[str, ...] | None = None
        for f_scheme, f_levels in self.filters:
            if f_scheme != scheme:
                continue
            if levels is None:
                levels = dest.topic_levels(name)
            if filter_matches(f_levels, levels):
                return True
        return False

    def partition_for(self, destination: str) -> Partition:
        return self.partitions[zlib.crc32(destination.encode("utf-8", "surrogateescape")) % len(self.partitions)]

    def partition(self, index: int) -> Partition:
        if not 0 <= index < len(self.partitions):
            raise UnknownPartition(f"stream {self.name!r} has partitions 0-{len(self.partitions) - 1}, not {index}")
        return self.partitions[index]

    # -- reading ----------------------------------------------------------

    def _chunks(self, index: int, pos: int) -> Iterator[tuple[int, bytes, ChunkHeader]]:
        """Stored chunks from the one holding ``pos`` on; stops at a gap (which would be a bug)."""
        for base, data in self.store.iter_chunks(self.name, index, pos):
            header = chunk_header(data)
            if base + header.count <= pos:
                continue
            if base > pos:
                log.error("stream {s}/{p}: offsets {a}-{b} are missing from the store", s=self.name, p=index, a=pos, b=base - 1)
                return
            yield base, data, header
            pos = base + header.count

    def read(self, index: int, start: int, end: int | None = None, max_records: int = 100_000, max_bytes: int = 8 << 20) -> RangeRead:
        """Records ``start <= offset < end``, bounded; the same records every time."""
        p = self.partition(index)
        if start < p.first or start > p.end:
            raise OffsetOutOfRange(
                f"offset {start} of {self.name}/{index} is out of range [{p.first}, {p.end}]"
                + (" (removed by retention)" if start < p.first else ""),
                p.first, p.end,
            )
        stop = p.end if end is None else min(end, p.end)
        messages: list[bytes | memoryview] = []
        pos = start
        count = size = 0
        if pos >= stop:
            return RangeRead(messages, pos, 0)
        for base, data, header in self._chunks(index, pos):
            chunk_end = base + header.count
            take_to = min(chunk_end, stop, pos + (max_records - count))
            whole = pos == base and take_to == chunk_end
            stored = chunk_message(data)
            if whole and size + len(stored) <= max_bytes:
                messages.append(stored)
                size += len(stored)
            else:
                rows = take_to - pos
                per_row = max(1, len(stored) // header.count)
                if size + per_row * rows > max_bytes:
                    # As many as the budget holds, and at least one record per answer.
                    rows = min(rows, (max_bytes - size) // per_row)
                    if rows <= 0:
                        if count:
                            break
                        rows = 1
                    take_to = pos + rows
                piece = serialize(chunk_batch(data).slice(pos - base, rows))
                messages.append(piece)
                size += len(piece)
            count += take_to - pos
            pos = take_to
            # Short of the chunk's end means a bound was reached: the next
            # chunk starts past ``pos``, so going on would skip records.
            if pos < chunk_end or pos >= stop or count >= max_records or size >= max_bytes:
                break
        return RangeRead(messages, pos, count)

    def batches(self, index: int, start: int, end: int | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Decoded batches from ``start`` (trimmed), for consumers that turn records into messages."""
        p = self.partition(index)
        stop = p.end if end is None else min(end, p.end)
        pos = max(start, p.first)
        if pos >= stop:
            return
        for base, data, header in self._chunks(index, pos):
            take_to = min(base + header.count, stop)
            yield pos, chunk_batch(data).slice(pos - base, take_to - pos)
            pos = take_to
            if pos >= stop:
                return

    def offset_for_time(self, index: int, ts_ms: int) -> int:
        """The first offset whose timestamp is at or after ``ts_ms`` (``end`` when none is).

        Timestamps never decrease within a partition, so a binary search over
        chunks (one seek each) finds the chunk, and its timestamp column the row.
        """
        p = self.partition(index)
        lo, hi = p.first, p.end
        if lo >= hi:
            return hi
        # Find the first chunk whose last timestamp reaches ts_ms.
        found: tuple[int, bytes] | None = None
        while lo < hi:
            mid = (lo + hi) // 2
            chunk = next(self.store.iter_chunks(self.name, index, mid), None)
            if chunk is None:
                break
            base, data = chunk
            header = chunk_header(data)
            if header.last_ts >= ts_ms:
                found = chunk
                hi = min(base, mid)
            else:
                lo = max(base + header.count, mid + 1)
        if found is None:
            return p.end
        base, data = found
        header = chunk_header(data)
        if header.first_ts >= ts_ms:
            return max(base, p.first)
        # Sorted within the chunk: how many are earlier is where the first later one stands.
        earlier = pc.sum(pc.less(chunk_batch(data).column(1).cast(pa.int64()), ts_ms)).as_py() or 0
        return max(base + earlier, p.first)

    # -- readers ----------------------------------------------------------

    def protected(self, index: int, now_ms: int) -> int | None:
        """The lowest offset a live reader still needs in partition ``index`` (None: no reader)."""
        low: int | None = None
        for reader in self.readers.values():
            if reader.expires_ms <= now_ms:
                continue
            offset = reader.offsets.get(index, 0)  # a partition it does not know yet: all of it
            if low is None or offset < low:
                low = offset
        return low


class StreamSet:
    """Every configured stream, the routing of destinations to them, and their upkeep."""

    def __init__(self, specs: list[StreamSpec], store: Store, now_ms: Callable[[], int]) -> None:
        self.store = store
        self.now_ms = now_ms
        self.streams: dict[str, Stream] = {spec.name: Stream(spec, store) for spec in specs}
        self.active = bool(self.streams)
        self._routes: dict[str, tuple[Partition, ...]] = {}
        self._dirty: list[Partition] = []
        self._hooked = False
        self.appended = 0

    def get(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            raise UnknownStream(f"unknown stream {name!r}")
        return stream

    def captures(self, destination: str) -> bool:
        """Whether a message to ``destination`` would be appended to some stream."""
        return any(s.matches(destination) for s in self.streams.values())

    # -- appending (the hot path) -----------------------------------------

    def append(self, message: Message) -> None:
        destination = message.destination
        targets = self._routes.get(destination)
        if targets is None:
            if len(self._routes) >= ROUTE_CACHE_SIZE:
                self._routes.clear()
            targets = self._routes[destination] = tuple(
                s.partition_for(destination) for s in self.streams.values() if s.matches(destination)
            )
        if not targets:
            return
        # Read by producers' sessions under the disk alarm: a record is stored whatever the message.
        self.appended += 1
        for partition in targets:
            pending = partition.messages
            if not pending:
                self._dirty.append(partition)
            pending.append(message)
        if not self._hooked:
            self._hooked = True
            self.store.before_flush(self._write)

    def _write(self) -> None:
        """The store is about to write its batch: add the turn's records to it."""
        self._hooked = False
        dirty, self._dirty = self._dirty, []
        written: list[tuple[Partition, int, int, list[Message] | None, list[int]]] = []
        now = self.now_ms()
        for partition in dirty:
            try:
                done = partition.write(self.store, now)
            except Exception:
                # A bug here must not stop every other write of the turn: the turn's
                # records are lost to this stream (its offsets are not used) and it is logged.
                log.failure("stream {s}/{p}: records could not be written", s=partition.stream.name, p=partition.index)
                partition.messages = []
                continue
            if done is not None:
                base, messages, timestamps = done
                # Kept until the sync only for a follower to take them without a read;
                # otherwise let go now, while they are in the cache (freed after the
                # sync they cost a tenth of a record's append, measured), and a
                # follower that comes meanwhile reads them from the store.
                kept = messages if partition.stream.feeds else None
                written.append((partition, base, len(messages), kept, timestamps))
        if written:
            # After the write: live consumers get the new records, and the byte limit is applied.
            # No client waits for this (its receipts wait on their own): let the store
            # choose a sync that does not stop the reactor (persistence/rocks.py).
            self.store.when_durable(lambda: self._written(written), urgent=False)

    def _written(self, written: list[tuple[Partition, int, int, list[Message] | None, list[int]]]) -> None:
        for partition, base, count, messages, timestamps in written:
            partition.end = base + count  # on disk: readers may have it
            stream = partition.stream
            for feed in list(stream.feeds):
                try:
                    feed.appended(partition.index, base, messages, timestamps)
                except Exception:
                    log.failure("stream {s}: a consumer failed to take new records", s=stream.name)
            if stream.spec.max_bytes:
                self._trim(partition, self.now_ms(), by_age=False)

    # -- retention ----------------------------------------------------------

    def sweep(self) -> int:
        """Age and byte retention for every partition, and expired reader leases; returns chunks removed."""
        now = self.now_ms()
        removed = 0
        for stream in self.streams.values():
            for name, reader in list(stream.readers.items()):
                if reader.expires_ms <= now:
                    self.forget_reader(stream.name, name)
            for partition in stream.partitions:
                removed += self._trim(partition, now, by_age=True)
        return removed

    def _trim(self, p: Partition, now: int, by_age: bool) -> int:
        stream = p.stream
        spec = stream.spec
        limit = spec.max_bytes // len(stream.partitions) if spec.max_bytes else 0
        cutoff = now - int(spec.max_age_seconds * 1000) if by_age and spec.max_age_seconds > 0 else None
        protected = stream.protected(p.index, now) if cutoff is not None else None
        removed = 0
        while p.first < p.end:
            over_bytes = limit and p.bytes > limit
            if not over_bytes and cutoff is None:
                break
            chunk = next(self.store.iter_chunks(stream.name, p.index, p.first), None)
            if chunk is None:
                break
            base, data = chunk
            header = chunk_header(data)
            chunk_end = base + header.count
            if chunk_end > p.end:
                break  # never a chunk that holds records readers cannot see yet
            if not over_bytes and cutoff is not None:  # else over_bytes holds, by the break above
                if header.last_ts >= cutoff or (protected is not None and chunk_end > protected):
                    break
            self.store.delete_chunk(stream.name, p.index, base)
            p.forget_small(base)
            p.bytes -= len(data)
            if over_bytes and protected is None:
                # Only the byte limit removes what a reader still needs: tell whoever looks.
                needed = stream.protected(p.index, now)
                if needed is not None and needed < chunk_end:
                    log.warn(
                        "stream {s}/{p}: byte limit removed offsets {a}-{b} that a reader still needed",
                        s=stream.name, p=p.index, a=max(base, needed), b=chunk_end - 1,
                    )
            p.first = chunk_end
            removed += 1
        if removed:
            p.save(self.store)
        return removed

    # -- readers ----------------------------------------------------------

    def register_reader(self, stream_name: str, reader: str, offsets: dict[int, int]) -> None:
        stream = self.get(stream_name)
        expires = self.now_ms() + int(stream.spec.reader_lease_seconds * 1000)
        stream.readers[reader] = Reader(reader, dict(offsets), expires)
        record = {"offsets": {str(k): v for k, v in offsets.items()}, "expires_ms": expires}
        self.store.put_record(STREAM_READER_KIND, f"{stream_name}\0{reader}", json.dumps(record).encode())

    def forget_reader(self, stream_name: str, reader: str) -> None:
        stream = self.get(stream_name)
        if stream.readers.pop(reader, None) is not None:
            self.store.delete_record(STREAM_READER_KIND, f"{stream_name}\0{reader}")

    # -- recovery ---------------------------------------------------------

    def recover(self) -> None:
        """Offsets, byte counts and readers from the store; refuses fewer partitions than stored."""
        store = self.store
        for stream in self.streams.values():
            stored = 0
            for key, raw in store.iter_records(STREAM_META_KIND, stream.name):
                if key == stream.name:
                    stored = int(json.loads(raw).get("partitions", 0))
            if stored > len(stream.partitions):
                raise StreamError(
                    f"stream {stream.name!r} has {stored} partitions in the store; partitions can be added, "
                    f"not removed (configure partitions = {stored} or more)"
                )
            if stored != len(stream.partitions):
                store.put_record(STREAM_META_KIND, stream.name, json.dumps({"partitions": len(stream.partitions)}).encode())
            for key, raw in store.iter_records(STREAM_STATE_KIND, stream.name + "\0"):
                index = int(key.rsplit("\0", 1)[1])
                if index < len(stream.partitions):
                    p = stream.partitions[index]
                    p.first, p.end, p.bytes = _STATE.unpack(raw)
                    p.written = p.end
                    last = None
                    for _, data in store.iter_chunks(stream.name, index, max(p.end - 1, 0)):
                        last = data
                    if last is not None:
                        p.last_ts = chunk_header(last).last_ts
            for key, raw in store.iter_records(STREAM_READER_KIND, stream.name + "\0"):
                name = key.split("\0", 1)[1]
                record = json.loads(raw)
                offsets = {int(k): int(v) for k, v in record.get("offsets", {}).items()}
                stream.readers[name] = Reader(name, offsets, int(record.get("expires_ms", 0)))
            if any(p.end for p in stream.partitions):
                log.info(
                    "stream {s}: recovered {n} records in {p} partitions",
                    s=stream.name, n=sum(p.end - p.first for p in stream.partitions), p=len(stream.partitions),
                )
