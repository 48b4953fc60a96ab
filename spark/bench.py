"""Throughput of the gateway source and sink in a local Spark, against a running broker.

    python -m spark.bench backfill --start-broker            # publish, then read it all back
    python -m spark.bench live --start-broker                # MQTT devices publish while a query follows
    python -m spark.bench idle --start-broker --queries 10   # what idle queries cost the broker

``backfill`` publishes N records (unless ``--no-publish``), then reads the
whole stream into Spark's ``noop`` sink as a batch and as an AvailableNow
stream.  ``live`` runs a streaming query from ``latest`` while MQTT QoS 0
publishers (processes of their own) send ``--rate`` messages/s for
``--seconds``, and reports the rates, the query's lag behind the stream
(sampled each second) and the publish-to-row latency (p50/p99: from the
send time each payload carries to the row reaching the query's
``foreachBatch`` on the driver).  ``idle`` runs ``--queries`` streaming
queries on a stream nobody publishes to and reports the broker's CPU over
``--seconds`` (its ``/proc/PID/stat``, so the broker must run on this
machine: ``--start-broker``, or ``--broker-pid``) and its HTTP requests per
second (``gateway_http_requests_total``).  ``--wait-ms`` sets the queries'
``latestOffsetWaitMs`` (0: ask without waiting, as before the long poll).
The target on the 2-core reference machine is
500,000 rows/s for 64-byte bodies, broker and Spark together.  Like the
rest of ``spark/`` this imports nothing of the broker; ``--start-broker``
runs ``python -m gateway.cli run`` as a separate process.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from spark.client import BrokerClient
from spark.localbroker import LocalBroker


def _broker(stream: str, partitions: int) -> LocalBroker:
    return LocalBroker(f'[streams.{stream}]\ndestinations = ["topic://{stream}.>"]\npartitions = {partitions}\n', "spark.bench")


def _requests(stream: str, body_size: int, rows: int, destinations: int) -> Iterator[bytes]:
    """Publish requests of ``rows`` rows, built once: the producer must not be what is measured."""
    body = b"x" * body_size
    batch = pa.record_batch([
        pa.array([f"topic://{stream}.d{i % destinations}" for i in range(rows)], pa.string()),
        pa.array([body] * rows, pa.binary()),
    ], names=["destination", "body"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as out:
        out.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    while True:
        yield data


def publish(url: str, stream: str, records: int, body_size: int, destinations: int = 64) -> float:
    """Publish ``records`` rows; returns rows/s."""
    start = time.perf_counter()
    with BrokerClient(url) as client:
        done = 0
        for data in _requests(stream, body_size, 10_000, destinations):
            if done >= records:
                break
            client.publish(data)
            done += 10_000
    return records / (time.perf_counter() - start)


def _session(cores: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark import GatewayDataSource

    session = (SparkSession.builder.master(f"local[{cores}]").appName("gateway-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(cores)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(GatewayDataSource)
    return session


def backfill(args: argparse.Namespace, url: str) -> None:
    if not args.no_publish:
        rate = publish(url, args.stream, args.records, args.body_size)
        print(f"published {args.records:,} rows of {args.body_size} bytes: {rate:,.0f} rows/s")
    with BrokerClient(url) as client:
        total = sum(p["latest"] - p["earliest"] for p in client.stream(args.stream)["partitions"])
    spark = _session(args.cores)
    reader = spark.read.format("gateway").option("url", url).option("stream", args.stream)
    if args.min_partitions:
        reader = reader.option("minPartitions", str(args.min_partitions))
    frame = reader.load()
    frame.write.format("noop").mode("overwrite").save()  # warm-up: Python workers, JIT
    for run in range(args.runs):
        start = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        elapsed = time.perf_counter() - start
        print(f"batch read {run + 1}: {total:,} rows in {elapsed:.2f} s = {total / elapsed:,.0f} rows/s")
    checkpoint = tempfile.mkdtemp(prefix="gateway-bench-cp-")
    start = time.perf_counter()
    query = (spark.readStream.format("gateway").option("url", url).option("stream", args.stream)
             .option("startingOffsets", "earliest").load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    rows = sum(p.numInputRows for p in query.recentProgress)
    busy = sum(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress) / 1000
    print(f"stream (AvailableNow): {rows:,} rows in {elapsed:.2f} s wall = {rows / elapsed:,.0f} rows/s; "
          f"{rows / busy if busy else 0:,.0f} rows/s over the micro-batches' own time")
    spark.stop()


# -- live: MQTT QoS 0 publishers, a query keeping up, publish-to-row latency -------------------


def _mqtt_string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def _remaining(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mqtt_publisher(host: str, port: int, topic: str, rate: float, seconds: float, body_size: int, index: int, sent: Any) -> None:
    """One MQTT 3.1.1 client publishing at QoS 0 at ``rate`` messages/s (a process of its own).

    Each payload starts with the send time (epoch ns, 19 digits), so the query
    can tell how long a message took from its publish to its row.  Packets
    are built by hand here (a QoS 0 PUBLISH is a header, the topic and the
    payload) so the publisher, not the broker, is never the bottleneck.
    """
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    variable = _mqtt_string("MQTT") + bytes([4, 2]) + (0).to_bytes(2, "big") + _mqtt_string(f"bench-live-{os.getpid()}-{index}")
    sock.sendall(bytes([0x10]) + _remaining(len(variable)) + variable)
    if sock.recv(4)[:1] != b"\x20":
        raise SystemExit("bench: the broker refused the MQTT connection")
    head = _mqtt_string(topic)
    pad = b" " * max(0, body_size - 19)
    fixed = bytes([0x30]) + _remaining(len(head) + 19 + len(pad))
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    start = time.perf_counter()
    deadline = start + seconds
    n = 0
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        due = int((now - start) * rate) + per_tick
        stamp = str(time.time_ns()).encode()
        chunk = b"".join(fixed + head + stamp + pad for _ in range(max(0, due - n)))
        if chunk:
            sock.sendall(chunk)
            n = due
        time.sleep(tick)
    sent.value = n
    sock.sendall(b"\xe0\x00")  # DISCONNECT
    sock.close()


def live(args: argparse.Namespace, url: str, mqtt: tuple[str, int]) -> None:
    """``--rate`` msgs/s of QoS 0 publishes for ``--seconds`` into the stream while a query follows it."""
    import multiprocessing

    from pyspark.sql import functions as F

    spark = _session(args.cores)
    checkpoint = tempfile.mkdtemp(prefix="gateway-bench-cp-")
    latencies: list[Any] = []
    rows = [0]
    lags: list[int] = []
    # Messages sent in the first --warmup seconds are counted but not timed: the first
    # batches with data also start Spark's Python workers.
    timed_from = [0]

    def measure(frame: Any, batch_id: int) -> None:
        table = frame.select(F.substring(F.col("body"), 1, 19).cast("string").alias("sent")).toArrow()
        now = time.time_ns()
        if table.num_rows:
            sent = pa.compute.cast(table.column("sent"), pa.int64())
            sent = sent.filter(pa.compute.greater_equal(sent, timed_from[0]))
            latencies.extend(pa.compute.subtract(pa.scalar(now, pa.int64()), sent).chunks)
            rows[0] += table.num_rows

    reader = spark.readStream.format("gateway").option("url", url).option("stream", args.stream)
    if args.wait_ms is not None:
        reader = reader.option("latestOffsetWaitMs", str(args.wait_ms))
    query = (reader.option("startingOffsets", "latest").load()
             .writeStream.foreachBatch(measure).option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
    while not query.recentProgress:  # planned its first batch: publishing starts now
        time.sleep(0.1)
    context = multiprocessing.get_context("spawn")
    per = args.rate / args.publishers
    counts = [context.Value("q", 0) for _ in range(args.publishers)]
    publishers = [
        context.Process(target=mqtt_publisher, args=(mqtt[0], mqtt[1], f"{args.stream}/device{i}/temp", per,
                                                     args.seconds, args.body_size, i, counts[i]))
        for i in range(args.publishers)
    ]
    start = time.perf_counter()
    timed_from[0] = time.time_ns() + int(args.warmup * 1e9)
    for p in publishers:
        p.start()
    def read_up_to() -> int:
        """Records the query has read to: the end offsets of its last micro-batch."""
        progress = query.lastProgress
        if not progress:
            return 0
        end = progress["sources"][0]["endOffset"]
        return sum(int(v) for v in (json.loads(end) if isinstance(end, str) else end).values())

    with BrokerClient(url) as client:
        while any(p.is_alive() for p in publishers):
            time.sleep(1.0)
            latest = sum(p["latest"] for p in client.stream(args.stream)["partitions"])
            if time.time_ns() >= timed_from[0]:
                lags.append(latest - read_up_to())
        for p in publishers:
            p.join()
        published = time.perf_counter() - start
        final = sum(p["latest"] for p in client.stream(args.stream)["partitions"])
        caught_up = time.perf_counter()
        while time.perf_counter() - caught_up < 30 and read_up_to() < final:
            time.sleep(0.2)
        drained = time.perf_counter() - caught_up
    durations = sorted(p.durationMs.get("triggerExecution", 0) for p in query.recentProgress)
    query.stop()
    spark.stop()
    sent = sum(c.value for c in counts)
    print(f"published {sent:,} QoS 0 messages in {published:.1f} s = {sent / published:,.0f} msgs/s "
          f"({args.publishers} MQTT publishers); the stream took {final:,}")
    print(f"the query read {rows[0]:,} rows; lag sampled each second after {args.warmup:g} s: max {max(lags, default=0):,} records, "
          f"median {sorted(lags)[len(lags) // 2] if lags else 0:,}; caught up {drained:.1f} s after the last publish")
    if latencies:
        values = pa.compute.divide(pa.chunked_array(latencies, pa.int64()).cast(pa.float64()), 1e6)
        p50, p99 = (pa.compute.quantile(values, q=[0.5, 0.99])).to_pylist()
        print(f"publish-to-row latency (ms, at foreachBatch on the driver, after {args.warmup:g} s): p50 {p50:.0f}, "
              f"p99 {p99:.0f}, max {pa.compute.max(values).as_py():.0f}  (trigger every {args.trigger_ms} ms)")
    if durations:
        print(f"micro-batch durations (ms, the last {len(durations)}): p50 {durations[len(durations) // 2]}, "
              f"p90 {durations[len(durations) * 9 // 10]}, max {durations[-1]}")


# -- idle: what queries with nothing to read cost the broker ------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_requests(url: str) -> float:
    """The broker's admin requests answered so far (gateway_http_requests_total, every series)."""
    with BrokerClient(url) as client:
        status, _, data = client.request("GET", "/metrics")
    if status != 200:
        raise SystemExit(f"bench: GET {url}/metrics answered {status}")
    return sum(float(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines()
               if line.startswith("gateway_http_requests_total{"))


def idle(args: argparse.Namespace, url: str, pid: int) -> None:
    """``--queries`` streaming queries on a stream nobody writes to; the broker's CPU and requests over ``--seconds``."""
    spark = _session(args.cores)
    queries = []
    for _ in range(args.queries):
        reader = spark.readStream.format("gateway").option("url", url).option("stream", args.stream)
        if args.wait_ms is not None:
            reader = reader.option("latestOffsetWaitMs", str(args.wait_ms))
        queries.append(reader.load().writeStream.format("noop")
                       .option("checkpointLocation", tempfile.mkdtemp(prefix="gateway-bench-cp-")).start())
    while not all(q.recentProgress for q in queries):  # every query past its first batch
        time.sleep(0.1)
    time.sleep(args.warmup)
    cpu, requests, start = cpu_seconds(pid), http_requests(url), time.perf_counter()
    time.sleep(args.seconds)
    cpu, requests = cpu_seconds(pid) - cpu, http_requests(url) - requests - 1  # less this scrape
    elapsed = time.perf_counter() - start
    stopping = time.perf_counter()
    for q in queries:
        q.stop()
    stopped = (time.perf_counter() - stopping) / len(queries)
    spark.stop()
    wait = "default" if args.wait_ms is None else f"{args.wait_ms} ms"
    print(f"{args.queries} idle quer{'y' if args.queries == 1 else 'ies'} (latestOffsetWaitMs {wait}) for {elapsed:.0f} s: "
          f"broker CPU {100 * cpu / elapsed:.2f}% of a core, {requests / elapsed:.1f} HTTP requests/s; "
          f"query.stop() took {stopped:.2f} s on average")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("backfill", "live", "idle"))
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running broker's admin URL, e.g. http://127.0.0.1:8161")
    where.add_argument("--start-broker", action="store_true", help="run a broker of its own in a temporary directory")
    parser.add_argument("--stream", default="bench", help="stream name; with --start-broker it takes topic://NAME.>")
    parser.add_argument("--partitions", type=int, default=2, help="stream partitions (with --start-broker)")
    parser.add_argument("--records", type=int, default=2_000_000, help="backfill: rows to publish first")
    parser.add_argument("--body-size", type=int, default=64)
    parser.add_argument("--no-publish", action="store_true", help="backfill: read what the stream already holds")
    parser.add_argument("--runs", type=int, default=3, help="backfill: timed batch reads")
    parser.add_argument("--min-partitions", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=60.0, help="live: how long the publishers publish; idle: "
                        "how long the broker's CPU is measured")
    parser.add_argument("--rate", type=float, default=20_000, help="live: QoS 0 messages/s, all publishers together")
    parser.add_argument("--publishers", type=int, default=2, help="live: MQTT publisher processes")
    parser.add_argument("--trigger-ms", type=int, default=500, help="live: the query's trigger interval")
    parser.add_argument("--warmup", type=float, default=5.0, help="live: seconds of messages not timed (Spark's workers "
                        "start); idle: seconds after the queries start before measuring")
    parser.add_argument("--wait-ms", type=int, default=None, help="live, idle: the queries' latestOffsetWaitMs "
                        "(default: the source's)")
    parser.add_argument("--queries", type=int, default=1, help="idle: streaming queries")
    parser.add_argument("--broker-pid", type=int, default=None, help="idle: the broker's process id (with --url)")
    parser.add_argument("--mqtt", default="127.0.0.1:1883", help="live: HOST:PORT of the broker's MQTT listener (with --url)")
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    args = parser.parse_args(argv)
    broker = _broker(args.stream, args.partitions) if args.start_broker else None
    try:
        url = broker.url if broker else args.url
        if args.mode == "backfill":
            backfill(args, url)
        elif args.mode == "idle":
            pid = broker.proc.pid if broker else args.broker_pid
            if pid is None:
                parser.error("idle needs --start-broker or --broker-pid (its CPU is read from /proc)")
            idle(args, url, pid)
        else:
            host, _, port = args.mqtt.rpartition(":")
            live(args, url, ("127.0.0.1", broker.mqtt_port) if broker else (host or "127.0.0.1", int(port)))
    finally:
        if broker:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
