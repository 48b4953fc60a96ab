"""Unfinished frames and connection limits against a real broker process, on every protocol.

A hundred STOMP connections each announcing a 4 MiB SEND and sending its body
slowly once grew the broker from 57 to 457 MiB.  Bytes held in unfinished
frames now count against ``partial_frame_memory`` (64 MiB): past it reading
pauses; a connection that completes nothing for ``partial_frame_timeout``
while holding part of a frame is dropped with its protocol's error.  And
connections are limited overall, per address and per second per address,
each refused with the protocol's answer.
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from websockets.sync.client import connect as ws_connect

from protocols.mqtt import codec as mq
from protocols.stomp.codec import StompDecoder, encode_frame
from tests.support import RawMqtt, RawStomp, wait_until
from tests.system.test_cli import BrokerProcess, free_port

pytestmark = pytest.mark.timeout(180)


class Broker:
    """A broker process on free ports; ``broker`` goes in its [broker] section, ``extra`` after it."""

    def __init__(self, tmp_path: Path, broker: str = "", extra: str = "") -> None:
        self.stomp, self.mqtt, self.ws = free_port(), free_port(), free_port()
        tmp_path.mkdir(parents=True, exist_ok=True)
        config = tmp_path / "gateway.toml"
        config.write_text(f"[broker]\n{broker}\n{extra}\n")
        self.process = BrokerProcess(
            "--config", str(config), "--data-dir", str(tmp_path / "data"), "--stomp-port", str(self.stomp),
            "--mqtt-port", str(self.mqtt), "--ws-port", str(self.ws), "--admin-port", "0", "--log-level", "info",
            cwd=tmp_path,
        )
        self.process.wait_for_line("WS listening on")
        self.host, self.port, self.mqtt_port, self.ws_port = "127.0.0.1", self.stomp, self.mqtt, self.ws

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.proc.pid}/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) / 1024

    def stop(self) -> None:
        assert self.process.stop() == 0, "".join(self.process.lines[-40:])


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Broker] = []

    def start(settings: str = "") -> Broker:
        broker = Broker(tmp_path / f"b{len(made)}", settings)
        made.append(broker)
        return broker

    yield start
    for broker in made:
        broker.stop()
        assert "Traceback" not in "".join(broker.process.lines), "".join(broker.process.lines[-60:])


class SlowSenders(threading.Thread):
    """Connections that send the start of a large frame, then its body a piece at a time, never finishing."""

    def __init__(self, connections: list[socket.socket]) -> None:
        super().__init__(daemon=True)
        self.connections = connections
        self.stopping = threading.Event()

    def run(self) -> None:
        chunk = b"x" * 16384
        while not self.stopping.is_set():
            for s in self.connections:
                try:
                    s.setblocking(False)
                    s.send(chunk)
                except OSError:
                    pass
            time.sleep(0.02)  # the behaviour under test: an attacker that drips, never finishing a frame

    def closed_by_broker(self) -> int:
        closed = 0
        for s in self.connections:
            s.setblocking(True)
            s.settimeout(2)
            try:
                data = s.recv(1 << 16)
                while data:
                    data = s.recv(1 << 16)
                closed += 1
            except (ConnectionResetError, BrokenPipeError):
                closed += 1
            except socket.timeout:
                pass
        return closed


def stomp_slowloris(broker: Broker, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection((broker.host, broker.port))
        s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
        assert s.recv(1024).startswith(b"CONNECTED")
        s.sendall(b"SEND\ndestination:/queue/slow\ncontent-length:4194304\n\n")
        out.append(s)
    return out


def round_trip(broker: Broker, queue: str, body: bytes) -> bytes:
    raw = RawStomp(broker)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": queue, "id": "1"})
    raw.frame("SEND", {"destination": queue}, body)
    got = raw.read(10).body
    raw.close()
    return got


def test_a_hundred_unfinished_4mib_frames_stay_within_the_budget_and_are_dropped(make):
    broker = make("partial_frame_timeout = 6.0")
    stored = RawStomp(broker)
    stored.connect()
    stored.frame("SEND", {"destination": "/queue/kept", "persistent": "true", "receipt": "r"}, b"stored before")
    assert stored.read().command == "RECEIPT"
    stored.close()
    before = broker.rss_mib()
    attackers = stomp_slowloris(broker, 100)
    senders = SlowSenders(attackers)
    senders.start()
    try:
        peak = before
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            # Other clients keep sending and receiving meanwhile.
            assert round_trip(broker, "/queue/meanwhile", b"still served") == b"still served"
            peak = max(peak, broker.rss_mib())
            time.sleep(0.2)  # sampling RSS while the attack goes on: memory has no event to wait for
        assert peak - before < 128, f"RSS grew {peak - before:.0f} MiB (from {before:.0f})"
        print(f"RSS {before:.0f} MiB before, {peak:.0f} MiB at most with 100 unfinished 4 MiB frames")
        lines = "".join(broker.process.lines)
        assert "unfinished frames" in lines and "reading paused" in lines
        # Past the timeout every attacker is told and closed: the broker logs each drop.
        wait_until(lambda: "".join(broker.process.lines).count("(partial_frame_timeout)") >= 100, 20,
                   "the 100 attackers dropped past partial_frame_timeout", interval=0.1)
    finally:
        senders.stopping.set()
        senders.join(5)
    assert senders.closed_by_broker() == 100
    assert "partial_frame_timeout" in "".join(broker.process.lines)
    # What was stored before is still there.
    kept = RawStomp(broker)
    kept.connect()
    kept.frame("SUBSCRIBE", {"destination": "/queue/kept", "id": "k"})
    assert kept.read().body == b"stored before"
    kept.close()


def test_stomp_client_holding_an_unfinished_frame_gets_an_error(make):
    broker = make("partial_frame_timeout = 2.0")
    raw = RawStomp(broker)
    raw.connect()
    raw.send(b"SEND\ndestination:/queue/x\ncontent-length:100\n\nonly part")
    error = raw.expect_error_and_close(timeout=10)
    assert error.headers["message"] == "Frame not completed" and "partial_frame_timeout" in error.body.decode()


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_client_holding_an_unfinished_packet_is_dropped(make, level):
    broker = make("partial_frame_timeout = 2.0")
    raw = RawMqtt(broker, level=level)
    assert raw.connect(f"slow{level}").reason_code == 0
    whole = mq.encode(mq.Publish("t/x", b"y" * 100_000, qos=0), level)
    raw.send(whole[:5000])
    if level == 5:
        bye = raw.read(10)
        assert isinstance(bye, mq.Disconnect) and bye.reason_code == 0x97
        assert "partial_frame_timeout" in bye.properties["reason_string"]
    assert raw.closed_by_peer(10)


def test_websocket_frames_reach_the_session_as_they_arrive_and_count_too(make):
    """A STOMP frame split over WebSocket frames of one message, never finished: dropped like on TCP."""
    broker = make("partial_frame_timeout = 2.0")
    with ws_connect(f"ws://127.0.0.1:{broker.ws_port}/", subprotocols=["v12.stomp"]) as ws:
        ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]).decode())
        decoder = StompDecoder(version="1.2")
        assert decoder.feed(ws.recv(timeout=5).encode())[0].command == "CONNECTED"
        # A fragmented message whose last fragment never comes: its frames still reach the session.
        ws.send(iter(["SEND\ndestination:/queue/ws\ncontent-length:50\n\nabc", "def"]))
        frames = decoder.feed(ws.recv(timeout=10).encode())
        assert frames[0].command == "ERROR" and frames[0].headers["message"] == "Frame not completed"


def test_connection_limits_answer_with_each_protocols_refusal(make):
    broker = make("max_connections = 3")
    held = [socket.create_connection((broker.host, broker.stomp)) for _ in range(3)]
    try:
        refused = RawStomp(broker)
        refused.frame("CONNECT", {"accept-version": "1.2", "host": "x"})
        error = refused.expect_error_and_close()
        assert error.headers["message"] == "Connection refused" and "max_connections" in error.body.decode()
        v311 = RawMqtt(broker, level=4)
        assert v311.connect("over4").reason_code == 3  # server unavailable
        v5 = RawMqtt(broker, level=5)
        ack = v5.connect("over5")
        assert ack.reason_code == 0x97 and "max_connections" in ack.properties["reason_string"]
    finally:
        for s in held:
            s.close()

    def admitted() -> bool:  # the barrier: the broker has seen the held connections go
        probe = RawStomp(broker)
        try:
            probe.frame("CONNECT", {"accept-version": "1.2", "host": "x"})
            return probe.read().command == "CONNECTED"
        except ConnectionError:
            return False
        finally:
            probe.close()

    wait_until(admitted, what="room again once the held connections closed", interval=0.05)
    assert round_trip(broker, "/queue/after", b"room again") == b"room again"
    assert "refused: the broker has 3 connections" in "".join(broker.process.lines)


def test_per_address_and_rate_limits(make):
    broker = make("max_connections_per_address = 2\nmax_connection_rate_per_address = 1000")
    a, b = RawStomp(broker), RawStomp(broker)
    a.connect()
    b.connect()
    third = RawMqtt(broker, level=5)
    ack = third.connect("third")
    assert ack.reason_code == 0x97 and "max_connections_per_address" in ack.properties["reason_string"]
    a.close()
    b.close()
    rated = make("max_connection_rate_per_address = 3")
    answers = []
    for i in range(6):
        raw = RawMqtt(rated, level=5)
        answers.append(raw.connect(f"r{i}").reason_code)
        raw.close()
    assert answers[:3] == [0, 0, 0] and 0x9F in answers[3:], answers
    time.sleep(1.1)  # a real clock window: the rate limit counts connections per second
    raw = RawMqtt(rated, level=5)
    assert raw.connect("later").reason_code == 0  # the next second has room again
    raw.close()
