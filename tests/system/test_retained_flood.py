"""Retained messages on ever new topics, against a real broker process.

300,000 retained 32-byte messages on ``dev/<n>/state`` once took the broker
from 57 to 399 MiB, all loaded again at every start.  Now only a compact
index is in memory (the messages stay in the store), and the count and bytes
are bounded by ``max_retained_messages`` / ``max_retained_bytes``.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from protocols.mqtt import codec as mq
from tests.support import RawMqtt
from tests.system.test_unfinished_frames import Broker

pytestmark = pytest.mark.timeout(300)

FLOOD = 300_000


def publish_retained(broker: Broker, count: int) -> None:
    """One device retaining a 32-byte state on a new topic each time, at QoS 0, in large writes."""
    raw = RawMqtt(broker, level=4)
    assert raw.connect("flooder").reason_code == 0
    payload = b"s" * 32
    batch = []
    for n in range(count):
        batch.append(mq.encode(mq.Publish(f"dev/{n}/state", payload, qos=0, retain=True), 4))
        if len(batch) == 2000:
            raw.send(b"".join(batch))
            batch = []
    if batch:
        raw.send(b"".join(batch))
    raw.packet(mq.Pingreq())  # a barrier: everything before it was handled
    assert isinstance(raw.read(120), mq.Pingresp)
    raw.close()


def retained_of(broker: Broker, topic_filter: str, level: int = 4, expect: int = 1) -> list[mq.Publish]:
    raw = RawMqtt(broker, level=level)
    raw.connect(f"reader-{time.monotonic_ns()}")
    raw.packet(mq.Subscribe(1, [mq.SubscriptionRequest(topic_filter, 0)]))
    got = []
    while True:
        packet = raw.read(10)
        if isinstance(packet, mq.Suback):
            break
    for _ in range(expect):
        packet = raw.read(10)
        assert isinstance(packet, mq.Publish) and packet.retain, packet
        got.append(packet)
    raw.packet(mq.Pingreq())
    assert isinstance(raw.read(10), mq.Pingresp)  # and nothing else was retained for the filter
    raw.close()
    return got


def test_a_flood_of_retained_topics_stays_small_in_memory_and_at_restart(tmp_path: Path):
    broker = Broker(tmp_path / "flood")
    try:
        before = broker.rss_mib()
        publish_retained(broker, FLOOD)
        time.sleep(0.5)  # a quiet moment before sampling RSS: the broker's freeing has no event to wait for
        after = broker.rss_mib()
        print(f"RSS {before:.0f} MiB before, {after:.0f} MiB after {FLOOD:,} retained topics")
        assert after - before < 128, f"RSS grew {after - before:.0f} MiB"
        (last,) = retained_of(broker, f"dev/{FLOOD - 1}/state")
        assert last.payload == b"s" * 32 and last.topic == f"dev/{FLOOD - 1}/state"
    finally:
        broker.stop()
    # A restart reads the index, not the messages.
    again = Broker(tmp_path / "flood")
    try:
        restarted = again.rss_mib()
        print(f"RSS after a restart: {restarted:.0f} MiB")
        assert restarted - before < 128
        (first,) = retained_of(again, "dev/0/state")
        assert first.payload == b"s" * 32
        assert len(retained_of(again, "dev/+/state", expect=FLOOD)) == FLOOD  # read from the store on demand
    finally:
        again.stop()


def test_past_the_bound_each_protocol_answers_as_it_can(tmp_path: Path):
    bounded = Broker(tmp_path / "bounded", extra="[policy]\nmax_retained_messages = 3")
    try:
        v5 = RawMqtt(bounded, level=5)
        assert v5.connect("pub5").reason_code == 0
        for i in range(3):
            v5.packet(mq.Publish(f"r/{i}", b"kept", qos=1, packet_id=i + 1, retain=True))
            assert v5.read().reason_code == 0
        v5.packet(mq.Publish("r/3", b"one too many", qos=1, packet_id=9, retain=True))
        ack = v5.read()
        assert isinstance(ack, mq.Puback) and ack.reason_code == 0x97
        assert "max_retained_messages" in ack.properties["reason_string"]
        v5.packet(mq.Publish("r/0", b"replaced", qos=1, packet_id=10, retain=True))  # not a new topic
        assert v5.read().reason_code == 0
        # 3.1.1: published to live subscribers, but not retained, and logged.
        live = RawMqtt(bounded, level=4)
        live.connect("live")
        live.packet(mq.Subscribe(1, [mq.SubscriptionRequest("r/#", 0)]))
        got = [live.read(10) for _ in range(4)]
        assert sorted(p.topic for p in got if isinstance(p, mq.Publish)) == ["r/0", "r/1", "r/2"]
        v4 = RawMqtt(bounded, level=4)
        v4.connect("pub4")
        v4.packet(mq.Publish("r/4", b"live only", qos=1, packet_id=1, retain=True))
        assert isinstance(v4.read(), mq.Puback)
        delivered = live.read(10)
        assert isinstance(delivered, mq.Publish) and delivered.payload == b"live only"
        assert [p.topic for p in retained_of(bounded, "r/#", expect=3)] == ["r/0", "r/1", "r/2"]
        assert "retained flag dropped on 'r/4'" in "".join(bounded.process.lines)
        # Clearing one makes room.
        v5.packet(mq.Publish("r/1", b"", qos=1, packet_id=11, retain=True))
        assert v5.read().reason_code == 0
        v5.packet(mq.Publish("r/5", b"now room", qos=1, packet_id=12, retain=True))
        assert v5.read().reason_code == 0
        assert sorted(p.topic for p in retained_of(bounded, "r/#", expect=3)) == ["r/0", "r/2", "r/5"]
    finally:
        bounded.stop()
