"""A backlog far deeper than memory, in a real broker process: RSS stays bounded, nothing is lost."""
from __future__ import annotations

import socket

from protocols.stomp.codec import StompDecoder, encode_frame
from tests.support import wait_for_port
from tests.system.test_cli import BrokerProcess, free_port

MESSAGES = 60_000
BODY = 1000
LIMIT = 4 * 1024 * 1024
# What the process may hold beyond its idle size: the in-memory window, encoders,
# socket buffers and RocksDB's memtables (16 MiB each) and block cache.
ALLOWED_GROWTH = 96 * 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def stomp_socket(port: int) -> tuple[socket.socket, StompDecoder]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
    decoder = StompDecoder(version="1.2")
    frames: list = []
    while not frames:
        frames = decoder.feed(sock.recv(65536))
    assert frames[0].command == "CONNECTED"
    decoder.version = "1.2"
    return sock, decoder


def wait_receipt(sock: socket.socket, decoder: StompDecoder, receipt: str) -> None:
    while True:
        for frame in decoder.feed(sock.recv(65536)):
            if frame.command == "RECEIPT" and frame.headers["receipt-id"] == receipt:
                return
            assert frame.command != "ERROR", frame


def test_backlog_beyond_the_memory_limit_stays_in_the_store(tmp_path):
    port = free_port()
    config = tmp_path / "gw.toml"
    config.write_text(f"[policy]\nqueue_memory_limit = {LIMIT}\n")
    broker = BrokerProcess(
        "--config", str(config), "--data-dir", str(tmp_path / "d"), "--stomp-port", str(port),
        "--mqtt-port", "0", "--ws-port", "0", "--admin-port", "0", "--log-level", "warn", cwd=tmp_path,
    )
    try:
        wait_for_port("127.0.0.1", port, 15, broker, "the broker")
        idle = rss(broker.proc.pid)

        producer, pdec = stomp_socket(port)
        batch = []
        for i in range(MESSAGES):
            body = b"%08d" % i + b"x" * (BODY - 8)
            headers = [("destination", "/queue/deep"), ("persistent", "true"), ("content-length", str(BODY))]
            if i == MESSAGES - 1:
                headers.append(("receipt", "last"))
            batch.append(encode_frame("SEND", headers, body))
            if len(batch) == 500:
                producer.sendall(b"".join(batch))
                batch.clear()
        producer.sendall(b"".join(batch))
        wait_receipt(producer, pdec, "last")
        loaded = rss(broker.proc.pid)
        assert loaded - idle < ALLOWED_GROWTH, f"RSS grew {(loaded - idle) >> 20} MiB for a {MESSAGES * BODY >> 20} MiB backlog"

        consumer, cdec = stomp_socket(port)
        consumer.sendall(encode_frame("SUBSCRIBE", [("destination", "/queue/deep"), ("id", "1"), ("ack", "auto")]))
        expected = 0
        peak = loaded
        while expected < MESSAGES:
            for frame in cdec.feed(consumer.recv(1 << 20)):
                assert frame.command == "MESSAGE", frame
                assert frame.body[:8] == b"%08d" % expected, (frame.body[:8], expected)
                expected += 1
            if expected % 10_000 == 0:
                peak = max(peak, rss(broker.proc.pid))
        peak = max(peak, rss(broker.proc.pid))
        assert peak - idle < ALLOWED_GROWTH, f"RSS peaked {(peak - idle) >> 20} MiB above idle while draining"
        print(f"idle {idle >> 20} MiB, after loading {loaded >> 20} MiB, peak {peak >> 20} MiB")
        producer.close()
        consumer.close()
    finally:
        assert broker.stop() == 0
