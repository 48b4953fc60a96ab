"""Users and rules on STOMP, MQTT 3.1.1/5.0 and WebSocket, with real clients: the answer each bad case gets.

After every refusal a permitted client still round-trips, and a persistent
message stored before is still there.
"""
from __future__ import annotations

import os
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion

from core.access import Rule
from core.stream import StreamSpec
from gateway.auth.users import Cost, PasswordHash, write_lines
from tests.support import BrokerHandle, Collector, MqttCollector, disconnect, make_config, mqtt_close, wait_until

CHEAP = Cost(ln=10)  # the format and the flow; the production cost is tested in tests/unit/test_users.py
PASSWORDS = {"dev1": "d1-secret", "dev2": "d2-secret", "ops": "o-secret", "keeper": "k-secret"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any):
    tmp = tmp_path_factory.mktemp("auth")
    users = tmp / "users"
    write_lines(str(users), [f"{name}:{PasswordHash.make(pw.encode(), CHEAP)}" for name, pw in PASSWORDS.items()])
    config = make_config(tmp)
    config.streams = [StreamSpec("readings", ["topic://sensors.>"])]
    config.auth.users_file = str(users)
    config.auth.max_failed_logins = 0  # this module fails logins on purpose; the ban has its own test
    config.auth.groups = {"devices": ["dev1", "dev2"]}
    config.auth.rules = [
        Rule.parse("group:devices", "allow", ["write"], ["topic://sensors.{username}.>"]),
        Rule.parse("group:devices", "allow", ["read"], ["topic://commands.{username}.>"]),
        Rule.parse("user:ops", "allow", ["read", "write"], ["topic://>", "queue://>", "temp-queue://>"]),
        Rule.parse("user:ops", "deny", ["write"], ["queue://frozen"]),
        # Queues: ops also creates them (admin), except dead-letter queues.
        Rule.parse("user:ops", "allow", ["admin"], ["queue://>"]),
        Rule.parse("user:ops", "deny", ["admin"], ["queue://DLQ", "queue://DLQ.>"]),
        # dev2 may write to the jobs queue an operator made, not make others.
        Rule.parse("user:dev2", "allow", ["write"], ["queue://jobs.>"]),
        # Dead letters: reading queue://> is not enough, the DLQ needs admin on it too.
        Rule.parse("user:keeper", "allow", ["read", "admin"], ["queue://DLQ"]),
    ]
    handle = BrokerHandle(config)
    # A message stored before any refusal: it must survive all of them.
    ops, got = stomp_login("ops", handle=handle)
    ops.send("/queue/kept", "stored before", headers={"persistent": "true"}, receipt="kept")
    got.wait_for(1, what="receipts")
    disconnect(ops)
    handle.users_path = str(users)
    yield handle
    handle.stop()


_handle: BrokerHandle | None = None


@pytest.fixture(autouse=True)
def still_serving(broker: BrokerHandle):
    global _handle
    _handle = broker
    yield
    assert broker.queue_bodies("queue://kept") == [b"stored before"]


def stomp_login(
    user: str, password: str | None = None, handle: BrokerHandle | None = None, client_id: str | None = None,
) -> tuple[Any, Collector]:
    h = handle or _handle
    assert h is not None
    conn = stomp.Connection12([(h.host, h.port)])
    got = Collector()
    conn.set_listener("c", got)
    headers = {"client-id": client_id} if client_id else {}
    conn.connect(user, PASSWORDS.get(user, "x") if password is None else password, wait=True, headers=headers)
    return conn, got


def connack(codes: list[Any]) -> list[Any]:
    """The CONNACK codes paho saw (``codes`` filled by its on_connect), once there is one."""
    wait_until(lambda: codes, what="the CONNACK")
    return codes


def stomp_refused(broker: BrokerHandle, user: str, password: str) -> Any:
    conn = stomp.Connection12([(broker.host, broker.port)])
    got = Collector()
    conn.set_listener("c", got)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect(user, password, wait=True)
    (error,) = got.wait_for(1, what="errors")
    assert got.disconnected.wait(5)
    return error


def test_stomp_wrong_password_and_unknown_user_get_the_same_error(broker):
    wrong = stomp_refused(broker, "dev1", "guess")
    unknown = stomp_refused(broker, "nobody", "guess")
    assert wrong.headers["message"] == unknown.headers["message"] == "Access refused"
    assert wrong.body == unknown.body == "bad user name or password"
    assert stomp_refused(broker, "", "").headers["message"] == "Access refused"  # no login, no anonymous


def test_stomp_denied_send_and_subscribe_name_the_destination(broker):
    conn, got = stomp_login("dev1")
    conn.send("/topic/sensors.dev2.t", "not mine", receipt="r1")
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Access denied" and error.headers["receipt-id"] == "r1"
    assert "/topic/sensors.dev2.t is not allowed" in error.body
    conn, got = stomp_login("ops")
    conn.send("/queue/frozen", "deny wins", receipt="r2")
    assert got.wait_for(1, what="errors")[0].headers["message"] == "Access denied"
    assert broker.queue_depth("queue://frozen") == 0
    conn, got = stomp_login("dev1")
    conn.subscribe("/topic/sensors.>", id="all", receipt="r3")
    assert "read access to /topic/sensors.> is not allowed" in got.wait_for(1, what="errors")[0].body


def test_stomp_allowed_user_round_trips(broker):
    ops, ops_got = stomp_login("ops")
    ops.subscribe("/topic/sensors.>", id="s", receipt="s")
    ops_got.wait_for(1, what="receipts")
    dev, dev_got = stomp_login("dev1")
    dev.send("/topic/sensors.dev1.temp", "21.5", receipt="r")
    dev_got.wait_for(1, what="receipts")
    assert [m.body for m in ops_got.wait_for(1)] == ["21.5"]
    disconnect(dev)
    disconnect(ops)


def paho(broker: BrokerHandle, client_id: str, version: int, user: str | None, password: str | None) -> tuple[Any, Any]:
    protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    if user is not None:
        client.username_pw_set(user, password)
    codes: list[Any] = []
    client.on_connect = lambda c, u, flags, reason, props: codes.append(reason)
    client.connect(broker.host, broker.mqtt_port, 30)
    client.loop_start()
    return client, codes


@pytest.mark.parametrize(("version", "user", "password", "expected"), [
    (4, "dev1", "guess", "Bad user name or password"),   # 3.1.1 CONNACK 4
    (4, "nobody", "guess", "Bad user name or password"),
    (4, None, None, "Not authorized"),                    # 3.1.1 CONNACK 5: no credentials
    (5, "dev1", "guess", "Bad user name or password"),   # 5.0 0x86
    (5, "nobody", "guess", "Bad user name or password"),
    (5, None, None, "Not authorized"),                    # 5.0 0x87
])
def test_mqtt_refused_logins(broker, version, user, password, expected):
    client, codes = paho(broker, f"refused-{version}-{user}", version, user, password)
    connack(codes)
    client.loop_stop()
    # paho names 3.1.1's return codes 4 and 5 as 5.0's; the bytes are checked in tests/unit/test_mqtt_session.py
    # and by mosquitto_sub below.
    assert [str(c) for c in codes] == [expected]
    if version == 5:
        assert codes[0].value == {"Bad user name or password": 0x86, "Not authorized": 0x87}[expected]


@pytest.mark.parametrize(("args", "said"), [
    (["-u", "dev1", "-P", "guess"], "bad user name or password"),
    (["-u", "nobody", "-P", "guess"], "bad user name or password"),
    ([], "not authorised"),
])
def test_mosquitto_sub_sees_the_311_return_code(broker, args, said):
    import shutil
    import subprocess

    if shutil.which("mosquitto_sub") is None:
        if os.environ.get("CI"):
            raise AssertionError("mosquitto-clients is not installed (.ci/run installs it)")
        pytest.skip("mosquitto-clients is not installed")
    done = subprocess.run(
        ["mosquitto_sub", "-h", broker.host, "-p", str(broker.mqtt_port), "-V", "mqttv311", "-t", "x", "-C", "1", "-W", "3", *args],
        capture_output=True, text=True, timeout=10,
    )
    assert done.returncode != 0 and said in (done.stderr + done.stdout).lower(), (done.stdout, done.stderr)


def paho_login(broker: BrokerHandle, client_id: str, version: int, user: str) -> tuple[Any, MqttCollector]:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311)
    client.username_pw_set(user, PASSWORDS[user])
    got = MqttCollector()
    for name in ("on_message", "on_connect", "on_subscribe", "on_disconnect"):
        setattr(client, name, getattr(got, name))
    client.connect(broker.host, broker.mqtt_port, 30)
    client.loop_start()
    got.wait_for(1, what="connacks")
    return client, got


@pytest.mark.parametrize("version", [4, 5])
def test_mqtt_denied_subscribe_and_publish(broker, version):
    watcher, watch_got = paho_login(broker, f"watch-{version}", 4, "ops")
    watcher.subscribe("sensors/#", qos=1)
    watch_got.wait_for(1, what="subacks")
    dev, got = paho_login(broker, f"dev1-{version}", version, "dev1")
    dev.subscribe("sensors/#", qos=1)
    (reasons,) = got.wait_for(1, what="subacks")
    assert [r.value for r in reasons] == [0x87 if version == 5 else 0x80]
    denied = dev.publish("sensors/dev2/t", b"not mine", qos=1)
    denied.wait_for_publish(5)  # acknowledged (5.0: PUBACK 0x87, see the session tests), never routed
    allowed = dev.publish("sensors/dev1/t", b"mine", qos=1)
    allowed.wait_for_publish(5)
    assert [m.payload for m in watch_got.wait_for(1)] == [b"mine"]
    assert [m.payload for m in watch_got.settle(0.3)] == [b"mine"]
    for c in (dev, watcher):
        mqtt_close(c)


def test_websocket_stomp_login(broker):
    conn = stomp.WSConnection([(broker.host, broker.ws_port)], ws_path="/ws")
    got = Collector()
    conn.set_listener("c", got)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("dev1", "guess", wait=True)
    assert got.wait_for(1, what="errors")[0].headers["message"] == "Access refused"
    conn = stomp.WSConnection([(broker.host, broker.ws_port)], ws_path="/ws")
    conn.set_listener("c", Collector())
    conn.connect("ops", PASSWORDS["ops"], wait=True)
    assert conn.is_connected()
    conn.disconnect()


def test_sighup_rereads_the_users_file(broker):
    write_lines(broker.users_path, [f"{name}:{PasswordHash.make(pw.encode(), CHEAP)}" for name, pw in PASSWORDS.items()]
                + [f"late:{PasswordHash.make(b'l-secret', CHEAP)}"])
    stomp_refused(broker, "late", "l-secret")
    broker.inspect(broker.gateway.reload)  # what the CLI's SIGHUP handler calls
    conn, _ = stomp_login("late", "l-secret")
    assert conn.is_connected()
    disconnect(conn)


def test_failed_logins_ban_the_address_and_everything_is_audited(tmp_path):
    import json

    users = tmp_path / "users"
    write_lines(str(users), [f"ops:{PasswordHash.make(PASSWORDS['ops'].encode(), CHEAP)}"])
    config = make_config(tmp_path)
    config.auth.users_file = str(users)
    config.auth.max_failed_logins = 3
    config.auth.failed_login_ban_seconds = 30
    config.auth.audit_log = str(tmp_path / "audit.jsonl")
    config.auth.rules = [Rule.parse("user:ops", "allow", ["read", "write"], ["queue://open"])]
    handle = BrokerHandle(config)
    try:
        for _ in range(3):
            assert stomp_refused(handle, "ops", "guess").body == "bad user name or password"
        # Banned now: even the right password is refused at once, saying why.
        banned = stomp_refused(handle, "ops", PASSWORDS["ops"])
        assert banned.headers["message"] == "Access refused" and "too many failed logins from this address" in banned.body
        client, codes = paho(handle, "banned-mqtt", 5, "ops", PASSWORDS["ops"])
        connack(codes)
        client.loop_stop()
        assert [c.value for c in codes] == [0x86]
    finally:
        handle.stop()
    handle = BrokerHandle(config)  # a restart forgets bans (they live in memory)
    try:
        conn, got = stomp_login("ops", handle=handle)
        conn.send("/queue/closed", "x", receipt="r")
        assert got.wait_for(1, what="errors")[0].headers["message"] == "Access denied"
    finally:
        handle.stop()
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "login_failed", "login_failed", "login_failed", "address_banned", "login_refused", "login_refused", "denied",
    ]
    assert events[0]["user"] == "ops" and events[0]["protocol"] == "stomp/1.2" and events[0]["address"].startswith("127.0.0.1:")
    assert events[-1] == {**events[-1], "user": "ops", "permission": "write", "destination": "queue://closed"}


def test_connections_per_user_are_limited(tmp_path):
    users = tmp_path / "users"
    write_lines(str(users), [f"ops:{PasswordHash.make(PASSWORDS['ops'].encode(), CHEAP)}"])
    config = make_config(tmp_path, max_connections_per_user=2)
    config.auth.users_file = str(users)
    config.auth.rules = [Rule.parse("user:ops", "allow", ["read", "write"], ["queue://>"])]
    handle = BrokerHandle(config)
    try:
        first, _ = stomp_login("ops", handle=handle)
        second, _ = paho_login(handle, "ops-mqtt", 5, "ops")
        conn = stomp.Connection12([(handle.host, handle.port)])
        got = Collector()
        conn.set_listener("c", got)
        with pytest.raises(stomp.exception.ConnectFailedException):
            conn.connect("ops", PASSWORDS["ops"], wait=True)
        (error,) = got.wait_for(1, what="errors")
        assert error.headers["message"] == "Connection refused" and "max_connections_per_user" in error.body
        client, codes = paho(handle, "ops-third", 5, "ops", PASSWORDS["ops"])
        connack(codes)
        client.loop_stop()
        assert [c.value for c in codes] == [0x97]  # quota exceeded
        disconnect(first)  # a connection closes: there is room again
        wait_until(lambda: handle.inspect(lambda: sum(c.user == "ops" for c in handle.broker.connections.values())) <= 1,
                   what="the closed connection of ops to leave the count")
        again, _ = stomp_login("ops", handle=handle)
        assert again.is_connected()
        disconnect(again)
        mqtt_close(second)
    finally:
        handle.stop()


def test_before_login_only_small_frames_and_packets_are_read(broker):
    from protocols.mqtt import codec as mq
    from tests.support import RawMqtt, RawStomp

    stomp_raw = RawStomp(broker)
    try:
        stomp_raw.frame("CONNECT", {"accept-version": "1.2", "login": "dev1", "passcode": "x" * 100_000})
        error = stomp_raw.expect_error_and_close()
        assert error.headers["message"] in ("Header too long", "Headers too large"), error.headers
    finally:
        stomp_raw.close()
    for level in (4, 5):
        raw = RawMqtt(broker, level=level)
        try:
            raw.packet(mq.Connect("MQTT", level, True, 30, f"big-{level}", username="dev1", password=b"x",
                                  will=mq.Will("sensors/dev1/gone", b"w" * 65_535)))  # over the 64 KiB CONNECT bound
            assert raw.closed_by_peer()
            # Refused before its level, let alone its password, was read: closed without a CONNACK.
            assert raw.received == []
        finally:
            raw.close()
    # Logged in, the usual limits apply: a 200 KiB message goes through.
    conn, got = stomp_login("ops")
    conn.subscribe("/queue/big", id="b")
    conn.send("/queue/big", "y" * 200_000, receipt="r")
    assert len(got.wait_for(1)[0].body) == 200_000
    disconnect(conn)


def test_stream_reads_need_read_on_the_stream(broker):
    """ops may read every topic and queue, but no stream://: its STOMP stream subscription is denied."""
    conn, got = stomp_login("ops")
    conn.subscribe("/stream/readings", id="s", ack="client-individual", headers={"x-stream-offset": "first", "receipt": "r"})
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Access denied" and "read access to /stream/readings is not allowed" in error.body


def test_a_temporary_queue_is_consumed_by_its_owner_only(broker):
    owner, owner_got = stomp_login("ops")
    owner.subscribe("/temp-queue/replies", id="t")
    owner.send("/temp-queue/replies", "hello", receipt="r")
    (hello,) = owner_got.wait_for(1)
    other, other_got = stomp_login("ops")  # the same user, another connection
    other.subscribe(hello.headers["destination"], id="steal", receipt="r2")
    (error,) = other_got.wait_for(1, what="errors")
    assert "only the connection that created a temporary queue can consume from it" in error.body
    disconnect(owner)


def test_a_durable_subscription_is_its_users_alone(broker):
    """Another user with the same client-id may neither attach to nor remove it; its owner resumes it."""
    dev, dev_got = stomp_login("dev1", client_id="shared-id")
    dev.subscribe("/topic/commands.dev1.>", id="d", headers={"activemq.subscriptionName": "cmds"}, receipt="s")
    dev_got.wait_for(1, what="receipts")
    disconnect(dev)
    ops, ops_got = stomp_login("ops", client_id="shared-id")
    ops.send("/topic/commands.dev1.reboot", "while away", receipt="sent")
    ops_got.wait_for(1, what="receipts")
    ops.subscribe("/topic/commands.dev1.>", id="o", headers={"activemq.subscriptionName": "cmds"}, receipt="r")
    (error,) = ops_got.wait_for(1, what="errors")
    assert "durable subscription 'cmds' of client 'shared-id' is another user's" in error.body
    assert ops_got.messages == []
    ops, ops_got = stomp_login("ops", client_id="shared-id")
    ops.unsubscribe(id="x", headers={"activemq.subscriptionName": "cmds"}, receipt="u")
    assert "is another user's" in ops_got.wait_for(1, what="errors")[0].body
    dev, dev_got = stomp_login("dev1", client_id="shared-id")
    dev.subscribe("/topic/commands.dev1.>", id="d", headers={"activemq.subscriptionName": "cmds"})
    assert [m.body for m in dev_got.wait_for(1)] == ["while away"]
    dev.unsubscribe(id="d", headers={"activemq.subscriptionName": "cmds"}, receipt="gone")
    dev_got.wait_for(1, what="receipts")
    disconnect(dev)
    assert broker.inspect(broker.broker.durable, "shared-id:cmds") is None


@pytest.mark.parametrize("version", [4, 5])
def test_an_mqtt_session_is_its_users_alone(broker, version):
    """Another user's CONNECT with the client id is refused (5.0 0x85, 3.1.1 code 2); the owner is not cut off."""
    dev, got = paho_login(broker, f"device-{version}", version, "dev1")
    dev.subscribe("commands/dev1/#", qos=1)
    got.wait_for(1, what="subacks")
    client, codes = paho(broker, f"device-{version}", version, "ops", PASSWORDS["ops"])
    connack(codes)
    client.loop_stop()
    client.disconnect()
    # paho names 3.1.1's return code 2 (identifier rejected) as 5.0's 0x85, as it does 4 and 5 above.
    assert [str(c) for c in codes] == ["Client identifier not valid"] and codes[0].value == 0x85
    ops, ops_got = stomp_login("ops")
    ops.send("/topic/commands.dev1.ping", "still yours", receipt="r")
    ops_got.wait_for(1, what="receipts")
    assert [m.payload for m in got.wait_for(1)] == [b"still yours"]
    disconnect(ops)
    mqtt_close(dev)


def test_the_dead_letter_queue_needs_admin(broker):
    """ops reads queue://>, but not the DLQ; keeper, with admin on it, does; nobody forges dead letters."""
    ops, got = stomp_login("ops")
    ops.subscribe("/queue/DLQ", id="d", receipt="r")
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Access denied" and "read access to /queue/DLQ is not allowed" in error.body
    ops, got = stomp_login("ops")
    ops.send("/queue/DLQ", "forged", receipt="w")
    assert got.wait_for(1, what="errors")[0].headers["message"] == "Access denied"
    assert broker.queue_depth("queue://DLQ") == 0
    keeper, kept = stomp_login("keeper")
    keeper.subscribe("/queue/DLQ", id="k", receipt="ok")
    assert kept.wait_for(1, what="receipts") and kept.errors == []
    disconnect(keeper)


def test_owners_of_durable_subscriptions_and_sessions_survive_a_restart(tmp_path):
    users = tmp_path / "users"
    write_lines(str(users), [f"{n}:{PasswordHash.make(PASSWORDS[n].encode(), CHEAP)}" for n in ("dev1", "ops")])
    config = make_config(tmp_path)
    config.auth.users_file = str(users)
    config.auth.rules = [Rule.parse("*", "allow", ["read", "write"], ["topic://>"])]
    handle = BrokerHandle(config)
    try:
        conn, got = stomp_login("dev1", handle=handle, client_id="c1")
        conn.subscribe("/topic/t", id="1", headers={"activemq.subscriptionName": "s"}, receipt="r")
        got.wait_for(1, what="receipts")
        disconnect(conn)
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="m1", protocol=mqtt.MQTTv5)
        client.username_pw_set("dev1", PASSWORDS["dev1"])
        from paho.mqtt.properties import Properties
        from paho.mqtt.packettypes import PacketTypes

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        client.connect(handle.host, handle.mqtt_port, 30, clean_start=False, properties=props)
        client.loop_start()
        wait_until(client.is_connected, what="the CONNACK")
        mqtt_close(client)
    finally:
        handle.stop()
    handle = BrokerHandle(config)
    try:
        conn, got = stomp_login("ops", handle=handle, client_id="c1")
        conn.subscribe("/topic/t", id="1", headers={"activemq.subscriptionName": "s"}, receipt="r")
        assert "is another user's" in got.wait_for(1, what="errors")[0].body
        client, codes = paho(handle, "m1", 5, "ops", PASSWORDS["ops"])
        connack(codes)
        client.loop_stop()
        assert [c.value for c in codes] == [0x85]
        # Their owner gets both back.
        conn, got = stomp_login("dev1", handle=handle, client_id="c1")
        conn.subscribe("/topic/t", id="1", headers={"activemq.subscriptionName": "s"}, receipt="r")
        assert got.wait_for(1, what="receipts") and got.errors == []
        disconnect(conn)
        client, codes = paho(handle, "m1", 5, "dev1", PASSWORDS["dev1"])
        connack(codes)
        assert [c.value for c in codes] == [0]
        mqtt_close(client)
    finally:
        handle.stop()


def test_creating_a_queue_needs_admin(broker):
    """dev2 may write to queue://jobs.>: to a queue that exists, not to a new one it would create."""
    ops, ops_got = stomp_login("ops")
    ops.send("/queue/jobs.made", "made by ops", receipt="m")  # ops has admin: the queue now exists
    ops_got.wait_for(1, what="receipts")
    dev, got = stomp_login("dev2")
    dev.send("/queue/jobs.made", "into an existing queue", receipt="ok")
    assert got.wait_for(1, what="receipts") and got.errors == []
    dev.send("/queue/jobs.typo", "would create", receipt="no")
    (error,) = got.wait_for(1, what="errors")
    assert error.headers["message"] == "Access denied" and error.headers["receipt-id"] == "no"
    assert error.body == ("write access to /queue/jobs.typo is not allowed for this user "
                          "(the queue does not exist yet, and creating it needs admin on it)")
    assert broker.inspect(broker.broker.queue, "queue://jobs.typo", False) is None
    assert broker.queue_bodies("queue://jobs.made") == [b"made by ops", b"into an existing queue"]
    disconnect(ops)
