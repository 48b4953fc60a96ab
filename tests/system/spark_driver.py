"""A Spark driver process for the fault tests: a stream of the broker into Parquet, checkpointed.

    python -m tests.system.spark_driver --url URL --stream NAME --out DIR --checkpoint DIR
        [--available-now] [--summary FILE] [--relay-to DESTINATION] [--java-options OPTIONS]

It runs a Structured Streaming query (the ``gateway`` source into Parquet's
file sink) until it is killed, or with ``--available-now`` until it has read
what the stream held when it started.  ``--summary`` then reads the output
back through Spark (which honours the sink's ``_spark_metadata`` log, so files
of a batch that a kill interrupted do not count) and writes the rows as JSON.
With ``--relay-to`` the query writes to the ``gateway`` sink instead,
publishing every record's body to that destination (``--out`` is unused).
Each start prints ``QUERY STARTED``; the tests kill its whole process group
(the Python driver and its JVM) with SIGKILL.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.spark_driver")
    parser.add_argument("--url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--trigger-ms", type=int, default=500)
    parser.add_argument("--summary")
    parser.add_argument("--relay-to")
    parser.add_argument("--java-options", default="-XX:TieredStopAtLevel=1", help="the driver JVM's (tests/spark_jvm.py)")
    args = parser.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark import GatewayDataSource

    session = (
        SparkSession.builder.master("local[2]").appName("gateway-fault-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", args.java_options)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GatewayDataSource)
    frame = (
        session.readStream.format("gateway").option("url", args.url).option("stream", args.stream)
        .option("startingOffsets", "earliest").load()
        .selectExpr("stream", "partition", "offset", "CAST(body AS STRING) AS body")
    )
    if args.relay_to:
        writer = (frame.selectExpr("body").writeStream.format("gateway").option("url", args.url)
                  .option("destination", args.relay_to).option("checkpointLocation", args.checkpoint))
    else:
        writer = frame.writeStream.format("parquet").option("path", args.out).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = writer.start()
    print("QUERY STARTED", flush=True)
    query.awaitTermination()
    if args.summary:
        rows = session.read.parquet(args.out).collect()
        with open(args.summary, "w") as f:
            json.dump([[r["stream"], r["partition"], r["offset"], r["body"]] for r in rows], f)
    session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
