"""What the console needs from the broker, over real HTTP and real clients: the history of message
rates its chart opens with (/api/v1/overview/history), the protocol names its connections page shows,
and an operator's close of a connection logged as what it is (not as a client's protocol error).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from tests.integration.test_admin_auth import auth_config
from tests.integration.test_admin_auth import call as auth_call
from tests.integration.test_admin_streams import Api
from tests.support import (
    BrokerHandle,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    sync,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    broker = BrokerHandle(make_config(tmp_path_factory.mktemp("console-support"), traffic_history_interval=0.1))
    yield broker
    broker.stop()


# -- the history of message rates ------------------------------------------------------------


def test_history_holds_the_totals_the_overview_gives_with_rates_between_samples(handle):
    api = Api(handle)
    conn, got = connect(handle)
    conn.subscribe("/queue/hist.q", id="h")
    for i in range(30):
        conn.send("/queue/hist.q", f"m{i}")
    got.wait_for(30)
    sync(conn, got)
    disconnect(conn)  # its counts move to the closed connections' totals, which the history keeps
    _, overview = api.json("GET", "/api/v1/overview")
    received, sent = overview["messages"]["received"], overview["messages"]["sent"]
    assert received >= 30 and sent >= 30
    # The barrier: a sample taken after the traffic (every 0.1 s here).
    status, history = wait_until(lambda: (answer := api.json("GET", "/api/v1/overview/history"))
                                 and answer[1]["samples"][-1]["received"] >= received and answer,
                                 10, "a history sample taken after the traffic")
    assert status == 200
    assert history["interval_seconds"] == 0.1 and history["window_seconds"] == 300
    samples = history["samples"]
    assert samples[-1]["time_ms"] <= history["now_ms"]
    assert samples[0]["in_per_second"] is None
    times = [s["time_ms"] for s in samples]
    assert times == sorted(times) and len(set(times)) == len(times)
    for before, after in zip(samples, samples[1:]):
        seconds = (after["time_ms"] - before["time_ms"]) / 1000
        assert after["received"] >= before["received"] and after["sent"] >= before["sent"]
        assert after["in_per_second"] == pytest.approx((after["received"] - before["received"]) / seconds, abs=0.001)
        assert after["out_per_second"] == pytest.approx((after["sent"] - before["sent"]) / seconds, abs=0.001)
    # The 30 messages in and out went by while the broker sampled: some rate above 0 shows them.
    assert any(s["in_per_second"] for s in samples[1:]) and any(s["out_per_second"] for s in samples[1:])


def test_history_is_empty_when_sampling_is_off(tmp_path):
    off = BrokerHandle(make_config(tmp_path, traffic_history_interval=0))
    try:
        status, history = Api(off).json("GET", "/api/v1/overview/history")
        assert status == 200 and history["interval_seconds"] == 0 and history["samples"] == []
    finally:
        off.stop()


def test_history_needs_admin_on_the_overview(tmp_path):
    secured = BrokerHandle(auth_config(tmp_path))
    try:
        status, _, body = auth_call(secured, "GET", "/api/v1/overview/history", user="alice")
        assert status == 403 and b"may not admin broker://overview" in body
        assert auth_call(secured, "GET", "/api/v1/overview/history")[0] == 401
    finally:
        secured.stop()


# -- protocol names ----------------------------------------------------------------------------


def test_connections_carry_a_protocol_name_beside_the_machine_value(handle):
    api = Api(handle)
    stomp_conn, _ = connect(handle, client_id="names-stomp")
    devices = [mqtt_connect(handle, f"names-v{v}", version=v)[0] for v in (3, 4, 5)]
    try:
        _, listing = api.json("GET", "/api/v1/connections?filter=names-")
        assert {c["client_id"]: (c["protocol"], c["protocol_name"]) for c in listing["connections"]} == {
            "names-stomp": ("stomp/1.2", "STOMP 1.2"), "names-v3": ("mqtt/3", "MQTT 3.1"),
            "names-v4": ("mqtt/4", "MQTT 3.1.1"), "names-v5": ("mqtt/5", "MQTT 5.0"),
        }
    finally:
        disconnect(stomp_conn)
        for device in devices:
            mqtt_close(device)


# -- an operator's close, in the log -------------------------------------------------------------


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every log line the broker writes while the test runs (formatted as the log file has them)."""
    lines: list[str] = []
    lock = threading.Lock()

    def observer(event: dict[str, Any]) -> None:
        text = formatEvent(event)
        with lock:
            lines.append(text)

    globalLogPublisher.addObserver(observer)
    try:
        yield lines
    finally:
        globalLogPublisher.removeObserver(observer)


def connection_id(api: Api, client_id: str) -> str:
    _, listing = api.json("GET", f"/api/v1/connections?filter={client_id}")
    (conn,) = [c for c in listing["connections"] if c["client_id"] == client_id]
    return conn["id"]


def test_an_operators_close_of_a_stomp_client_is_logged_as_such(handle, log_lines):
    api = Api(handle)
    _client, got = connect(handle, client_id="log-stomp")
    conn_id = connection_id(api, "log-stomp")
    status, answer = api.json("DELETE", f"/api/v1/connections/{conn_id}?reason=maintenance%20window")
    assert status == 200 and answer == {"closed": conn_id, "reason": "maintenance window"}
    assert got.disconnected.wait(5)
    assert [e.headers["message"] for e in got.errors] == ["maintenance window"]  # the client is still told why
    label = f"[{conn_id} log-stomp]"
    wait_until(lambda: f"{label} closed by an operator: maintenance window" in log_lines, 10, "the log line of the close")
    assert not [line for line in log_lines if line.startswith(label) and "protocol error" in line]


@pytest.mark.parametrize("version", [4, 5])
def test_an_operators_close_of_an_mqtt_client_is_logged_as_such(handle, log_lines, version):
    api = Api(handle)
    client_id = f"log-mqtt-v{version}"
    device, got = mqtt_connect(handle, client_id, version=version, reconnect_on_failure=False)
    try:
        conn_id = connection_id(api, client_id)
        status, _ = api.json("POST", f"/api/v1/connections/{conn_id}/close", b'{"reason": "rebalancing"}', "application/json")
        assert status == 200
        got.wait_for(1, what="disconnects")
        pattern = re.compile(rf"^\[127\.0\.0\.1:\d+ {client_id}\] closed by an operator: rebalancing$")
        wait_until(lambda: any(pattern.match(line) for line in log_lines), 10, "the log line of the close")
        assert not [line for line in log_lines if client_id in line and "protocol error" in line]
    finally:
        mqtt_close(device)
