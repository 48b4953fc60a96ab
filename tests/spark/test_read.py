"""Reading broker streams with Spark: streaming queries and batch reads against a real broker.

Records come from real producers (paho-mqtt QoS 1, stomp.py with receipts)
or from the broker's own publish endpoint; what Spark read is checked
against the records the broker serves, offset by offset.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import pytest

from tests.spark.support import BrokerProcess, mqtt_publish, stomp_publish, wait_until

pytestmark = pytest.mark.spark

STREAMS = {
    "sensors": {"destinations": ["topic://sensors.>"], "partitions": 3},
    "bulk": {"destinations": ["topic://bulk.>"], "partitions": 3},
    "timed": {"destinations": ["topic://timed.>"], "partitions": 2},
    "live": {"destinations": ["topic://live.>"], "partitions": 2},
    "direct": {"destinations": ["topic://direct.>"], "partitions": 2},
    "idle": {"destinations": ["topic://idle.>"], "partitions": 2},
    "polled": {"destinations": ["topic://polled.>"], "partitions": 2},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any) -> Any:
    handle = BrokerProcess(tmp_path_factory.mktemp("broker-read"), STREAMS)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def bulk(broker: BrokerProcess) -> dict[int, tuple[int, int]]:
    """600 records over 12 destinations in stream "bulk" (its partitions get uneven shares)."""
    broker.publish_json([{"destination": f"topic://bulk.d{i % 12}", "body": f"b{i}", "headers": {"n": str(i)}} for i in range(600)])
    bounds = broker.bounds("bulk")
    assert sum(latest for _, latest in bounds.values()) == 600
    return bounds


def read_stream(spark: Any, broker: BrokerProcess, stream: str, **options: str) -> Any:
    reader = spark.readStream.format("gateway").option("url", broker.url).option("stream", stream)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def read_batch(spark: Any, broker: BrokerProcess, stream: str, **options: str) -> Any:
    reader = spark.read.format("gateway").option("url", broker.url).option("stream", stream)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(df: Any, path: Any, checkpoint: Any) -> Any:
    query = (df.writeStream.format("parquet").option("path", str(path)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def publish_across_protocols(broker: BrokerProcess, round_: int) -> list[tuple[str, str, dict[str, str]]]:
    """MQTT 3.1.1, MQTT 5 with user properties, and STOMP with headers; returns (destination, body, headers)."""
    sent = []
    bodies = [f"mqtt4-{round_}-{i}".encode() for i in range(40)]
    mqtt_publish(broker, "sensors/mqtt4/temp", bodies)
    sent += [("topic://sensors.mqtt4.temp", b.decode(), {}) for b in bodies]
    bodies = [f"mqtt5-{round_}-{i}".encode() for i in range(30)]
    props = [[("seq", str(i)), ("origin", "mqtt5")] for i in range(30)]
    mqtt_publish(broker, "sensors/mqtt5/hum", bodies, version=5, user_properties=props)
    sent += [("topic://sensors.mqtt5.hum", b.decode(), {"seq": str(i), "origin": "mqtt5"}) for i, b in enumerate(bodies)]
    bodies = [f"stomp-{round_}-{i}".encode() for i in range(50)]
    headers = [{"seq": str(i), "origin": "stomp"} for i in range(50)]
    stomp_publish(broker, "/topic/sensors.stomp.pressure", bodies, headers)
    sent += [("topic://sensors.stomp.pressure", b.decode(), h) for b, h in zip(bodies, headers)]
    return sent


def test_stream_reads_each_record_once_in_order_across_protocols_and_restarts(spark, broker, tmp_path):
    first = publish_across_protocols(broker, 1)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = read_stream(spark, broker, "sensors", startingOffsets="earliest", includeHeaders="true")
    run_available_now(df, out, checkpoint)
    second = publish_across_protocols(broker, 2)
    query = run_available_now(df, out, checkpoint)  # same checkpoint: only what is new
    assert sum(p.numInputRows for p in query.recentProgress) == len(second)

    rows = spark.read.parquet(str(out)).collect()
    sent = first + second
    assert len(rows) == len(sent)
    assert len({(r.partition, r.offset) for r in rows}) == len(sent), "a record was read twice"
    bounds = broker.bounds("sensors")
    by_partition: dict[int, list[Any]] = defaultdict(list)
    for r in rows:
        by_partition[r.partition].append(r)
    for p, (earliest, latest) in bounds.items():
        assert sorted(r.offset for r in by_partition[p]) == list(range(earliest, latest)), f"partition {p} has gaps"
    # Per destination (one partition each), offset order is publish order, bodies and headers intact.
    got_by_destination: dict[str, list[Any]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r.partition, r.offset)):
        assert r.stream == "sensors"
        got_by_destination[r.destination].append(r)
    want_by_destination: dict[str, list[Any]] = defaultdict(list)
    for destination, body, headers in sent:
        want_by_destination[destination].append((body, headers))
    assert set(got_by_destination) == set(want_by_destination)
    for destination, want in want_by_destination.items():
        got = got_by_destination[destination]
        assert [bytes(r.body).decode() for r in got] == [b for b, _ in want]
        for r, (_, headers) in zip(got, want):
            assert {k: v for k, v in r.headers.items() if k in headers} == headers
            assert r.message_id and r.timestamp is not None
    # The broker's own view of one record agrees with Spark's.
    record = broker.records("sensors", rows[0].partition, rows[0].offset)[0]
    assert record["message_id"] == rows[0].message_id and record["destination"] == rows[0].destination


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark, broker, bulk, tmp_path):
    df = read_stream(spark, broker, "bulk", startingOffsets="earliest", maxOffsetsPerTrigger="250")
    query = run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")
    sizes = [p.numInputRows for p in query.recentProgress if p.numInputRows]
    assert sizes == [250, 250, 100]
    latest = {str(p): latest for p, (_, latest) in bulk.items()}
    assert json.loads(query.recentProgress[-1].sources[0].endOffset) == latest
    assert json.loads(query.recentProgress[-1].sources[0].latestOffset) == latest  # reportLatestOffset
    assert spark.read.parquet(str(tmp_path / "out")).select("partition", "offset").distinct().count() == 600


def test_starting_offsets_json_and_latest_default(spark, broker, bulk, tmp_path):
    # Kafka's nested form; partition 2 not named starts at its earliest, like a new partition.
    starting = json.dumps({"bulk": {"0": 10, "1": -1}})
    df = read_stream(spark, broker, "bulk", startingOffsets=starting)
    query = run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")
    rows = spark.read.parquet(str(tmp_path / "out")).select("partition", "offset").collect()
    want = {(0, o) for o in range(10, bulk[0][1])} | {(2, o) for o in range(bulk[2][0], bulk[2][1])}
    assert {(r.partition, r.offset) for r in rows} == want and len(rows) == len(want)
    # Default for a stream is latest: nothing old, as Kafka.
    query = run_available_now(read_stream(spark, broker, "bulk"), tmp_path / "out2", tmp_path / "checkpoint2")
    assert sum(p.numInputRows for p in query.recentProgress) == 0


def test_batch_read_with_starting_and_ending_offsets(spark, broker, bulk):
    df = read_batch(spark, broker, "bulk", startingOffsets='{"0": 5, "1": -2, "2": 3}', endingOffsets='{"0": 20, "1": 7, "2": -1}')
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    want = sorted([(0, o) for o in range(5, 20)] + [(1, o) for o in range(0, 7)] + [(2, o) for o in range(3, bulk[2][1])])
    assert got == want
    assert "headers" not in df.columns
    # Small fetches: each task follows X-Stream-Next-Offset through many answers.
    small = read_batch(spark, broker, "bulk", maxRecordsPerFetch="7", maxBytesPerFetch="512")
    assert sorted((r.partition, r.offset) for r in small.select("partition", "offset").collect()) == sorted(
        (p, o) for p, (first, latest) in bulk.items() for o in range(first, latest))
    assert read_batch(spark, broker, "bulk").count() == 600  # earliest to latest by default


def test_batch_read_min_partitions_splits_ranges(spark, broker, bulk):
    df = read_batch(spark, broker, "bulk", minPartitions="8")
    assert df.rdd.getNumPartitions() >= 8
    rows = df.select("partition", "offset").collect()
    assert len(rows) == 600 and len({(r.partition, r.offset) for r in rows}) == 600
    assert read_batch(spark, broker, "bulk").rdd.getNumPartitions() == 3  # one per stream partition


def test_batch_read_headers_and_types(spark, broker, bulk):
    df = read_batch(spark, broker, "bulk", includeHeaders="true", endingOffsets='{"0": 3, "1": 3, "2": 3}')
    assert df.schema.simpleString() == (
        "struct<stream:string,partition:int,offset:bigint,timestamp:timestamp,destination:string,"
        "message_id:string,body:binary,headers:map<string,string>>")
    for r in df.collect():
        assert r.headers["n"] == bytes(r.body).decode()[1:]
        assert r.destination.startswith("topic://bulk.d")


def test_starting_timestamp(spark, broker):
    broker.publish_json([{"destination": f"topic://timed.d{i}", "body": f"old{i}"} for i in range(20)])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    broker.publish_json([{"destination": f"topic://timed.d{i}", "body": f"new{i}"} for i in range(20)])
    rows = read_batch(spark, broker, "timed", startingTimestamp=str(cut)).collect()
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"new{i}" for i in range(20))


def test_running_query_registers_its_position_and_unregisters_on_stop(spark, broker):
    name = "spark-test-reader"
    df = read_stream(spark, broker, "live", startingOffsets="earliest", readerName=name)
    query = df.writeStream.format("memory").queryName("live_rows").trigger(processingTime="200 milliseconds").start()
    try:
        broker.publish_json([{"destination": f"topic://live.d{i}", "body": f"x{i}"} for i in range(30)])
        wait_until(lambda: spark.sql("select count(*) c from live_rows").collect()[0].c == 30, what="30 rows in the memory sink")
        latest = {str(p): latest for p, (_, latest) in broker.bounds("live").items()}

        def registered() -> Any:
            readers = {r["name"]: r for r in broker.stream("live")["readers"]}
            # commit(end) registers the batch's end once the next batch is planned.
            return readers.get(name) if readers.get(name, {}).get("offsets") == latest else None

        reader = wait_until(registered, what="the reader's registered offsets to reach latest")
        assert reader["expires_in_seconds"] > 0
    finally:
        query.stop()
    t0 = time.monotonic()
    wait_until(lambda: name not in {r["name"] for r in broker.stream("live")["readers"]}, timeout=20, what="DELETE of the reader")
    print("deleted after", time.monotonic() - t0)


def test_driver_side_offsets_against_the_broker(broker):
    """The stream reader's planning, called as Spark's driver calls it: AvailableNow's cap, budgets, new partitions."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from spark.options import parse_read_options
    from spark.reader import GatewayStreamReader, read_schema

    schema = read_schema(True)
    opts = parse_read_options({"url": broker.url, "stream": "direct", "startingOffsets": "earliest", "includeHeaders": "true"},
                              streaming=True)
    reader = GatewayStreamReader(opts, schema)
    try:
        broker.publish_json([{"destination": f"topic://direct.d{i}", "body": f"a{i}"} for i in range(40)])
        start = reader.initialOffset()
        assert start == {"0": 0, "1": 0}
        reader.prepareForTriggerAvailableNow()
        target = {str(p): latest for p, (_, latest) in broker.bounds("direct").items()}
        broker.publish_json([{"destination": f"topic://direct.d{i}", "body": f"b{i}"} for i in range(40)])
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == target, "AvailableNow read beyond the offsets it recorded at its start"
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        limited = reader.latestOffset(start, ReadMaxRows(5))
        assert sum(limited.values()) == 5
        # A partition missing from start (the stream grew) is read from its beginning.
        parts = reader.partitions({"0": 0}, end)
        assert sorted((p.partition, p.start, p.end) for p in parts) == [(0, 0, end["0"]), (1, 0, end["1"])]
        batches = [b for p in parts for b in reader.read(p)]
        assert all(b.schema.equals(to_arrow_schema(schema, timezone="UTC")) for b in batches)
        assert sum(b.num_rows for b in batches) == 40
        assert reader.reportLatestOffset() == {str(p): latest for p, (_, latest) in broker.bounds("direct").items()}
        reader.commit(end)
        registered = {r["name"]: r["offsets"] for r in broker.stream("direct")["readers"]}
        assert registered[reader.reader_name] == end
    finally:
        reader.stop()
    assert reader.reader_name not in {r["name"] for r in broker.stream("direct")["readers"]}


# -- latestOffset's long poll (latestOffsetWaitMs, GET /api/v1/streams/NAME/latest) ------------------


def stream_requests(broker: BrokerProcess) -> float:
    """Requests the broker answered on a stream's description and its long poll (gateway_http_requests_total)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, data = broker.request("GET", "/metrics")
    assert status == 200, data
    return sum(s.value for f in text_string_to_metric_families(data.decode()) for s in f.samples
               if s.name == "gateway_http_requests_total"
               and s.labels["route"] in ("/api/v1/streams/{name}", "/api/v1/streams/{name}/latest"))


def test_latest_offset_waits_only_when_the_query_has_read_everything(broker):
    """latestOffset called as Spark's driver calls it, against the broker's long poll."""
    import threading

    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from spark.errors import OptionError
    from spark.options import parse_read_options
    from spark.reader import GatewayStreamReader, read_schema

    def reader(**options: str) -> GatewayStreamReader:
        opts = parse_read_options({"url": broker.url, "stream": "polled", **options}, streaming=True)
        return GatewayStreamReader(opts, read_schema(False))

    def timed(r: GatewayStreamReader, start: dict, limit: Any = None) -> tuple[dict, float]:
        began = time.monotonic()
        end = r.latestOffset(start, limit or ReadAllAvailable())
        return end, time.monotonic() - began

    assert parse_read_options({"url": broker.url, "stream": "s"}, True).latest_offset_wait_ms == 1000
    assert parse_read_options({"url": broker.url, "stream": "s", "requestTimeoutMs": "1000"}, True).latest_offset_wait_ms == 500
    for value in ("-1", "30001", "soon", "60000"):
        with pytest.raises(OptionError, match="latestOffsetWaitMs"):
            parse_read_options({"url": broker.url, "stream": "s", "latestOffsetWaitMs": value}, True)
    with pytest.raises(OptionError, match="shorter than requestTimeoutMs"):
        parse_read_options({"url": broker.url, "stream": "s", "latestOffsetWaitMs": "2000", "requestTimeoutMs": "2000"}, True)
    with pytest.raises(OptionError, match="streaming queries only"):
        parse_read_options({"url": broker.url, "stream": "s", "latestOffsetWaitMs": "10"}, False)

    slow = reader(latestOffsetWaitMs="5000")  # a wait would show as seconds
    short = reader(latestOffsetWaitMs="300")
    try:
        start = slow.initialOffset()
        end, took = timed(slow, start)
        assert end == start and took < 2.5, "the first call waited (Trigger.Once makes only that one)"
        # Nothing new since: the second call waits, and wakes when a record is written.
        sent = threading.Timer(0.3, lambda: broker.publish_json([{"destination": "topic://polled.a", "body": "x"}]))
        sent.start()
        end, took = timed(slow, end)
        sent.join()
        assert sum(end.values()) == sum(start.values()) + 1 and took < 2.5, took
        # Records the read limit left for later: no wait.
        broker.publish_json([{"destination": f"topic://polled.d{i}", "body": "x"} for i in range(10)])
        first, _ = timed(slow, end, ReadMaxRows(4))
        second, took = timed(slow, first, ReadMaxRows(4))
        assert sum(second.values()) == sum(first.values()) + 4 and took < 2.5
        # Idle: the answer comes at the bound, unchanged.
        top = short.initialOffset()
        timed(short, top)
        end, took = timed(short, top)
        assert end == top and took >= 0.29
        # Trigger.AvailableNow stops at its target: never a wait.
        slow.prepareForTriggerAvailableNow()
        end, _ = timed(slow, second)
        end, took = timed(slow, end)
        assert end == {str(p): latest for p, (_, latest) in broker.bounds("polled").items()} and took < 2.5
    finally:
        slow.stop()
        short.stop()


def test_an_idle_query_long_polls_and_wakes_for_a_record(spark, broker):
    """An idle query (default trigger) asks about once per latestOffsetWaitMs, not a hundred times a second."""
    df = read_stream(spark, broker, "idle", latestOffsetWaitMs="4000")
    query = df.writeStream.format("memory").queryName("idle_rows").start()
    rows = lambda: spark.sql("select count(*) c from idle_rows").collect()[0].c  # noqa: E731
    try:
        wait_until(lambda: query.recentProgress, interval=0.05, what="the query's first micro-batch (its start offsets)")
        # A first record: the first batch with data also starts Spark's Python workers.
        broker.publish_json([{"destination": "topic://idle.d0", "body": "warm up"}])
        wait_until(lambda: rows() == 1, interval=0.05, what="the first record in the memory sink")
        before = stream_requests(broker)
        time.sleep(2)
        asked = stream_requests(broker) - before
        assert asked <= 3, f"an idle query asked {asked:g} times in 2 s (without the long poll: about 200)"
        wait_until(lambda: query.status["message"].startswith("Getting offsets"), interval=0.02, what="latestOffset")
        published = time.monotonic()
        broker.publish_json([{"destination": "topic://idle.d1", "body": "wake up"}])
        wait_until(lambda: rows() == 2, interval=0.05, what="the record in the memory sink")
        took = time.monotonic() - published
        assert took < 2.5, f"the record reached the query {took:.2f} s after its publish (the wait is 4 s)"
    finally:
        stopping = time.monotonic()
        query.stop()
        assert time.monotonic() - stopping < 4 + 3, "stop() waited longer than latestOffsetWaitMs"
