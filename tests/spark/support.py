"""Helpers for the Spark connector's tests: a broker process, HTTP checks, real producers."""
from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests import support

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


class BrokerProcess:
    """A broker in its own process, on free ports, with ``[streams.NAME]`` sections from a dict.

    ``restart()`` keeps the data directory, so offsets and records survive as
    they would for a real deployment.
    """

    def __init__(self, workdir: Path, streams: dict[str, dict[str, Any]], extra: str = "") -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        lines = []
        for name, settings in streams.items():
            lines.append(f"[streams.{name}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in settings.items())
            lines.append("")
        self.config = workdir / "gateway.toml"
        self.config.write_text("\n".join(lines) + extra)
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen | None = None
        self.log: list[str] = []
        self.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def start(self) -> None:
        self.stomp_port, self.mqtt_port, self.admin_port = free_port(), free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "run", "--config", str(self.config),
             "--data-dir", str(self.workdir / "data"), "--stomp-port", str(self.stomp_port),
             "--mqtt-port", str(self.mqtt_port), "--ws-port", "0", "--admin-port", str(self.admin_port)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        ready = threading.Event()
        proc = self.proc

        def drain() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.log.append(line.rstrip())
                if "ADMIN listening on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True, name="broker-log").start()
        if not ready.wait(30) or proc.poll() is not None:
            self.stop()
            raise RuntimeError("broker did not start:\n" + "\n".join(self.log[-30:]))
        status, data = self.request("GET", "/api/v1/streams")
        if status not in (200, 401):  # 401: it answers, and wants a user (a broker with [auth])
            self.stop()  # never leave a broker process behind a failed start
            raise RuntimeError(f"broker answered GET /api/v1/streams with {status}: {data[:200]!r}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- HTTP, for checks from the test's side -------------------------------------

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json") -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get(self, path: str) -> Any:
        status, data = self.request("GET", path)
        assert status == 200, (path, status, data)
        return json.loads(data)

    def stream(self, name: str) -> dict[str, Any]:
        return self.get(f"/api/v1/streams/{name}")

    def bounds(self, name: str) -> dict[int, tuple[int, int]]:
        return {p["partition"]: (p["earliest"], p["latest"]) for p in self.stream(name)["partitions"]}

    def records(self, name: str, partition: int, start: int = 0) -> list[dict[str, Any]]:
        """Every record from ``start`` as JSON lines: an independent check of what Spark read or wrote."""
        out: list[dict[str, Any]] = []
        latest = self.bounds(name)[partition][1]
        while start < latest:
            status, data = self.request("GET", f"/api/v1/streams/{name}/partitions/{partition}/records?from={start}&format=jsonl")
            assert status == 200, data
            got = [json.loads(line) for line in data.splitlines() if line.strip()]
            if not got:
                break
            out.extend(got)
            start = got[-1]["offset"] + 1
        return out

    def publish_json(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """POST /api/v1/messages as JSON lines: quick bulk publishing for setting up a test."""
        body = "".join(json.dumps(r) + "\n" for r in rows).encode()
        status, data = self.request("POST", "/api/v1/messages", body, "application/x-ndjson")
        assert status == 200, data
        return json.loads(data)


# tests.support's, with defaults for Spark: a query takes seconds, and each look (a SQL query) costs.
wait_until = functools.partial(support.wait_until, timeout=60.0, interval=0.2)


def error_text(exc: BaseException) -> str:
    """What a user reads: Spark's message with the Python one inside (and any cause's)."""
    parts = [str(exc)]
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(parts) < 5:
        parts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


# -- real producers ---------------------------------------------------------------------


class _Receipts:
    def __init__(self) -> None:
        self.receipts: set[str] = set()
        self.errors: list[Any] = []
        self.messages: list[Any] = []
        self.cond = threading.Condition()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()


def stomp_publish(broker: BrokerProcess, destination: str, bodies: list[bytes], headers: list[dict[str, str]] | None = None) -> None:
    """SEND persistent messages, each with a receipt, and return once every receipt came back."""
    import stomp

    conn = stomp.Connection12([(broker.host, broker.stomp_port)])
    listener = _Receipts()
    conn.set_listener("r", listener)
    conn.connect(wait=True)
    try:
        wanted = []
        for i, body in enumerate(bodies):
            receipt = f"r-{i}"
            wanted.append(receipt)
            extra = dict(headers[i]) if headers else {}
            conn.send(destination, body, headers={"persistent": "true", "receipt": receipt, **extra})
        deadline = time.monotonic() + 30
        with listener.cond:
            while not set(wanted) <= listener.receipts:
                assert not listener.errors, listener.errors
                left = deadline - time.monotonic()
                assert left > 0, f"{len(set(wanted) - listener.receipts)} receipts missing"
                listener.cond.wait(left)
    finally:
        conn.disconnect()


def mqtt_publish(broker: BrokerProcess, topic: str, payloads: list[bytes], version: int = 4,
                 user_properties: list[list[tuple[str, str]]] | None = None) -> None:
    """QoS 1 publishes; returns once every PUBACK arrived (the broker has them on disk)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"spark-test-{time.monotonic_ns()}", protocol=protocol)
    client.max_inflight_messages_set(100)
    client.connect(broker.host, broker.mqtt_port, 30)
    client.loop_start()
    try:
        infos = []
        for i, payload in enumerate(payloads):
            props = None
            if user_properties is not None:
                props = Properties(PacketTypes.PUBLISH)
                props.UserProperty = user_properties[i]
            infos.append(client.publish(topic, payload, qos=1, properties=props))
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


class StompSubscriber:
    """A STOMP subscriber that counts what a topic delivers (a consumer's view of a Spark write)."""

    def __init__(self, broker: BrokerProcess, destination: str) -> None:
        import stomp

        self.conn = stomp.Connection12([(broker.host, broker.stomp_port)])
        self.listener = _Receipts()
        self.conn.set_listener("r", self.listener)
        self.conn.connect(wait=True)
        self.conn.subscribe(destination, id="sub-1", ack="auto")
        # A topic of its own (in no stream) for the marker barrier of ``bodies``.
        self.marker = f"/topic/spark-test.marker.{id(self)}"
        self.conn.subscribe(self.marker, id="marker", ack="auto", headers={"receipt": "subscribed"})
        with self.listener.cond:
            assert self.listener.cond.wait_for(lambda: "subscribed" in self.listener.receipts, 10), "not subscribed"

    def bodies(self, count: int, timeout: float = 30.0) -> list[bytes]:
        """Wait for ``count`` messages, then for a marker sent now: the broker routed the write's messages
        before it, so any extra copy has arrived too when the marker does (one connection, in order)."""
        listener = self.listener
        with listener.cond:
            listener.cond.wait_for(lambda: len(listener.messages) >= count, timeout)
        self.conn.send(self.marker, "marker")
        with listener.cond:
            marked = listener.cond.wait_for(
                lambda: any(m.headers.get("subscription") == "marker" for m in listener.messages), timeout,
            )
            assert marked, "the marker did not come back"
            return [m.body for m in listener.messages if m.headers.get("subscription") == "sub-1"]

    def close(self) -> None:
        self.conn.disconnect()
