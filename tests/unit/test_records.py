"""Stream records built straight into Arrow buffers are the batches pyarrow's own conversion makes."""
from __future__ import annotations

import pyarrow as pa

from core.message import Message
from core.records import SCHEMA, build_batch, chunk_batch, chunk_header, encode_chunk
from core.stream import record_headers


def reference(base, timestamps, destinations, ids, headers, bodies):
    """The batch as pa.array() converts Python objects (what the broker wrote before)."""
    return pa.RecordBatch.from_arrays([
        pa.array(range(base, base + len(bodies)), pa.int64()),
        pa.array(timestamps, SCHEMA.field("timestamp").type),
        pa.array(destinations, pa.string()),
        pa.array(ids, pa.string()),
        pa.array([list(h.items()) for h in headers], SCHEMA.field("headers").type),
        pa.array(bodies, pa.binary()),
    ], schema=SCHEMA)


def built(base, timestamps, destinations, ids, headers, bodies):
    """As Partition.write calls it: the distinct maps and an index, when some repeat."""
    maps, index = [], []
    for h in headers:
        if not maps or h != maps[-1]:
            maps.append(h)
        index.append(len(maps) - 1)
    return build_batch(base, timestamps, destinations, ids, maps, index if len(maps) < len(headers) else None, bodies)


def test_the_same_batch_as_pyarrows_conversion():
    args = (
        1000,
        [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_001],
        ["topic://sensors.a", "queue://orders", "topic://sensors.a"],
        ["ID:gw-1", "ID:gw-2", "ID:gw-3"],
        [{}, {"mqtt-qos": "1", "persistent": "true"}, {"k": ""}],
        [b"", b"\x00\xff binary", b"x" * 1000],
    )
    batch = built(*args)
    batch.validate(full=True)
    assert batch.equals(reference(*args))
    assert batch.column("offset").to_pylist() == [1000, 1001, 1002]


def test_non_ascii_names_and_headers_keep_their_characters():
    args = (0, [1, 2], ["topic://capteurs.température", "topic://ascii"], ["ID:1", "ID:2"],
            [{"clé": "valeur é", "a": "b"}, {"emoji": "\U0001f600"}], [b"1", b"2"])
    batch = built(*args)
    batch.validate(full=True)
    assert batch.equals(reference(*args))
    assert batch.column("headers")[0].as_py() == [("clé", "valeur é"), ("a", "b")]


def test_repeated_header_maps_are_taken_from_one_conversion():
    same = {"mqtt-qos": "0"}
    args = (0, [1] * 5, ["topic://t"] * 5, [f"ID:{i}" for i in range(5)],
            [same, dict(same), {"mqtt-qos": "1"}, {"mqtt-qos": "1"}, same], [b"x"] * 5)
    batch = built(*args)
    batch.validate(full=True)
    assert batch.equals(reference(*args))


def test_an_empty_header_column_and_a_stored_chunk_round_trip():
    args = (7, [5, 6], ["topic://t", "topic://t"], ["a", "b"], [{}, {}], [b"one", b"two"])
    batch = built(*args)
    data = encode_chunk(batch, 5, 6)
    assert chunk_header(data).count == 2
    assert chunk_batch(data).equals(reference(*args))


def test_record_headers_of_a_persistent_message_with_fields():
    m = Message("ID:1", "queue://q", b"x", {"h": "1"}, persistent=True, priority=7, content_type="text/plain")
    assert record_headers(m) == {"h": "1", "persistent": "true", "priority": "7", "content-type": "text/plain"}
