"""The admin API's read side over real HTTP: queues, topics, durable subscriptions, MQTT sessions,
connections (and closing one), overview, health and readiness, with and without users.

State is made by real clients (stomp.py, paho); one broker serves most of the
module, each test with destinations and client ids of its own.
"""
from __future__ import annotations

import base64
import json
import urllib.parse

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


# -- queues ---------------------------------------------------------------------


def test_queue_counts_follow_sends_and_partial_acks(api, handle):
    producer, got = connect(handle)
    for i in range(10):
        producer.send("/queue/api.work", f"job {i}", headers={"persistent": "true"})
    sync(producer, got)
    consumer, received = connect(handle)
    consumer.subscribe("/queue/api.work", id="1", ack="client-individual", headers={"activemq.prefetchSize": "4"})
    first = received.wait_for(4)
    for frame in first[:2]:
        consumer.ack(frame.headers["ack"])
    received.wait_for(6)  # the two acks gave the consumer credit for two more
    sync(consumer, received)

    status, queue = get(api, "/api/v1/queues/api.work")
    assert status == 200
    assert queue["destination"] == "queue://api.work" and queue["name"] == "api.work"
    assert (queue["ready"], queue["unacknowledged"], queue["messages"]) == (4, 4, 8)
    assert (queue["consumers"], queue["enqueued"], queue["dequeued"]) == (1, 10, 2)
    assert queue["expired"] == queue["dead_lettered"] == 0
    assert queue["oldest_message_age_ms"] >= 0 and queue["memory_bytes"] > 0 and queue["store_bytes"] > 0
    [consumer_view] = queue["consumer_list"]
    assert consumer_view["prefetch"] == 4 and consumer_view["unacknowledged"] == 4

    disconnect(consumer)  # its four unacknowledged messages go back
    wait_until(lambda: get(api, "/api/v1/queues/api.work")[1]["consumers"] == 0, what="no consumers on api.work")
    queue = get(api, "/api/v1/queues/api.work")[1]
    assert (queue["ready"], queue["unacknowledged"]) == (8, 0)
    disconnect(producer)


def test_queue_list_pages_filters_and_sorts(api, handle):
    producer, got = connect(handle)
    for i in range(25):
        for _ in range(i % 5):
            producer.send(f"/queue/api.page.q{i:02d}", "x")
        if i % 5 == 0:
            producer.send(f"/queue/api.page.q{i:02d}", "x", headers={"expires": "1"})  # expired at once: still a queue
    sync(producer, got)
    status, page = get(api, "/api/v1/queues?filter=API.PAGE.&page_size=10&page=2")
    assert status == 200
    assert (page["total"], page["pages"], page["page"], page["page_size"]) == (25, 3, 2, 10)
    assert [q["name"] for q in page["queues"]] == [f"api.page.q{i:02d}" for i in range(10, 20)]
    last = get(api, "/api/v1/queues?filter=api.page.&page_size=10&page=3")[1]
    assert len(last["queues"]) == 5
    assert get(api, "/api/v1/queues?filter=api.page.&page=9")[1]["queues"] == []  # past the end: an empty page
    deepest = get(api, "/api/v1/queues?filter=api.page.&sort=-messages&page_size=5")[1]["queues"]
    assert all(q["messages"] == 4 for q in deepest)
    assert [q["name"] for q in get(api, "/api/v1/queues?filter=api.page.&sort=-name&page_size=2")[1]["queues"]] == [
        "api.page.q24", "api.page.q23",
    ]
    disconnect(producer)


def test_expired_and_dead_lettered_counts(api, handle):
    producer, got = connect(handle)
    producer.send("/queue/api.expiring", "late", headers={"expires": "1"})
    producer.send("/queue/api.failing", "bad")
    sync(producer, got)
    consumer, received = connect(handle)
    consumer.subscribe("/queue/api.expiring", id="1")
    consumer.subscribe("/queue/api.failing", id="2", ack="client-individual")
    for _ in range(7):  # max_redeliveries 6: the seventh failure dead-letters it
        frame = received.wait_for(1)[0]
        received.messages.clear()
        consumer.nack(frame.headers["ack"])
    wait_until(lambda: get(api, "/api/v1/queues/api.failing")[1]["dead_lettered"] == 1, what="one dead-lettered")
    assert get(api, "/api/v1/queues/api.expiring")[1]["expired"] == 1
    dlq = get(api, "/api/v1/queues/DLQ")[1]
    assert dlq["dead_letter_queue"] is True and dlq["ready"] >= 2
    disconnect(consumer)
    disconnect(producer)


def test_bad_requests_get_4xx_json(api):
    for path, status, code in [
        ("/api/v1/queues/no.such.queue", 404, "unknown_queue"),
        ("/api/v1/queues?page=0", 400, "bad_request"),
        ("/api/v1/queues?page=abc", 400, "bad_request"),
        ("/api/v1/queues?page_size=1001", 400, "bad_request"),
        ("/api/v1/queues?sort=colour", 400, "bad_request"),
        ("/api/v1/connections?sort=-nothing", 400, "bad_request"),
        ("/api/v1/connections/no-such-id", 404, "unknown_connection"),
        ("/api/v1/topics/no.subscriber.here", 404, "unknown_topic"),
        ("/api/v1/durable-subscriptions/nobody%3Anothing", 404, "unknown_subscription"),
        ("/api/v1/mqtt-sessions/nobody", 404, "unknown_session"),
    ]:
        answer_status, body = get(api, path)
        assert (answer_status, body["code"]) == (status, code), path
        assert body["error"]
    status, _, _ = api.call("POST", "/api/v1/connections/x/close", b"{", "application/json")
    assert status == 404  # the connection is looked up first: no such connection
    status, _, _ = api.call("PUT", "/api/v1/overview")
    assert status == 405


# -- topics, durable subscriptions, MQTT sessions ----------------------------------------


def test_topics_and_durable_subscriptions(api, handle):
    listener, heard = connect(handle, client_id="api-durable")
    listener.subscribe("/topic/api.news", id="1", headers={"activemq.subscriptionName": "news"})
    plain, plain_heard = connect(handle)
    plain.subscribe("/topic/api.>", id="1")
    device, device_got = mqtt_connect(handle, "api-news-reader", version=4)
    device.subscribe("api/news", 1)
    device_got.wait_for(1, what="subacks")
    sync(plain, plain_heard)
    sync(listener, heard)
    producer, got = connect(handle)
    for i in range(3):
        producer.send("/topic/api.news", f"n{i}")
    heard.wait_for(3)
    plain_heard.wait_for(3)
    device_got.wait_for(3)

    status, topic = get(api, "/api/v1/topics/api.news")
    assert status == 200 and topic["destination"] == "topic://api.news"
    kinds = sorted(s["kind"] for s in topic["subscription_list"])
    assert kinds == ["durable", "mqtt", "subscription"]
    assert topic["subscriptions"] == 3 and topic["durable"] == 1 and topic["consumers"] == 3
    assert topic["enqueued"] == 9  # three messages to each of three subscriptions
    wildcard = get(api, "/api/v1/topics/" + urllib.parse.quote("api.>", safe=""))[1]
    assert [s["kind"] for s in wildcard["subscription_list"]] == ["subscription"]
    listed = get(api, "/api/v1/topics?filter=api.")[1]["topics"]
    assert {t["name"] for t in listed} == {"api.news", "api.>"}

    durables = get(api, "/api/v1/durable-subscriptions?filter=api-durable")[1]["durable_subscriptions"]
    assert [(d["key"], d["client_id"], d["name"], d["destination"], d["active"]) for d in durables] == [
        ("api-durable:news", "api-durable", "news", "topic://api.news", True),
    ]
    disconnect(listener)  # away: the durable subscription keeps what is published meanwhile
    wait_until(lambda: not get(api, "/api/v1/durable-subscriptions/api-durable%3Anews")[1]["active"],
               what="the durable subscription inactive")
    producer.send("/topic/api.news", "while away")
    sync(producer, got)
    away = get(api, "/api/v1/durable-subscriptions/api-durable%3Anews")[1]
    assert away["ready"] == 1 and away["consumers"] == 0
    for conn in (plain, producer):
        disconnect(conn)
    mqtt_close(device)


def test_mqtt_sessions_persistent_and_clean(api, handle):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    keeper, keeper_got = mqtt_connect(handle, "api-keeper", version=5, clean=False, properties=props)
    keeper.subscribe("api/alerts/#", 1)
    keeper_got.wait_for(1, what="subacks")
    passer, _ = mqtt_connect(handle, "api-passer", version=4)

    sessions = {s["client_id"]: s for s in get(api, "/api/v1/mqtt-sessions?filter=api-")[1]["mqtt_sessions"]}
    assert sessions["api-keeper"]["persistent"] is True and sessions["api-keeper"]["connected"] is True
    assert sessions["api-keeper"]["subscriptions"] == ["topic://api.alerts.>"]
    assert sessions["api-passer"]["persistent"] is False and sessions["api-passer"]["connected"] is True
    # A clean session gets its queue with its first subscription; until then it shows an empty one.
    assert sessions["api-passer"]["subscriptions"] == [] and sessions["api-passer"]["messages"] == 0
    assert set(sessions["api-passer"]) == set(sessions["api-keeper"]) - {"expiry_interval", "disconnected_at"}
    passer.subscribe("$share/api-group/api/shared/#", 1)  # a shared group's consumer comes first
    passer.subscribe("api/passer/#", 1)
    wait_until(lambda: get(api, "/api/v1/mqtt-sessions/api-passer")[1]["subscriptions"] == ["topic://api.passer.>"],
               what="api-passer's subscription")
    assert get(api, "/api/v1/mqtt-sessions/api-passer")[1]["consumers"] == 1

    mqtt_close(keeper)
    wait_until(lambda: not get(api, "/api/v1/mqtt-sessions/api-keeper")[1]["connected"], what="api-keeper offline")
    sender, sender_got = connect(handle)
    sender.send("/topic/api.alerts.fire", "while away", headers={"persistent": "true"})
    sync(sender, sender_got)
    away = get(api, "/api/v1/mqtt-sessions/api-keeper")[1]
    assert away["ready"] == 1 and away["expiry_interval"] == 300 and away["disconnected_at"].endswith("Z")
    mqtt_close(passer)
    # A clean session ends with its connection.
    wait_until(lambda: get(api, "/api/v1/mqtt-sessions/api-passer")[0] == 404, what="api-passer's session gone")
    disconnect(sender)


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
