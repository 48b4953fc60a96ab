"""Wildcard subscriptions beside a deny rule, with real clients: granted, and filtered at delivery.

The configuration is the one the Eclipse Paho interoperability suites assume
(anonymous clients, everything allowed but reading ``test/nosubscribe``).  As
in Mosquitto, ``#`` is granted at the QoS asked and the denied topic's
messages are skipped silently; the skips are counted in the admin API and
``/metrics``.  Each case is checked where a user would look: which messages
arrive, retained ones, shared groups, STOMP, durable subscriptions and
persistent sessions across a restart, and a SIGHUP that changes the rules.
"""
from __future__ import annotations

import signal
from typing import Any

import pytest

from core.access import Rule
from tests.integration.test_admin_streams import Api
from tests.integration.test_metrics import one, scrape
from tests.support import (
    BrokerHandle,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
)
from tests.system.test_cli import BrokerProcess, free_port

DENIED = "test/nosubscribe"
PAHO_RULES = [
    Rule.parse("*", "allow", ["read", "write"], ["topic://>"]),
    Rule.parse("*", "deny", ["read"], ["topic://test.nosubscribe"]),
]


def paho_config(tmp_path: Any) -> Any:
    config = make_config(tmp_path)
    config.auth.allow_anonymous = True
    # The admin API's connections and metrics, where an operator sees the skipped deliveries.
    config.auth.rules = [*PAHO_RULES, Rule.parse("*", "allow", ["admin"], ["broker://>"])]
    return config


@pytest.fixture
def broker(tmp_path: Any):
    handle = BrokerHandle(paho_config(tmp_path))
    yield handle
    handle.stop()


def publish(client: Any, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
    client.publish(topic, payload, qos, retain).wait_for_publish(5)


def codes(got: Any) -> list[int]:
    (reasons,) = got.wait_for(1, what="subacks")
    return [r.value for r in reasons]


def connection_of(handle: BrokerHandle, client_id: str) -> dict[str, Any]:
    status, body = Api(handle).json("GET", f"/api/v1/connections?filter={client_id}")
    assert status == 200, body
    (found,) = [c for c in body["connections"] if c["client_id"] == client_id]
    return found


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_wildcards_beside_a_denied_topic_are_granted_and_filtered(broker, version):
    sub, got = mqtt_connect(broker, "sub", version)
    sub.subscribe([("#", 1), ("+/+", 2), (DENIED, 1)])
    assert codes(got) == [1, 2, 0x87 if version == 5 else 0x80]  # the denied topic itself is still refused
    pub, _ = mqtt_connect(broker, "pub", version)
    for topic in (DENIED, "TopicA/B", "Topic/C", DENIED, "test/other"):
        publish(pub, topic, topic.encode())
    assert [m.topic for m in got.wait_for(3)] == ["TopicA/B", "Topic/C", "test/other"]
    assert [(m.topic, m.qos) for m in got.settle()] == [("TopicA/B", 1), ("Topic/C", 1), ("test/other", 1)]
    # Skipped silently (the client stays connected) and counted where operators look.
    assert sub.is_connected() and got.disconnects == []
    assert connection_of(broker, "sub")["messages_denied"] == 2
    assert one(scrape(Api(broker)), "gateway_deliveries_denied_total") == 2
    for client in (sub, pub):
        mqtt_close(client)


@pytest.mark.parametrize("version", [4, 5])
def test_retained_messages_sent_on_subscribe_skip_the_denied_topic(broker, version):
    pub, _ = mqtt_connect(broker, "pub", version)
    publish(pub, DENIED, b"kept, not for readers", retain=True)
    publish(pub, "TopicA", b"kept", retain=True)
    sub, got = mqtt_connect(broker, "sub", version)
    sub.subscribe([("#", 2)])
    assert codes(got) == [2]
    assert [(m.topic, m.payload, m.retain) for m in got.settle()] == [("TopicA", b"kept", True)]
    publish(pub, DENIED, b"live, denied")
    publish(pub, "TopicA", b"live")
    assert [(m.topic, m.payload, m.retain) for m in got.settle()][1:] == [("TopicA", b"live", False)]
    assert connection_of(broker, "sub")["messages_denied"] == 2
    for client in (sub, pub):
        mqtt_close(client)


def test_a_shared_subscription_beside_a_denied_topic_delivers_the_rest_once(broker):
    members = [mqtt_connect(broker, f"member-{i}", 5) for i in range(2)]
    for client, got in members:
        client.subscribe([("$share/readers/test/+", 1)])
        assert codes(got) == [1]
    pub, _ = mqtt_connect(broker, "pub", 5)
    for n in range(6):
        publish(pub, DENIED, b"denied %d" % n)
        publish(pub, "test/open", b"open %d" % n)
    received = [m.payload for _, got in members for m in got.settle()]
    assert sorted(received) == [b"open %d" % n for n in range(6)]
    assert sum(connection_of(broker, f"member-{i}")["messages_denied"] for i in range(2)) == 6
    for client, _ in (*members, (pub, None)):
        mqtt_close(client)


def test_stomp_wildcard_subscriptions_beside_a_denied_topic(broker):
    conn, got = connect(broker)
    conn.subscribe("/topic/>", id="all", receipt="s1")
    conn.subscribe("/topic/test.*", id="test", receipt="s2")
    got.wait_for(2, what="receipts")
    producer, produced = connect(broker)
    producer.send("/topic/test.nosubscribe", "from STOMP, denied")
    producer.send("/topic/test.open", "from STOMP")
    sync(producer, produced)
    pub, _ = mqtt_connect(broker, "pub", 4)
    publish(pub, DENIED, b"from MQTT, denied")
    publish(pub, "test/open", b"from MQTT")
    seen = sorted((m.headers["subscription"], m.body) for m in got.settle())
    assert seen == [("all", "from MQTT"), ("all", "from STOMP"), ("test", "from MQTT"), ("test", "from STOMP")]
    assert got.errors == [] and conn.is_connected()
    # A subscription to the denied topic itself is refused as before.
    conn.subscribe("/topic/test.nosubscribe", id="denied", receipt="s3")
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Access denied"
    assert "read access to /topic/test.nosubscribe is not allowed" in error.body
    disconnect(producer)
    mqtt_close(pub)


def durable_count(handle: BrokerHandle, queue_key: str) -> int:
    def count() -> int:
        queue = handle.broker.durable_queues.get(queue_key)
        return -1 if queue is None else len(queue) + queue.inflight + queue.paged
    return int(handle.inspect(count))


def test_durable_subscriptions_and_persistent_sessions_stay_filtered_across_a_restart(tmp_path):
    config = paho_config(tmp_path)
    handle = BrokerHandle(config)
    try:
        stomp_conn, stomp_got = connect(handle, client_id="durable-reader")
        stomp_conn.subscribe("/topic/>", id="all", headers={"activemq.subscriptionName": "everything"}, receipt="s")
        stomp_got.wait_for(1, what="receipts")
        disconnect(stomp_conn)
        device, device_got = mqtt_connect(handle, "dashboard", 4, clean=False)
        device.subscribe([("#", 1)])
        assert codes(device_got) == [1]
        mqtt_close(device)
        pub, _ = mqtt_connect(handle, "pub", 4)
        publish(pub, DENIED, b"denied before")
        publish(pub, "TopicA", b"before")
        mqtt_close(pub)
        # Stored for both while they are away (the check is made at delivery, by the rules of that moment).
        assert durable_count(handle, "durable-reader:everything") == 2
    finally:
        handle.stop()
    handle = BrokerHandle(config)  # the same data directory
    try:
        pub, _ = mqtt_connect(handle, "pub", 4)
        publish(pub, DENIED, b"denied after")
        publish(pub, "TopicA", b"after")
        stomp_conn, stomp_got = connect(handle, client_id="durable-reader")
        stomp_conn.subscribe("/topic/>", id="all", headers={"activemq.subscriptionName": "everything"}, receipt="s")
        assert [m.body for m in stomp_got.wait_for(2)] == ["before", "after"]
        device, device_got = mqtt_connect(handle, "dashboard", 4, clean=False)
        assert [m.payload for m in device_got.wait_for(2)] == [b"before", b"after"]
        publish(pub, DENIED, b"denied live")
        publish(pub, "TopicA", b"live")
        assert [m.body for m in stomp_got.settle()] == ["before", "after", "live"]
        assert [m.payload for m in device_got.settle()] == [b"before", b"after", b"live"]
        # What was skipped is gone from the store, not left behind in the durable queues.
        assert durable_count(handle, "durable-reader:everything") == 0
        assert durable_count(handle, "mqtt:dashboard") == 0
        disconnect(stomp_conn)
        for client in (device, pub):
            mqtt_close(client)
    finally:
        handle.stop()
    handle = BrokerHandle(config)  # and nothing denied comes back after another restart
    try:
        device, device_got = mqtt_connect(handle, "dashboard", 4, clean=False)
        stomp_conn, stomp_got = connect(handle, client_id="durable-reader")
        stomp_conn.subscribe("/topic/>", id="all", headers={"activemq.subscriptionName": "everything"}, receipt="s")
        stomp_got.wait_for(1, what="receipts")
        assert device_got.settle() == [] and stomp_got.settle() == []
        disconnect(stomp_conn)
        mqtt_close(device)
    finally:
        handle.stop()


def rules_toml(denied: str) -> str:
    return (
        "[auth]\nallow_anonymous = true\n"
        '[[auth.rules]]\nwho = "*"\npermissions = ["read", "write"]\ndestinations = ["topic://>"]\n'
        f'[[auth.rules]]\nwho = "*"\naccess = "deny"\npermissions = ["read"]\ndestinations = ["{denied}"]\n'
    )


class Ports:
    """What the shared client helpers (tests/support.py) need of a broker run as a process: where it listens."""

    def __init__(self, stomp: int, mqtt: int) -> None:
        self.host, self.port, self.mqtt_port = "127.0.0.1", stomp, mqtt


def test_a_sighup_that_changes_the_rules_applies_to_the_next_delivery(tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text(rules_toml("topic://test.nosubscribe"))
    stomp_port, mqtt_port = free_port(), free_port()
    process = BrokerProcess(
        "--config", str(config), "--data-dir", str(tmp_path / "d"), "--stomp-port", str(stomp_port),
        "--mqtt-port", str(mqtt_port), "--ws-port", "0", "--admin-port", "0", cwd=tmp_path,
    )
    try:
        process.wait_for_line("MQTT listening")
        handle: Any = Ports(stomp_port, mqtt_port)
        everything, every_got = mqtt_connect(handle, "everything", 5)
        everything.subscribe([("#", 1)])
        branch, branch_got = mqtt_connect(handle, "branch", 4)
        branch.subscribe([("TopicA/#", 1)])  # granted whole: nothing is denied below TopicA yet
        assert codes(every_got) == [1] and codes(branch_got) == [1]
        stomp_conn, stomp_got = connect(handle)
        stomp_conn.subscribe("/topic/>", id="all", receipt="s")
        stomp_got.wait_for(1, what="receipts")
        pub, _ = mqtt_connect(handle, "pub", 4)

        def round_of(tag: str) -> None:
            publish(pub, DENIED, f"{tag} nosubscribe".encode())
            publish(pub, "TopicA/secret", f"{tag} secret".encode())

        round_of("before")
        assert [m.payload for m in every_got.settle()] == [b"before secret"]
        assert [m.payload for m in branch_got.settle()] == [b"before secret"]
        assert [m.body for m in stomp_got.settle()] == ["before secret"]
        config.write_text(rules_toml("topic://TopicA.secret"))
        process.proc.send_signal(signal.SIGHUP)
        process.wait_for_line("[auth] reloaded")
        round_of("after")
        assert [m.payload for m in every_got.settle()] == [b"before secret", b"after nosubscribe"]
        assert [m.payload for m in branch_got.settle()] == [b"before secret"]  # checked from the reload on
        assert [m.body for m in stomp_got.settle()] == ["before secret", "after nosubscribe"]
        assert everything.is_connected() and branch.is_connected() and stomp_conn.is_connected()
        process.wait_for_line("rules reloaded: 1 of its subscriptions checked at delivery")
        disconnect(stomp_conn)
        for client in (everything, branch, pub):
            mqtt_close(client)
    finally:
        assert process.stop() == 0
