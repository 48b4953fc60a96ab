"""The laptop pipeline (spark/pipeline.py) end to end: paho devices -> stream -> Spark -> sink -> STOMP."""
from __future__ import annotations

import pytest

from tests.spark.support import BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_averages_per_room_reach_a_stomp_client(spark, tmp_path):
    from spark.pipeline import Settings, room_temperature, run

    broker = BrokerProcess(tmp_path / "broker", {"sensors": {"destinations": ["topic://sensors.>"], "partitions": 2}})
    try:
        settings = Settings(
            broker.url, ("127.0.0.1", broker.mqtt_port), ("127.0.0.1", broker.stomp_port),
            seconds=14, rooms=3, rate=20, window_seconds=2, watermark_seconds=1, checkpoint=str(tmp_path / "checkpoint"),
        )
        averages, published = run(spark, settings, echo=False)
    finally:
        broker.stop()
    assert published > 0
    got = averages.received
    assert {a["room"] for a in got} == {"room0", "room1", "room2"}, got
    for a in got:
        room = int(a["room"][len("room"):])
        # Readings alternate half a degree either side of the room's temperature.
        assert abs(a["avg_celsius"] - room_temperature(room, 0) - 0.5) <= 0.5, a
        assert a["destination"] == f"/topic/averages.{a['room']}" and a["readings"] > 0
    windows = [(a["room"], a["window_start"]) for a in got]
    assert len(windows) == len(set(windows)), "a window was published twice"
