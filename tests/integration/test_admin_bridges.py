"""A bridge as operators see it: the admin API, ``/metrics``, ``$SYS`` and ``gateway bridges``.

Two in-process gateways: B plain, A bridged to B on ``t/#`` both ways (MQTT 5).
The state is real: the link comes up, paho clients publish on each side, B is
stopped under A's feet.  Every surface is read over its real transport (HTTP,
an MQTT subscription, the CLI as a subprocess) and checked against what the
clients did.
"""
from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.access import Rule
from protocols.bridge.settings import BridgeSettings, BridgeTopic
from tests.integration.test_admin_auth import auth_config
from tests.integration.test_admin_auth import call as auth_call
from tests.integration.test_admin_streams import Api
from tests.support import BrokerHandle, call, make_config, mqtt_close, mqtt_connect, wait_until
from tests.system.test_ops_cli import gateway, rows

pytestmark = pytest.mark.timeout(60)

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


LINK = 15.0  # seconds a bridge's state may take to follow (its link reconnects with back-off)


class Pair:
    """B, and A bridged to it as ``tob``; ``stop_remote`` stops B once, the teardown whatever is left."""

    def __init__(self, tmp_path: Any) -> None:
        self.remote = BrokerHandle(make_config(tmp_path / "b"))
        config = make_config(tmp_path / "a")
        config.sys_interval = 0.2  # $SYS figures every 0.2 s: a test sees a change without waiting 10 s
        config.bridges = [BridgeSettings(
            name="tob", url=f"mqtt://127.0.0.1:{self.remote.mqtt_port}", version=5,
            topics=[BridgeTopic("t/#", direction="both")],
        )]
        self.local = BrokerHandle(config)
        self.local.url = f"http://127.0.0.1:{self.local.admin_port}"  # for the CLI helper
        self.remote.url = f"http://127.0.0.1:{self.remote.admin_port}"
        self.api = Api(self.local)
        self.remote_up = True

    def bridge(self, name: str = "tob") -> tuple[int, Any]:
        return self.api.json("GET", f"/api/v1/bridges/{name}")

    def status(self) -> dict[str, Any]:
        status, answer = self.bridge()
        assert status == 200, answer
        return answer

    def stop_remote(self) -> None:
        self.remote_up = False
        self.remote.stop()

    def stop(self) -> None:
        self.local.stop()
        if self.remote_up:
            self.remote.stop()


@pytest.fixture
def pair(tmp_path):
    handles = Pair(tmp_path)
    try:
        wait_until(lambda: handles.status()["state"] == "connected", LINK, "bridge tob connected")
        yield handles
    finally:
        handles.stop()


def scrape(api: Api) -> dict[str, dict[tuple, float]]:
    status, _, body = api.call("GET", "/metrics")
    assert status == 200, body
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def bridge_metric(api: Api, name: str, **labels: str) -> float | None:
    return scrape(api).get(name, {}).get(tuple(sorted({"bridge": "tob", **labels}.items())))


def publish(handle: BrokerHandle, topic: str, count: int, client_id: str) -> None:
    """QoS 1 publishes, each confirmed (PUBACK) by the broker before the next."""
    client, _ = mqtt_connect(handle, client_id, version=5)
    try:
        for i in range(count):
            client.publish(topic, f"m{i}".encode(), qos=1).wait_for_publish(5)
    finally:
        mqtt_close(client)


# -- the admin API and /metrics -----------------------------------------------------------


def test_a_connected_bridge_counts_what_it_forwards_and_receives(pair):
    answer = pair.status()
    assert answer["name"] == "tob" and answer["state"] == "connected" and answer["last_error"] is None
    assert answer["url"] == f"mqtt://127.0.0.1:{pair.remote.mqtt_port}"
    assert answer["protocol"] == "mqtt" and answer["version"] == 5 and answer["connects"] == 1
    assert answer["client_id"] == f"{pair.local.broker.node_name}-tob"
    assert answer["remote_broker"] == pair.remote.broker.node_name  # B said who it is (MQTT 5 user property)
    assert ISO.match(answer["since_iso"]) and answer["since"] <= int(time.time() * 1000)
    assert answer["out"] == {"patterns": ["t/#"], "queued": 0, "inflight": 0, "forwarded": 0, "refused": 0}
    assert answer["in"] == {"patterns": ["t/#"], "received": 0}
    status, listing = pair.api.json("GET", "/api/v1/bridges")
    assert status == 200 and listing == {"bridges": [answer]}

    at_remote, got_remote = mqtt_connect(pair.remote, "sub-b", version=5)
    at_remote.subscribe("t/#", qos=1)
    got_remote.wait_for(1, what="subacks")
    publish(pair.local, "t/x", 3, "pub-a")
    got_remote.wait_for(3)
    assert got_remote.payloads() == [b"m0", b"m1", b"m2"]
    out = wait_until(lambda: (o := pair.status()["out"])["forwarded"] == 3 and o, LINK, "3 forwarded")
    assert out["queued"] == 0 and out["inflight"] == 0 and out["refused"] == 0

    at_local, got_local = mqtt_connect(pair.local, "sub-a", version=5)
    at_local.subscribe("t/#", qos=1)
    got_local.wait_for(1, what="subacks")
    publish(pair.remote, "t/y", 2, "pub-b")
    got_local.wait_for(2)
    wait_until(lambda: pair.status()["in"]["received"] == 2, LINK, "2 received")
    assert got_remote.settle() and len(got_remote.messages) == 5  # B's own two, and nothing came back over the link
    mqtt_close(at_remote)
    mqtt_close(at_local)

    samples = scrape(pair.api)
    tob = (("bridge", "tob"),)
    assert samples["gateway_bridge_connected"] == {tob: 1}
    assert samples["gateway_bridge_queued_messages"] == {tob: 0}
    assert samples["gateway_bridge_inflight_messages"] == {tob: 0}
    assert samples["gateway_bridge_messages_total"] == {
        (("bridge", "tob"), ("direction", "in")): 2, (("bridge", "tob"), ("direction", "out")): 3,
    }
    assert samples["gateway_bridge_refused_total"] == {tob: 0}
    assert samples["gateway_bridge_connects_total"] == {tob: 1}
    assert samples["gateway_bridge_loops_dropped_total"] == {tob: 0}


def test_a_remote_outage_shows_as_disconnected_with_the_reason_and_the_backlog(pair):
    connected_since = pair.status()["since"]
    pair.stop_remote()
    down = wait_until(lambda: (s := pair.status())["state"] == "disconnected" and s, LINK, "bridge tob disconnected")
    assert down["last_error"]  # B said it was shutting down, or the connection was lost: either way, a reason
    assert down["since"] >= connected_since and ISO.match(down["since_iso"])
    assert bridge_metric(pair.api, "gateway_bridge_connected") == 0

    publish(pair.local, "t/x", 5, "pub-a")  # stored for B, confirmed to the publisher
    wait_until(lambda: pair.status()["out"]["queued"] == 5, LINK, "5 queued while B is down")
    assert bridge_metric(pair.api, "gateway_bridge_queued_messages") == 5
    assert bridge_metric(pair.api, "gateway_bridge_messages_total", direction="out") == 0
    assert pair.status()["state"] == "disconnected"  # reconnecting meanwhile, to no one


def test_an_unknown_bridge_is_404_and_a_broker_without_bridges_lists_none(pair):
    status, answer = pair.bridge("nope")
    assert status == 404 and answer == {"error": "no bridge 'nope'", "code": "unknown_bridge"}
    plain = Api(pair.remote)
    assert plain.json("GET", "/api/v1/bridges") == (200, {"bridges": []})
    assert plain.json("GET", "/api/v1/bridges/tob")[0] == 404
    assert not [name for name in scrape(plain) if name.startswith("gateway_bridge_")]  # no bridge, no series
    assert "/api/v1/bridges" in pair.api.json("GET", "/api/v1")[1]["api"]


def test_a_password_in_the_url_is_not_shown(tmp_path):
    """The bridge reads no credentials from its URL, but one written there must not reach every reader."""
    config = make_config(tmp_path)
    config.bridges = [BridgeSettings(name="secret", url="mqtt://edge:hunter2@127.0.0.1:1", topics=[BridgeTopic("s/#")])]
    handle = BrokerHandle(config)
    try:
        status, answer = Api(handle).json("GET", "/api/v1/bridges/secret")
        assert status == 200 and answer["url"] == "mqtt://edge:***@127.0.0.1:1"
    finally:
        handle.stop()


def test_with_users_the_bridges_need_admin_on_broker_bridges(tmp_path):
    config = auth_config(tmp_path)
    config.auth.rules.append(Rule.parse("user:bob", "allow", ["admin"], ["broker://bridges"]))
    handle = BrokerHandle(config)
    try:
        for path in ("/api/v1/bridges", "/api/v1/bridges/x"):
            assert auth_call(handle, "GET", path)[0] == 401
            assert auth_call(handle, "GET", path, "alice")[0] == 403  # admin on queues and topics, not on the broker's
        status, _, body = auth_call(handle, "GET", "/api/v1/bridges", "bob")
        assert status == 200 and json.loads(body) == {"bridges": []}
        status, _, body = auth_call(handle, "GET", "/api/v1/bridges/x", "bob")
        assert status == 404 and json.loads(body)["code"] == "unknown_bridge"
    finally:
        handle.stop()


# -- $SYS -----------------------------------------------------------------------------------


def test_sys_topics_give_the_link_state_as_mosquitto_and_the_bridge_figures(pair):
    client_id = pair.status()["client_id"]
    state_topic = f"$SYS/broker/connection/{client_id}/state"
    watcher, got = mqtt_connect(pair.local, "sys-watcher", version=5)
    watcher.subscribe([(state_topic, 0), ("$SYS/broker/bridges/#", 0)])
    got.wait_for(1, what="subacks")

    def latest() -> dict[str, bytes]:
        with got._cond:
            return {m.topic: m.payload for m in got.messages}

    wait_until(lambda: latest().get(state_topic) == b"1", LINK, "state 1 on $SYS")
    publish(pair.local, "t/x", 2, "pub-a")
    wait_until(lambda: latest().get("$SYS/broker/bridges/tob/forwarded") == b"2", LINK, "forwarded 2 on $SYS")
    assert latest()["$SYS/broker/bridges/tob/queued"] == b"0"
    assert latest()["$SYS/broker/bridges/tob/received"] == b"0"

    pair.stop_remote()
    wait_until(lambda: latest().get(state_topic) == b"0", LINK, "state 0 on $SYS once B is down")
    publish(pair.local, "t/x", 3, "pub-a")
    wait_until(lambda: latest().get("$SYS/broker/bridges/tob/queued") == b"3", LINK, "queued 3 on $SYS")
    mqtt_close(watcher)

    # Retained: a client connecting now has them at once; a bridge removed by a reload leaves none behind.
    sys_name = "$SYS.broker.connection." + client_id.replace(".", "/") + ".state"
    assert pair.local.inspect(pair.local.broker.retained.holds, sys_name)
    call(pair.local.gateway.bridges.reload, [])
    wait_until(lambda: not pair.local.inspect(pair.local.broker.retained.holds, sys_name), LINK, "state topic cleared")
    assert not pair.local.inspect(pair.local.broker.retained.holds, "$SYS.broker.bridges.tob.queued")
    assert pair.local.inspect(pair.local.broker.retained.holds, "$SYS.broker.uptime")  # the others stay


# -- gateway bridges ------------------------------------------------------------------------


def test_gateway_bridges_lists_them_and_shows_one(pair):
    publish(pair.local, "t/x", 2, "pub-a")
    wait_until(lambda: pair.status()["out"]["forwarded"] == 2, LINK, "2 forwarded")

    code, out, err = gateway(pair.local, "bridges")
    assert code == 0 and err == "", err
    header, *lines = out.splitlines()
    assert header.split() == ["Name", "State", "Since(UTC)", "Url", "Queued", "Inflight", "OutForwarded",
                              "InReceived", "LastError"]
    [row] = rows(out)
    assert row[:2] == ["tob", "connected"] and re.fullmatch(r"\d{4}-\d\d-\d\d", row[2]) and re.fullmatch(r"\d\d:\d\d:\d\d", row[3])
    assert row[4:] == [f"mqtt://127.0.0.1:{pair.remote.mqtt_port}", "0", "0", "2", "0", "-"]

    code, out, err = gateway(pair.local, "bridges", "tob")
    assert code == 0 and err == "", err
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()[1:])
    assert fields["name"] == "tob" and fields["state"].startswith("connected since ") and fields["state"].endswith(" UTC")
    assert fields["out forwarded"] == "2" and fields["out patterns"] == "t/#" and fields["last error"] == "-"
    assert fields["remote broker"] == pair.remote.broker.node_name

    code, out, _ = gateway(pair.local, "bridges", "--json")
    assert code == 0 and [b["name"] for b in json.loads(out)] == ["tob"]
    code, out, _ = gateway(pair.local, "bridges", "tob", "--json")
    assert code == 0 and json.loads(out)["out"]["forwarded"] == 2

    code, out, err = gateway(pair.local, "bridges", "nope")
    assert (code, out) == (1, "") and err.strip() == "gateway bridges: no bridge 'nope' (HTTP 404)"
    code, out, err = gateway(pair.remote, "bridges")
    assert (code, out, err) == (0, "no bridges configured\n", "")

    pair.stop_remote()
    wait_until(lambda: pair.status()["state"] == "disconnected", LINK, "bridge tob disconnected")
    publish(pair.local, "t/x", 4, "pub-a")
    wait_until(lambda: pair.status()["out"]["queued"] == 4, LINK, "4 queued")
    code, out, _ = gateway(pair.local, "bridges")
    [row] = rows(out)
    assert row[1] == "disconnected" and row[5:9] == ["4", "0", "2", "0"] and row[9] != "-"
