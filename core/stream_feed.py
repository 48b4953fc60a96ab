"""A protocol consumer reading a stream from an offset on, then following it live.

The consumer gets an ordinary (unstored) queue of its own, so acks,
prefetch and TCP back-pressure work as they do everywhere; the feed keeps
that queue topped up from the stream.  Catching up reads chunks from the
store a window at a time; once a partition is read to its end the feed takes
new records straight from the append (no store read) as each batch is
written.  Acks only release credit: nothing is removed from a stream by
consuming it (RabbitMQ's stream semantics).
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pyarrow as pa

from core.entry import Entry
from core.message import Message
from core.stream import Stream, message_from_record
from core.stream_config import OffsetOutOfRange

if TYPE_CHECKING:
    from core.queue import MessageQueue

# Records a feed keeps waiting in its queue; below LOW it reads more, up to WINDOW.
LOW = 128
WINDOW = 512


def resolve_offsets(stream: Stream, spec: str, partition: int | None, now_ms: int) -> list[int | None]:
    """Where each partition starts for an ``x-stream-offset`` value (RabbitMQ's names).

    ``first``, ``last`` (the last record), ``next`` (only new records), an
    offset (``N`` or ``offset=N``), or ``timestamp=<seconds>``.  With
    ``partition`` only that partition is read; the others are None.
    """
    text = spec.strip()
    positions: list[int | None] = []
    for p in stream.partitions:
        if partition is not None and p.index != partition:
            positions.append(None)
            continue
        if text == "first":
            positions.append(p.first)
        elif text == "last":
            positions.append(max(p.first, p.end - 1))
        elif text == "next":
            positions.append(p.end)
        elif text.startswith("timestamp="):
            try:
                seconds = float(text[len("timestamp="):])
            except ValueError:
                raise ValueError(f"x-stream-offset timestamp must be epoch seconds, got {text!r}") from None
            positions.append(stream.offset_for_time(p.index, int(seconds * 1000)))
        else:
            number = text[len("offset="):] if text.startswith("offset=") else text
            try:
                offset = int(number)
            except ValueError:
                raise ValueError(
                    f"x-stream-offset must be first, last, next, an offset or timestamp=<seconds>, got {text!r}"
                ) from None
            if offset < 0:
                raise ValueError(f"x-stream-offset must not be negative, got {offset}")
            # As RabbitMQ: an offset before the first kept starts at the first, past the end at the end.
            positions.append(min(max(offset, p.first), p.end))
    return positions


class StreamFeed:
    __slots__ = ("stream", "queue", "positions", "_filling", "_seq", "_tag_partition", "closed")

    def __init__(self, stream: Stream, queue: "MessageQueue", positions: list[int | None]) -> None:
        self.stream = stream
        self.queue = queue
        self.positions = positions
        self._filling = False
        self._seq = itertools.count(1)
        # Multi-partition streams say which partition an offset belongs to.
        self._tag_partition = len(stream.partitions) > 1
        self.closed = False
        stream.add_feed(self)

    def close(self) -> None:
        self.closed = True
        self.stream.remove_feed(self)

    def _extra(self, partition: int, offset: int) -> dict[str, str]:
        if self._tag_partition:
            return {"x-stream-offset": str(offset), "x-stream-partition": str(partition)}
        return {"x-stream-offset": str(offset)}

    def fill(self) -> None:
        """Read from the store until the queue holds a window or every partition is at its end."""
        if self._filling or self.closed:
            return
        self._filling = True
        try:
            queue = self.queue
            while len(queue) < LOW and queue.consumers:
                loaded = 0
                for index, position in enumerate(self.positions):
                    if position is None:
                        continue
                    room = WINDOW - len(queue)
                    if room <= 0:
                        break
                    loaded += self._read(index, position, room)
                if not loaded:
                    break
                queue.dispatch()
        finally:
            self._filling = False

    def _read(self, index: int, position: int, room: int) -> int:
        partition = self.stream.partitions[index]
        if position < partition.first:
            position = partition.first  # retention went past this consumer: it goes on from the first kept
        end = min(partition.end, position + room)
        loaded = 0
        try:
            batches = list(self.stream.batches(index, position, end))
        except OffsetOutOfRange:
            batches = []
        seqs = self._seq
        for start, batch in batches:
            columns = batch.to_pydict()
            timestamps = batch.column(1).cast(pa.int64()).to_pylist()
            self.queue.refilled(
                Entry(message_from_record(destination, message_id, ts, dict(headers), body, self._extra(index, start + i)), next(seqs))
                for i, (ts, destination, message_id, headers, body) in enumerate(zip(
                    timestamps, columns["destination"], columns["message_id"], columns["headers"], columns["body"],
                ))
            )
            loaded += batch.num_rows
            position = start + batch.num_rows
        self.positions[index] = position
        return loaded

    def appended(self, index: int, base: int, messages: list[Message] | None, timestamps: list[int]) -> None:
        """New records were written; take them directly when this feed was at the end."""
        position = self.positions[index]
        if self.closed or position is None:
            return
        queue = self.queue
        if messages is None or position != base or len(queue) + len(messages) > WINDOW:
            self.fill()  # behind, full, or begun after the write: the store has them
            return
        seqs = self._seq
        entries: list[Entry] = []
        for i, (message, ts) in enumerate(zip(messages, timestamps)):
            headers = dict(message.headers)
            if message.expiration:
                headers["expires"] = str(message.expiration)
            headers.update(self._extra(index, base + i))
            # Offset order, not priority; a log's records do not expire on their way out.
            entries.append(Entry(message.copy(headers=headers, timestamp=ts, priority=4, expiration=0, origin=None), next(seqs)))
        queue.refilled(entries)
        self.positions[index] = base + len(messages)
        queue.dispatch()
