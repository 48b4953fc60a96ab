"""A turn's stream records encoded straight into a stored chunk, without pyarrow.

The write path of a stream (``Partition.write``) used to hand Python lists to
pyarrow (``pa.array`` per column, the header maps as lists of tuples, a
``take`` of them, then a record batch and its IPC serialization), a cost per
record and per batch that made a stream add a third to a QoS 0 message's.
The records of a turn are six columns of known types, so this module writes
their Arrow buffers itself: the int64 columns packed with ``struct``, each
string and binary column as an offsets buffer (``accumulate`` over the
lengths) and its data (one encode of the joined column when it is ASCII), the
header maps as offsets and their keys and values, built by repetition when
every record has the same map.  Per record there are a few list appends and a
comparison of its header map with the one before; per batch a join of the
pieces, one copy of the data.

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
from itertools import accumulate
from typing import Final

from core.message import Message

__all__ = ["CHUNK_HEADER", "CHUNK_MAGIC", "CHUNK_VERSION", "encode_records", "record_headers", "utf8"]

# The stored chunk's header: magic, version, pad, record count, first and last timestamp.
CHUNK_HEADER: Final = struct.Struct(">2sBxIqq")
CHUNK_MAGIC: Final = b"GS"
CHUNK_VERSION: Final = 1

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


# -- integers as bytes ------------------------------------------------------------
#
# Packing Python ints one by one costs: ``array('i', values)`` converts each
# through PyArg_Parse (about 150 instructions), struct about 80 with the
# iteration around it.  The columns of a turn are mostly regular: one
# destination, ids and bodies of one length, one header map, one timestamp.
# An offsets buffer always starts at 0, so a regular column's is a prefix of
# one series that depends only on the lengths of the values in a block (a
# record's): cached, and sliced per batch.

_PACKERS: dict[int, struct.Struct] = {}
_SERIES: dict[tuple[int, ...], bytes] = {}
_SERIES_BYTES = [0]
_SERIES_LIMIT: Final = 8 << 20  # bytes of cached series; past it the cache starts over
_LARGEST_SERIES: Final = 1 << 16  # blocks; a longer column is packed one by one


def _packed(code: str, values: list[int]) -> bytes:
    """Little-endian int32 (``code`` "i") or int64 ("q") values, one by one."""
    count = len(values)
    key = count * 2 + (code == "q")
    packer = _PACKERS.get(key)
    if packer is None:
        if len(_PACKERS) >= 512:
            _PACKERS.clear()
        packer = _PACKERS[key] = struct.Struct(f"<{count}{code}")
    return packer.pack(*values)


def _int64s(values: list[int]) -> bytes:
    """Never-decreasing int64s (the timestamps): a run of equal ones packed once.

    A turn's records arrive within a few milliseconds, so its timestamps are
    a few runs; packed one by one, each value was a Python int parsed by
    struct.  Past ``_MAX_RUNS`` runs they are packed one by one after all.
    """
    first = values[0]
    n = len(values)
    if first == values[-1]:  # never decreasing: all equal
        return _I64.pack(first) * n
    runs: list[bytes] = []
    value = first
    start = 0
    i = 0
    for v in values:
        if v != value:
            if len(runs) >= _MAX_RUNS:
                return _packed("q", values)
            runs.append(_I64.pack(value) * (i - start))
            value = v
            start = i
        i += 1
    runs.append(_I64.pack(value) * (n - start))
    return b"".join(runs)


_MAX_RUNS: Final = 32

# The offsets column is base, base + 1, ...: read as one little-endian integer it
# is base * ONES + STEPS (ONES: a 1 in each 64-bit word; STEPS: 0, 1, 2, ... in
# them), whose bytes are the column.  A multiplication, an addition and to_bytes
# are three C loops over the turn's 8n bytes, where struct parsed a Python int
# made for each record.  Kept for each count of records seen, within a bound.
_SEQUENCES: dict[int, tuple[int, int]] = {}
_SEQUENCE_BYTES = [0]
_SEQUENCE_LIMIT: Final = 8 << 20  # bytes of cached integers; past it the cache starts over
_LONGEST_SEQUENCE: Final = 1 << 16


def _sequence(base: int, n: int) -> bytes:
    """The int64 offsets ``base`` .. ``base + n - 1``, little-endian (0 <= base, base + n <= 2**63)."""
    if n > _LONGEST_SEQUENCE:
        return _packed("q", list(range(base, base + n)))
    found = _SEQUENCES.get(n)
    if found is None:
        if _SEQUENCE_BYTES[0] > _SEQUENCE_LIMIT:
            _SEQUENCES.clear()
            _SEQUENCE_BYTES[0] = 0
        ones = int.from_bytes(_ONE * n, "little")
        steps = int.from_bytes(_packed("q", list(range(n))), "little")
        found = _SEQUENCES[n] = (ones, steps)
        _SEQUENCE_BYTES[0] += 16 * n
    ones, steps = found
    return (base * ones + steps).to_bytes(8 * n, "little")


_ONE: Final = _I64.pack(1)


def _uniform_offsets(body: _Body, lengths: list[int], n: int) -> int:
    """The int32 offsets of n blocks of values of these byte lengths; returns the last offset."""
    step = sum(lengths)
    end = step * n
    if end >= 1 << 31:
        raise ValueError(f"a stream batch of {end} bytes in one column is over Arrow's 2 GiB")
    if not lengths:  # a map with no entries: no values, one offset
        body.add(bytes(4))
        return 0
    k = len(lengths)
    size = 4 * (k * n + 1)
    key = tuple(lengths)
    series = _SERIES.get(key)
    if series is None or len(series) < size:
        capacity = 256
        while capacity < n:
            capacity *= 2
        if n > _LARGEST_SERIES or step * capacity >= 1 << 31:  # a series this long is not kept
            body.add(_packed("i", list(accumulate(lengths * n, initial=0))))
            return end
        if _SERIES_BYTES[0] > _SERIES_LIMIT:
            _SERIES.clear()
            _SERIES_BYTES[0] = 0
        series = _SERIES[key] = _packed("i", list(accumulate(lengths * capacity, initial=0)))
        _SERIES_BYTES[0] += len(series)
    body.add(series[:size])
    return end


def _offsets(body: _Body, lengths: list[int]) -> None:
    """The int32 offsets buffer of values of these byte lengths."""
    body.add(_packed("i", list(accumulate(lengths, initial=0))))


def _strings(body: _Body, values: list[str], same_length: bool) -> None:
    """A string column: validity (none), int32 offsets, UTF-8 data."""
    body.absent()
    joined = "".join(values)
    if joined.isascii():
        # One encode for the column; a character is a byte.
        if same_length:
            _uniform_offsets(body, [len(values[0])], len(values))
        else:
            _offsets(body, list(map(len, values)))
        body.add(joined.encode("ascii"))
        return
    parts = [utf8(value) for value in values]
    lengths = list(map(len, parts))
    _offsets(body, lengths)
    body.add_all(parts, sum(lengths))


def _repeated(body: _Body, values: list[str], n: int) -> None:
    """A string column of ``values`` over and over, ``n`` times (a map's keys when every record has it)."""
    body.absent()
    parts = [utf8(value) for value in values]
    _uniform_offsets(body, list(map(len, parts)), n)
    body.add(b"".join(parts) * n)


def _binaries(body: _Body, values: list[bytes], same_length: bool) -> None:
    body.absent()
    if same_length:
        size = _uniform_offsets(body, [len(values[0])], len(values))
    else:
        lengths = list(map(len, values))
        _offsets(body, lengths)
        size = sum(lengths)
    body.add_all(values, size)


class _Entries:
    """A record's header map as two lists, made once for the records of a turn that share it."""

    __slots__ = ("keys", "values")

    def __init__(self, headers: dict[str, str]) -> None:
        self.keys = list(headers.keys())
        self.values = list(headers.values())


def encode_records(base: int, messages: list[Message], timestamps: list[int]) -> tuple[bytes, int]:
    """The stored chunk of ``messages`` at offsets from ``base``, and its records' data size in bytes.

    ``timestamps`` are the records' (never decreasing).  The size is that of
    the Arrow buffers, each padded to 8 bytes (the message's body).
    """
    n = len(messages)
    head = messages[0]
    destination = head.destination
    one_destination = True
    id_length = len(head.id)
    ids_alike = True  # of one length
    body_length = len(head.body)
    bodies_alike = True
    # The records of a turn mostly carry equal header maps (an MQTT device's QoS
    # header): compared as dicts with the last one, not converted again.  Each
    # record's map is listed only once they differ.
    last: dict[str, str] | None = None
    last_persistent = False
    entries = first = _Entries({})
    maps: list[_Entries] = []
    uniform = True
    i = 0
    for m in messages:
        if one_destination and m.destination != destination:
            one_destination = False
        if ids_alike and len(m.id) != id_length:
            ids_alike = False
        if bodies_alike and len(m.body) != body_length:
            bodies_alike = False
        headers = m.headers
        if _structured(m):
            entries = _Entries(record_headers(m))
            last = None
        elif headers is not last or m.persistent != last_persistent:
            if last is None or m.persistent != last_persistent or headers != last:
                entries = _Entries(record_headers(m))
                last_persistent = m.persistent
            last = headers
        if i == 0:
            first = entries
        elif uniform and entries is not first:
            uniform = False
            maps = [first] * i
        if not uniform:
            maps.append(entries)
        i += 1
    ids = [m.id for m in messages]
    bodies = [m.body for m in messages]

    pieces: list[bytes] = [b"", _PREFIX, b""]  # the chunk header and the metadata go in last
    body = _Body(pieces)
    body.absent()
    body.add(_sequence(base, n))
    body.absent()
    body.add(_int64s(timestamps))
    if one_destination:
        _repeated(body, [destination], n)
    else:
        _strings(body, [m.destination for m in messages], False)
    _strings(body, ids, ids_alike)
    body.absent()  # the map: validity, offsets
    if uniform:
        total = _uniform_offsets(body, [len(first.keys)], n)
        body.absent()  # its entries (a struct): validity only
        _repeated(body, first.keys, n)
        _repeated(body, first.values, n)
    else:
        keys: list[str] = []
        values: list[str] = []
        counts: list[int] = []
        for each in maps:
            keys.extend(each.keys)
            values.extend(each.values)
            counts.append(len(each.keys))
        total = len(keys)
        _offsets(body, counts)
        body.absent()
        _strings(body, keys, False)
        _strings(body, values, False)
    _binaries(body, bodies, bodies_alike)

    meta = bytearray(_META)
    _I64.pack_into(meta, _BODY_LENGTH_AT, body.pos)
    _I64.pack_into(meta, _LENGTH_AT, n)
    _LENGTHS.pack_into(meta, _NODES_AT, n, 0, n, 0, n, 0, n, 0, n, 0, total, 0, total, 0, total, 0, n, 0)
    _PLACES.pack_into(meta, _BUFFERS_AT, *body.places)
    pieces[0] = CHUNK_HEADER.pack(CHUNK_MAGIC, CHUNK_VERSION, n, timestamps[0], timestamps[-1])
    pieces[2] = bytes(meta)
    return b"".join(pieces), body.pos
