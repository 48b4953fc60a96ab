"""Stored stream chunks: their header, their batch, and the IPC stream a range read serves."""
from __future__ import annotations

import pyarrow as pa
import pytest

from core.message import Message
from core.record_writer import encode_records
from core.records import EMPTY_STREAM, ChunkFormatError, chunk_batch, chunk_header, chunk_message, encode_chunk, ipc_stream
from tests.unit.test_record_writer import reference


def test_chunks_written_by_pyarrow_and_by_the_writer_read_as_one_stream():
    # What the broker stored before (pyarrow's IPC writer) and what it stores now.
    old = [Message("ID:1", "topic://t", b"old", {"k": "v"})]
    new = [Message("ID:2", "topic://t", b"new", {})]
    before = encode_chunk(reference(0, old, [1]), 1, 1)
    after, _ = encode_records(1, new, [2])
    table = pa.ipc.open_stream(pa.py_buffer(b"".join(ipc_stream([chunk_message(before), chunk_message(after)])))).read_all()
    assert table.column("body").to_pylist() == [b"old", b"new"]
    assert table.column("headers").to_pylist() == [[("k", "v")], []]
    assert pa.concat_batches([chunk_batch(before), chunk_batch(after)]).num_rows == 2


def test_the_empty_stream_reads_as_no_records():
    assert pa.ipc.open_stream(pa.py_buffer(EMPTY_STREAM)).read_all().num_rows == 0


def test_a_chunk_of_another_format_or_cut_short_is_refused_by_name():
    data, _ = encode_records(0, [Message("ID:1", "topic://t", b"x", {})], [5])
    assert chunk_header(data).count == 1
    with pytest.raises(ChunkFormatError, match="unknown stream chunk format b'GS' v9"):
        chunk_header(data[:2] + b"\x09" + data[3:])
    with pytest.raises(ChunkFormatError, match="unknown stream chunk format b'XX' v1"):
        chunk_batch(b"XX" + data[2:])
    with pytest.raises(ChunkFormatError, match="truncated stream chunk"):
        chunk_header(data[:10])
