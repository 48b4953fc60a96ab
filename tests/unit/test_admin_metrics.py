"""The pieces of the operators' views without sockets: counters in the core, the metrics
collector's cap, the store's histograms, the [admin] metrics keys and the broker:// rules."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock

from core.access import Permission, Principal, Rule, Rules
from core.broker import Broker
from core.consumer import AckMode
from core.message import Message
from core.policy import Policy
from gateway.admin.metrics import BrokerCollector
from gateway.config import ConfigError, load
from persistence.memory import MemoryStore
from persistence.rocks import RocksStore
from persistence.stats import Buckets


def make(**policy):
    clock = Clock()
    clock.advance(1_000_000)
    broker = Broker(MemoryStore(), clock, Policy(**policy))
    broker.start()
    return broker, clock


def send(broker, conn, destination, n=1, **fields):
    for _ in range(n):
        conn.send(Message(broker.new_message_id(), destination, b"x", {}, timestamp=broker.now_ms(), **fields))


def test_connections_count_their_messages_and_leave_them_to_the_protocol_totals():
    broker, _ = make()
    producer = broker.connect("p", protocol="stomp/1.2")
    consumer = broker.connect("c", protocol="mqtt/5")
    consumer.subscribe("queue://q", lambda c, e, t: None, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, producer, "queue://q", 3)
    assert (producer.messages_in, producer.messages_out) == (3, 0)
    assert (consumer.messages_in, consumer.messages_out) == (0, 3)
    producer.close()
    consumer.close()
    assert broker.closed_traffic == {"stomp/1.2": [3, 0], "mqtt/5": [0, 3]}


def test_close_for_asks_the_session_and_only_once():
    broker, _ = make()
    conn = broker.connect("c", protocol="stomp/1.2")
    assert conn.close_for("why") is False  # no session registered a closer
    told = []

    class Session:
        def close_by_admin(self, reason: str) -> None:
            told.append(reason)
            conn.close()

    conn.closer = Session()
    assert conn.close_for("maintenance") is True and told == ["maintenance"]
    assert conn.close_for("again") is False and told == ["maintenance"]


def test_queues_count_expired_and_dead_lettered():
    broker, clock = make(max_redeliveries=0)
    conn = broker.connect("c", protocol="stomp/1.2")
    send(broker, conn, "queue://old", expiration=broker.now_ms() + 10)
    clock.advance(1)  # the sweep finds it expired
    assert broker.queues["queue://old"].expired == 1 and broker.queues["queue://old"].dead_lettered == 1
    consumer = conn.subscribe("queue://bad", lambda c, e, t: None, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "queue://bad")
    conn.nack(consumer, 1)
    assert broker.queues["queue://bad"].dead_lettered == 1 and broker.queues["queue://bad"].expired == 0
    assert len(broker.queues["queue://DLQ"]) == 2


def scrape(collector):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_the_cap_keeps_the_deepest_queues_and_zero_keeps_none():
    broker, _ = make()
    conn = broker.connect("p", protocol="stomp/1.2")
    for depth in range(1, 8):
        send(broker, conn, f"queue://q{depth}", depth)
    broker.create_temp_queue(conn, "tmp")
    samples = scrape(BrokerCollector(broker, "test", max_destinations=2))
    assert set(samples["gateway_queue_messages"]) == {(("queue", "q7"),), (("queue", "q6"),)}
    assert samples["gateway_queue_series_omitted"][()] == 5
    assert samples["gateway_queues"][()] == 7  # the temporary queue is not counted
    assert samples["gateway_queues_messages"][()] == 28
    none = scrape(BrokerCollector(broker, "test", max_destinations=0))
    assert "gateway_queue_messages" not in none and none["gateway_queue_series_omitted"][()] == 7
    chosen = scrape(BrokerCollector(broker, "test", patterns=["queue://q1", "queue://q2"]))
    assert set(chosen["gateway_queue_messages"]) == {(("queue", "q1"),), (("queue", "q2"),)}


def test_buckets_are_cumulative_with_an_infinite_last():
    buckets = Buckets((1.0, 10.0))
    for value in (0.5, 1.0, 5, 50):
        buckets.observe(value)
    assert buckets.cumulative() == [(1.0, 2), (10.0, 3), (float("inf"), 4)]
    assert (buckets.count, buckets.sum) == (4, 56.5)


def test_the_rocks_store_records_each_batch(tmp_path):
    store = RocksStore(str(tmp_path / "db"), sync=False)
    for seq in range(5):
        store.put_message("queue://q", seq, b"x")
    store.flush()
    store.flush()  # nothing pending: nothing recorded
    assert store.batch_ops.count == 1 and store.batch_ops.sum == 6  # five messages and the destination index
    assert store.write_seconds.count == 1
    assert set(store.family_sizes()) == {"meta", "default"}
    store.close()


@pytest.mark.parametrize("text, error", [
    ("[admin]\nmetrics_max_destinations = -1\n", "metrics_max_destinations must be 0"),
    ("[admin]\nmetrics_destinations = ['topic://a.>']\n", "not a queue pattern"),
    ("[admin]\nmetrics_destinations = ['queue://a.>.b']\n", "'>' before the last level"),
    ("[admin]\nmetrics_destinations = 'queue://a'\n", "metrics_destinations must be list"),
])
def test_metrics_keys_are_checked(tmp_path, text, error):
    path = tmp_path / "gw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load(str(path))


def test_metrics_keys_are_read(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text("[admin]\nmetrics_max_destinations = 50\nmetrics_destinations = ['queue://orders.>']\n")
    settings = load(str(path)).admin_settings
    assert settings.metrics_max_destinations == 50 and settings.metrics_destinations == ["queue://orders.>"]


def test_broker_resources_in_rules():
    rules = Rules([Rule.parse("user:ops", "allow", ["admin"], ["broker://>"])])
    ops = Principal("ops")
    assert rules.allowed(ops, Permission.ADMIN, "broker://connections")
    assert rules.allowed(ops, Permission.ADMIN, "broker://metrics")
    assert not rules.allowed(ops, Permission.ADMIN, "queue://orders")
    assert not rules.allowed(Principal("dev"), Permission.ADMIN, "broker://metrics")
    with pytest.raises(ValueError, match="broker://"):
        Rule.parse("user:ops", "allow", ["admin"], ["brokers://>"])
