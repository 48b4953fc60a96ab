"""Exactly-once under faults: the Spark driver or the broker killed with SIGKILL mid-stream.

Producers (stomp.py with receipts, paho-mqtt at QoS 1) keep sending into a
broker process that streams their destinations; a Structured Streaming query
(tests/system/spark_driver.py: the ``gateway`` source into a checkpointed
Parquet sink) reads the stream.  Then either the driver's whole process group
(Python and JVM) is killed with SIGKILL several times and started again from
its checkpoint, or the broker is, and the running query rides each restart
out.  At the end a last
``availableNow`` run reads up to the end and the output is compared with what
the producers were told was stored: every confirmed message exactly once, no
(partition, offset) twice, nothing that was never sent.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark_jvm import class_archive, driver_options
from tests.system.crash import STREAM_CONFIG, Broker, Ledger, MqttProducer, StompProducer, read_stream

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("pyspark")

RATE = 200  # messages a second per producer: every micro-batch has work, and Spark keeps up on 2 cores


@pytest.fixture
def java_options(tmp_path_factory: Any) -> str:
    """The drivers' JVM options: the class archive tests/spark's session left, when it ran (tests/spark_jvm.py)."""
    return driver_options(class_archive(tmp_path_factory))


class Driver:
    """One run of tests/system/spark_driver.py in its own process group."""

    def __init__(
        self, broker: Broker, work: Path, java_options: str, available_now: bool = False,
        summary: Path | None = None, relay_to: str | None = None,
    ) -> None:
        command = [
            sys.executable, "-m", "tests.system.spark_driver", "--url", f"http://127.0.0.1:{broker.admin_port}",
            "--stream", "crash", "--out", str(work / "out"), "--checkpoint", str(work / "checkpoint"),
            f"--java-options={java_options}",  # one argument, also when it is a lone "-XX:..." (no archive yet)
        ]
        if relay_to:
            command += ["--relay-to", relay_to]
        if available_now:
            command.append("--available-now")
        if summary is not None:
            command += ["--summary", str(summary)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        self.log = open(work / "driver.log", "a")
        self.proc = subprocess.Popen(
            command, cwd=Path(__file__).resolve().parents[2], stdout=self.log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL for the driver and everything it started (its JVM, its Python workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.log.close()

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()
        self.log.close()
        return code


def committed_batches(work: Path) -> int:
    """Micro-batches the query has committed (its checkpoint's commit log)."""
    log = work / "checkpoint" / "commits"
    if not log.is_dir():
        return 0
    return sum(1 for p in log.iterdir() if p.name.split(".")[0].isdigit())


def wait_for_batches(work: Path, at_least: int, timeout: float, driver: Driver) -> None:
    deadline = time.monotonic() + timeout
    while committed_batches(work) < at_least:
        if driver.proc.poll() is not None:
            raise AssertionError(f"the driver exited ({driver.proc.returncode}):\n{(work / 'driver.log').read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {at_least} batches in {timeout}s:\n{(work / 'driver.log').read_text()[-4000:]}")
        time.sleep(0.2)  # a poll: the checkpoint's commit log (files another process writes) has no event


class Producers:
    """A STOMP and an MQTT producer, started anew after each broker start."""

    def __init__(self) -> None:
        self.stomp = Ledger("stomp")
        self.mqtt = Ledger("mqtt")
        self.running: list[Any] = []
        self.generation = 0

    def start(self, broker: Broker) -> None:
        self.generation += 1
        self.running = [
            StompProducer(broker.stomp_port, self.generation, self.stomp, rate=RATE),
            MqttProducer(broker.mqtt_port, self.generation, self.mqtt, rate=RATE),
        ]
        for producer in self.running:
            producer.start()

    def finish(self) -> None:
        for producer in self.running:
            producer.finish()
        self.running = []

    def confirmed(self) -> set[str]:
        return self.stomp.confirmed | self.mqtt.confirmed

    def sent(self) -> set[str]:
        return set(self.stomp.sent) | set(self.mqtt.sent)


def check_exactly_once(summary_file: Path, producers: Producers) -> dict[str, Any]:
    rows = json.loads(summary_file.read_text())
    bodies = [body for _, _, _, body in rows]
    positions = [(p, o) for _, p, o, _ in rows]
    figures = {
        "rows": len(rows),
        "confirmed": len(producers.confirmed()),
        "sent": len(producers.sent()),
        "missing": len(producers.confirmed() - set(bodies)),
        "twice": len(bodies) - len(set(bodies)),
        "positions_twice": len(positions) - len(set(positions)),
        "unexpected": len(set(bodies) - producers.sent()),
    }
    text = json.dumps(figures)
    assert figures["confirmed"] > 1000, text
    assert figures["missing"] == 0, f"confirmed messages missing from the output: {text}"
    assert figures["twice"] == 0 and figures["positions_twice"] == 0, f"rows written twice: {text}"
    assert figures["unexpected"] == 0, text
    # Offsets are dense per partition: nothing read was skipped either.
    by_partition: dict[int, list[int]] = {}
    for _, p, o, _ in rows:
        by_partition.setdefault(p, []).append(o)
    for p, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {p}: offsets not dense from 0"
    return figures


def kill_between_publish_and_commit(broker: Broker, work: Path, driver: Driver, timeout: float = 60) -> None:
    """SIGKILL the driver once a micro-batch's rows are on the broker but its commit is not written.

    The sink is the only publisher to relay.out: rows appearing there while
    the commit log stands still belong to a batch Spark has not committed.
    """
    import urllib.request

    def relayed() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/api/v1/streams/relay", timeout=5) as answer:
            return sum(p["latest"] for p in json.load(answer)["partitions"])

    baseline: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        commits = committed_batches(work)
        latest = relayed()
        if commits == committed_batches(work):  # no commit landed while we looked
            if latest > baseline.setdefault(commits, latest):
                driver.kill()
                return
        time.sleep(0.005)  # a poll for a moment (published, not yet committed) that no event marks: the kill lands in it
    raise AssertionError(f"no micro-batch published without committing in {timeout}s:\n{(work / 'driver.log').read_text()[-3000:]}")


def read_to_the_end_and_check(broker: Broker, tmp_path: Path, producers: Producers, java_options: str) -> None:
    """A last availableNow run from the checkpoint, then every confirmed message exactly once."""
    producers.finish()
    summary = tmp_path / "summary.json"
    final = Driver(broker, tmp_path, java_options, available_now=True, summary=summary)
    assert final.wait(180) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    print(json.dumps(check_exactly_once(summary, producers)))


RELAY_CONFIG = """
[streams.relay]
destinations = ["topic://relay.>"]
"""


def _stream_broker(tmp_path: Path) -> Broker:
    config = tmp_path / "stream.toml"
    config.write_text(STREAM_CONFIG + RELAY_CONFIG)
    broker = Broker(tmp_path / "data", config=str(config), keep_ports=True)
    broker.start()
    return broker


def test_driver_killed_mid_stream_then_restarted_from_its_checkpoint(tmp_path, java_options):
    rng = random.Random(7)
    broker = _stream_broker(tmp_path)
    producers = Producers()
    try:
        producers.start(broker)
        for kill in range(3):
            driver = Driver(broker, tmp_path, java_options)
            wait_for_batches(tmp_path, committed_batches(tmp_path) + 2, 120, driver)
            time.sleep(rng.uniform(0.1, 1.5))  # the fault's timing under test: a kill somewhere inside a later batch
            driver.kill()
        read_to_the_end_and_check(broker, tmp_path, producers, java_options)
    finally:
        producers.finish()
        broker.ensure_dead()


def test_broker_killed_and_restarted_under_the_query(tmp_path, java_options):
    rng = random.Random(11)
    broker = _stream_broker(tmp_path)
    producers = Producers()
    driver: Driver | None = None
    try:
        producers.start(broker)
        driver = Driver(broker, tmp_path, java_options)
        wait_for_batches(tmp_path, 2, 120, driver)
        for kill in range(3):
            time.sleep(rng.uniform(0.5, 2.0))  # the fault's timing under test: a kill at a random point of the stream
            broker.kill()
            producers.finish()
            time.sleep(rng.uniform(0.2, 1.0))  # the fault's timing under test: the broker down for a while
            broker.start()
            producers.start(broker)
            # The query rides the restart out (the source retries for retryTimeoutMs): no new driver.
            wait_for_batches(tmp_path, committed_batches(tmp_path) + 2, 120, driver)
        driver.kill()
        read_to_the_end_and_check(broker, tmp_path, producers, java_options)
    finally:
        producers.finish()
        if driver is not None and driver.proc.poll() is None:
            driver.kill()
        broker.ensure_dead()


def test_sink_batches_killed_after_publishing_publish_nothing_twice(tmp_path, java_options):
    """The gateway sink relays the stream to a topic; the driver is killed mid-batch three times.

    A batch killed after its rows were published and before Spark committed
    it runs again after the restart, with the same ids: the broker drops
    them.  The relay topic's own stream (a consumer of every message routed
    to it) must hold each confirmed message exactly once.
    """
    broker = _stream_broker(tmp_path)
    producers = Producers()
    try:
        producers.start(broker)
        for kill in range(2):
            driver = Driver(broker, tmp_path, java_options, relay_to="/topic/relay.out")
            wait_for_batches(tmp_path, committed_batches(tmp_path) + 1, 120, driver)
            kill_between_publish_and_commit(broker, tmp_path, driver)
        producers.finish()
        final = Driver(broker, tmp_path, java_options, available_now=True, relay_to="/topic/relay.out")
        assert final.wait(180) == 0, (tmp_path / "driver.log").read_text()[-4000:]
        relayed = [body for records in read_stream(broker, "relay").values() for _, body in records]
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/api/v1", timeout=10) as answer:
            duplicates = json.load(answer)["duplicates"]
        figures = {
            "relayed": len(relayed), "confirmed": len(producers.confirmed()), "dropped_as_duplicates": duplicates["dropped"],
            "twice": len(relayed) - len(set(relayed)), "missing": len(producers.confirmed() - set(relayed)),
            "unexpected": len(set(relayed) - producers.sent()),
        }
        print(json.dumps(figures))
        assert figures["confirmed"] > 1000, figures
        assert figures["dropped_as_duplicates"] > 0, f"no retried batch republished anything: {figures}"
        assert figures["twice"] == 0, f"a retried batch published rows again: {figures}"
        assert figures["missing"] == 0 and figures["unexpected"] == 0, figures
    finally:
        producers.finish()
        broker.ensure_dead()
