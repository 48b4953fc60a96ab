"""A full disk with real ``gateway run`` processes on a real small filesystem (a tmpfs).

What an operator's disk does, three ways: the broker fills it itself (no floor),
the floor holds producers before it is full, and another process fills it.
STOMP and MQTT producers wait for their RECEIPT/PUBACK; a stream records the
MQTT traffic.  Whatever path the broker takes, the contract is the same: it
keeps answering, confirms nothing it has not stored, recovers by itself when
space returns, and after a ``kill -9`` and a restart every confirmed message
is there, exactly once.  An I/O error that is not a lack of space stops the
broker non-zero (an ext4 on a loop device whose backing file runs out of room).

The figures the README gives come from these runs (printed with ``-s``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from protocols.stomp.codec import StompDecoder, StompLimits, encode_frame
from tests.support import resize_filesystem, small_filesystem, wait_stable, wait_until
from tests.system.test_cli import BrokerProcess, free_port

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

SIZE = 4000  # bytes of each body: hex, which RocksDB's compression cannot shrink much


def body(seq: int) -> bytes:
    return f"{seq:06d}".encode() + os.urandom(SIZE // 2).hex().encode()[: SIZE - 6]


class Broker:
    """A ``gateway run`` on its own ports with a config file, and the admin API's answers."""

    def __init__(self, root: Path, data: str, config: str, cwd: Path) -> None:
        self.stomp, self.mqtt, self.admin = free_port(), free_port(), free_port()
        path = root / f"gateway-{self.stomp}.toml"
        path.write_text(config)
        self.process = BrokerProcess(
            "--config", str(path), "--data-dir", data, "--stomp-port", str(self.stomp), "--mqtt-port", str(self.mqtt),
            "--ws-port", "0", "--admin-port", str(self.admin), "--log-level", "info", cwd=cwd,
        )
        self.process.wait_for_line(f"STOMP listening on 127.0.0.1:{self.stomp}")

    def http(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}", timeout=10) as answer:
                raw, status = answer.read(), answer.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def metric(self, name: str) -> float:
        for line in self.http("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")

    def ready(self) -> tuple[int, str]:
        status, answer = self.http("/api/v1/ready")
        return status, answer.get("reason", "")

    def log(self) -> str:
        return "".join(self.process.lines)

    def kill(self) -> None:
        self.process.proc.kill()
        self.process.proc.wait(10)


def config(floor: int | str, policy: str = "block") -> str:
    floor_text = f'"{floor}"' if isinstance(floor, str) else str(floor)
    return (
        f"[persistence]\ndisk_free_limit = {floor_text}\ndisk_check_interval = 0.5\n"
        f'[policy]\nstore_full_policy = "{policy}"\n'
        '[streams.sensors]\ndestinations = ["topic://sensors.>"]\n'
    )


class StompProducer(threading.Thread):
    """Persistent SENDs with a receipt each, ``window`` unanswered at most: the receipted seqs."""

    def __init__(self, port: int, destination: str, count: int, window: int = 50, first: int = 0,
                 host: str = "127.0.0.1") -> None:
        """``first``: the first seq (a second producer after a kill numbers on from the first's)."""
        super().__init__(daemon=True)
        self.port, self.destination, self.count, self.window, self.first = port, destination, count, window, first
        self.host = host
        self.receipted: list[int] = []
        self.errors: list[str] = []

    def run(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=120)
        decoder = StompDecoder(StompLimits(max_frame_size=1 << 20), version="1.2")
        sock.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "/")], b"", version="1.2"))
        frames: list[Any] = []
        sent = 0

        def next_frame() -> Any:
            while not frames:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                frames.extend(f for f in decoder.feed(data) if f.command)
            return frames.pop(0)

        try:
            assert next_frame().command == "CONNECTED"
            while len(self.receipted) < self.count:
                while sent < self.count and sent - len(self.receipted) < self.window:
                    seq = self.first + sent
                    headers = [("destination", self.destination), ("persistent", "true"), ("receipt", str(seq)), ("seq", str(seq))]
                    sock.sendall(encode_frame("SEND", headers, body(seq), version="1.2"))
                    sent += 1
                frame = next_frame()
                if frame.command == "RECEIPT":
                    self.receipted.append(int(frame.headers["receipt-id"]))
                elif frame.command == "ERROR":
                    self.errors.append(frame.headers.get("message", "") + ": " + frame.body.decode())
                    return
        except (OSError, ConnectionError) as exc:
            self.errors.append(repr(exc))
        finally:
            sock.close()


class MqttProducer:
    """QoS 1 publishes (MQTT 5) of numbered bodies; the seqs the broker PUBACKed with success."""

    def __init__(self, port: int, topic: str, count: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.acked: list[int] = []
        self.refused: list[int] = []
        self._seq_of: dict[int, int] = {}
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"producer-{port}", protocol=mqtt.MQTTv5)
        self.client.max_inflight_messages_set(50)
        self.client.on_publish = self._on_publish
        self.client.connect("127.0.0.1", port, 60)
        self.client.loop_start()
        self.topic, self.count = topic, count

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        with self._lock:
            seq = self._seq_of.get(mid)
            if seq is None:
                return
            (self.refused if getattr(reason_code, "is_failure", False) else self.acked).append(seq)

    def start(self) -> None:
        for seq in range(self.count):
            info = self.client.publish(self.topic, body(seq), qos=1)
            with self._lock:
                self._seq_of[info.mid] = seq

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def keep_session(port: int, client_id: str, topic_filter: str) -> None:
    """An MQTT 5 session that outlives its connection, so QoS 1 messages to it are stored."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.properties import Properties
    from paho.mqtt.packettypes import PacketTypes

    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    done = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    client.on_subscribe = lambda *args: done.set()
    client.connect("127.0.0.1", port, 60, clean_start=False, properties=properties)
    client.loop_start()
    client.subscribe(topic_filter, qos=1)
    assert done.wait(10)
    client.disconnect()
    client.loop_stop()


def session_messages(port: int, client_id: str, expected: int, timeout: float = 60) -> list[int]:
    """Reconnect to a kept session and read the seqs of what it held."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.properties import Properties
    from paho.mqtt.packettypes import PacketTypes

    seqs: list[int] = []
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    client.on_message = lambda c, u, message: seqs.append(int(message.payload[:6]))
    client.connect("127.0.0.1", port, 60, clean_start=False, properties=properties)
    client.loop_start()
    wait(lambda: len(seqs) >= expected, timeout, f"{expected} session messages")
    time.sleep(0.5)  # waiting for an absence: none more than expected (an extra copy would come now)
    client.disconnect()
    client.loop_stop()
    return seqs


def queue_messages(port: int, destination: str, expected: int, timeout: float = 60) -> list[int]:
    """Read a queue with auto acks; the seqs of its messages, in order."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    decoder = StompDecoder(StompLimits(max_frame_size=1 << 20), version="1.2")
    sock.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "/")], b"", version="1.2"))
    sock.sendall(encode_frame("SUBSCRIBE", [("id", "1"), ("destination", destination), ("ack", "auto")], b"", version="1.2"))
    seqs: list[int] = []
    deadline = time.monotonic() + timeout
    quiet_until = None
    while time.monotonic() < deadline:
        if len(seqs) >= expected:
            quiet_until = quiet_until or time.monotonic() + 0.5  # none more than expected
            if time.monotonic() >= quiet_until:
                break
        sock.settimeout(0.2)
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not data:
            break
        seqs.extend(int(f.headers["seq"]) for f in decoder.feed(data) if f.command == "MESSAGE")
    sock.close()
    return seqs


def stream_seqs(broker: Broker) -> list[int]:
    seqs: list[int] = []
    start = 0
    while True:
        status, text = broker.http(f"/api/v1/streams/sensors/partitions/0/records?from={start}&format=jsonl&max_records=5000")
        assert status == 200, text
        lines = [json.loads(line) for line in (text if isinstance(text, str) else json.dumps(text)).splitlines() if line]
        if not lines:
            return seqs
        seqs.extend(int(r["body"][:6]) for r in lines)
        start = lines[-1]["offset"] + 1


def wait(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait for ``condition``; the seconds it took."""
    started = time.monotonic()
    wait_until(condition, timeout, what, interval=0.1)
    return time.monotonic() - started


def restart_and_check(
    root: Path, data: str, stomp_seqs: list[int], mqtt_seqs: list[int], session: str | None, everything_confirmed: bool = True,
) -> None:
    """After kill -9: every confirmed message there exactly once, in its queue, session and stream.

    ``everything_confirmed``: every message sent was confirmed before the kill, so the
    queue holds exactly those; after a crash mid-flight it may also hold some that were
    written and never confirmed (their producer was not told either way).
    """
    broker = Broker(root, data, config(0), root)
    try:
        got = queue_messages(broker.stomp, "/queue/full", len(stomp_seqs))
        assert len(got) == len(set(got)), "a message twice"
        if everything_confirmed:
            assert sorted(got) == sorted(stomp_seqs), f"queue: {len(got)} read, {len(stomp_seqs)} confirmed"
        else:
            missing = set(stomp_seqs) - set(got)
            assert not missing, f"queue: {len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert got == sorted(got), "queue order"
        if session is not None:
            held = session_messages(broker.mqtt, session, len(mqtt_seqs))
            assert sorted(held) == sorted(mqtt_seqs), f"session: {len(held)} read, {len(mqtt_seqs)} confirmed"
        if mqtt_seqs:
            recorded = stream_seqs(broker)
            assert sorted(recorded) == sorted(mqtt_seqs), f"stream: {len(recorded)} records, {len(mqtt_seqs)} confirmed"
    finally:
        broker.process.stop()


def test_a_disk_the_broker_fills_itself_costs_no_confirmed_message(tmp_path):
    """No floor (disk_free_limit = 0): the store's writes fail for want of space.

    Issue 24 reproduced 12,008 receipted and lost messages here: a failed write's
    receipt went out with the next sync.  Now nothing is confirmed while the disk
    is full, the broker says why, and it goes on by itself once the disk grows.
    """
    with small_filesystem(tmp_path / "disk", "48m") as disk:
        data = os.path.join(disk, "data")
        broker = Broker(tmp_path, data, config(0), tmp_path)
        keep_session(broker.mqtt, "keeper", "sensors/#")
        stomp_producer = StompProducer(broker.stomp, "/queue/full", 9000)
        mqtt_producer = MqttProducer(broker.mqtt, "sensors/a", 3000)
        stomp_producer.start()
        mqtt_producer.start()

        def counts() -> tuple[int, int]:
            return len(stomp_producer.receipted), len(mqtt_producer.acked)

        wait(lambda: broker.ready()[0] == 503, 60, "store fault")
        at_fault = wait_stable(counts, quiet=2.0, timeout=90)
        assert at_fault[0] < 9000 and at_fault[1] < 3000, at_fault
        status, reason = broker.ready()
        assert status == 503 and "could not write" in reason and " free at " in reason, reason
        assert broker.metric("gateway_store_fault") == 1 and broker.metric("gateway_store_faults_total") == 1
        # It keeps serving: a new client connects, and what needs no disk flows.
        live = queue_messages_after_send(broker.stomp)
        assert live == "not stored"
        assert broker.log().count("store write failed") == 1 and "Traceback" not in broker.log()
        assert not stomp_producer.errors and not mqtt_producer.refused
        time.sleep(1)  # waiting for an absence: no confirmation while the disk is full
        assert counts() == at_fault, "confirmed while the disk was full"

        resize_filesystem(disk, "256m")
        recovery = wait(lambda: broker.ready()[0] == 200, 60, "recovery")
        wait(lambda: counts() == (9000, 3000), 120, "every confirmation")
        stomp_producer.join(10)
        assert not stomp_producer.errors and not mqtt_producer.refused
        assert "writes again after" in broker.log()
        print(f"\nbroker-filled disk: {at_fault} confirmed when full, recovered {recovery:.1f}s after the disk grew")
        mqtt_producer.close()
        broker.kill()
        restart_and_check(tmp_path, data, stomp_producer.receipted, mqtt_producer.acked, "keeper")


def queue_messages_after_send(port: int) -> str:
    """A new connection sends a non-persistent message to itself: the broker answers without its disk."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    decoder = StompDecoder(StompLimits(), version="1.2")
    for command, headers, payload in (
        ("CONNECT", [("accept-version", "1.2"), ("host", "/")], b""),
        ("SUBSCRIBE", [("id", "1"), ("destination", "/queue/live")], b""),
        ("SEND", [("destination", "/queue/live"), ("persistent", "false")], b"not stored"),
    ):
        sock.sendall(encode_frame(command, headers, payload, version="1.2"))
    frames: list[Any] = []
    while not any(f.command == "MESSAGE" for f in frames):
        data = sock.recv(65536)
        assert data, "closed"
        frames.extend(decoder.feed(data))
    sock.close()
    return next(f for f in frames if f.command == "MESSAGE").body.decode()


def test_the_floor_holds_producers_before_the_disk_fills_and_consumers_let_them_go(tmp_path):
    floor = 24 << 20
    with small_filesystem(tmp_path / "disk", "96m") as disk:
        data = os.path.join(disk, "data")
        broker = Broker(tmp_path, data, config(floor), tmp_path)
        producer = StompProducer(broker.stomp, "/queue/full", 20000)  # 80 MB: far beyond the room above the floor
        producer.start()
        wait(lambda: broker.ready()[0] == 503, 60, "disk alarm")
        held_at = wait_stable(lambda: len(producer.receipted), quiet=2.0, timeout=90)
        status, reason = broker.ready()
        assert status == 503 and "below disk_free_limit 24.0 MiB" in reason, reason
        free = shutil.disk_usage(disk).free
        assert broker.metric("gateway_store_faults_total") == 0, "the disk filled in spite of the floor"
        assert 0 < free < floor and held_at < 20000 and not producer.errors
        print(f"\nfloor 24 MiB: producer held after {held_at} receipts with {free / 2**20:.1f} MiB free")

        got: list[int] = []
        reader = threading.Thread(target=lambda: got.extend(queue_messages(broker.stomp, "/queue/full", 20000, 180)))
        reader.start()
        wait(lambda: len(producer.receipted) == 20000, 180, "every receipt")
        reader.join(180)
        assert sorted(got) == list(range(20000)) and got == sorted(got)
        assert sorted(producer.receipted) == list(range(20000)) and not producer.errors
        assert broker.metric("gateway_store_faults_total") == 0
        assert "disk alarm cleared" in broker.log()
        broker.process.stop()


def test_a_disk_another_process_fills_is_waited_out_and_nothing_confirmed_is_lost(tmp_path):
    with small_filesystem(tmp_path / "disk", "64m") as disk:
        data = os.path.join(disk, "data")
        broker = Broker(tmp_path, data, config(8 << 20), tmp_path)
        keep_session(broker.mqtt, "keeper", "sensors/#")
        stomp_producer = StompProducer(broker.stomp, "/queue/full", 6000, window=5)
        mqtt_producer = MqttProducer(broker.mqtt, "sensors/a", 1000)
        stomp_producer.start()
        wait(lambda: len(stomp_producer.receipted) >= 500, 60, "a first batch of receipts")
        mqtt_producer.start()
        filler = Path(disk) / "filler"
        with open(filler, "wb") as f:  # another process's data takes every byte left
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(chunk)
                    f.flush()
            except OSError:
                pass
        wait(lambda: broker.ready()[0] == 503, 30, "the alarm")
        counts = lambda: (len(stomp_producer.receipted), len(mqtt_producer.acked))  # noqa: E731
        at_full = wait_stable(counts, quiet=2.0, timeout=90)
        assert at_full[0] < 6000, at_full
        time.sleep(1)  # waiting for an absence: no confirmation while the disk is full
        assert counts() == at_full, "confirmed while the disk was full"
        assert broker.log().count("store write failed") <= 1 and "Traceback" not in broker.log()

        filler.unlink()
        recovery = wait(lambda: broker.ready()[0] == 200, 60, "recovery")
        wait(lambda: counts() == (6000, 1000), 120, "every confirmation")
        print(f"\nfilled by another process: {at_full} confirmed when full, "
              f"{int(broker.metric('gateway_store_faults_total'))} store fault(s), recovered {recovery:.1f}s after the file went")
        mqtt_producer.close()
        broker.kill()
        restart_and_check(tmp_path, data, stomp_producer.receipted, mqtt_producer.acked, "keeper")


def test_an_io_error_that_is_not_a_full_disk_stops_the_broker_non_zero(tmp_path):
    """ext4 on a loop device whose backing file lives on a tmpfs too small for it: the
    device fails writes (EIO), ext4 aborts its journal.  Nothing here can be trusted to
    recover in process; the broker exits 3, and a restart has every confirmed message."""
    for tool in ("losetup", "mkfs.ext4", "e2fsck"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    with small_filesystem(tmp_path / "back", "40m") as back:
        image = os.path.join(back, "disk.img")
        subprocess.run(["truncate", "-s", "200M", image], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True, capture_output=True)
        attached = subprocess.run(["losetup", "-f", "--show", image], capture_output=True, text=True)
        if attached.returncode != 0:
            pytest.skip(f"no loop device here: {attached.stderr.strip()}")
        device = attached.stdout.strip()
        mount = tmp_path / "ext4"
        mount.mkdir()
        try:
            subprocess.run(["mount", device, str(mount)], check=True, capture_output=True)
            data = str(mount / "data")
            broker = Broker(tmp_path, data, config(0), tmp_path)
            producer = StompProducer(broker.stomp, "/queue/full", 40000)
            producer.start()
            code = broker.process.proc.wait(120)
            producer.join(30)
            assert code == 3, broker.log()
            assert "gateway: stopping: the store failed with an error it cannot recover from" in broker.log()
            assert 0 < len(producer.receipted) < 40000
            subprocess.run(["umount", str(mount)], check=True, capture_output=True)
            resize_filesystem(back, "400m")
            subprocess.run(["e2fsck", "-fy", device], capture_output=True)  # exit 1: errors corrected
            subprocess.run(["mount", device, str(mount)], check=True, capture_output=True)
            restart_and_check(tmp_path, data, producer.receipted, [], None, everything_confirmed=False)
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
            subprocess.run(["losetup", "-d", device], capture_output=True)


def test_a_broker_below_its_floor_at_start_says_so(tmp_path):
    broker = Broker(tmp_path, str(tmp_path / "data"), config("99.9%"), tmp_path)
    try:
        line = broker.process.wait_for_line("disk alarm:")
        assert "below disk_free_limit" in line
        assert broker.ready()[0] == 503
    finally:
        assert broker.process.stop(signal.SIGTERM) == 0
