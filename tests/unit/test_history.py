"""The broker's short history of message totals (core/history.py), on a virtual clock."""
from __future__ import annotations

from twisted.internet.task import Clock

from core.broker import Broker
from core.history import TrafficHistory
from core.message import Message
from core.policy import Policy
from persistence.memory import MemoryStore


def make(**policy):
    clock = Clock()
    clock.advance(1_000)
    broker = Broker(MemoryStore(), clock, Policy(**policy))
    broker.start()
    return broker, clock


def test_samples_every_interval_keep_five_minutes_and_give_rates():
    broker, clock = make(traffic_history_interval=5.0)
    conn = broker.connect(protocol="stomp/1.2")
    got = []
    conn.subscribe("queue://h", lambda consumer, entry, tag: got.append(entry))
    for second in range(400):
        if second < 100:  # two messages a second for the first 100 s, then silence
            for _ in range(2):
                conn.send(Message(broker.new_message_id(), "queue://h", b"x", timestamp=broker.now_ms()))
        clock.advance(1)
    samples = broker.history.describe()
    # A sample at start and every 5 s since; the last 300 s of them, one more for the first rate.
    assert len(samples) == 61
    assert [s["time_ms"] for s in samples] == [1_000_000 + 100_000 + 5_000 * i for i in range(61)]
    assert samples[0]["in_per_second"] is None and samples[0]["out_per_second"] is None
    assert all(s["in_per_second"] == 0 and s["out_per_second"] == 0 for s in samples[1:])
    assert samples[-1]["received"] == 200 and samples[-1]["sent"] == 200 == len(got)
    assert broker.traffic_totals() == (200, 200)


def test_rates_are_over_the_real_time_between_samples():
    history = TrafficHistory(interval=5.0)
    history.add(10_000, 0, 0)
    history.add(15_000, 50, 10)
    history.add(25_000, 50, 30)  # a late sample: 10 s, not 5
    assert [(s["in_per_second"], s["out_per_second"]) for s in history.describe()] == [(None, None), (10.0, 2.0), (0.0, 2.0)]


def test_a_closed_connections_traffic_stays_in_the_totals():
    broker, clock = make(traffic_history_interval=1.0)
    conn = broker.connect(protocol="mqtt/4")
    conn.send(Message(broker.new_message_id(), "topic://t", b"x", timestamp=broker.now_ms()))
    conn.close()
    clock.advance(1)
    assert broker.history.describe()[-1]["received"] == 1 and broker.history.describe()[-1]["in_per_second"] == 1.0


def test_no_history_when_the_interval_is_0_and_stop_ends_the_sampling():
    broker, clock = make(traffic_history_interval=0)
    clock.advance(60)
    assert broker.history.describe() == []
    assert all(call.func != broker._sample_traffic for call in clock.getDelayedCalls())  # no timer at all
    broker, clock = make(traffic_history_interval=5.0)
    broker.stop()
    assert all(call.func != broker._sample_traffic for call in clock.getDelayedCalls())
    clock.advance(60)
    assert len(broker.history.describe()) == 1  # the one taken at start
