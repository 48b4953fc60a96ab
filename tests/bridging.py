"""Test support for bridges: a real Mosquitto, and MQTT clients that keep a ledger of what was confirmed.

Mosquitto is Debian's (``apt install mosquitto``; .ci/run installs it), run
on a free loopback port with its own configuration and persistence file in the
test's directory, so it can be stopped and started again with its state.
"""
from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_until
from tests.system.test_cli import free_port


class Mosquitto:
    """A ``mosquitto`` process on loopback, anonymous, persistent in ``directory``."""

    def __init__(self, directory: Path, port: int | None = None, tls: dict[str, str] | None = None,
                 extra: str = "") -> None:
        """``tls``: make_certificates' paths; the listener then asks for TLS and a client certificate.
        ``extra``: more configuration, such as a ``connection`` (a bridge of Mosquitto's own)."""
        if shutil.which("mosquitto") is None:
            pytest.skip("Mosquitto is not installed (apt install mosquitto)")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.config = directory / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {directory}/\nautosave_interval 1\n"
            "max_queued_messages 0\nmax_inflight_messages 0\n"
            # As root Mosquitto would become the user "mosquitto", who cannot read the test's files.
            + ("user root\n" if os.geteuid() == 0 else "")
            + extra
        )
        if tls is not None:
            with open(self.config, "a") as f:
                f.write(f"cafile {tls['ca']}\ncertfile {tls['server']}\nkeyfile {tls['server-key']}\n"
                        "require_certificate true\nuse_identity_as_username true\n")
        self.log = directory / "mosquitto.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(["mosquitto", "-c", str(self.config)], stdout=log, stderr=log)
        wait_until(self._accepts, 10, f"Mosquitto listening on {self.port}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM: Mosquitto saves its persistence file and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Subscriber:
    """A paho client subscribed to a filter, collecting (topic, payload, properties) in arrival order.

    ``client_id`` with ``clean=False`` makes a persistent session at the broker, which
    keeps QoS 1 messages while it is away; paho reconnects it by itself.
    """

    def __init__(self, port: int, topic_filter: str, *, version: int = 4, client_id: str = "", clean: bool = True,
                 qos: int = 1) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.messages: list[tuple[str, bytes, dict[str, str]]] = []
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        if version == 5:
            self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        else:
            self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, clean_session=clean)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic_filter, qos)
        self.client.on_subscribe = lambda *args: self._subscribed.set()
        self.client.reconnect_delay_set(0.1, 1)
        if version == 5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)
            if not clean:
                props.SessionExpiryInterval = 3600
            self.client.connect("127.0.0.1", port, 30, clean_start=clean, properties=props)
        else:
            self.client.connect("127.0.0.1", port, 30)
        self.client.loop_start()
        assert self._subscribed.wait(10), f"no SUBACK for {topic_filter!r} on port {port}"

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        props = {k: v for k, v in getattr(message.properties, "UserProperty", None) or []}
        with self._cond:
            self.messages.append((message.topic, message.payload, props))
            self._cond.notify_all()

    def payloads(self) -> list[bytes]:
        with self._cond:
            return [m[1] for m in self.messages]

    def wait_for(self, count: int, timeout: float = 30) -> list[tuple[str, bytes, dict[str, str]]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.messages)} of {count} messages arrived within {timeout:g} s")
                self._cond.wait(left)
            return list(self.messages)

    def wait_for_payload(self, payload: bytes, timeout: float = 30) -> None:
        """A barrier: the marker sent last has arrived, so whatever came before it has too."""
        wait_until(lambda: payload in self.payloads(), timeout, f"{payload!r} arrived")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Publisher:
    """A paho client publishing QoS 1 and keeping the payloads the broker confirmed (PUBACK)."""

    def __init__(self, port: int, *, version: int = 4, client_id: str = "") -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        # One connection: a publisher whose broker is killed is done (paho's wait before a
        # reconnect would also hold loop_stop() for a second).
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                                  reconnect_on_failure=False)
        self.client.max_inflight_messages_set(100)
        self.client.max_queued_messages_set(0)
        self._sent: list[tuple[Any, bytes]] = []  # paho's MQTTMessageInfo (published once PUBACKed), payload
        # PUBACKs counted as paho reports them (on_publish), so that the window and the waits below
        # are a condition to wait on, not a scan of every message sent, polled.
        self._cond = threading.Condition()
        self._acked = 0
        self.client.on_publish = self._on_publish
        self.client.connect("127.0.0.1", port, 30)
        self.client.loop_start()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        with self._cond:  # called under paho's lock: only count and wake (publish() calls paho outside _cond)
            self._acked += 1
            self._cond.notify_all()

    @property
    def confirmed(self) -> list[bytes]:
        return [payload for info, payload in list(self._sent) if info.is_published()]

    @property
    def confirmed_count(self) -> int:
        """How many of the publishes the broker has confirmed: ``len(confirmed)`` without the scan."""
        with self._cond:
            return self._acked

    def unconfirmed(self) -> int:
        with self._cond:
            return len(self._sent) - self._acked

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(ready, timeout):
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what} ({len(self._sent) - self._acked} unconfirmed)")

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> Any:
        """Publish, waiting while 100 are unconfirmed (a window, as a device keeps)."""
        self._wait(lambda: len(self._sent) - self._acked < 100, 60, "room in the publisher's window")
        info = self.client.publish(topic, payload, qos)
        with self._cond:
            self._sent.append((info, payload))
        return info

    def publish_all(self, topic: str, payloads: list[bytes], timeout: float = 60) -> None:
        """Publish and wait until every one is confirmed."""
        for payload in payloads:
            self.publish(topic, payload)
        self._wait(lambda: len(self._sent) == self._acked, timeout, f"{len(payloads)} PUBACKs")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


_markers = itertools.count()


def exchange(subscribers: list[Subscriber], *sends: tuple[Publisher, str, list[bytes]]) -> None:
    """Each publisher sends its payloads, then a marker; every subscriber then has had time for all
    of them: a barrier, no sleep."""
    for publisher, topic, payloads in sends:
        publisher.publish_all(topic, payloads)
    markers = [(publisher, topic, f"end of {topic} {next(_markers)}".encode()) for publisher, topic, _ in sends]
    for publisher, topic, marker in markers:
        publisher.publish_all(topic, [marker])
    for subscriber in subscribers:
        for _, _, marker in markers:
            subscriber.wait_for_payload(marker)
