"""Bad input meets a clear error: what the user reads names the option, the value and what to do.

Each check asserts on the text of the exception Spark raises to the user,
whichever of Spark's wrappers carries it.
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.spark.support import BrokerProcess, error_text, free_port

pytestmark = pytest.mark.spark

STREAMS = {"events": {"destinations": ["topic://events.>"], "partitions": 2}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any) -> Any:
    handle = BrokerProcess(tmp_path_factory.mktemp("broker-errors"), STREAMS)
    handle.publish_json([{"destination": f"topic://events.e{i}", "body": f"e{i}"} for i in range(20)])
    yield handle
    handle.stop()


def batch(spark: Any, url: str, **options: str) -> Any:
    reader = spark.read.format("gateway").option("url", url)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader


def stream_failure(spark: Any, broker: BrokerProcess, tmp_path: Any, **options: str) -> str:
    """Start a streaming read and return the text of the error that stops it."""
    reader = spark.readStream.format("gateway").option("url", broker.url)
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception) as info:
        query = reader.load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")).start()
        query.awaitTermination(60)
    return error_text(info.value)


def failure(action: Any) -> str:
    with pytest.raises(Exception) as info:
        action()
    return error_text(info.value)


@pytest.mark.parametrize("options, expected", [
    ({"maxOffsetsPerTrigger": "abc"}, "option 'maxOffsetsPerTrigger' must be a positive integer (records per micro-batch), got 'abc'"),
    ({"startingOffsets": "garbage"}, "option 'startingOffsets' must be 'earliest' or 'latest' or JSON offsets per partition"),
    ({"failOnDataLoss": "maybe"}, "option 'failOnDataLoss' must be true or false, got 'maybe'"),
    ({"minPartitions": "0"}, "option 'minPartitions' must be a positive integer, got '0'"),
    ({"includeHeaders": "1"}, "option 'includeHeaders' must be true or false, got '1'"),
])
def test_bad_option_values_fail_at_load(spark, broker, options, expected):
    text = failure(lambda: batch(spark, broker.url, stream="events", **options).load())
    assert expected in text, text
    text = failure(lambda: spark.readStream.format("gateway").option("url", broker.url).option("stream", "events")
                   .options(**options).load())
    assert expected in text, text


def test_missing_url_and_stream(spark, broker):
    text = failure(lambda: spark.read.format("gateway").option("stream", "events").load())
    assert "option 'url' is required" in text, text
    text = failure(lambda: batch(spark, broker.url).load())
    assert "option 'stream' is required" in text, text


def test_unknown_stream(spark, broker, tmp_path):
    text = failure(lambda: batch(spark, broker.url, stream="nope").load().count())
    assert f"option 'stream' names 'nope', which the broker at {broker.url} does not have (its streams: events)" in text, text
    text = stream_failure(spark, broker, tmp_path, stream="nope")
    assert "option 'stream' names 'nope'" in text, text


def test_unreachable_broker_names_the_url(spark):
    url = f"http://127.0.0.1:{free_port()}"
    text = failure(lambda: batch(spark, url, stream="events").load().count())
    assert f"cannot reach the broker at {url}: connection refused" in text, text


def test_offsets_beyond_the_end(spark, broker, tmp_path):
    latest = broker.bounds("events")
    text = failure(lambda: batch(spark, broker.url, stream="events", startingOffsets='{"0": 1000000}').load().count())
    assert "option 'startingOffsets'" in text and "asks for offset 1000000 of stream 'events' partition 0, beyond its end" in text, text
    text = failure(lambda: batch(spark, broker.url, stream="events", endingOffsets='{"1": 5000}').load().count())
    assert "option 'endingOffsets'" in text and "asks for offset 5000 of stream 'events' partition 1, beyond its end" in text, text
    text = failure(lambda: batch(spark, broker.url, stream="events", startingOffsets='{"7": 0}').load().count())
    assert "option 'startingOffsets'" in text and "names partition(s) 7, but stream 'events' has partitions 0 to 1" in text, text
    text = stream_failure(spark, broker, tmp_path, stream="events", startingOffsets='{"1": 99999}')
    assert "asks for offset 99999 of stream 'events' partition 1, beyond its end" in text, text
    assert broker.bounds("events") == latest


def test_batch_only_option_on_a_stream(spark, broker, tmp_path):
    text = stream_failure(spark, broker, tmp_path, stream="events", endingOffsets="latest")
    assert "option 'endingOffsets' is for batch queries only" in text, text


def test_schema_cannot_be_chosen(spark, broker):
    text = failure(lambda: spark.read.format("gateway").schema("body binary").option("url", broker.url)
                   .option("stream", "events").load().count())
    assert "option 'schema'" in text and "cannot be chosen for the gateway source" in text, text


# -- the sink ---------------------------------------------------------------------------


def write(df: Any, url: str, **options: str) -> None:
    writer = df.write.format("gateway").option("url", url).mode("append")
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()


def test_sink_needs_a_destination(spark, broker):
    df = spark.createDataFrame([(b"x",)], "body binary")
    text = failure(lambda: write(df, broker.url))
    assert "writing needs a destination: a 'destination' column" in text and "or the option 'destination'" in text, text


def test_sink_body_type_and_presence(spark, broker):
    text = failure(lambda: write(spark.createDataFrame([("topic://events.x", 1)], "destination string, body int"), broker.url))
    assert "column 'body' must be binary or string, got int" in text, text
    text = failure(lambda: write(spark.createDataFrame([("topic://events.x", "v")], "destination string, value string"), broker.url))
    assert "writing needs a 'body' column" in text and "destination, value" in text, text


def test_sink_refuses_overwrite_and_unknown_id_column(spark, broker):
    df = spark.createDataFrame([("topic://events.x", "v")], "destination string, body string")
    text = failure(lambda: df.write.format("gateway").option("url", broker.url).mode("overwrite").save())
    assert "option 'mode'" in text and "use mode('append')" in text, text
    text = failure(lambda: write(df, broker.url, idColumn="nope"))
    assert "option 'idColumn' must name a column of the data" in text, text


def test_sink_unreachable_broker(spark):
    url = f"http://127.0.0.1:{free_port()}"
    df = spark.createDataFrame([("topic://events.x", "v")], "destination string, body string")
    text = failure(lambda: write(df, url))
    assert f"cannot reach the broker at {url}: connection refused" in text, text


def test_sink_reports_the_brokers_refusal(spark, broker):
    before = broker.bounds("events")
    df = spark.createDataFrame([("topic://events.ok", "fine"), ("no-such-kind-of-name", "bad")], "destination string, body string")
    text = failure(lambda: write(df.coalesce(1), broker.url))
    assert f"the broker at {broker.url} refused POST /api/v1/messages: 400 row 1:" in text, text
    assert broker.bounds("events") == before  # one bad row refuses the whole request
    text = failure(lambda: write(spark.createDataFrame([(None, "v")], "destination string, body string"), broker.url))
    assert "1 row(s) have no destination (null 'destination')" in text, text


def test_registering_where_the_workers_python_lacks_the_connector_says_what_to_do(spark, tmp_path, monkeypatch):
    """Spark's Python workers run PYSPARK_PYTHON (python3 by default), not the driver's venv:
    without the connector there, every task failed with ModuleNotFoundError in a JVM trace.
    Registering the format now refuses, naming the interpreter and the setting to change."""
    import shutil
    import sys

    from spark import GatewayDataSource, GatewayError
    from spark.workers import worker_python_problem

    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    if not base or worker_python_problem(base, str(tmp_path)) is None:
        pytest.skip("the base interpreter has the connector too: nothing to refuse here")
    monkeypatch.chdir(tmp_path)  # where a user's script lives, away from the checkout's spark/
    monkeypatch.setattr(spark.sparkContext, "pythonExec", base)
    with pytest.raises(GatewayError) as info:
        spark.dataSource.register(GatewayDataSource)
    text = str(info.value)
    assert repr(base) in text and "no module named 'spark'" in text
    assert f"export PYSPARK_PYTHON={sys.executable}" in text
