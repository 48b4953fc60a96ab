"""Stream records as Arrow record batches, and the chunks that store them.

A stream's records are stored and served in the shape Spark reads: each
chunk is one Arrow record batch (a group commit's appends to one partition,
merged with its neighbours once they are small), so a range read sends whole
chunks as they lie on disk and only trims the two ends.  Decoding stored
messages one by one would cap reads at about 225k records/s here; Kafka
avoids per-record work the same way, by storing and serving record batches.

A chunk is a fixed 24-byte header (magic, version, record count, first and
last timestamp) followed by the batch as an encapsulated Arrow IPC message.
The header lets retention and timestamp lookups decide without touching the
batch, and its size keeps the batch's buffers 8-byte aligned so reading one
is zero-copy.

A turn's records are written by ``core/record_writer.py`` (its buffers built
directly); a merge of small chunks goes through pyarrow here.  Both are the
same format, and a reader cannot tell them apart.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, cast

import pyarrow as pa

from core.record_writer import CHUNK_HEADER, CHUNK_MAGIC, CHUNK_VERSION

__all__ = [
    "SCHEMA", "ChunkHeader", "ChunkFormatError", "encode_chunk", "chunk_header",
    "chunk_batch", "chunk_message", "ipc_stream", "EMPTY_STREAM",
]

SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("destination", pa.string(), nullable=False),
    pa.field("message_id", pa.string(), nullable=False),
    pa.field("headers", pa.map_(pa.string(), pa.string()), nullable=False),
    pa.field("body", pa.binary(), nullable=False),
])

_HEADER = CHUNK_HEADER  # magic, version, pad, count, first ts, last ts
_MAGIC = CHUNK_MAGIC
_VERSION = CHUNK_VERSION
_SCHEMA_MESSAGE = SCHEMA.serialize().to_pybytes()
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# An IPC stream with the schema and no records: a range with nothing in it.
EMPTY_STREAM = _SCHEMA_MESSAGE + _EOS


class ChunkFormatError(ValueError):
    """A stored chunk this version cannot read."""


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    count: int
    first_ts: int
    last_ts: int


def encode_chunk(batch: pa.RecordBatch, first_ts: int, last_ts: int) -> bytes:
    # Joined from Arrow's buffer: one copy of the records, where to_pybytes() and + made two.
    return b"".join((_HEADER.pack(_MAGIC, _VERSION, batch.num_rows, first_ts, last_ts), batch.serialize()))


def chunk_header(data: bytes) -> ChunkHeader:
    try:
        magic, version, count, first_ts, last_ts = _HEADER.unpack_from(data, 0)
    except struct.error as exc:
        raise ChunkFormatError(f"truncated stream chunk: {exc}") from None
    if magic != _MAGIC or version != _VERSION:
        raise ChunkFormatError(f"unknown stream chunk format {magic!r} v{version}")
    return ChunkHeader(count, first_ts, last_ts)


def chunk_message(data: bytes) -> memoryview:
    """The chunk's batch as it is stored: an IPC message that can go on the wire unchanged."""
    return memoryview(data)[_HEADER.size:]


def chunk_batch(data: bytes) -> pa.RecordBatch:
    chunk_header(data)
    return pa.ipc.read_record_batch(pa.py_buffer(data).slice(_HEADER.size), SCHEMA)


def ipc_stream(messages: Iterable[bytes | memoryview]) -> list[bytes | memoryview]:
    """The pieces of an Arrow IPC stream: the schema, the batches' messages, the end marker.

    Returned as pieces, not joined, so the caller writes stored chunks to the
    socket without copying them into one buffer first.
    """
    return [_SCHEMA_MESSAGE, *messages, _EOS]


def serialize(batch: pa.RecordBatch) -> bytes:
    """A batch (a trimmed end of a range) as an IPC message."""
    return cast(bytes, batch.serialize().to_pybytes())  # pyarrow is untyped
