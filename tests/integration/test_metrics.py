"""``/metrics`` parsed by prometheus-client's own parser, its values checked against what clients did."""
from __future__ import annotations

import base64
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.access import Rule
from core.stream import StreamSpec
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.integration.test_admin_streams import Api
from tests.support import (
    BrokerHandle,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
)


def scrape(api: Api, headers: dict | None = None) -> dict[str, dict[tuple, float]]:
    """name of each sample -> {sorted label pairs: value}."""
    status, answer_headers, body = api.call("GET", "/metrics", headers=headers)
    assert status == 200, body
    assert answer_headers["Content-Type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def one(samples, name, **labels):
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("metrics"))
    config.admin_settings.metrics_max_destinations = 3
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"], partitions=2)]
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


def test_traffic_queues_and_the_cap(capped):
    api = Api(capped)
    producer, got = connect(capped)
    for depth in range(1, 6):  # m.q1 holds 1 message ... m.q5 holds 5
        for _ in range(depth):
            producer.send(f"/queue/m.q{depth}", "x", headers={"persistent": "true"})
    sync(producer, got)
    consumer, received = connect(capped)
    consumer.subscribe("/queue/m.q1", id="1", ack="client-individual")
    received.wait_for(1)
    device, _ = mqtt_connect(capped, "metrics-device", version=4)
    for i in range(4):
        device.publish("m/t", b"p", qos=1).wait_for_publish(5)
    mqtt_close(device)  # its traffic stays counted after it leaves
    sync(consumer, received)

    samples = scrape(api)
    assert one(samples, "gateway_messages_received_total", protocol="stomp") == 15
    assert one(samples, "gateway_messages_received_total", protocol="mqtt") == 4
    assert one(samples, "gateway_messages_sent_total", protocol="stomp") == 1
    assert one(samples, "gateway_connections", protocol="stomp") == 2
    assert one(samples, "gateway_connections", protocol="mqtt") == 0

    # Five queues, three series: the deepest; the totals count every queue.
    assert set(samples["gateway_queue_messages"]) == {(("queue", f"m.q{d}"),) for d in (3, 4, 5)}
    assert one(samples, "gateway_queue_messages", queue="m.q5") == 5
    assert one(samples, "gateway_queue_enqueued_total", queue="m.q4") == 4
    assert one(samples, "gateway_queue_series_omitted") == 2
    assert one(samples, "gateway_queues") == 5
    assert one(samples, "gateway_queues_messages") == 15  # m.q1's one is unacknowledged, still counted
    assert one(samples, "gateway_queues_enqueued_total") == 15
    assert one(samples, "gateway_queues_consumers") == 1
    assert one(samples, "gateway_store_usage_bytes") > 0

    # Group commit: persistent sends were written in batches, each timed.
    assert one(samples, "gateway_store_batch_operations_count") >= 1
    assert one(samples, "gateway_store_batch_operations_bucket", le="+Inf") == one(samples, "gateway_store_batch_operations_count")
    assert one(samples, "gateway_store_write_seconds_count") >= 1
    assert one(samples, "gateway_store_write_seconds_sum") > 0
    # Receipts waited for syncs; with a fast disk the first ones at least run on the reactor thread.
    assert one(samples, "gateway_store_syncs_total", thread="reactor") >= 1
    assert one(samples, "gateway_store_syncs_total", thread="worker") >= 0
    assert 0 < one(samples, "gateway_store_inline_sync_seconds") < 1
    assert ("family", "default") in {pair for labels in samples["gateway_store_memtable_bytes"] for pair in labels}

    consumer.ack(received.messages[0].headers["ack"])
    sync(consumer, received)
    samples = scrape(api)
    assert one(samples, "gateway_queues_dequeued_total") == 1
    assert one(samples, "gateway_queues_messages") == 14
    disconnect(consumer)
    disconnect(producer)


def test_streams_appends_and_reader_lag(capped):
    api = Api(capped)
    device, _ = mqtt_connect(capped, "metrics-sensor", version=4)
    for i in range(6):
        device.publish("sensors/room1/temp", b"21", qos=1).wait_for_publish(5)
    mqtt_close(device)
    records = scrape(api)["gateway_stream_records_total"]
    partition = next(labels for labels, value in records.items() if value == 6)  # one destination: one partition
    index = dict(partition)["partition"]
    assert sum(records.values()) == 6
    status, _, _ = api.call("PUT", "/api/v1/streams/sensors/readers/spark-1", json.dumps({"offsets": {index: 2}}).encode(), "application/json")
    assert status == 204
    lag = scrape(api)["gateway_stream_reader_lag"]
    assert lag[(("partition", index), ("reader", "spark-1"), ("stream", "sensors"))] == 4


# -- chosen destinations, credentials ------------------------------------------------------

CHEAP = Cost(ln=10)
PASSWORDS = {"alice": "a-secret", "bob": "b-secret"}


def basic(user: str, password: str | None = None) -> dict:
    token = base64.b64encode(f"{user}:{password or PASSWORDS[user]}".encode()).decode()
    return {"Authorization": "Basic " + token}


@pytest.fixture(scope="module")
def chosen(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics-auth")
    users = tmp / "users"
    write_lines(str(users), [f"{name}:{PasswordHash.make(pw.encode(), CHEAP)}" for name, pw in PASSWORDS.items()])
    config = make_config(tmp)
    config.auth.users_file = str(users)
    config.auth.rules = [
        Rule.parse("user:alice", "allow", ["read", "write", "admin"], ["queue://>", "broker://>"]),
        Rule.parse("user:bob", "allow", ["read", "write", "admin"], ["queue://orders.>"]),
    ]
    config.admin_settings.metrics_destinations = ["queue://orders.>"]
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


def test_metrics_need_admin_on_broker_and_count_failed_logins(chosen):
    api = Api(chosen)
    assert api.call("GET", "/metrics")[0] == 401
    assert api.call("GET", "/metrics", headers=basic("bob"))[0] == 403
    before = one(scrape(api, basic("alice")), "gateway_auth_failures_total", reason="bad_credentials")
    assert api.call("GET", "/metrics", headers=basic("alice", "wrong"))[0] == 401
    import stomp

    refused = stomp.Connection12([(chosen.host, chosen.port)])
    with pytest.raises(stomp.exception.ConnectFailedException):
        refused.connect("bob", "wrong", wait=True)
    after = one(scrape(api, basic("alice")), "gateway_auth_failures_total", reason="bad_credentials")
    assert after == before + 2


def test_metrics_destinations_choose_the_series(chosen):
    api = Api(chosen)
    producer = __import__("stomp").Connection12([(chosen.host, chosen.port)])
    from tests.support import Collector

    got = Collector()
    producer.set_listener("c", got)
    producer.connect("alice", PASSWORDS["alice"], wait=True)
    for name in ("orders.eu", "orders.us", "billing", "billing.big"):
        for _ in range(3 if name.startswith("billing") else 1):
            producer.send(f"/queue/{name}", "x")
    sync(producer, got)
    samples = scrape(api, basic("alice"))
    assert set(samples["gateway_queue_messages"]) == {(("queue", "orders.eu"),), (("queue", "orders.us"),)}
    assert one(samples, "gateway_queue_series_omitted") == 2
    assert one(samples, "gateway_queues_messages") == 8  # the totals still count the deeper billing queues
    disconnect(producer)
