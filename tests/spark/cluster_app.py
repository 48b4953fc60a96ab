"""The application tests/spark/test_cluster.py submits with spark-submit to local-cluster mode.

    spark-submit --master local-cluster[2,1,1024] --py-files gateway_spark.zip \\
        tests/spark/cluster_app.py URL STREAM RESULT.json

Executors are separate processes, so everything a task needs must travel
pickled in its partition or ship with --py-files, as on a real cluster.
It reads the stream as a batch and as an AvailableNow stream, writes rows
back with the sink, and records what it saw (and which processes did the
work) in RESULT.json.
"""
from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

from spark import GatewayDataSource


def main() -> None:
    url, stream, result = sys.argv[1:4]
    session = SparkSession.builder.appName("gateway-local-cluster").config("spark.ui.showConsoleProgress", "false").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GatewayDataSource)
    frame = session.read.format("gateway").option("url", url).option("stream", stream).option("minPartitions", "4").load()
    rows = frame.selectExpr("partition", "offset", "CAST(body AS STRING) AS body").collect()
    workers = frame.rdd.map(lambda _: os.getpid()).distinct().collect()
    query = (
        session.readStream.format("gateway").option("url", url).option("stream", stream)
        .option("startingOffsets", "earliest").load()
        .writeStream.format("memory").queryName("streamed").trigger(availableNow=True).start()
    )
    query.awaitTermination()
    streamed = session.sql("SELECT count(*) AS n FROM streamed").collect()[0].n
    (frame.selectExpr("concat('topic://', 'cluster.out') AS destination", "body").limit(50)
     .write.format("gateway").option("url", url).mode("append").save())
    with open(result, "w") as f:
        json.dump({
            "rows": [[r.partition, r.offset, r.body] for r in rows], "streamed": streamed,
            "worker_pids": workers, "driver_pid": os.getpid(),
        }, f)
    session.stop()


if __name__ == "__main__":
    main()
