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
"""
from __future__ import annotations

import array
import struct
from dataclasses import dataclass
from typing import Iterable, cast

import pyarrow as pa

__all__ = [
    "SCHEMA", "ChunkHeader", "ChunkFormatError", "build_batch", "clean_headers", "encode_chunk", "chunk_header",
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

_HEADER = struct.Struct(">2sBxIqq")  # magic, version, pad, count, first ts, last ts
_MAGIC = b"GS"
_VERSION = 1
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


_TIMESTAMP = SCHEMA.field("timestamp").type
_HEADERS = SCHEMA.field("headers").type
_STRING = pa.string()
_BINARY = pa.binary()
_INT32 = pa.int32()


def _utf8(value: str) -> str:
    # A byte an MQTT name or header carried as surrogateescape: Arrow's UTF-8 cannot hold
    # it, and the turn's records must not be lost for it: U+FFFD, as a lenient decoder shows it.
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def clean_headers(headers: dict[str, str]) -> dict[str, str]:
    """A header map Arrow can hold (see _utf8)."""
    return {_utf8(k): _utf8(v) for k, v in headers.items()}


def _strings(values: list[str]) -> pa.Array:
    try:
        return pa.array(values, _STRING)
    except UnicodeEncodeError:
        return pa.array([_utf8(v) for v in values], _STRING)


def build_batch(
    base: int, timestamps: list[int], destinations: list[str], ids: list[str],
    header_maps: list[dict[str, str]], header_index: list[int] | None, bodies: list[bytes],
) -> pa.RecordBatch:
    """One batch from column lists: conversion happens in Arrow's C++, not per record in Python.

    ``header_maps`` are the distinct header maps of the batch and
    ``header_index`` which one each record has (None: one map per record).
    Converting a dict costs pyarrow a tuple per header, the largest part of a
    batch; the records of a turn mostly carry the same few maps (an MQTT
    device's QoS header), so each distinct one is converted once and the
    column taken from them (0.10 us a record instead of 0.24, measured).
    """
    n = len(bodies)
    # Offsets through array.array: pa.array() of a range or list costs far more for small batches.
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(array.array("q", range(base, base + n)))])
    stamps = pa.Array.from_buffers(_TIMESTAMP, n, [None, pa.py_buffer(array.array("q", timestamps))])
    headers = pa.array(header_maps, _HEADERS)
    if header_index is not None:
        headers = headers.take(pa.array(header_index, _INT32))
    return pa.RecordBatch.from_arrays([
        offsets, stamps, _strings(destinations), _strings(ids), headers, pa.array(bodies, _BINARY),
    ], schema=SCHEMA)


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
