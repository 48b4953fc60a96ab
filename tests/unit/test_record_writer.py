"""core.record_writer: stream records written straight into Arrow buffers read back as pyarrow's own conversion makes them."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.message import Message
from core.record_writer import encode_records
from core.records import SCHEMA, chunk_batch, chunk_header, chunk_message, encode_chunk, ipc_stream
from core.record_writer import record_headers


def reference(base, messages, timestamps):
    """The batch as pa.array() converts Python objects (what the broker wrote before)."""
    return pa.RecordBatch.from_arrays([
        pa.array(range(base, base + len(messages)), pa.int64()),
        pa.array(timestamps, SCHEMA.field("timestamp").type),
        pa.array([m.destination for m in messages], pa.string()),
        pa.array([m.id for m in messages], pa.string()),
        pa.array([list(record_headers(m).items()) for m in messages], SCHEMA.field("headers").type),
        pa.array([m.body for m in messages], pa.binary()),
    ], schema=SCHEMA)


def written(base, messages, timestamps):
    data, size = encode_records(base, messages, timestamps)
    header = chunk_header(data)
    assert (header.count, header.first_ts, header.last_ts) == (len(messages), timestamps[0], timestamps[-1])
    batch = chunk_batch(data)
    batch.validate(full=True)
    assert batch.get_total_buffer_size() <= size < batch.get_total_buffer_size() + 22 * 8  # padded to 8 each
    # As a range read serves it: the stored message in an IPC stream, read by Spark's side.
    table = pa.ipc.open_stream(pa.py_buffer(b"".join(ipc_stream([chunk_message(data)])))).read_all()
    assert table.to_batches()[0].equals(batch)
    return batch


def test_the_same_batch_as_pyarrows_conversion():
    messages = [
        Message("ID:gw-1", "topic://sensors.a", b"", {}),
        Message("ID:gw-2", "queue://orders", b"\x00\xff binary", {"mqtt-qos": "1"}, persistent=True),
        Message("ID:gw-3", "topic://sensors.a", b"x" * 1000, {"k": ""}),
    ]
    timestamps = [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_001]
    batch = written(1000, messages, timestamps)
    assert batch.equals(reference(1000, messages, timestamps))
    assert batch.column("offset").to_pylist() == [1000, 1001, 1002]
    assert batch.column("headers")[1].as_py() == [("mqtt-qos", "1"), ("persistent", "true")]


def test_the_same_bytes_as_pyarrow_but_for_the_metadata():
    messages = [Message(f"ID:{i}", "topic://perf.x", b"y" * (i % 70), {"mqtt-qos": "0"}) for i in range(300)]
    timestamps = list(range(5, 305))
    ours, _ = encode_records(7, messages, timestamps)
    theirs = encode_chunk(reference(7, messages, timestamps), 5, 304)
    assert ours[:24] == theirs[:24]  # the chunk header

    def body(data):
        # After the chunk header, the continuation marker, the metadata's length and the metadata.
        return data[32 + int.from_bytes(data[28:32], "little"):]

    # Every buffer, padded, byte for byte what pyarrow's IPC writer puts there.
    assert body(ours) == body(theirs)
    assert len(body(ours)) == encode_records(7, messages, timestamps)[1] > 300 * 64


def test_non_ascii_names_and_headers_keep_their_characters():
    messages = [
        Message("ID:1", "topic://capteurs.température", b"1", {"clé": "valeur é", "a": "b"}),
        Message("ID:é2", "topic://ascii", b"2", {"emoji": "\U0001f600"}),
    ]
    batch = written(0, messages, [1, 2])
    assert batch.equals(reference(0, messages, [1, 2]))
    assert batch.column("headers")[0].as_py() == [("clé", "valeur é"), ("a", "b")]
    assert batch.column("message_id").to_pylist() == ["ID:1", "ID:é2"]


def test_a_lone_surrogate_becomes_a_replacement_character():
    messages = [Message("ID:1", "topic://bad\udcff", b"x", {"h\udcfd": "v\udcfe"}), Message("ID:2", "topic://bad\udcff", b"y")]
    batch = written(0, messages, [1, 1])
    assert batch.column("destination").to_pylist() == ["topic://bad\ufffd"] * 2
    assert batch.column("headers").to_pylist() == [[("h\ufffd", "v\ufffd")], []]


@pytest.mark.parametrize("same", [True, False])
def test_repeated_equal_and_changing_header_maps(same):
    qos0 = {"mqtt-qos": "0"}
    messages = [
        Message("ID:0", "topic://t", b"x", qos0),
        Message("ID:1", "topic://t" if same else "topic://u", b"x", dict(qos0)),
        Message("ID:2", "topic://t", b"x", {"mqtt-qos": "1"}, persistent=True),
        Message("ID:3", "topic://t", b"x", {"mqtt-qos": "1"}),  # equal map, not persistent: no header added
        Message("ID:4", "topic://t", b"x", qos0, priority=9, expiration=77, correlation_id="c", reply_to="queue://r",
                content_type="text/plain", group_id="g", group_seq=3),
        Message("ID:5", "topic://t", b"x", qos0),
        Message("ID:6", "topic://t", b"", {}),
    ]
    batch = written(0, messages, [1] * len(messages))
    assert batch.equals(reference(0, messages, [1] * len(messages)))
    assert batch.column("headers")[3].as_py() == [("mqtt-qos", "1")]
    assert dict(batch.column("headers")[4].as_py()) == {
        "mqtt-qos": "0", "priority": "9", "expires": "77", "correlation-id": "c", "reply-to": "queue://r",
        "content-type": "text/plain", "JMSXGroupID": "g", "JMSXGroupSeq": "3",
    }


@pytest.mark.parametrize("headers", [{}, {"mqtt-qos": "0"}, {"a": "1", "bé": "2é"}])
def test_every_record_with_the_same_map(headers):
    messages = [Message(f"ID:{i}", "topic://t", b"%d" % i, dict(headers)) for i in range(5)]
    batch = written(0, messages, [1] * 5)
    assert batch.equals(reference(0, messages, [1] * 5))
    assert batch.column("headers").to_pylist() == [list(headers.items())] * 5


_text = st.sampled_from(["", "a", "ab", "é", "topic://t", "ID:1", "ID:22", "\U0001f600"])
_message = st.builds(
    lambda i, d, b, h, p, prio: Message(i, d, b, h, persistent=p, priority=prio),
    _text, st.sampled_from(["topic://a", "topic://bb", "queue://é"]), st.sampled_from([b"", b"x", b"yy", b"\x00" * 9]),
    st.sampled_from([{}, {"mqtt-qos": "0"}, {"mqtt-qos": "1"}, {"a": "1", "é": ""}]), st.booleans(), st.sampled_from([4, 4, 4, 9]),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**40), st.lists(_message, min_size=1, max_size=300), st.data())
def test_any_records_read_back_as_pyarrows_conversion(base, messages, data):
    # Regular columns take the arithmetic-series paths, irregular ones the packed ones.
    if data.draw(st.booleans()):
        messages = [Message(m.id, messages[0].destination, messages[0].body, messages[0].headers) for m in messages]
    start = data.draw(st.integers(0, 2**41))
    steps = data.draw(st.lists(st.integers(0, 3), min_size=len(messages), max_size=len(messages)))
    timestamps = [start + sum(steps[:i + 1]) for i in range(len(messages))]
    assert written(base, messages, timestamps).equals(reference(base, messages, timestamps))


def test_a_turn_past_the_cached_series_is_packed_one_by_one():
    n = 70_000
    messages = [Message("ID:%d" % (i % 10), "topic://t", b"x" * (i % 3), {"q": "0"}) for i in range(n)]
    batch = written(10, messages, [5] * n)
    assert batch.column("offset")[n - 1].as_py() == 10 + n - 1
    assert batch.column("body")[n - 1].as_py() == b"x" * ((n - 1) % 3)
    assert batch.column("headers")[n - 1].as_py() == [("q", "0")]


@pytest.mark.parametrize("runs", [1, 2, 32, 33, 600])
def test_timestamps_in_runs_of_equal_values_read_back_exactly(runs):
    """A turn's timestamps are packed a run at a time, and one by one past 32 runs."""
    n = 600
    timestamps = [1_700_000_000_000 + (i * runs) // n for i in range(n)]
    assert len(set(timestamps)) == runs
    messages = [Message("ID:%d" % i, "topic://t", b"x", {}) for i in range(n)]
    batch = written(3, messages, timestamps)
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == timestamps
    assert batch.equals(reference(3, messages, timestamps))


@pytest.mark.parametrize("n", [1, 2, 584])
def test_offsets_up_to_the_last_int64(n):
    """The offsets, built as one integer's bytes, stay exact up to 2**63 - 1."""
    base = 2**63 - n
    messages = [Message("ID:%d" % i, "topic://t", b"x", {}) for i in range(n)]
    batch = written(base, messages, [7] * n)
    assert batch.column("offset").to_pylist() == list(range(base, 2**63))


def test_large_bodies_of_one_length():
    messages = [Message("ID:%d" % i, "topic://t", bytes([i]) * (8 << 20), {}) for i in range(3)]
    batch = written(0, messages, [1, 2, 3])
    assert [len(b) for b in batch.column("body").to_pylist()] == [8 << 20] * 3
    assert batch.column("body")[2].as_py()[:1] == b"\x02"


def test_record_headers_of_a_persistent_message_with_fields():
    m = Message("ID:1", "queue://q", b"x", {"h": "1"}, persistent=True, priority=7, content_type="text/plain")
    assert record_headers(m) == {"h": "1", "persistent": "true", "priority": "7", "content-type": "text/plain"}
