"""A turn's stream records encoded straight into a stored chunk, without pyarrow.

The write path of a stream (``Partition.write``) used to hand Python lists to
pyarrow (``pa.array`` per column, the header maps as lists of tuples, then a
record batch and its IPC serialization): about 10,000 instructions a record
with the calls around them, more than a plain QoS 0 message costs the broker
in all.  The records of a turn are six columns of known types, so this module
writes their Arrow buffers itself: the int64 columns packed with ``array``,
the string and binary columns as one offsets buffer and their data, the header
maps as offsets and their keys and values.  Per record there are a few list
appends; per batch a join of the pieces, one copy of the data.

The result is the same stored chunk as ``core.records.encode_chunk`` makes of
the same records: the 24-byte chunk header and an encapsulated Arrow IPC
record batch message of ``core.records.SCHEMA``.  Only the layout of the
message's flatbuffer metadata differs from what pyarrow writes (any reader of
Arrow IPC reads both); ``tests/unit/test_records.py`` reads what this writes
with pyarrow and compares it with pyarrow's own conversion.

The metadata (an Arrow ``Message`` whose header is a ``RecordBatch``) has the
same shape for every batch of this schema (9 field nodes, 22 buffers), so it
is a template of 584 bytes into which a batch's lengths are packed.
"""
from __future__ import annotations

import struct
import sys
from array import array
from typing import Final

from core.message import Message

__all__ = ["CHUNK_HEADER", "CHUNK_MAGIC", "CHUNK_VERSION", "encode_records", "record_headers", "utf8"]

# The stored chunk's header: magic, version, pad, record count, first and last timestamp.
CHUNK_HEADER: Final = struct.Struct(">2sBxIqq")
CHUNK_MAGIC: Final = b"GS"
CHUNK_VERSION: Final = 1

_LITTLE: Final = sys.byteorder == "little"

# -- the metadata template ----------------------------------------------------
#
# A flatbuffer laid out by hand (positions from its start; every offset is
# relative to the field that holds it, a table starts with the signed distance
# back to its vtable, a vtable is u16s: its size, the table's size, each
# field's position in the table):
#
#   0  u32  root -> Message table at 16
#   4  vtable of Message: 12 bytes, table 20 bytes; version @16, header_type @18, header @4, bodyLength @8
#  16  Message: soffset 12; header (u32 -> 52) at 20; bodyLength (i64) at 24; version (i16, V5 = 4) at 32;
#      header_type (u8, RecordBatch = 3) at 34
#  36  vtable of RecordBatch: 10 bytes, table 20 bytes; length @4, nodes @12, buffers @16
#  52  RecordBatch: soffset 16; length (i64) at 56; nodes (u32 -> 76) at 64; buffers (u32 -> 228) at 68
#  76  u32 9, then 9 FieldNode structs (length, null_count: i64 each) at 80
# 228  u32 22, then 22 Buffer structs (offset, length: i64 each) at 232; ends at 584
_NODES: Final = 9
_BUFFERS: Final = 22
_META_SIZE: Final = 584
_BODY_LENGTH_AT: Final = 24
_LENGTH_AT: Final = 56
_NODES_AT: Final = 80
_BUFFERS_AT: Final = 232


def _template() -> bytes:
    meta = bytearray(_META_SIZE)
    struct.pack_into("<I", meta, 0, 16)
    struct.pack_into("<6H", meta, 4, 12, 20, 16, 18, 4, 8)
    struct.pack_into("<iI", meta, 16, 12, 52 - 20)
    struct.pack_into("<hB", meta, 32, 4, 3)
    struct.pack_into("<5H", meta, 36, 10, 20, 4, 12, 16)
    struct.pack_into("<i", meta, 52, 16)
    struct.pack_into("<II", meta, 64, 76 - 64, 228 - 68)
    struct.pack_into("<I", meta, 76, _NODES)
    struct.pack_into("<I", meta, 228, _BUFFERS)
    return bytes(meta)


_META: Final = _template()
# An encapsulated IPC message: the continuation marker and the metadata's length, then it.
_PREFIX: Final = struct.pack("<Ii", 0xFFFFFFFF, _META_SIZE)
_LENGTHS: Final = struct.Struct("<" + "q" * (2 * _NODES))
_PLACES: Final = struct.Struct("<" + "q" * (2 * _BUFFERS))
_I64: Final = struct.Struct("<q")
_PAD: Final = [b"\0" * i for i in range(8)]


# -- record headers -----------------------------------------------------------


def _structured(message: Message) -> bool:
    """Whether a message has a field besides ``persistent`` that its record keeps as a header."""
    return (
        message.content_type is not None or message.correlation_id is not None or message.reply_to is not None
        or message.priority != 4 or message.expiration != 0 or message.group_id is not None
    )


# Message fields kept as record headers, under the names STOMP gives them.
def record_headers(message: Message) -> dict[str, str]:
    """A record's header map: the message's headers plus its structured fields, when set."""
    headers = message.headers
    if not (message.persistent or _structured(message)):
        return headers  # the common case: no copy
    out = dict(headers)
    if message.persistent:
        out["persistent"] = "true"
    if message.priority != 4:
        out["priority"] = str(message.priority)
    if message.expiration:
        out["expires"] = str(message.expiration)
    if message.content_type is not None:
        out["content-type"] = message.content_type
    if message.correlation_id is not None:
        out["correlation-id"] = message.correlation_id
    if message.reply_to is not None:
        out["reply-to"] = message.reply_to
    if message.group_id is not None:
        out["JMSXGroupID"] = message.group_id
        out["JMSXGroupSeq"] = str(message.group_seq)
    return out


def utf8(value: str) -> bytes:
    """A string as Arrow's UTF-8 holds it.

    A byte that an MQTT name or header carried as surrogateescape cannot be
    UTF-8: it becomes U+FFFD, as a lenient decoder shows it, rather than
    losing the turn's records.
    """
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace").encode("utf-8")


# -- the columns ----------------------------------------------------------------


class _Body:
    """The IPC message's body as pieces to join, and the Buffer entries that describe them."""

    __slots__ = ("pieces", "places", "pos")

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.places: list[int] = []
        self.pos = 0

    def absent(self) -> None:
        """A validity buffer left out: no column here has nulls."""
        self.places.append(self.pos)
        self.places.append(0)

    def add(self, data: bytes) -> None:
        size = len(data)
        self.pieces.append(data)
        self._close(size)

    def add_all(self, items: list[bytes], size: int) -> None:
        """One buffer of ``items`` joined, ``size`` bytes, without joining them twice."""
        self.pieces.extend(items)
        self._close(size)

    def _close(self, size: int) -> None:
        self.places.append(self.pos)
        self.places.append(size)
        pad = -size & 7
        if pad:
            self.pieces.append(_PAD[pad])
        self.pos += size + pad


def _offsets(sizes: list[int]) -> bytes:
    out = array("i", sizes)
    if not _LITTLE:
        out.byteswap()
    return out.tobytes()


def _int64s(values: "array[int]") -> bytes:
    if not _LITTLE:
        values.byteswap()
    return values.tobytes()


def _strings(body: _Body, values: list[str]) -> None:
    """A string column: validity (none), int32 offsets, UTF-8 data."""
    body.absent()
    joined = "".join(values)
    offsets = [0]
    total = 0
    if joined.isascii():
        # One encode for the column; a character is a byte.
        for value in values:
            total += len(value)
            offsets.append(total)
        body.add(_offsets(offsets))
        body.add(joined.encode("ascii"))
        return
    parts = [utf8(value) for value in values]
    for part in parts:
        total += len(part)
        offsets.append(total)
    body.add(_offsets(offsets))
    body.add_all(parts, total)


def _same_strings(body: _Body, value: str, n: int) -> None:
    """A string column whose ``n`` values are one string (a partition fed by one destination)."""
    body.absent()
    data = value.encode("ascii") if value.isascii() else utf8(value)
    size = len(data)
    body.add(_offsets(list(range(0, size * (n + 1), size)) if size else [0] * (n + 1)))
    body.add(data * n)


def _binaries(body: _Body, values: list[bytes]) -> None:
    body.absent()
    offsets = [0]
    total = 0
    for value in values:
        total += len(value)
        offsets.append(total)
    body.add(_offsets(offsets))
    body.add_all(values, total)


def encode_records(base: int, messages: list[Message], timestamps: list[int]) -> tuple[bytes, int]:
    """The stored chunk of ``messages`` at offsets from ``base``, and its records' data size in bytes.

    ``timestamps`` are the records' (never decreasing).  The size is that of
    the Arrow buffers, each padded to 8 bytes (the message's body).
    """
    n = len(messages)
    ids: list[str] = []
    bodies: list[bytes] = []
    keys: list[str] = []
    values: list[str] = []
    map_offsets = [0]
    entries = 0
    destination = messages[0].destination
    one_destination = True
    # The header entries of the last plain record: the records of a turn mostly carry
    # equal maps (an MQTT device's QoS header), compared as dicts, not rebuilt.
    last: dict[str, str] | None = None
    last_persistent = False
    last_keys: list[str] = []
    last_values: list[str] = []
    for m in messages:
        ids.append(m.id)
        bodies.append(m.body)
        if one_destination and m.destination != destination:
            one_destination = False
        headers = m.headers
        if _structured(m):
            full = record_headers(m)
            keys.extend(full.keys())
            values.extend(full.values())
            entries += len(full)
        else:
            if headers is not last or m.persistent != last_persistent:
                if last is None or m.persistent != last_persistent or headers != last:
                    full = record_headers(m)
                    last_keys = list(full.keys())
                    last_values = list(full.values())
                    last_persistent = m.persistent
                last = headers
            keys.extend(last_keys)
            values.extend(last_values)
            entries += len(last_keys)
        map_offsets.append(entries)

    pieces: list[bytes] = []
    body = _Body(pieces)
    body.absent()
    body.add(_int64s(array("q", range(base, base + n))))
    body.absent()
    body.add(_int64s(array("q", timestamps)))
    if one_destination:
        _same_strings(body, destination, n)
    else:
        _strings(body, [m.destination for m in messages])
    _strings(body, ids)
    body.absent()  # the map: validity, offsets
    body.add(_offsets(map_offsets))
    body.absent()  # its entries (a struct): validity only
    _strings(body, keys)
    _strings(body, values)
    _binaries(body, bodies)

    meta = bytearray(_META)
    _I64.pack_into(meta, _BODY_LENGTH_AT, body.pos)
    _I64.pack_into(meta, _LENGTH_AT, n)
    _LENGTHS.pack_into(meta, _NODES_AT, n, 0, n, 0, n, 0, n, 0, n, 0, entries, 0, entries, 0, entries, 0, n, 0)
    _PLACES.pack_into(meta, _BUFFERS_AT, *body.places)
    head = CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, n, timestamps[0], timestamps[-1])
    return b"".join([head, _PREFIX, meta, *pieces]), body.pos
