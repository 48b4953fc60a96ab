"""Retention against Spark queries: data loss as Kafka reports it, and what a registered reader keeps.

The byte limit removes records whatever readers need, so a stopped query's
checkpoint falls behind and its restart must fail clearly (failOnDataLoss,
the default) or skip ahead (failOnDataLoss=false).  Age retention is held
back by a running query's registration.
"""
from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.spark.support import BrokerProcess, error_text, wait_until

pytestmark = pytest.mark.spark

STREAMS = {
    "short": {"destinations": ["topic://short.>"], "partitions": 1, "max_bytes": 60_000, "max_age_seconds": 0.0},
    "aged": {"destinations": ["topic://aged.>"], "partitions": 1, "max_age_seconds": 1.0, "reader_lease_seconds": 60.0},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any) -> Any:
    handle = BrokerProcess(tmp_path_factory.mktemp("broker-retention"), STREAMS,
                           extra="[policy]\nstream_retention_interval = 0.2\n")
    yield handle
    handle.stop()


def publish(broker: BrokerProcess, stream: str, start: int, count: int) -> None:
    for first in range(start, start + count, 200):
        broker.publish_json([{"destination": f"topic://{stream}.a", "body": f"{i:04d}" + "x" * 96}
                             for i in range(first, min(first + 200, start + count))])


def stream_query(spark: Any, broker: BrokerProcess, out: Any, checkpoint: Any, **options: str) -> Any:
    reader = spark.readStream.format("gateway").option("url", broker.url).option("stream", "short")
    for k, v in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def test_restart_after_retention_fails_clearly_or_skips_ahead(spark, broker, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    publish(broker, "short", 0, 100)
    assert broker.bounds("short")[0] == (0, 100)
    query = stream_query(spark, broker, out, checkpoint)
    query.awaitTermination(120)
    assert query.exception() is None
    assert spark.read.parquet(str(out)).count() == 100

    # While the query is stopped, the byte limit removes what it would read next.
    publish(broker, "short", 100, 2000)
    earliest, latest = broker.bounds("short")[0]
    assert 100 < earliest < latest == 2100

    query = stream_query(spark, broker, out, checkpoint)
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(120)
    text = error_text(info.value)
    assert "data loss" in text and "stream 'short' partition 0" in text, text
    assert f"offsets 100 to {earliest - 1} were removed" in text, text
    assert "failOnDataLoss=false" in text, text

    query = stream_query(spark, broker, out, checkpoint, failOnDataLoss="false")
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())
    assert offsets == list(range(100)) + list(range(earliest, latest))


def test_batch_read_below_earliest(spark, broker):
    publish(broker, "short", broker.bounds("short")[0][1], 1000)
    earliest, latest = broker.bounds("short")[0]
    assert earliest > 0
    df = (spark.read.format("gateway").option("url", broker.url).option("stream", "short")
          .option("startingOffsets", '{"0": 0}'))
    with pytest.raises(Exception) as info:
        df.load().count()
    assert "data loss" in error_text(info.value) and "failOnDataLoss=false" in error_text(info.value)
    rows = df.option("failOnDataLoss", "false").load().select("offset").collect()
    assert sorted(r.offset for r in rows) == list(range(earliest, latest))


def test_running_query_holds_back_age_retention(spark, broker):
    """Records older than max_age_seconds stay while a running query's registration still needs them."""
    name = "aged-reader"
    df = (spark.readStream.format("gateway").option("url", broker.url).option("stream", "aged")
          .option("startingOffsets", "earliest").option("readerName", name).option("maxOffsetsPerTrigger", "25").load())
    query = df.writeStream.format("memory").queryName("aged_rows").trigger(processingTime="1 second").start()
    try:
        wait_until(lambda: any(r["name"] == name for r in broker.stream("aged")["readers"]), what="the reader's registration")
        publish(broker, "aged", 0, 100)
        wait_until(lambda: spark.sql("select count(*) c from aged_rows").collect()[0].c == 100, timeout=90,
                   what="100 rows, read 25 per second although each is older than max_age_seconds by then")
        assert query.exception() is None
        offsets = sorted(r.offset for r in spark.sql("select offset from aged_rows").collect())
        assert offsets == list(range(100))
    finally:
        query.stop()
    # Unregistered, nothing holds them: age retention takes them.
    wait_until(lambda: broker.bounds("aged")[0][0] == 100, timeout=30, what="age retention after the reader left")
