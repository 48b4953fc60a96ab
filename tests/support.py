"""Test support: a reactor thread, brokers on ephemeral ports, real clients.

One Twisted reactor runs in a daemon thread for the whole test session; each
test gets its own broker (milliseconds to start) on kernel-chosen ports, so
tests are isolated and never collide on ports.  Clients are the real ones
(stomp.py) or raw sockets for what no client library will send.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import socket
import struct
import subprocess
import threading
import time
from typing import Any, Callable, Iterator

import pytest
import stomp
from twisted.internet import threads

from gateway.config import Config
from gateway.server import Gateway
from protocols.stomp.codec import Frame, StompDecoder, StompLimits, encode_frame

_reactor_started = threading.Lock()
_reactor: Any = None


def reactor() -> Any:
    global _reactor
    with _reactor_started:
        if _reactor is None:
            from twisted.internet import reactor as r

            threading.Thread(target=r.run, kwargs={"installSignalHandlers": False}, daemon=True, name="reactor").start()
            _reactor = r
    return _reactor


def call(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run f in the reactor thread and wait for its result (Deferreds are waited on)."""
    return threads.blockingCallFromThread(reactor(), f, *args, **kwargs)


def wait_until(
    condition: Callable[[], Any], timeout: float = 5.0, what: str | Callable[[], str] = "the condition",
    interval: float = 0.01,
) -> Any:
    """Poll ``condition`` every ``interval`` seconds until it returns something true; that value.

    The suite's one poll loop: a barrier on state another thread, process or
    connection changes (the broker's, read with ``BrokerHandle.inspect``; an
    admin API answer; a log line).  After ``timeout`` seconds it fails saying
    what was awaited (``what``, or what a callable ``what`` says then) and the
    condition's last answer.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {described} (last: {value!r})")
        time.sleep(interval)  # the poll interval: what is awaited has no event a test can block on


def wait_past(deadline_ms: float, what: str = "the deadline") -> None:
    """Wait until the wall clock -- the broker's, ``time.time`` -- reaches ``deadline_ms`` (epoch milliseconds).

    For behaviour due at a time the test itself set (a message's ``expires``):
    that moment awaited exactly, where a sleep would guess a margin.
    """
    wait_until(
        lambda: time.time() * 1000 >= deadline_ms, max(0.0, deadline_ms / 1000 - time.time()) + 5.0, what, interval=0.005,
    )


def wait_stable(read: Callable[[], Any], quiet: float = 0.5, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Wait until ``read()`` stops changing for ``quiet`` seconds; its value then.

    For a producer held by flow control, whose being held is the absence of more
    confirmations: no event says "nothing more will come", so a quiet period does.
    """
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(interval)  # an absence (no more change) has no barrier: sampled for ``quiet`` seconds
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"still changing after {timeout:g} s (last: {last!r})")


def wait_for_port(host: str, port: int, timeout: float = 15.0, process: Any = None, what: str = "") -> None:
    """Wait until ``host:port`` accepts a TCP connection (a broker process listening).

    With ``process`` (a ``subprocess.Popen``, or anything with ``proc`` and ``lines``, as
    ``BrokerProcess``) it fails at once if that process exits first, showing its output.
    """
    proc = getattr(process, "proc", process)

    def output() -> str:
        return "".join(getattr(process, "lines", []))

    def accepts() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what or 'the process'} exited ({proc.returncode}) before listening on {port}:\n{output()}")
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_until(accepts, timeout, lambda: f"{what or host} to accept connections on {port}:\n{output()}", interval=0.05)


class BrokerHandle:
    """A running in-process broker; ``inspect`` reads core state safely from the reactor thread."""

    def __init__(self, config: Config, store: Any = None) -> None:
        self.config = config
        self.gateway = call(self._start, config, store)
        self.host = "127.0.0.1"
        self.port = self.gateway.stomp_port
        self.mqtt_port = self.gateway.mqtt_port
        self.ws_port = self.gateway.ws_port
        self.admin_port = self.gateway.admin_port if "admin" in self.gateway.ports else 0
        # TLS listeners (0: none): on when the config has [tls] cert and key.
        ports = self.gateway.ports
        self.stomp_tls_port, self.mqtt_tls_port, self.ws_tls_port, self.admin_tls_port = (
            ports[name].getHost().port if name in ports else 0 for name in ("stomp_tls", "mqtt_tls", "ws_tls", "admin_tls")
        )
        self.broker = self.gateway.broker

    @staticmethod
    def _start(config: Config, store: Any) -> Gateway:
        gateway = Gateway(config, reactor(), store)
        gateway.start(ephemeral=True)
        return gateway

    def inspect(self, f: Callable[..., Any], *args: Any) -> Any:
        return call(f, *args)

    def queue_depth(self, name: str) -> int:
        def depth() -> int:
            q = self.broker.queues.get(name)
            return 0 if q is None else len(q)
        return call(depth)

    def queue_bodies(self, name: str) -> list[bytes]:
        def bodies() -> list[bytes]:
            q = self.broker.queues.get(name)
            return [] if q is None else [e.message.body for e in q.messages()]
        return call(bodies)

    def sessions(self) -> int:
        """Live client sessions (every protocol): a session leaves once the broker has seen its connection lost."""
        return call(lambda: len(self.gateway.sessions()))

    def unfinished(self) -> list[int]:
        """The bytes each live session holds of a frame or packet not complete yet: what the broker has read of it."""
        return call(lambda: [s.decoder.buffered for s in self.gateway.sessions() if getattr(s, "decoder", None) is not None])

    def stop(self) -> None:
        call(self.gateway.stop)


class HeldSyncs:
    """The store's fsync runner, held: a sync "still on the disk" is one the test has not let finish.

    The only stand-in here: no test can make a real disk slow on purpose.  A slow disk's
    syncs all go to the worker thread, none inline (persistence/rocks.py, "Inline syncs").
    """

    def __init__(self, handle: BrokerHandle) -> None:
        self.store = handle.gateway.store
        self.jobs: list[tuple[Callable[[], None], Callable[[BaseException | None], None]]] = []
        self.real = self.store._background
        self.inline_below = self.store.inline_sync_below
        call(setattr, self.store, "inline_sync_below", 0.0)
        call(setattr, self.store, "_background", lambda work, done: self.jobs.append((work, done)))

    def held(self) -> int:
        return call(len, self.jobs)

    def waiting(self) -> int:
        """Confirmations (a turn's RECEIPTs and PUBACKs of a session, one callback) the store releases once synced."""
        return call(lambda: sum(len(callbacks) for _, callbacks in self.store._unsynced) + len(self.store._callbacks))

    def finish_all(self) -> None:
        def run() -> None:
            while self.jobs:
                work, done = self.jobs.pop(0)
                work()
                done(None)
        call(run)

    def stop_holding(self) -> None:
        call(setattr, self.store, "_background", self.real)
        self.finish_all()
        call(setattr, self.store, "inline_sync_below", self.inline_below)


@contextlib.contextmanager
def small_filesystem(directory: Any, size: str) -> Iterator[str]:
    """A real filesystem of ``size`` ("48m") mounted at ``directory``: a tmpfs, for a disk that fills.

    Mounting needs root (CI runs as root); elsewhere the test is skipped, saying why.
    """
    path = str(directory)
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full disk here ({mounted.stderr.strip()}); run as root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def resize_filesystem(path: str, size: str) -> None:
    """Give a ``small_filesystem`` more (or less) room, as an operator growing a volume."""
    subprocess.run(["mount", "-o", f"remount,size={size}", path], check=True, capture_output=True)


def make_config(tmp_path: Any, **policy: Any) -> Config:
    config = Config(data_dir=str(tmp_path / "data"), shutdown_timeout=1.0)
    # The default floor (1 GiB) would hold every persistent producer on a CI disk with less
    # free: the tests of the floor set their own on a small filesystem.
    config.persistence.disk_free_limit = 16 * 1024 * 1024
    for key, value in policy.items():
        setattr(config.policy, key, value)
    return config


class Waits:
    """What both clients' collectors share: lists filled by callbacks, and waits on them that fail loudly."""

    messages: list[Any]
    _cond: threading.Condition

    def wait_for(self, count: int, timeout: float = 5.0, what: str = "messages") -> list[Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(getattr(self, what)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"expected {count} {what}, got {len(getattr(self, what))}")
                self._cond.wait(left)
            return list(getattr(self, what))

    def wait_more(self, seen: int, timeout: float = 0.1) -> list[Any]:
        """What came after the first ``seen`` messages, once something has (``[]`` after ``timeout``): a worker's loop."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.messages) > seen, timeout)
            return self.messages[seen:]

    def settle(self, quiet: float = 0.3) -> list[Any]:
        """Wait until nothing more arrives for ``quiet`` seconds; for asserting that something did NOT arrive."""
        last = -1
        while True:
            with self._cond:
                n = len(self.messages)
            if n == last:
                return list(self.messages)
            last = n
            time.sleep(quiet)  # proves nothing more arrives: an absence has no barrier


class Collector(Waits, stomp.ConnectionListener):
    """Gathers what a stomp.py connection receives, with waits that fail loudly."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.errors: list[Any] = []
        self.receipts: list[str] = []
        self.disconnected = threading.Event()
        self._cond = threading.Condition()

    def on_message(self, frame: Any) -> None:
        with self._cond:
            self.messages.append(frame)
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self._cond:
            self.errors.append(frame)
            self._cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self.receipts.append(frame.headers["receipt-id"])
            self._cond.notify_all()

    def on_disconnected(self) -> None:
        self.disconnected.set()

    def wait_receipt(self, receipt: str, timeout: float = 5.0) -> None:
        """Wait for the RECEIPT of ``receipt``: the broker has handled the frame that asked for it (and all before)."""
        with self._cond:
            if not self._cond.wait_for(lambda: receipt in self.receipts, timeout):
                raise AssertionError(f"no RECEIPT {receipt} within {timeout:g} s (got {self.receipts})")

    def bodies(self) -> list[str]:
        with self._cond:
            return [m.body for m in self.messages]


def connect(handle: BrokerHandle, version: str = "1.2", client_id: str | None = None, **kwargs: Any) -> tuple[Any, Collector]:
    cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}[version]
    conn = cls([(handle.host, handle.port)], **kwargs)
    collector = Collector()
    conn.set_listener("collector", collector)
    headers = {"client-id": client_id} if client_id else {}
    conn.connect(wait=True, headers=headers)
    return conn, collector


_ids = itertools.count(1)


def disconnect(conn: Any) -> None:
    """A clean DISCONNECT that returns once the broker has closed the connection.

    Waiting matters: reconnecting with the same client-id straight after a
    DISCONNECT that the broker has not processed yet is refused as a duplicate.
    """
    try:
        if conn.is_connected():
            conn.disconnect(receipt=f"bye-{next(_ids)}")
    except Exception:
        pass


leave = disconnect


def sync(conn: Any, got: Collector, timeout: float = 5.0) -> None:
    """Wait until the broker has handled every frame this connection sent so far (a receipt barrier)."""
    tx = f"sync-{next(_ids)}"
    conn.begin(transaction=tx)
    conn.abort(tx, headers={"receipt": tx})
    got.wait_receipt(tx, timeout)


def drop(conn: Any, got: Collector) -> None:
    """Lose the TCP connection without a DISCONNECT frame (a crashed client)."""
    sock = conn.transport.socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.shutdown(socket.SHUT_RDWR)
    assert got.disconnected.wait(5), "stomp.py did not notice the dropped socket"


def bodies(messages: list[Any]) -> list[str]:
    return [m.body for m in messages]


class RawClient:
    """A plain socket and our own decoder for the broker's replies: what both raw clients share."""

    sock: socket.socket
    decoder: Any
    received: list[Any]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while not self.received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("nothing from the broker in time")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.received.extend(self.decoder.feed(data))
        return self.received.pop(0)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not data:
                return True
            self.received.extend(self.decoder.feed(data))
        return False

    def close(self) -> None:
        self.sock.close()


class RawStomp(RawClient):
    """A plain socket speaking STOMP bytes, for framing and bad-input tests."""

    def __init__(self, handle: BrokerHandle, version: str = "1.2") -> None:
        self.sock = socket.create_connection((handle.host, handle.port), timeout=5)
        self.decoder = StompDecoder(StompLimits(max_frame_size=64 * 1024 * 1024), version=version)
        self.received: list[Frame] = []
        self.frames = self.received  # the name STOMP tests use
        self.version = version

    def frame(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send(encode_frame(command, (headers or {}).items(), body, version=self.version))

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        self.frame("CONNECT", {"accept-version": version, "host": "localhost", **headers})
        frame = self.read()
        assert frame.command == "CONNECTED", frame
        return frame


    def expect_error_and_close(self, timeout: float = 5.0) -> Frame:
        """The broker's answer to bad input: an ERROR frame, then a closed socket."""
        frame = self.read(timeout)
        assert frame.command == "ERROR", frame
        assert frame.headers.get("message"), frame
        assert self.closed_by_peer(timeout), "the broker kept the connection open after ERROR"
        return frame



# -- MQTT (paho-mqtt 2.x, callback API version 2) ---------------------------------


class MqttCollector(Waits):
    """What a paho client receives, with waits that fail loudly."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.connacks: list[tuple[Any, Any, Any]] = []  # (flags, reason_code, properties)
        self.subacks: list[list[Any]] = []
        self.unsubacks: list[list[Any]] = []
        self.disconnects: list[Any] = []  # reason codes
        self._cond = threading.Condition()

    def _add(self, name: str, item: Any) -> None:
        with self._cond:
            getattr(self, name).append(item)
            self._cond.notify_all()

    def on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self._add("messages", message)

    def on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self._add("connacks", (flags, reason_code, properties))

    def on_subscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        self._add("subacks", list(reason_codes))

    def on_unsubscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        self._add("unsubacks", list(reason_codes))

    def on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self._add("disconnects", reason_code)



    def payloads(self) -> list[bytes]:
        with self._cond:
            return [m.payload for m in self.messages]


def mqtt_connect(
    handle: BrokerHandle, client_id: str = "", version: int = 4, clean: bool = True,
    properties: Any = None, will: tuple | None = None, keepalive: int = 60, wait: bool = True, **kwargs: Any,
) -> tuple[Any, MqttCollector]:
    """A started paho client (network loop in its thread). version: 3 (3.1), 4 (3.1.1) or 5.

    ``will`` is (topic, payload, qos, retain[, properties]).  For version 5, ``clean`` is
    clean_start; set the session expiry through ``properties``.

    The client never reconnects by itself (``reconnect_on_failure=False`` unless told): a
    connection the broker closes stays closed, as a test expects, and ``mqtt_close`` returns
    at once instead of waiting out paho's reconnect delay (up to a second).
    """
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    kwargs.setdefault("reconnect_on_failure", False)

    protocol = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[version]
    if version == 5:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **kwargs)
    else:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, clean_session=clean, **kwargs)
    collector = MqttCollector()
    for name in ("on_message", "on_connect", "on_subscribe", "on_unsubscribe", "on_disconnect"):
        setattr(client, name, getattr(collector, name))
    if will is not None:
        topic, payload, qos, retain, *rest = will
        client.will_set(topic, payload, qos, retain, properties=rest[0] if rest else None)
    if version == 5:
        client.connect(handle.host, handle.mqtt_port, keepalive, clean_start=clean, properties=properties)
    else:
        client.connect(handle.host, handle.mqtt_port, keepalive)
    client.loop_start()
    if wait:
        collector.wait_for(1, what="connacks")
    return client, collector


def mqtt_close(client: Any) -> None:
    """A clean DISCONNECT, then stop the network thread."""
    try:
        client.disconnect()
    finally:
        client.loop_stop()


def mqtt_subscribe(client: Any, got: MqttCollector, *args: Any, timeout: float = 5.0, **kwargs: Any) -> list[int]:
    """SUBSCRIBE and wait for the SUBACK (a barrier: the subscription is in place); its reason codes as ints.

    Arguments as paho's ``subscribe`` ("t/#", 1, options=..., properties=...),
    or several (filter, qos) pairs: ``mqtt_subscribe(c, got, ("a/#", 1), ("b", 0))``.
    """
    if args and all(isinstance(a, tuple) for a in args):
        args = (list(args),)
    n = len(got.subacks)
    result, _ = client.subscribe(*args, **kwargs)
    assert result == 0, f"paho did not send the SUBSCRIBE (rc {result})"
    return [getattr(c, "value", c) for c in got.wait_for(n + 1, timeout, what="subacks")[n]]


def mqtt_unsubscribe(client: Any, got: MqttCollector, *topics: str, timeout: float = 5.0) -> None:
    """UNSUBSCRIBE and wait for the UNSUBACK (a barrier: the subscriptions are gone)."""
    n = len(got.unsubacks)
    result, _ = client.unsubscribe(list(topics))
    assert result == 0, f"paho did not send the UNSUBSCRIBE (rc {result})"
    got.wait_for(n + 1, timeout, what="unsubacks")


def mqtt_publish(
    client: Any, topic: str, payload: Any, qos: int = 1, retain: bool = False, properties: Any = None,
    timeout: float = 5.0,
) -> Any:
    """PUBLISH and wait until the broker has it: its PUBACK (QoS 1), PUBCOMP (QoS 2), or for QoS 0
    until paho has written it.  QoS 1 unless told: the acknowledgement is the barrier.  Returns paho's info."""
    info = client.publish(topic, payload, qos, retain, properties)
    info.wait_for_publish(timeout)
    assert info.is_published(), f"no {('write', 'PUBACK', 'PUBCOMP')[qos]} for {topic!r} within {timeout:g} s"
    return info


class RawMqtt(RawClient):
    """A plain socket speaking MQTT bytes, for bad-input tests (our codec reads the broker's replies)."""

    def __init__(self, handle: BrokerHandle, level: int = 4) -> None:
        from protocols.mqtt.codec import MqttDecoder

        self.sock = socket.create_connection((handle.host, handle.mqtt_port), timeout=5)
        self.decoder = MqttDecoder(level=level, server=False)
        self.received: list[Any] = []
        self.packets = self.received  # the name MQTT tests use
        self.level = level

    def packet(self, packet: Any) -> None:
        from protocols.mqtt.codec import encode

        self.send(encode(packet, self.level))

    def connect(self, client_id: str = "raw", clean: bool = True, keep_alive: int = 60, properties: dict | None = None) -> Any:
        from protocols.mqtt.codec import Connect

        name = "MQIsdp" if self.level == 3 else "MQTT"
        self.packet(Connect(name, self.level, clean, keep_alive, client_id, properties=properties or {}))
        return self.read()




# -- TLS: a CA, a server certificate and client certificates, made with the openssl command ----


def make_certificates(directory: Any) -> dict[str, str]:
    """PEM files in ``directory`` made by ``openssl``: a CA, a server certificate for
    127.0.0.1 and localhost, a client certificate with CN dev1 from that CA, one from
    another CA, a second server certificate (for reload) and one from an intermediate
    CA with its chain ("chained").  Returns name -> path, keys as "<name>-key"."""
    import subprocess
    from pathlib import Path

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    def authority(name: str) -> None:
        openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "3", "-subj", f"/CN=Gateway test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )

    def issue(name: str, cn: str, ca: str, usage: str, san: str = "") -> None:
        openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
        )
        if usage == "CA":  # an intermediate authority
            extensions = ["basicConstraints=critical,CA:TRUE,pathlen:0", "keyUsage=critical,keyCertSign,cRLSign"]
        else:
            extensions = [
                "basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature", f"extendedKeyUsage={usage}",
            ]
        extensions += ["subjectKeyIdentifier=hash", "authorityKeyIdentifier=keyid"] + ([f"subjectAltName={san}"] if san else [])
        (d / f"{name}.ext").write_text("\n".join(extensions) + "\n")
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        )

    authority("ca")
    authority("other-ca")
    issue("server", "localhost", "ca", "serverAuth", "DNS:localhost,IP:127.0.0.1")
    issue("server2", "localhost", "ca", "serverAuth", "DNS:localhost,IP:127.0.0.1")
    issue("client", "dev1", "ca", "clientAuth")
    issue("stranger", "intruder", "other-ca", "clientAuth")
    # A server certificate from an intermediate, the PEM file holding the chain (leaf first).
    issue("intermediate", "Gateway test intermediate", "ca", "CA")
    issue("leaf", "localhost", "intermediate", "serverAuth", "DNS:localhost,IP:127.0.0.1")
    (d / "chained.pem").write_bytes((d / "leaf.pem").read_bytes() + (d / "intermediate.pem").read_bytes())
    (d / "chained.key").write_bytes((d / "leaf.key").read_bytes())
    names = ("ca", "other-ca", "server", "server2", "client", "stranger", "chained")
    paths = {name: str(d / f"{name}.pem") for name in names}
    paths.update({f"{name}-key": str(d / f"{name}.key") for name in names})
    return paths


def make_tls_config(tmp_path: Any, certificates: dict[str, str], client_certs: str = "optional", **policy: Any) -> Config:
    """``make_config`` with [tls] from ``make_certificates``: every listener also gets a TLS port."""
    config = make_config(tmp_path, **policy)
    config.tls.cert, config.tls.key = certificates["server"], certificates["server-key"]
    config.tls.ca, config.tls.client_certs = certificates["ca"], client_certs
    return config
