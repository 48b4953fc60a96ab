"""The connector's pure parts: option checking, budget and range arithmetic, writer ids, isolation.

No Spark session and no broker: these run in milliseconds and pin down the
rules the end-to-end tests rely on.
"""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from spark.errors import OptionError
from spark.options import parse_read_options, parse_write_options
from spark.reader import allocate, split
from spark.writer import _Publisher

pytestmark = pytest.mark.spark

URL = "http://127.0.0.1:8161"


def test_importing_spark_loads_no_broker_package():
    """Executors have only the connector: it must not need the broker's packages."""
    code = (
        "import sys, spark, spark.reader, spark.writer, spark.client\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('gateway', 'protocols', 'core', 'persistence'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"spark imported broker modules: {out.stdout}"


def test_defaults_follow_kafka():
    stream = parse_read_options({"url": URL, "stream": "s"}, streaming=True)
    batch = parse_read_options({"url": URL, "stream": "s"}, streaming=False)
    assert stream.starting == "latest" and batch.starting == "earliest" and batch.ending == "latest"
    assert stream.fail_on_data_loss is True and stream.include_headers is False
    assert stream.max_offsets_per_trigger is None and stream.min_partitions is None and stream.reader_name is None


def test_option_names_are_case_insensitive_and_json_offsets_parse():
    opts = parse_read_options({"URL": URL + "/", "Stream": "s", "STARTINGOFFSETS": '{"s": {"0": 5, "2": -2}}',
                               "maxoffsetspertrigger": "10", "FailOnDataLoss": "FALSE"}, streaming=True)
    assert opts.url == URL and opts.starting == {0: 5, 2: -2}
    assert opts.max_offsets_per_trigger == 10 and opts.fail_on_data_loss is False


@pytest.mark.parametrize("options, option, fragment", [
    ({"maxOffsetsPerTrigger": "abc"}, "maxOffsetsPerTrigger", "'abc'"),
    ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "positive"),
    ({"startingOffsets": "garbage"}, "startingOffsets", "'garbage'"),
    ({"startingOffsets": '{"0": -3}'}, "startingOffsets", "-3"),
    ({"startingOffsets": '{"x": 1}'}, "startingOffsets", "'x'"),
    ({"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets", "other"),
    ({"failOnDataLoss": "maybe"}, "failOnDataLoss", "'maybe'"),
    ({"includeHeaders": "yes"}, "includeHeaders", "'yes'"),
    ({"minPartitions": "-1"}, "minPartitions", "'-1'"),
    ({"startingTimestamp": "yesterday"}, "startingTimestamp", "'yesterday'"),
    ({"readerName": "has space"}, "readerName", "'has space'"),
    ({"endingOffsets": "x"}, "endingOffsets", "'x'"),
    ({"url": "ftp://host:1"}, "url", "'ftp://host:1'"),
    ({"url": ""}, "url", "required"),
    ({"stream": ""}, "stream", "required"),
])
def test_bad_read_options_name_the_option_and_value(options, option, fragment):
    with pytest.raises(OptionError) as info:
        parse_read_options({"url": URL, "stream": "s", **options}, streaming=False)
    text = str(info.value)
    assert f"option '{option}'" in text and fragment in text, text


def test_options_for_the_other_kind_of_query_are_refused():
    with pytest.raises(OptionError, match="option 'endingOffsets' is for batch queries"):
        parse_read_options({"url": URL, "stream": "s", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="option 'maxOffsetsPerTrigger' is for streaming queries"):
        parse_read_options({"url": URL, "stream": "s", "maxOffsetsPerTrigger": "5"}, streaming=False)
    # Not known yet (DataSource.schema): neither is judged.
    parse_read_options({"url": URL, "stream": "s", "maxOffsetsPerTrigger": "5", "endingOffsets": "latest"}, streaming=None)


def test_bad_write_options():
    with pytest.raises(OptionError, match="option 'destination'.*'sensors'"):
        parse_write_options({"url": URL, "destination": "sensors"})
    with pytest.raises(OptionError, match="option 'maxRowsPerRequest'.*'many'"):
        parse_write_options({"url": URL, "maxRowsPerRequest": "many"})
    opts = parse_write_options({"url": URL, "destination": "/topic/a.b"})
    assert opts.max_rows_per_request == 10_000 and opts.max_bytes_per_request == 4 << 20


def test_allocate_splits_the_budget_in_proportion_and_exactly():
    assert allocate({0: 10, 1: 30, 2: 0}, 8) == {0: 2, 1: 6, 2: 0}
    assert sum(allocate({0: 1, 1: 1, 2: 1}, 2).values()) == 2
    assert allocate({0: 5, 1: 7}, 100) == {0: 5, 1: 7}
    got = allocate({p: 1000 + p for p in range(7)}, 999)
    assert sum(got.values()) == 999 and all(got[p] <= 1000 + p for p in got)


def test_split_reaches_min_partitions_in_proportion():
    pieces = split([(0, 0, 10), (1, 100, 130)], 5)
    assert len(pieces) >= 5
    for p, lo, hi in [(0, 0, 10), (1, 100, 130)]:
        mine = sorted((s, e) for q, s, e in pieces if q == p)
        assert mine[0][0] == lo and mine[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))  # contiguous, no overlap
    assert split([(0, 0, 3)], 10) == [(0, 0, 1), (0, 1, 2), (0, 2, 3)]  # never empty pieces
    assert split([(0, 0, 10), (1, 0, 10)], 2) == [(0, 0, 10), (1, 0, 10)]


def _ids(prefix: bytes, partition: int, rows: list[tuple[str, bytes, dict[str, str] | None]]) -> list[str]:
    opts = parse_write_options({"url": URL})
    publisher = _Publisher(opts, prefix, partition)
    batch = pa.record_batch([
        pa.array([r[0] for r in rows]), pa.array([r[1] for r in rows], pa.binary()),
        pa.array([list((r[2] or {}).items()) for r in rows], pa.map_(pa.string(), pa.string())),
    ], names=["destination", "body", "headers"])
    return publisher._request_batch(batch).column("id").to_pylist()


def test_writer_ids_do_not_depend_on_row_order_and_count_identical_rows():
    rows = [("topic://a", b"x", None), ("topic://a", b"y", {"k": "1"}), ("topic://a", b"x", None), ("topic://b", b"x", None)]
    first = _ids(b"query:q:batch:3", 0, rows)
    again = _ids(b"query:q:batch:3", 0, list(reversed(rows)))
    assert sorted(first) == sorted(again)
    assert len(set(first)) == 4  # two identical rows are two messages
    assert set(_ids(b"query:q:batch:4", 0, rows)).isdisjoint(first)
    assert set(_ids(b"query:q:batch:3", 1, rows)).isdisjoint(first)
    # Headers are part of the content, whatever their order.
    a = _ids(b"p", 0, [("topic://a", b"x", {"k": "1", "j": "2"})])
    b = _ids(b"p", 0, [("topic://a", b"x", {"j": "2", "k": "1"})])
    c = _ids(b"p", 0, [("topic://a", b"x", {"k": "2", "j": "2"})])
    assert a == b != c


def test_user_and_password_become_http_basic_and_go_together():
    import base64

    opts = parse_read_options({"url": "http://h:1", "stream": "s", "user": "spark", "password": "p:w"}, True)
    assert opts.authorization == "Basic " + base64.b64encode(b"spark:p:w").decode()
    assert parse_write_options({"url": "http://h:1"}).authorization is None
    for bad in ({"user": "spark"}, {"password": "x"}, {"user": "a:b", "password": "x"}):
        with pytest.raises(OptionError, match="user"):
            parse_write_options({"url": "http://h:1", **bad})
