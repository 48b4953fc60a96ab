"""Producers flooding a real broker process with no consumer: what bounds its memory, measured by RSS.

The broker runs as ``gateway run`` with ``queue_memory_limit`` = 4 MiB and
``store_limit`` = 32 MiB; raw-socket producers send as fast as their sockets
take it, while a thread samples the process's RSS (``/proc/<pid>/status``).
What bounds memory, by kind of message:

- non-persistent to a queue: the queue keeps ``queue_memory_limit`` in memory
  and spills the rest to ``data/spill``; the producer is never held (and the
  spill has no size limit of its own: disk, not memory, takes the backlog);
- persistent to a queue (STOMP ``persistent:true``, MQTT QoS 1): the same
  window in memory, the rest only in the store, and once the store holds
  ``store_limit`` the producer is held back (its socket is not read; no
  RECEIPT / PUBACK) until consumers make room;
- anything to a topic with no subscriber: dropped, except the recent-message
  windows for retroactive consumers, which share one 8 MiB budget
  (``retroactive_memory``) however many topics there are; nothing holds the
  producer back (a full store holds only producers whose messages it stores).

So RSS may grow by at most one memory window per flooded queue, one more for
what a draining consumer's socket holds, and a fixed ``OVERHEAD`` (itemised
below: mostly RocksDB's caches and write buffers of the store and the spill).
After the flood, consumers drain every queue and get every message, in order.

Two more tests pin down what was fixed after they found it: a non-persistent
flood spread over many queues (the per-queue limit did not bound the sum; the
broker-wide ``memory_limit`` does), and a full store holding producers whose
messages are never stored.
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from protocols.mqtt import codec as mq
from protocols.stomp.codec import StompDecoder, encode_frame
from tests.support import wait_for_port, wait_stable, wait_until
from tests.system.test_cli import BrokerProcess, free_port

MiB = 1024 * 1024
LIMIT = 4 * MiB             # queue_memory_limit
MEMORY = 4 * LIMIT          # memory_limit: all queues' in-memory windows together
STORE_LIMIT = 32 * MiB      # store_limit (store_full_policy = "block")
BODY = 4096
FLOOD = 12 * 1024           # messages per flooded destination: 48 MiB of bodies, 12x the memory limit
# What the process may add beyond the in-memory windows, whatever the flood's size:
ROCKSDB_CACHES = 2 * 32 * MiB     # RocksDB's default block cache (32 MiB per column family), filled by
                                  # paging reads: the store's and the spill's "default" families
ROCKSDB_MEMTABLES = 4 * 16 * MiB  # 16 MiB write buffers: one filling and one being flushed, per database
RETROACTIVE = 8 * MiB             # recent-message windows of all topics together (retroactive_memory)
SLACK = 16 * MiB                  # socket buffers, decoders, what the allocator keeps after a burst
OVERHEAD = ROCKSDB_CACHES + ROCKSDB_MEMTABLES + RETROACTIVE + SLACK
DEADLINE = 60.0


# -- the broker process ---------------------------------------------------------------


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    return found


class Broker:
    """``gateway run`` with the limits above, on free ports; ``start_sampling`` samples its RSS in a thread."""

    def __init__(self, tmp_path: Path) -> None:
        self.stomp_port = free_port()
        self.mqtt_port = free_port()
        config = tmp_path / "gw.toml"
        config.write_text(
            f"[policy]\nqueue_memory_limit = {LIMIT}\nmemory_limit = {MEMORY}\nstore_limit = {STORE_LIMIT}\nstore_full_policy = \"block\"\n"
            "[mqtt]\nqueue_topics = [\"jobs/#\"]\n"
        )
        self.process = BrokerProcess(
            "--config", str(config), "--data-dir", str(tmp_path / "data"), "--stomp-port", str(self.stomp_port),
            "--mqtt-port", str(self.mqtt_port), "--ws-port", "0", "--admin-port", "0", "--log-level", "warn", cwd=tmp_path,
        )
        self.pid = self.process.proc.pid
        for port in (self.stomp_port, self.mqtt_port):
            wait_for_port("127.0.0.1", port, 15, self.process, "the broker")
        self.peak = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def idle(self) -> int:
        """RSS once a client of each protocol has come and gone (lazy imports, first buffers)."""
        stomp, _ = stomp_client(self)
        stomp.close()
        mqtt, _ = mqtt_client(self, "warm-up")
        mqtt.close()
        time.sleep(0.3)  # a quiet moment before sampling RSS: the broker's freeing has no event to wait for
        return status(self.pid)["VmRSS"]

    def start_sampling(self) -> None:
        def run() -> None:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, status(self.pid)["VmRSS"])

        self._sampler = threading.Thread(target=run, daemon=True)
        self._sampler.start()

    def peak_rss(self) -> int:
        """The highest RSS seen: the sampler's, and the kernel's own high-water mark."""
        current = status(self.pid)
        return max(self.peak, current["VmRSS"], current["VmHWM"])

    def stop(self) -> int:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(5)
        return self.process.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    """A fresh broker process per test: RSS figures of one flood never leak into the next."""
    handle = Broker(tmp_path)
    try:
        yield handle
    finally:
        assert handle.stop() == 0, "".join(handle.process.lines[-20:])


# -- raw clients ------------------------------------------------------------------------


def body(i: int) -> bytes:
    return b"%08d" % i + b"x" * (BODY - 8)


def stomp_client(broker: Broker) -> tuple[socket.socket, StompDecoder]:
    sock = socket.create_connection(("127.0.0.1", broker.stomp_port), timeout=DEADLINE)
    sock.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
    decoder = StompDecoder(version="1.2")
    frames: list[Any] = []
    while not frames:
        frames = decoder.feed(sock.recv(65536))
    assert frames[0].command == "CONNECTED", frames[0]
    return sock, decoder


def mqtt_client(broker: Broker, client_id: str) -> tuple[socket.socket, mq.MqttDecoder]:
    sock = socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=DEADLINE)
    sock.sendall(mq.encode(mq.Connect("MQTT", 4, True, 0, client_id), 4))
    decoder = mq.MqttDecoder(level=4, server=False)
    packets: list[Any] = []
    while not packets:
        packets = decoder.feed(sock.recv(65536))
    assert isinstance(packets[0], mq.Connack) and packets[0].reason_code == 0, packets[0]
    return sock, decoder


class Flood:
    """One producer on its own socket: a thread sends everything as fast as the socket takes it,
    another counts the broker's acknowledgements (STOMP RECEIPTs, MQTT PUBACKs)."""

    def __init__(self, name: str, sock: socket.socket, decoder: Any, chunks: list[bytes], acks: type | str) -> None:
        self.name = name
        self.sock = sock
        self.decoder = decoder
        self.acked = 0
        self.sent_all = threading.Event()
        self.errors: list[Any] = []
        self._acks = acks
        self._sender = threading.Thread(target=self._send, args=(chunks,), daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._sender.start()

    def _send(self, chunks: list[bytes]) -> None:
        try:
            for chunk in chunks:
                self.sock.sendall(chunk)
        except OSError:
            return  # closed by the test while the broker was holding it back
        self.sent_all.set()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            for item in self.decoder.feed(data):
                if self._acks == "RECEIPT" and item.command == "RECEIPT":
                    self.acked += 1
                elif isinstance(self._acks, type) and isinstance(item, self._acks):
                    self.acked += 1
                elif getattr(item, "command", None) == "ERROR":
                    self.errors.append(item)

    def close(self) -> None:
        self.sock.close()


def stomp_flood(broker: Broker, destination: str, count: int, persistent: bool, receipt_every: int) -> Flood:
    """SENDs numbered 0..count-1; every ``receipt_every``-th (and the last) asks for a RECEIPT."""
    sock, decoder = stomp_client(broker)
    frames = []
    for i in range(count):
        headers = [("destination", destination), ("persistent", "true" if persistent else "false"),
                   ("content-length", str(BODY))]
        if (i + 1) % receipt_every == 0 or i == count - 1:
            headers.append(("receipt", str(i)))
        frames.append(encode_frame("SEND", headers, body(i)))
    chunks = [b"".join(frames[i:i + 64]) for i in range(0, count, 64)]
    return Flood(f"STOMP {destination} persistent={persistent}", sock, decoder, chunks, "RECEIPT")


def mqtt_flood(broker: Broker, topic: str, count: int, qos: int, distinct: bool = False) -> Flood:
    """PUBLISHes numbered 0..count-1 (to ``topic/<i>`` when ``distinct``); QoS 0 ends with a PINGREQ."""
    sock, decoder = mqtt_client(broker, f"flood-{topic}-{qos}")
    packets = [
        mq.encode_publish(f"{topic}/{i}" if distinct else topic, body(i), qos, False, False,
                          (i % 65535) + 1 if qos else None, None, 4)
        for i in range(count)
    ]
    if not qos:
        packets.append(mq.encode(mq.Pingreq(), 4))
    chunks = [b"".join(packets[i:i + 64]) for i in range(0, len(packets), 64)]
    return Flood(f"MQTT {topic} QoS {qos}", sock, decoder, chunks, mq.Puback if qos else mq.Pingresp)


def drain(broker: Broker, destination: str, count: int) -> list[int]:
    """Consume ``count`` messages from a queue over STOMP (auto ack); returns their numbers in arrival order."""
    sock, decoder = stomp_client(broker)
    sock.sendall(encode_frame("SUBSCRIBE", [("destination", destination), ("id", "d"), ("ack", "auto")]))
    got: list[int] = []
    try:
        while len(got) < count:
            data = sock.recv(1 << 20)
            assert data, f"broker closed the consumer of {destination} after {len(got)} messages"
            for frame in decoder.feed(data):
                assert frame.command == "MESSAGE", frame
                assert len(frame.body) == BODY, (destination, len(got), len(frame.body))
                got.append(int(frame.body[:8]))
    finally:
        sock.close()
    return got


def check_rss(idle: int, peak: int, queues: int, what: str) -> None:
    """RSS growth within one window per flooded queue, one for a draining consumer, and OVERHEAD."""
    windows = queues + 1
    bound = windows * LIMIT + OVERHEAD
    assert peak - idle <= bound, (
        f"{what}: RSS peaked at {peak / MiB:.0f} MiB, {(peak - idle) / MiB:.0f} MiB above idle "
        f"({idle / MiB:.0f} MiB); allowed {windows} x {LIMIT / MiB:.0f} MiB windows + {OVERHEAD / MiB:.0f} MiB overhead"
    )
    print(f"{what}: idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB (+{(peak - idle) / MiB:.0f}, bound +{bound / MiB:.0f})")


def check_held(acknowledged: int, who: str) -> None:
    """Held at the store limit: acknowledged bodies within 10% below it (the store counts some
    bytes per record too) and at most one 256 KiB read of frames beyond it."""
    stored = acknowledged * BODY
    assert 0.9 * STORE_LIMIT <= stored <= STORE_LIMIT + 256 * 1024, (
        f"{who} held after {acknowledged} messages ({stored / MiB:.1f} MiB) were acknowledged; "
        f"store_limit {STORE_LIMIT / MiB:.0f} MiB"
    )
    print(f"{who}: held after {acknowledged} messages, {stored / MiB:.1f} MiB of bodies")


def in_order(got: list[int], count: int) -> str:
    gaps = [(pos, value) for pos, value in enumerate(got) if value != pos][:5]
    return f"{len(got)} of {count} messages; first out of place (position, number): {gaps}"


# -- the tests --------------------------------------------------------------------------


def test_stomp_flood_without_consumers_stays_within_memory_bounds(broker: Broker) -> None:
    """Non-persistent and persistent STOMP floods to queues and a topic, nobody consuming.

    The non-persistent producers complete (spill, and drop for the topic); the
    persistent one is held once the store holds ``store_limit``; RSS stays
    within two memory windows (two queues) plus the overhead.  Then consumers
    drain both queues: every message, in order, and the held producer finishes.
    """
    idle = broker.idle()
    broker.start_sampling()
    spilled = stomp_flood(broker, "/queue/flood.np", FLOOD, persistent=False, receipt_every=FLOOD)
    dropped = stomp_flood(broker, "/topic/flood.nobody", FLOOD, persistent=False, receipt_every=FLOOD)
    held = stomp_flood(broker, "/queue/flood.p", 2 * FLOOD, persistent=True, receipt_every=64)
    try:
        wait_until(lambda: spilled.acked == 1 and dropped.acked == 1, DEADLINE, "the non-persistent floods are all handled")
        stalled_at = wait_stable(lambda: held.acked, quiet=0.7, timeout=DEADLINE)
        assert stalled_at < (2 * FLOOD) // 64, "the persistent producer was never held"
        check_held(stalled_at * 64, "persistent STOMP producer")
        flooded = broker.peak_rss()
        check_rss(idle, flooded, 2, "STOMP flood")

        got = drain(broker, "/queue/flood.np", FLOOD)
        assert got == list(range(FLOOD)), in_order(got, FLOOD)
        got = drain(broker, "/queue/flood.p", 2 * FLOOD)
        assert got == list(range(2 * FLOOD)), in_order(got, 2 * FLOOD)
        wait_until(lambda: held.acked == (2 * FLOOD) // 64, DEADLINE, "the held producer's last receipt")
        assert not (spilled.errors or dropped.errors or held.errors), spilled.errors + dropped.errors + held.errors
        check_rss(idle, broker.peak_rss(), 2, "STOMP flood and drain")
    finally:
        for flood in (spilled, dropped, held):
            flood.close()


def test_mqtt_flood_without_subscribers_stays_within_memory_bounds(broker: Broker) -> None:
    """MQTT QoS 0 and QoS 1 floods: to queues (``queue_topics = ["jobs/#"]``), to a topic nobody
    subscribes to, and to 12,288 distinct topics (a recent-message window each).

    QoS 0 to a queue spills; topic publishes are dropped but for the shared 8 MiB
    retroactive budget (before it, one window per topic grew without bound);
    QoS 1 to a queue is stored and the publisher is held at ``store_limit``
    (PUBACKs stop).  RSS stays within the windows of two queues plus the
    overhead; STOMP consumers then drain both queues, in order, and the held
    publisher gets its last PUBACK.
    """
    idle = broker.idle()
    broker.start_sampling()
    spilled = mqtt_flood(broker, "jobs/np", FLOOD, qos=0)
    dropped0 = mqtt_flood(broker, "sensors/nobody", FLOOD, qos=0)
    dropped1 = mqtt_flood(broker, "sensors/nobody", FLOOD, qos=1)
    many = mqtt_flood(broker, "fleet", FLOOD, qos=0, distinct=True)
    floods = [spilled, dropped0, dropped1, many]
    try:
        wait_until(lambda: spilled.acked == dropped0.acked == many.acked == 1, DEADLINE, "the QoS 0 floods are all handled")
        # Before the store fills, so this flood is about memory, not the store limit.
        wait_until(lambda: dropped1.acked == FLOOD, DEADLINE, "every QoS 1 publish to the topic nobody reads is acknowledged")
        held = mqtt_flood(broker, "jobs/p", 2 * FLOOD, qos=1)
        floods.append(held)
        stalled_at = wait_stable(lambda: held.acked, quiet=0.7, timeout=DEADLINE)
        assert stalled_at < 2 * FLOOD, "the QoS 1 publisher to a queue was never held"
        check_held(stalled_at, "QoS 1 publisher")
        check_rss(idle, broker.peak_rss(), 2, "MQTT flood")

        got = drain(broker, "/queue/jobs.np", FLOOD)
        assert got == list(range(FLOOD)), in_order(got, FLOOD)
        got = drain(broker, "/queue/jobs.p", 2 * FLOOD)
        assert got == list(range(2 * FLOOD)), in_order(got, 2 * FLOOD)
        wait_until(lambda: held.acked == 2 * FLOOD, DEADLINE, "the held publisher's last PUBACK")
        check_rss(idle, broker.peak_rss(), 2, "MQTT flood and drain")
    finally:
        for flood in floods:
            flood.close()


QUEUES = 64


def test_non_persistent_flood_over_many_queues_stays_within_memory_bounds(broker: Broker) -> None:
    """192 MiB of non-persistent messages spread over 64 queues nobody consumes (3 MiB each).

    Why: a flood must not grow the process by more than a bounded amount; per
    queue each stays under ``queue_memory_limit`` and so nothing is spilled, but
    the sum is held in memory (measured: +73 MiB RSS for 64 MiB over 64 queues,
    +145 MiB for 128 MiB), growing with the number of destinations.  Bound
    asserted: what one flooded queue may cost (its window, a consumer's, the overhead).
    """
    idle = broker.idle()
    broker.start_sampling()
    sock, decoder = stomp_client(broker)
    frames = [
        encode_frame("SEND", [("destination", f"/queue/many.{i % QUEUES}"), ("content-length", str(BODY))], body(i))
        for i in range(4 * FLOOD)
    ]
    frames.append(encode_frame("SEND", [("destination", "/queue/many.0"), ("receipt", "end")], b""))
    flood = Flood("STOMP 64 queues", sock, decoder, [b"".join(frames[i:i + 64]) for i in range(0, len(frames), 64)], "RECEIPT")
    try:
        wait_until(lambda: flood.acked == 1, DEADLINE, "the flood is handled")
        # The broker-wide memory_limit bounds the sum (MEMORY / LIMIT windows), not the queue count.
        check_rss(idle, broker.peak_rss(), MEMORY // LIMIT, f"non-persistent flood over {QUEUES} queues")
    finally:
        flood.close()


def test_full_store_does_not_hold_publishers_whose_messages_are_not_stored(broker: Broker) -> None:
    """A store filled by one queue must not stall QoS 1 / persistent publishers of topics that store nothing.

    Why: the store limit bounds what the store holds.  A persistent message to
    a topic with no durable subscriber is delivered to whoever listens and
    never written (ActiveMQ optimises such sends out of the store and does not
    block them).  Before the fix: with the store full, 15 of 100 such publishes were
    acknowledged (one socket read), then the publisher was held until the
    unrelated queue is drained.
    """
    filler = mqtt_flood(broker, "jobs/p", 2 * FLOOD, qos=1)
    publishers: list[Flood] = [filler]
    try:
        stalled_at = wait_stable(lambda: filler.acked, quiet=0.7, timeout=DEADLINE)
        check_held(stalled_at, "QoS 1 publisher filling the store")
        mqtt = mqtt_flood(broker, "sensors/nobody", 100, qos=1)
        stomp = stomp_flood(broker, "/topic/nobody", 100, persistent=True, receipt_every=1)
        publishers += [mqtt, stomp]
        acknowledged = (
            wait_stable(lambda: mqtt.acked, quiet=0.7, timeout=DEADLINE),
            wait_stable(lambda: stomp.acked, quiet=0.7, timeout=DEADLINE),
        )
        assert acknowledged == (100, 100), (
            f"with the store full, {acknowledged[0]} of 100 QoS 1 publishes and {acknowledged[1]} of 100 "
            "persistent SENDs to topics nobody stores were acknowledged"
        )
    finally:
        for flood in publishers:
            flood.close()
