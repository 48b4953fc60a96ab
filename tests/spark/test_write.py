"""Publishing from Spark: batch and streaming writes reach consumers once, and a retried batch adds nothing.

What the writes published is counted twice, independently: by a STOMP
subscriber on the topic and by a broker stream that records the topic.
"""
from __future__ import annotations

import shutil
from typing import Any

import pytest

from tests.spark.support import BrokerProcess, StompSubscriber, error_text

pytestmark = pytest.mark.spark

STREAMS = {
    "out": {"destinations": ["topic://out.>"], "partitions": 2},
    "src": {"destinations": ["topic://src.>"], "partitions": 2},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any) -> Any:
    handle = BrokerProcess(tmp_path_factory.mktemp("broker-write"), STREAMS, extra="[admin]\nmax_request_size = 2097152\n")
    yield handle
    handle.stop()


def total(broker: BrokerProcess, stream: str) -> int:
    return sum(latest for _, latest in broker.bounds(stream).values())


def out_records(broker: BrokerProcess, since: dict[int, int]) -> list[dict[str, Any]]:
    return [r for p in broker.bounds("out") for r in broker.records("out", p, since.get(p, 0))]


def test_batch_write_publishes_each_row_once_with_headers(spark, broker):
    before = {p: latest for p, (_, latest) in broker.bounds("out").items()}
    subscriber = StompSubscriber(broker, "/topic/out.batch.>")
    try:
        rows = [(f"topic://out.batch.d{i % 5}", f"body-{i}".encode(), {"seq": str(i), "kind": "batch"}) for i in range(500)]
        rows += [("/topic/out.batch.same", b"same", None)] * 3  # identical rows are distinct messages
        df = spark.createDataFrame(rows, "destination string, body binary, headers map<string,string>").repartition(3)
        df.write.format("gateway").option("url", broker.url).mode("append").save()
        got = subscriber.bodies(503)
    finally:
        subscriber.close()
    assert sorted(got) == sorted([f"body-{i}" for i in range(500)] + ["same"] * 3)
    records = out_records(broker, before)
    assert len(records) == 503
    for r in records:
        if r["body"] != "same":
            assert r["headers"]["kind"] == "batch" and r["body"] == f"body-{r['headers']['seq']}"
            assert r["destination"] == f"topic://out.batch.d{int(r['headers']['seq']) % 5}"


def test_user_id_column_makes_a_repeated_write_a_no_op(spark, broker):
    df = spark.createDataFrame([(f"k{i}", f"text {i}") for i in range(200)], "key string, body string")
    writer = (df.write.format("gateway").option("url", broker.url).option("destination", "/topic/out.keyed")
              .option("idColumn", "key").option("maxRowsPerRequest", "64").mode("append"))
    before = total(broker, "out")
    writer.save()
    assert total(broker, "out") == before + 200
    writer.save()  # every id seen before: the broker drops them all
    assert total(broker, "out") == before + 200


def test_stream_write_retried_batch_publishes_nothing_twice(spark, broker, tmp_path):
    broker.publish_json([{"destination": f"topic://src.d{i % 7}", "body": f"src-{i}"} for i in range(300)])
    checkpoint = tmp_path / "checkpoint"

    def run() -> Any:
        source = (spark.readStream.format("gateway").option("url", broker.url).option("stream", "src")
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load())
        query = (source.selectExpr("concat('topic://out.relay.', partition) as destination", "body")
                 .writeStream.format("gateway").option("url", broker.url)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
        return query

    before = total(broker, "out")
    first = run()
    assert [p.numInputRows for p in first.recentProgress if p.numInputRows] == [100, 100, 100]
    assert total(broker, "out") == before + 300

    # As after a crash between publishing and committing: the last batch's commit is gone,
    # so a restart runs batch 2 again, with the same query id and batch id.
    last = max(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    shutil.rmtree(checkpoint / "commits" / f".{last}.crc", ignore_errors=True)
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    again = run()
    assert [(p.batchId, p.numInputRows) for p in again.recentProgress if p.numInputRows] == [(last, 100)]
    assert total(broker, "out") == before + 300, "the retried micro-batch published its rows again"
    relayed = sorted(r["body"] for p, (_, _) in broker.bounds("out").items()
                     for r in broker.records("out", p) if r["destination"].startswith("topic://out.relay."))
    assert relayed == sorted(f"src-{i}" for i in range(300))


def test_requests_are_cut_to_max_bytes_per_request(spark, broker):
    """60 rows of 100 KB: one request would exceed the broker's 2 MiB limit, 1 MiB pieces do not."""
    df = spark.createDataFrame([(f"{i:03d}" + "z" * 100_000,) for i in range(60)], "body string").coalesce(1)
    writer = df.write.format("gateway").option("url", broker.url).option("destination", "topic://out.big").mode("append")
    before = total(broker, "out")
    with pytest.raises(Exception) as info:
        writer.option("maxBytesPerRequest", str(8 << 20)).save()
    text = error_text(info.value)
    assert "as too large (413); lower the option 'maxBytesPerRequest'" in text, text
    assert total(broker, "out") == before
    writer.option("maxBytesPerRequest", str(1 << 20)).save()
    assert total(broker, "out") == before + 60


def test_a_broker_with_users_needs_user_and_password_for_reading_and_writing(spark, tmp_path):
    from gateway.auth.users import Cost, PasswordHash, write_lines

    workdir = tmp_path / "secured"
    workdir.mkdir()
    write_lines(str(workdir / "users"), [f"etl:{PasswordHash.make(b'etl-secret', Cost(ln=10))}"])
    secured = BrokerProcess(workdir, {"jobs": {"destinations": ["topic://jobs.>"], "partitions": 1}}, extra=(
        '[auth]\nusers_file = "users"\n'
        '[[auth.rules]]\nwho = "user:etl"\npermissions = ["read", "write"]\n'
        'destinations = ["topic://jobs.>", "stream://jobs"]\n'
    ))
    try:
        df = spark.createDataFrame([(f"topic://jobs.j{i}", f"job {i}") for i in range(50)], "destination string, body string")
        with pytest.raises(Exception) as refused:
            df.write.format("gateway").option("url", secured.url).mode("append").save()
        assert "401" in error_text(refused.value) and "set the options user and password" in error_text(refused.value)
        (df.write.format("gateway").option("url", secured.url).option("user", "etl").option("password", "etl-secret")
         .mode("append").save())
        read = (spark.read.format("gateway").option("url", secured.url).option("stream", "jobs")
                .option("user", "etl").option("password", "etl-secret").load())
        assert sorted(r.body.decode() for r in read.collect()) == sorted(f"job {i}" for i in range(50))
    finally:
        secured.stop()
