"""The admin API over real HTTP, beside its resources' own tests: connections (gateway/admin/connections.py)
and closing one, overview, health and readiness, the index and ``/``, a standby, and who sees what with users.

Queues, topics, durable subscriptions, MQTT sessions and retained messages
have test files of their own (test_admin_queues.py and its neighbours).
State is made by real clients (stomp.py, paho); one broker serves most of the
module, each test with destinations and client ids of its own.
"""
from __future__ import annotations

import base64
import json

import pytest

from core.access import Rule
from gateway.auth.users import Cost, PasswordHash, write_lines
from gateway.server import Gateway
from tests.integration.test_admin_streams import Api
from tests.support import (
    BrokerHandle,
    call,
    connect,
    disconnect,
    make_config,
    mqtt_close,
    mqtt_connect,
    reactor,
    sync,
    wait_until,
)


@pytest.fixture(scope="module")
def handle(tmp_path_factory):
    broker = BrokerHandle(make_config(tmp_path_factory.mktemp("admin-api")))
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def api(handle):
    return Api(handle)


def get(api, path, **headers):
    status, answer_headers, body = api.call("GET", path, headers=headers)
    assert answer_headers.get("Content-Type") == "application/json", (status, body)
    return status, json.loads(body)


# -- bad requests ---------------------------------------------------------------------


def test_bad_requests_get_4xx_json(api):
    for path, status, code in [
        ("/api/v1/connections?sort=-nothing", 400, "bad_request"),
        ("/api/v1/connections/no-such-id", 404, "unknown_connection"),
    ]:
        answer_status, body = get(api, path)
        assert (answer_status, body["code"]) == (status, code), path
        assert body["error"]
    status, _, _ = api.call("POST", "/api/v1/connections/x/close", b"{", "application/json")
    assert status == 404  # the connection is looked up first: no such connection
    status, _, _ = api.call("PUT", "/api/v1/overview")
    assert status == 405


# -- connections ---------------------------------------------------------------------


def _connection(api, client_id):
    found = get(api, f"/api/v1/connections?filter={client_id}")[1]["connections"]
    return found[0] if len(found) == 1 else None


def test_connections_list_both_protocols_with_their_traffic(api, handle):
    stomp_client, got = connect(handle, client_id="api-conn-stomp")
    stomp_client.subscribe("/queue/api.conn", id="1")
    for i in range(3):
        stomp_client.send("/queue/api.conn", f"m{i}")
    got.wait_for(3)
    sync(stomp_client, got)
    device, device_got = mqtt_connect(handle, "api-conn-paho", version=5)
    device.subscribe("api/conn/#", 0)
    device_got.wait_for(1, what="subacks")
    device.publish("api/conn/x", b"1", qos=1).wait_for_publish(5)
    device_got.wait_for(1)

    stomp_view = _connection(api, "api-conn-stomp")
    assert stomp_view["protocol"] == "stomp/1.2" and stomp_view["remote"].startswith("127.0.0.1:")
    assert (stomp_view["messages_in"], stomp_view["messages_out"]) == (3, 3)
    assert stomp_view["subscriptions"] == ["queue://api.conn"]
    assert stomp_view["connected_since"].endswith("Z") and stomp_view["connected_since_ms"] > 0
    mqtt_view = _connection(api, "api-conn-paho")
    assert mqtt_view["protocol"] == "mqtt/5" and mqtt_view["subscriptions"] == ["topic://api.conn.>"]
    assert (mqtt_view["messages_in"], mqtt_view["messages_out"]) == (1, 1)
    assert get(api, f"/api/v1/connections/{mqtt_view['id']}")[1]["client_id"] == "api-conn-paho"
    everything = get(api, "/api/v1/connections?sort=-messages_in&page_size=1000")[1]
    assert everything["connections"][0]["messages_in"] >= 3
    disconnect(stomp_client)
    mqtt_close(device)


def test_closing_a_stomp_connection_tells_the_client_why(api, handle):
    _client, got = connect(handle, client_id="api-close-stomp")
    conn_id = _connection(api, "api-close-stomp")["id"]
    status, answer = api.json("DELETE", f"/api/v1/connections/{conn_id}?reason=maintenance%20window")
    assert status == 200 and answer == {"closed": conn_id, "reason": "maintenance window"}
    [error] = got.wait_for(1, what="errors")
    assert error.headers["message"] == "maintenance window"
    assert got.disconnected.wait(5)
    assert get(api, f"/api/v1/connections/{conn_id}")[0] == 404


def test_closing_mqtt_connections(api, handle):
    reasons = []
    v5, v5_got = mqtt_connect(handle, "api-close-v5", version=5, reconnect_on_failure=False)
    v5.on_disconnect = lambda client, userdata, flags, code, props: (
        reasons.append(getattr(props, "ReasonString", None)), v5_got.on_disconnect(client, userdata, flags, code, props),
    )
    conn_id = _connection(api, "api-close-v5")["id"]
    status, answer = api.json("POST", f"/api/v1/connections/{conn_id}/close", b'{"reason": "rebalancing"}', "application/json")
    assert status == 200 and answer["reason"] == "rebalancing"
    [code] = v5_got.wait_for(1, what="disconnects")
    assert code.value == 0x98 and reasons == ["rebalancing"]
    mqtt_close(v5)  # no reconnection attempt

    v3, v3_got = mqtt_connect(handle, "api-close-v311", version=4, reconnect_on_failure=False)
    conn_id = _connection(api, "api-close-v311")["id"]
    assert api.json("POST", f"/api/v1/connections/{conn_id}/close", b"", "application/json")[0] == 200
    v3_got.wait_for(1, what="disconnects")  # 3.1.1 has no server DISCONNECT: the socket is just closed
    mqtt_close(v3)
    assert get(api, f"/api/v1/connections/{conn_id}")[0] == 404
    assert api.json("POST", "/api/v1/connections/x/close", b"[1]", "application/json")[0] == 404


def test_close_reason_is_checked(api, handle):
    client, _ = connect(handle, client_id="api-close-bad")
    conn_id = _connection(api, "api-close-bad")["id"]
    status, answer = api.json("POST", f"/api/v1/connections/{conn_id}/close", b'{"reason": 7}', "application/json")
    assert status == 400
    status, answer = api.json("POST", f"/api/v1/connections/{conn_id}/close", b"not json", "application/json")
    assert status == 400 and "JSON" in answer["error"]
    assert _connection(api, "api-close-bad") is not None  # still open
    disconnect(client)


# -- overview, health, readiness ------------------------------------------------------------


def test_overview_health_and_ready(api, handle):
    producer, got = connect(handle)  # a queue and a message of its own, whatever ran before
    producer.send("/queue/api.overview", "x")
    sync(producer, got)
    disconnect(producer)
    status, overview = get(api, "/api/v1/overview")
    assert status == 200 and overview["broker"] == "gateway"
    assert overview["queues"]["count"] >= 1 and overview["messages"]["received"] >= 1
    assert get(api, "/api/v1/health") == (200, {"status": "ok", "role": "master"})
    assert get(api, "/api/v1/ready") == (200, {"status": "ready", "role": "master"})
    index = get(api, "/api/v1")[1]["api"]
    assert {"/api/v1/queues", "/api/v1/connections", "/api/v1/streams", "/metrics", "/api/v1/ready"} <= set(index)


# -- the root: a browser to the console, JSON for API clients; the one version everywhere -----------


def setup_cfg_version() -> str:
    """The version as setup.cfg declares it: read here on its own, not through the package under test."""
    import configparser
    from pathlib import Path

    parser = configparser.ConfigParser()
    parser.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    return parser.get("metadata", "version")


def raw_get(handle, path, **headers):
    """A GET that does not follow redirects (urllib would): the status and Location a browser acts on."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", handle.admin_port, timeout=10)
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


# What Chrome and Firefox send when a person types the address.
CHROME = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8"
FIREFOX = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize("accept", [CHROME, FIREFOX])
def test_a_browser_at_the_admin_root_is_sent_to_the_console(handle, accept):
    status, headers, body = raw_get(handle, "/", Accept=accept)
    assert status == 302 and headers["location"] == "/console/", (status, headers)
    assert headers["vary"] == "Accept"
    assert b'href="/console/"' in body  # for a client that shows the body instead of following
    # Where it lands is the console's page.
    status, headers, page = raw_get(handle, headers["location"], Accept=accept)
    assert status == 200 and headers["content-type"].startswith("text/html")


@pytest.mark.parametrize("headers", [
    {},  # python-requests without Accept, urllib
    {"Accept": "*/*"},  # curl
    {"Accept": "application/json"},
    {"Accept": "application/json, text/html;q=0.5"},  # a client that prefers JSON
])
def test_an_api_client_at_the_admin_root_gets_the_index_as_json(handle, headers):
    status, answer_headers, body = raw_get(handle, "/", **headers)
    assert status == 200 and answer_headers["content-type"] == "application/json"
    assert answer_headers["vary"] == "Accept"
    index = json.loads(body)
    assert index["version"] == setup_cfg_version() and "/console/" in index["api"]


def test_the_api_index_stays_json_for_a_browser(handle):
    """``/api/v1`` is the API's own index (the console reads it): no redirect there, whatever Accept says."""
    status, headers, body = raw_get(handle, "/api/v1", Accept=FIREFOX)
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["version"] == setup_cfg_version()


def test_every_version_the_broker_reports_is_the_bare_package_version(handle, api):
    """One source (setup.cfg): the index, the overview and gateway_info carry ``0.1.0``, not ``gateway 0.1.0``."""
    version = setup_cfg_version()
    assert get(api, "/api/v1")[1]["version"] == version
    assert get(api, "/api/v1/overview")[1]["version"] == version
    status, _, metrics = api.call("GET", "/metrics")
    assert status == 200
    info = [line for line in metrics.decode().splitlines() if line.startswith("gateway_info{")]
    assert info == [f'gateway_info{{name="gateway",version="{version}"}} 1.0'], info


def test_ready_is_503_while_the_store_is_full(tmp_path):
    handle = BrokerHandle(make_config(tmp_path, store_limit=4096, store_full_policy="fail"))
    try:
        api = Api(handle)
        producer, got = connect(handle)
        producer.send("/queue/big", "x" * 8000, headers={"persistent": "true"})
        sync(producer, got)
        status, answer = get(api, "/api/v1/ready")
        assert status == 503 and answer["status"] == "not_ready" and "store" in answer["reason"]
        consumer, received = connect(handle)
        consumer.subscribe("/queue/big", id="1")
        received.wait_for(1)
        wait_until(lambda: get(api, "/api/v1/ready")[0] == 200, what="ready")
        disconnect(consumer)
        disconnect(producer)
    finally:
        handle.stop()


def test_a_standby_answers_probes_then_takes_over_on_the_same_port(tmp_path):
    master = BrokerHandle(make_config(tmp_path))
    config = make_config(tmp_path)  # the same data directory: the store lock is held by the master
    config.persistence.lock_retry_interval = 0.05
    standby = call(Gateway, config, reactor())
    started = []
    call(lambda: standby.start_when_master(ephemeral=True).addCallback(started.append) and None)
    try:
        port = call(lambda: standby.ports["admin"].getHost().port)
        api = Api(type("Handle", (), {"admin_port": port})())
        assert get(api, "/api/v1/health") == (200, {"status": "ok", "role": "standby"})
        status, answer = get(api, "/api/v1/ready")
        assert status == 503 and answer["role"] == "standby" and "store lock" in answer["reason"]
        assert get(api, "/api/v1/queues")[0] == 503
        assert not started
        master.stop()
        wait_until(lambda: started, what="the standby to start once the master stopped")
        assert get(api, "/api/v1/ready") == (200, {"status": "ready", "role": "master"})
        assert get(api, "/api/v1/queues")[0] == 200
    finally:
        if not started:
            master.stop()
        call(standby.stop)


# -- with users: who sees what ---------------------------------------------------------------

CHEAP = Cost(ln=10)
PASSWORDS = {"alice": "a-secret", "bob": "b-secret", "carol": "c-secret"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin-api-auth")
    users = tmp / "users"
    write_lines(str(users), [f"{name}:{PasswordHash.make(pw.encode(), CHEAP)}" for name, pw in PASSWORDS.items()])
    config = make_config(tmp)
    config.auth.users_file = str(users)
    config.auth.rules = [
        Rule.parse("user:alice", "allow", ["read", "write", "admin"], ["queue://>", "topic://>", "broker://>"]),
        Rule.parse("user:bob", "allow", ["read", "write", "admin"], ["queue://orders"]),
        Rule.parse("user:carol", "allow", ["read", "write"], ["queue://>"]),
    ]
    broker = BrokerHandle(config)
    yield broker
    broker.stop()


def login(handle, user, client_id=None):
    import stomp

    from tests.support import Collector

    conn = stomp.Connection12([(handle.host, handle.port)])
    got = Collector()
    conn.set_listener("c", got)
    conn.connect(user, PASSWORDS[user], wait=True, headers={"client-id": client_id} if client_id else {})
    return conn, got


def as_user(handle, user, method, path, body=None):
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    status, answer_headers, data = Api(handle).call(method, path, body, "application/json" if body is not None else None, headers)
    return status, json.loads(data) if answer_headers.get("Content-Type") == "application/json" else data


def test_users_see_only_what_they_may_administer(secured):
    producer, got = login(secured, "alice")
    for name in ("orders", "invoices", "audit"):
        producer.send(f"/queue/{name}", "x")
    sync(producer, got)
    status, alice = as_user(secured, "alice", "GET", "/api/v1/queues")
    assert status == 200 and {q["name"] for q in alice["queues"]} == {"orders", "invoices", "audit"}
    status, bob = as_user(secured, "bob", "GET", "/api/v1/queues")
    assert status == 200 and [q["name"] for q in bob["queues"]] == ["orders"] and bob["total"] == 1
    assert as_user(secured, "bob", "GET", "/api/v1/queues/orders")[0] == 200
    assert as_user(secured, "bob", "GET", "/api/v1/queues/invoices")[0] == 403
    assert as_user(secured, "bob", "GET", "/api/v1/queues/no.such")[0] == 403  # says nothing of what exists
    assert as_user(secured, "carol", "GET", "/api/v1/queues")[1]["queues"] == []  # read and write are not admin
    assert as_user(secured, None, "GET", "/api/v1/queues/orders")[0] == 401
    disconnect(producer)


def test_broker_wide_routes_need_admin_on_broker(secured):
    for path in ("/api/v1/connections", "/api/v1/overview", "/api/v1/mqtt-sessions", "/metrics"):
        assert as_user(secured, None, "GET", path)[0] == 401, path
        status, body = as_user(secured, "bob", "GET", path)
        assert status == 403 and body["code"] == "forbidden", path
        assert as_user(secured, "alice", "GET", path)[0] == 200, path
    _client, _ = login(secured, "bob", client_id="secured-c")
    [conn] = [c for c in as_user(secured, "alice", "GET", "/api/v1/connections")[1]["connections"] if c["client_id"] == "secured-c"]
    assert conn["user"] == "bob"
    assert as_user(secured, "bob", "DELETE", f"/api/v1/connections/{conn['id']}")[0] == 403
    assert as_user(secured, "alice", "DELETE", f"/api/v1/connections/{conn['id']}?reason=bye")[0] == 200


def test_health_and_ready_need_no_credentials(secured):
    assert as_user(secured, None, "GET", "/api/v1/health") == (200, {"status": "ok", "role": "master"})
    assert as_user(secured, None, "GET", "/api/v1/ready") == (200, {"status": "ready", "role": "master"})
    # Only those two: the rest of the listener still asks.
    assert as_user(secured, None, "GET", "/api/v1")[0] == 401
