"""A whole pipeline on one laptop: devices -> broker stream -> Spark -> broker topic -> STOMP.

    python -m spark.pipeline --start-broker            # starts a broker of its own, too
    python -m spark.pipeline --url http://127.0.0.1:8161 --mqtt 127.0.0.1:1883 --stomp 127.0.0.1:61613

Simulated devices (paho-mqtt, one client per room) publish temperatures to
``sensors/<room>/temp``.  The broker keeps them in the stream ``sensors``
(``[streams.sensors] destinations = ["topic://sensors.>"]``).  A Structured
Streaming query reads the stream with the ``gateway`` source, averages each
room's readings over tumbling windows of broker time, and publishes one
message per room and window with the ``gateway`` sink to
``/topic/averages.<room>``.  A STOMP client (stomp.py) subscribed to
``/topic/averages.>`` prints them as they arrive.

It needs the broker's URL and its MQTT and STOMP addresses, or
``--start-broker`` (``gateway run`` in a temporary directory with that
stream).  This module imports nothing of the broker: everything goes over
the network, as it would between machines.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spark.localbroker import LocalBroker

STREAM_CONFIG = """[streams.sensors]
destinations = ["topic://sensors.>"]
partitions = 2
"""


@dataclass
class Settings:
    url: str
    mqtt: tuple[str, int]
    stomp: tuple[str, int]
    seconds: float = 60.0
    rooms: int = 4
    rate: float = 10.0          # readings per second per room
    window_seconds: int = 10
    watermark_seconds: int = 5
    checkpoint: str = ""


@dataclass
class Averages:
    """What the STOMP client saw: one entry per message on /topic/averages.>."""

    received: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: dict[str, Any]) -> None:
        with self.lock:
            self.received.append(item)


def room_temperature(room: int, n: int) -> float:
    """Readings alternate half a degree either side of the room's own temperature."""
    return 18.0 + 2 * room + (0.5 if n % 2 else -0.5)


class Devices:
    """One paho client per room, publishing at QoS 1 until stopped."""

    def __init__(self, settings: Settings) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.settings = settings
        self.stopping = threading.Event()
        self.published = 0
        self.clients = []
        for room in range(settings.rooms):
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pipeline-room{room}-{os.getpid()}", protocol=mqtt.MQTTv311)
            client.connect(*settings.mqtt)
            client.loop_start()
            self.clients.append(client)
        self.thread = threading.Thread(target=self._run, daemon=True, name="devices")

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        interval = 1.0 / self.settings.rate
        n = 0
        next_at = time.monotonic()
        while not self.stopping.is_set():
            for room, client in enumerate(self.clients):
                client.publish(f"sensors/room{room}/temp", f"{room_temperature(room, n):.1f}", qos=1)
                self.published += 1
            n += 1
            next_at += interval
            self.stopping.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        for client in self.clients:
            client.disconnect()
            client.loop_stop()


class Watcher:
    """The STOMP end of the pipeline: prints (and keeps) every average as it arrives."""

    def __init__(self, settings: Settings, averages: Averages, echo: bool) -> None:
        import stomp

        # stomp.py ships no type information, so its ConnectionListener is Any to mypy; the
        # subclass is needed (stomp calls on_send and others on every listener).
        class Listener(stomp.ConnectionListener):  # type: ignore[misc]
            def on_message(self, frame: Any) -> None:
                item = json.loads(frame.body)
                item["destination"] = frame.headers.get("destination")
                averages.add(item)
                if echo:
                    print(
                        f"{item['window_start']} .. {item['window_end']}  {item['room']:>6}  "
                        f"{item['avg_celsius']:6.2f} C  over {item['readings']} readings  ({item['destination']})",
                        flush=True,
                    )

        self.conn = stomp.Connection12([settings.stomp])
        self.conn.set_listener("averages", Listener())
        self.conn.connect(wait=True)
        self.conn.subscribe("/topic/averages.>", id="averages", ack="auto")

    def stop(self) -> None:
        self.conn.disconnect()


def start_query(session: Any, settings: Settings) -> Any:
    """The Spark part: windowed averages per room, published back to the broker."""
    from pyspark.sql import functions as F

    readings = (
        session.readStream.format("gateway").option("url", settings.url).option("stream", "sensors")
        .option("startingOffsets", "latest").load()
        .select(
            F.col("timestamp"),
            F.split(F.col("destination"), r"\.").getItem(1).alias("room"),
            F.col("body").cast("string").cast("double").alias("celsius"),
        )
    )
    averages = (
        readings.withWatermark("timestamp", f"{settings.watermark_seconds} seconds")
        .groupBy(F.window("timestamp", f"{settings.window_seconds} seconds"), F.col("room"))
        .agg(F.avg("celsius").alias("avg"), F.count(F.lit(1)).alias("readings"))
        .select(
            F.concat(F.lit("/topic/averages."), F.col("room")).alias("destination"),
            F.to_json(F.struct(
                F.col("room"),
                F.date_format("window.start", "HH:mm:ss").alias("window_start"),
                F.date_format("window.end", "HH:mm:ss").alias("window_end"),
                F.round("avg", 2).alias("avg_celsius"),
                F.col("readings"),
            )).alias("body"),
        )
    )
    return (
        averages.writeStream.format("gateway").option("url", settings.url)
        .option("checkpointLocation", settings.checkpoint)
        .outputMode("append")  # one message per room and window, once the watermark closes it
        .trigger(processingTime="1 second")
        .start()
    )


def run(session: Any, settings: Settings, echo: bool = True) -> tuple[Averages, int]:
    """Run every part for ``settings.seconds``; returns what the STOMP client saw and how many readings were sent."""
    averages = Averages()
    watcher = Watcher(settings, averages, echo)
    query = start_query(session, settings)
    devices = Devices(settings)
    try:
        devices.start()
        deadline = time.monotonic() + settings.seconds
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the Spark query failed: {query.exception()}")
            time.sleep(0.5)
    finally:
        devices.stop()
        try:
            if query.exception() is None:
                query.processAllAvailable()  # stop between batches, not inside one
        finally:
            query.stop()
            watcher.stop()
    return averages, devices.published


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--start-broker", action="store_true", help="start a broker with the sensors stream for the run")
    parser.add_argument("--url", default="http://127.0.0.1:8161", help="the broker's admin HTTP address")
    parser.add_argument("--mqtt", default="127.0.0.1:1883", help="HOST:PORT of its MQTT listener")
    parser.add_argument("--stomp", default="127.0.0.1:61613", help="HOST:PORT of its STOMP listener")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rooms", type=int, default=4)
    parser.add_argument("--rate", type=float, default=10.0, help="readings per second per room")
    parser.add_argument("--window", type=int, default=10, help="window length in seconds")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    broker = LocalBroker(STREAM_CONFIG, "spark.pipeline") if args.start_broker else None
    checkpoint = tempfile.mkdtemp(prefix="gateway-pipeline-checkpoint-")
    try:
        if broker is not None:
            url, mqtt_address, stomp_address = broker.url, ("127.0.0.1", broker.mqtt_port), ("127.0.0.1", broker.stomp_port)
        else:
            url, mqtt_address, stomp_address = args.url, _address(args.mqtt), _address(args.stomp)
        from pyspark.sql import SparkSession

        from spark import GatewayDataSource

        session = (
            SparkSession.builder.master(args.master).appName("gateway-pipeline")
            .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false").getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        session.dataSource.register(GatewayDataSource)
        settings = Settings(
            url, mqtt_address, stomp_address, seconds=args.seconds, rooms=args.rooms, rate=args.rate,
            window_seconds=args.window, watermark_seconds=max(1, args.window // 2), checkpoint=checkpoint,
        )
        print(f"devices publish to sensors/<room>/temp; averages over {args.window} s windows arrive on /topic/averages.>", flush=True)
        averages, published = run(session, settings)
        print(f"{published} readings published, {len(averages.received)} averages received over STOMP", flush=True)
        session.stop()
        return 0 if averages.received else 1
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
