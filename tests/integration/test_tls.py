"""TLS listeners: STOMP, MQTT, WebSocket (wss) and admin HTTPS with real clients and openssl-made certificates.

Certificates come from the ``openssl`` command (tests/support.py
``make_certificates``): a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate with CN ``dev1``, and one from another CA.
After each bad client (no certificate where one is required, a stranger's
certificate, plain bytes on a TLS port, TLS 1.1) a good client still gets the
persistent message sent before it, so the broker kept serving and lost nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion
from websockets.sync.client import connect as ws_connect

from gateway.config import ConfigError, load
from gateway.server import Gateway
from gateway.tls import TlsError
from protocols.stomp.codec import encode_frame
from tests.integration.test_websocket import stomp_connect, stomp_frames
from tests.support import (
    BrokerHandle,
    Collector,
    MqttCollector,
    call,
    connect,
    disconnect,
    make_certificates,
    make_tls_config,
    mqtt_close,
    reactor,
    wait_until,
)

KEPT = "/queue/kept"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: Any) -> dict[str, str]:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_broker(tmp_path, certs):
    handle = BrokerHandle(make_tls_config(tmp_path, certs, "optional"))
    yield handle
    handle.stop()


@pytest.fixture
def strict_broker(tmp_path, certs):
    """Client certificates required on every TLS port."""
    handle = BrokerHandle(make_tls_config(tmp_path, certs, "required"))
    yield handle
    handle.stop()


def context(certs, client: str | None = None) -> ssl.SSLContext:
    """A client context that verifies the broker against the test CA, with ``client``'s certificate if named."""
    ctx = ssl.create_default_context(cafile=certs["ca"])
    if client is not None:
        ctx.load_cert_chain(certs[client], certs[f"{client}-key"])
    return ctx


def stomp_tls(handle, certs, client: str | None = None, port: int | None = None) -> tuple[Any, Collector]:
    """stomp.py over TLS (``set_ssl``), checking the broker's certificate and host name."""
    address = (handle.host, port or handle.stomp_tls_port)
    conn = stomp.Connection12([address])
    key_file, cert_file = (certs[f"{client}-key"], certs[client]) if client else (None, None)
    conn.set_ssl(for_hosts=[address], ca_certs=certs["ca"], key_file=key_file, cert_file=cert_file)
    got = Collector()
    conn.set_listener("collector", got)
    conn.connect(wait=True)
    return conn, got


def paho_tls(handle, certs, version: int = 4, client: str | None = None, websockets: bool = False, client_id: str = ""):
    """A started paho client with ``tls_set`` against the test CA (MQTT over TLS, or over wss on /mqtt)."""
    protocol = {4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[version]
    paho = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
        transport="websockets" if websockets else "tcp",
    )
    got = MqttCollector()
    for name in ("on_message", "on_connect", "on_subscribe", "on_disconnect"):
        setattr(paho, name, getattr(got, name))
    if websockets:
        paho.ws_set_options(path="/mqtt")
    certfile, keyfile = (certs[client], certs[f"{client}-key"]) if client else (None, None)
    paho.tls_set(ca_certs=certs["ca"], certfile=certfile, keyfile=keyfile)
    paho.connect(handle.host, handle.ws_tls_port if websockets else handle.mqtt_tls_port, 30)
    paho.loop_start()
    (connack,) = got.wait_for(1, what="connacks")
    assert not connack[1].is_failure, connack
    return paho, got


def keep(handle, body: str) -> None:
    """A persistent message on a plain connection, receipted (so stored) before the bad case runs."""
    conn, got = connect(handle)
    conn.send(KEPT, body, headers={"persistent": "true"}, receipt="stored")
    got.wait_for(1, what="receipts")
    disconnect(conn)


def still_serving(handle, certs, body: str) -> None:
    """A good TLS client gets the message kept before the bad case: the broker serves, nothing was lost."""
    conn, got = stomp_tls(handle, certs, "client" if handle.config.tls.client_certs == "required" else None)
    conn.subscribe(KEPT, id="kept", ack="client-individual")
    (message,) = got.wait_for(1)
    assert message.body == body
    conn.ack(message.headers["ack"], receipt="acked")
    got.wait_for(1, what="receipts")
    assert not got.errors, got.errors
    disconnect(conn)


def users(handle) -> list[str]:
    """What each open connection's transport says of its client certificate (what the sessions ask)."""
    return handle.inspect(lambda: sorted((s.transport.certificate_user() or "-") for s in handle.gateway.sessions()))


def refused(sock: ssl.SSLSocket, data: bytes = encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")])) -> bool:
    """True when the broker ends the connection (TLS alert or close) instead of answering ``data``."""
    try:
        sock.sendall(data)
        return sock.recv(4096) == b""
    except (ssl.SSLError, ConnectionError):
        return True
    finally:
        sock.close()


# -- round trips ------------------------------------------------------------------------------


def test_stomp_over_tls_round_trip(tls_broker, certs):
    conn, got = stomp_tls(tls_broker, certs)
    conn.subscribe("/queue/tls", id="s")
    conn.send("/queue/tls", "over TLS", headers={"persistent": "true"})
    (message,) = got.wait_for(1)
    assert message.body == "over TLS"
    # The same destination from a plain connection: one broker behind both listeners.
    plain, _ = connect(tls_broker)
    plain.send("/queue/tls", "from plain TCP")
    assert got.wait_for(2)[1].body == "from plain TCP"
    disconnect(plain)
    disconnect(conn)


@pytest.mark.parametrize("version", [4, 5], ids=["mqtt-3.1.1", "mqtt-5"])
def test_paho_publish_and_subscribe_over_tls(tls_broker, certs, version):
    paho, got = paho_tls(tls_broker, certs, version)
    paho.subscribe("sensors/+/temp", qos=1)
    got.wait_for(1, what="subacks")
    paho.publish("sensors/a/temp", b"21.5", qos=1).wait_for_publish(5)
    # And from STOMP over TLS to the MQTT subscriber.
    conn, _ = stomp_tls(tls_broker, certs)
    conn.send("/topic/sensors.b.temp", "19.0")
    assert sorted(got.wait_for(2) and got.payloads()) == [b"19.0", b"21.5"]
    disconnect(conn)
    mqtt_close(paho)


def test_client_certificate_cn_reaches_the_sessions(tls_broker, certs):
    """paho and stomp.py with the dev1 certificate: the sessions' hook names dev1; without one, nothing."""
    paho, _ = paho_tls(tls_broker, certs, 5, client="client", client_id="with-cert")
    conn, _ = stomp_tls(tls_broker, certs, "client")
    anonymous, _ = stomp_tls(tls_broker, certs)
    plain, _ = connect(tls_broker)
    assert users(tls_broker) == ["-", "-", "dev1", "dev1"]
    for c in (conn, anonymous, plain):
        disconnect(c)
    mqtt_close(paho)


def test_wss_stomp_and_mqtt(tls_broker, certs):
    url = f"wss://127.0.0.1:{tls_broker.ws_tls_port}/"
    with ws_connect(url, ssl=context(certs, "client"), subprotocols=["v12.stomp"]) as ws:
        stomp_connect(ws)
        ws.send(encode_frame("SUBSCRIBE", [("destination", "/topic/wss"), ("id", "1"), ("receipt", "sub")]))
        (receipt,) = stomp_frames(ws, 1)  # the SUBSCRIBE handled before paho's publish
        assert receipt.command == "RECEIPT" and receipt.headers["receipt-id"] == "sub", receipt
        assert users(tls_broker) == ["dev1"]
        paho, _ = paho_tls(tls_broker, certs, 5, websockets=True)  # paho over wss, on /mqtt
        paho.publish("wss", b"paho over wss", qos=1).wait_for_publish(5)
        (frame,) = stomp_frames(ws, 1)
        assert frame.command == "MESSAGE" and frame.body == b"paho over wss"
        mqtt_close(paho)


def test_admin_over_https(tls_broker, certs):
    url = f"https://127.0.0.1:{tls_broker.admin_tls_port}/api/v1"
    with urllib.request.urlopen(url, context=context(certs), timeout=10) as answer:
        assert answer.status == 200
        assert "api" in json.loads(answer.read())
    # curl as an operator would run it, with the CA and the client certificate.
    result = subprocess.run(
        ["curl", "-sS", "--fail", "--cacert", certs["ca"], "--cert", certs["client"], "--key", certs["client-key"], url],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "api" in json.loads(result.stdout)
    # Plain HTTP stays on its own port.
    with urllib.request.urlopen(f"http://127.0.0.1:{tls_broker.admin_port}/api/v1", timeout=10) as answer:
        assert answer.status == 200


def _mosquitto(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        why = f"{tool} is not installed (apt-get install mosquitto-clients)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"TLS tests cannot run under CI: {why}")
        pytest.skip(why)
    return path


def test_mosquitto_clients_over_tls(tls_broker, certs):
    pub, sub = _mosquitto("mosquitto_pub"), _mosquitto("mosquitto_sub")
    tls = ["-h", "127.0.0.1", "-p", str(tls_broker.mqtt_tls_port), "--cafile", certs["ca"]]
    paho, got = paho_tls(tls_broker, certs)
    paho.subscribe("plant/#", qos=1)
    got.wait_for(1, what="subacks")
    subprocess.run([pub, *tls, "-t", "plant/line1", "-m", "from mosquitto_pub", "-q", "1"], check=True, timeout=30)
    assert got.wait_for(1)[0].payload == b"from mosquitto_pub"
    # A retained message from paho, read by mosquitto_sub with a client certificate.
    paho.publish("plant/state", b"running", qos=1, retain=True).wait_for_publish(5)
    result = subprocess.run(
        [sub, *tls, "--cert", certs["client"], "--key", certs["client-key"], "-t", "plant/state", "-C", "1", "-W", "20"],
        capture_output=True, timeout=30,
    )
    assert result.stdout.strip() == b"running", result.stderr
    mqtt_close(paho)


@pytest.mark.parametrize("listener", ["stomp_tls_port", "mqtt_tls_port", "ws_tls_port", "admin_tls_port"])
def test_clients_offering_alpn_get_in(tls_broker, certs, listener):
    """Browsers offer http/1.1 (and h2), IoT clients names like mqtt: no overlap is no refusal."""
    ctx = context(certs)
    ctx.set_alpn_protocols(["mqtt", "h2", "http/1.1"])
    port = getattr(tls_broker, listener)
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1") as sock:
        # Only the admin listener speaks a protocol ALPN names; it picks one of the offers.
        assert sock.selected_alpn_protocol() in ((None,) if listener != "admin_tls_port" else ("h2", "http/1.1"))
        assert sock.version() in ("TLSv1.2", "TLSv1.3")


# -- refusals -------------------------------------------------------------------------------


def test_required_client_certificates(strict_broker, certs):
    keep(strict_broker, "kept through refusals")
    port = strict_broker.stomp_tls_port
    # No certificate: the handshake fails (TLS 1.3 says so at the client's first read).
    bare = context(certs).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1")
    assert refused(bare)
    # A certificate from another CA: refused too.
    stranger = context(certs, "stranger").wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1")
    assert refused(stranger)
    # MQTT likewise; then paho with the dev1 certificate is let in.
    bare = context(certs).wrap_socket(socket.create_connection(("127.0.0.1", strict_broker.mqtt_tls_port), timeout=5), server_hostname="127.0.0.1")
    assert refused(bare, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
    paho, _ = paho_tls(strict_broker, certs, 4, client="client")
    assert users(strict_broker) == ["dev1"]
    mqtt_close(paho)
    still_serving(strict_broker, certs, "kept through refusals")


def test_stranger_certificate_refused_when_optional(tls_broker, certs):
    keep(tls_broker, "kept")
    stranger = context(certs, "stranger").wrap_socket(
        socket.create_connection(("127.0.0.1", tls_broker.stomp_tls_port), timeout=5), server_hostname="127.0.0.1",
    )
    assert refused(stranger)
    still_serving(tls_broker, certs, "kept")


@pytest.mark.parametrize("listener", ["stomp_tls_port", "mqtt_tls_port", "ws_tls_port", "admin_tls_port"])
def test_plain_client_on_a_tls_port_gets_nothing(tls_broker, certs, listener):
    keep(tls_broker, "kept after plain bytes")
    with socket.create_connection(("127.0.0.1", getattr(tls_broker, listener)), timeout=5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
        else:
            raise AssertionError("the broker kept a plain client on its TLS port open")
    # At most a TLS alert record (content type 21), never a protocol answer.
    assert answer[:1] in (b"", b"\x15"), answer
    assert b"CONNECTED" not in answer and b"HTTP" not in answer
    still_serving(tls_broker, certs, "kept after plain bytes")


def _old_tls_context(certs, newest: ssl.TLSVersion) -> ssl.SSLContext | None:
    """A client that offers nothing newer than ``newest`` (None if this OpenSSL cannot make one)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certs["ca"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = newest
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 allows TLS 1.1 only at security level 0
    except (ValueError, ssl.SSLError):
        return None
    return ctx


def test_tls_1_1_client_is_refused(tls_broker, certs):
    """On every TLS listener: STOMP, MQTT, wss and admin HTTPS share the one minimum (TLS 1.2)."""
    keep(tls_broker, "kept after TLS 1.1")
    for listener in ("stomp_tls_port", "mqtt_tls_port", "ws_tls_port", "admin_tls_port"):
        port = getattr(tls_broker, listener)
        old = _old_tls_context(certs, ssl.TLSVersion.TLSv1_1)
        if old is not None:
            with pytest.raises(ssl.SSLError) as info:
                old.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1")
            # The broker's alert, not the client's own refusal to offer TLS 1.1.
            assert "PROTOCOL_VERSION" in str(info.value) or "UNSUPPORTED_PROTOCOL" in str(info.value), (listener, info.value)
            # The same client allowed TLS 1.2 gets in: the refusal was about the version.
            modern = _old_tls_context(certs, ssl.TLSVersion.TLSv1_2)
            assert modern is not None
            with modern.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1") as ok:
                assert ok.version() == "TLSv1.2", listener
        else:
            result = subprocess.run(
                ["openssl", "s_client", "-tls1_1", "-connect", f"127.0.0.1:{port}", "-CAfile", certs["ca"]],
                input=b"", capture_output=True, timeout=30,
            )
            assert result.returncode != 0 and b"Protocol  : TLSv1.1" not in result.stdout, listener
    still_serving(tls_broker, certs, "kept after TLS 1.1")


def test_a_closed_session_frees_its_socket_without_the_clients_close_notify(tls_broker, certs):
    """The broker closes TLS connections itself: a client that never answers close_notify holds nothing."""
    sock = context(certs).wrap_socket(
        socket.create_connection(("127.0.0.1", tls_broker.stomp_tls_port), timeout=5), server_hostname="127.0.0.1",
    )
    sock.sendall(b"NONSENSE\n\n\x00")  # an ERROR frame, then the broker closes
    received = b""
    while chunk := sock.recv(4096):  # b"" at the broker's close_notify; this client never answers it
        received += chunk
    assert received.startswith(b"ERROR")
    # The session is gone only once the connection is lost: the socket is closed on the broker's side.
    wait_until(lambda: tls_broker.sessions() == 0, what="the session to go without the client's close_notify")
    sock.close()


def test_min_version_1_3_refuses_tls_1_2(tmp_path, certs):
    config = make_tls_config(tmp_path, certs)
    config.tls.min_version = "1.3"
    handle = BrokerHandle(config)
    try:
        ctx = context(certs)
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"):
            ctx.wrap_socket(socket.create_connection(("127.0.0.1", handle.mqtt_tls_port), timeout=5), server_hostname="127.0.0.1")
        with context(certs).wrap_socket(socket.create_connection(("127.0.0.1", handle.mqtt_tls_port), timeout=5), server_hostname="127.0.0.1") as ok:
            assert ok.version() == "TLSv1.3"
    finally:
        handle.stop()


# -- reload, switching plain listeners off, configuration ------------------------------------


def test_certificate_file_with_its_chain(tmp_path, certs):
    """A server certificate from an intermediate CA: the broker sends the chain, clients trust the root."""
    config = make_tls_config(tmp_path, certs)
    config.tls.cert, config.tls.key = certs["chained"], certs["chained-key"]
    handle = BrokerHandle(config)
    try:
        paho, got = paho_tls(handle, certs, 5)
        paho.subscribe("chain", qos=1)
        got.wait_for(1, what="subacks")
        paho.publish("chain", b"through the intermediate", qos=1).wait_for_publish(5)
        assert got.wait_for(1)[0].payload == b"through the intermediate"
        mqtt_close(paho)
    finally:
        handle.stop()


def _serial(port: int, certs) -> int:
    with context(certs).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1") as s:
        return int(s.getpeercert()["serialNumber"], 16)


def _file_serial(path: str) -> int:
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", path], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().split("=", 1)[1], 16)


def test_reload_gives_new_connections_the_new_certificate(tmp_path, certs):
    live = tmp_path / "live"
    live.mkdir()
    for name in ("server.pem", "server.key"):
        shutil.copy(Path(certs["server"]).parent / name, live / name)
    config = make_tls_config(tmp_path, certs)
    config.tls.cert, config.tls.key = str(live / "server.pem"), str(live / "server.key")
    handle = BrokerHandle(config)
    try:
        assert _serial(handle.stomp_tls_port, certs) == _file_serial(certs["server"])
        before, got = stomp_tls(handle, certs)
        before.subscribe("/queue/reload", id="s")
        shutil.copy(certs["server2"], live / "server.pem")
        shutil.copy(certs["server2-key"], live / "server.key")
        assert handle.inspect(handle.gateway.reload_tls) is True
        for port in (handle.stomp_tls_port, handle.mqtt_tls_port, handle.ws_tls_port, handle.admin_tls_port):
            assert _serial(port, certs) == _file_serial(certs["server2"])
        # The connection made before the reload goes on with its session.
        after, _ = stomp_tls(handle, certs)
        after.send("/queue/reload", "sent after reload")
        assert got.wait_for(1)[0].body == "sent after reload"
        # A key that does not fit: the reload is refused and the working certificate stays.
        shutil.copy(certs["client-key"], live / "server.key")
        assert handle.inspect(handle.gateway.reload_tls) is False
        assert _serial(handle.stomp_tls_port, certs) == _file_serial(certs["server2"])
        disconnect(before)
        disconnect(after)
    finally:
        handle.stop()


def test_plain_listeners_switched_off_leave_only_tls(tmp_path, certs):
    config = make_tls_config(tmp_path, certs)
    for name in ("stomp", "mqtt", "ws", "admin"):
        getattr(config, name).port = 0

    def start() -> Gateway:
        gateway = Gateway(config, reactor())
        gateway.start(ephemeral=True)
        return gateway

    gateway = call(start)
    try:
        assert sorted(gateway.ports) == ["admin_tls", "mqtt_tls", "stomp_tls", "ws_tls"]
        port = gateway.port("stomp_tls")
        conn = stomp.Connection12([("127.0.0.1", port)])
        conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=certs["ca"])
        conn.connect(wait=True)
        disconnect(conn)
    finally:
        call(gateway.stop)


@pytest.mark.parametrize("key, error", [("client-key", "does not fit"), ("missing", "cannot read")])
def test_unusable_certificate_stops_the_start_with_its_reason(tmp_path, certs, key, error):
    config = make_tls_config(tmp_path, certs)
    config.tls.key = certs.get(key, str(tmp_path / "missing.key"))
    with pytest.raises(TlsError, match=error):
        call(Gateway(config, reactor()).start, True)


def test_tls_configuration(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text(
        '[tls]\ncert = "server.pem"\nkey = "server.key"\nca = "/etc/ca.pem"\nclient_certs = "required"\n'
        '[stomp]\ntls_port = 62612\n[mqtt]\ntls_client_certs = "optional"\n[admin]\ntls_port = 0\n'
    )
    config = load(str(path), {"ws_tls_port": 7443})
    assert config.tls.cert == str(tmp_path / "server.pem") and config.tls.ca == "/etc/ca.pem"
    assert [config.tls_port(n) for n in ("stomp", "mqtt", "ws", "admin")] == [62612, 8883, 7443, 0]
    assert config.tls_client_certs("stomp") == "required" and config.tls_client_certs("mqtt") == "optional"
    # Without [tls] no TLS listener; the plain ones as ever.
    plain = load()
    assert [plain.tls_port(n) for n in ("stomp", "mqtt", "ws", "admin")] == [0, 0, 0, 0]


@pytest.mark.parametrize("text, error", [
    ('[stomp]\ntls_port = 61612\n', "tls_port needs a certificate"),
    ('[tls]\ncert = "a.pem"\n', "cert and key go together"),
    ('[tls]\ncert = "a.pem"\nkey = "a.key"\nclient_certs = "required"\n', "set \\[tls\\] ca"),
    ('[tls]\ncert = "a.pem"\nkey = "a.key"\nclient_certs = "maybe"\n', "client_certs must be"),
    ('[tls]\ncert = "a.pem"\nkey = "a.key"\nmin_version = "1.1"\n', "min_version"),
    ('[tls]\ncert = "a.pem"\nkey = "a.key"\n[mqtt]\ntls_port = 70000\n', "0-65535"),
    ('[tls]\ncert = "a.pem"\nkey = "a.key"\n[websocket]\ntls_client_certs = "yes"\n', "tls_client_certs must be"),
])
def test_bad_tls_configuration_names_the_problem(tmp_path, text, error):
    path = tmp_path / "gw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load(str(path))
