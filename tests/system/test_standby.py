"""Shared-store master/slave with real ``gateway run`` processes.

Broker A takes the RocksDB lock of ``<data_dir>/store``; broker B started on
the same data directory stands by (no listener) and retries the lock every
``persistence.lock_retry_interval`` (1 s).  When A dies, even by ``kill -9``,
B takes the lock over, recovers the store and starts listening on its own
ports, where every message A confirmed (RECEIPT, PUBACK) is waiting.
"""
from __future__ import annotations

import contextlib
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import Collector, wait_until
from tests.system.test_cli import BrokerProcess, free_port

pytestmark = pytest.mark.timeout(60)

STANDING_BY = "standing by"
TAKING_OVER = "taking over as master"


def start(data_dir: Path, stomp_port: int, mqtt_port: int, cwd: Path) -> BrokerProcess:
    return BrokerProcess(
        "--data-dir", str(data_dir), "--stomp-port", str(stomp_port), "--mqtt-port", str(mqtt_port),
        "--ws-port", "0", "--admin-port", "0", "--log-level", "info", cwd=cwd,
    )


def refused(port: int) -> bool:
    """Nothing listens on the port: connecting is refused."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def stomp_client(port: int) -> tuple[Any, Collector]:
    import stomp

    conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1)
    got = Collector()
    conn.set_listener("c", got)
    conn.connect(wait=True)
    return conn, got


def close(conn: Any) -> None:
    with contextlib.suppress(stomp_errors()):
        if conn.is_connected():
            conn.disconnect()


def stomp_errors() -> tuple[type[BaseException], ...]:
    """What stomp.py raises on a connection the broker has gone from."""
    from stomp.exception import StompException

    return (StompException, OSError)


def kill(*brokers: BrokerProcess) -> None:
    for broker in brokers:
        if broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait(10)


def test_standby_takes_over_after_kill_9_with_every_confirmed_message(tmp_path):
    data = tmp_path / "shared"
    p1, p2, p3, p4 = (free_port() for _ in range(4))
    a = start(data, p1, p2, tmp_path)
    b = None
    conn = None
    try:
        a.wait_for_line(f"STOMP listening on 127.0.0.1:{p1}")
        a.wait_for_line(f"MQTT listening on 127.0.0.1:{p2}")
        b = start(data, p3, p4, tmp_path)
        b.wait_for_line(STANDING_BY)
        standing_since = time.monotonic()
        assert b.proc.poll() is None, "".join(b.lines)

        # Persistent messages to A, each confirmed by a RECEIPT (sent once on disk).
        conn, got = stomp_client(p1)
        sent = [f"confirmed-{i}" for i in range(50)]
        for i, body in enumerate(sent):
            conn.send("/queue/ha.orders", body, headers={"persistent": "true", "receipt": f"r{i}"})
        got.wait_for(len(sent), what="receipts")
        # A retained QoS 1 message over MQTT, confirmed by its PUBACK.
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="ha-pub")
        pub.connect("127.0.0.1", p2)
        pub.loop_start()
        try:
            info = pub.publish("ha/state", b"retained-on-a", qos=1, retain=True)
            info.wait_for_publish(5)
            assert info.is_published()
        finally:
            pub.disconnect()
            pub.loop_stop()

        # B has retried the lock meanwhile (every second) and still does not listen.
        time.sleep(max(0.0, standing_since + 1.3 - time.monotonic()))  # a real clock window: past a retry (logged at debug only)
        assert refused(p3) and refused(p4), "the standby listens while the master holds the store"
        assert TAKING_OVER not in "".join(b.lines)
        assert b.proc.poll() is None

        a.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert a.proc.wait(5) == -signal.SIGKILL
        close(conn)

        b.wait_for_line(TAKING_OVER, timeout=5)
        b.wait_for_line(f"STOMP listening on 127.0.0.1:{p3}", timeout=5)
        took = time.monotonic() - killed_at
        assert took < 4.0, f"takeover took {took:.1f}s"
        assert not refused(p3)

        conn, got = stomp_client(p3)
        conn.subscribe("/queue/ha.orders", id="1", ack="client-individual")
        got.wait_for(len(sent))
        assert [m.body for m in got.settle()] == sent
        for message in got.messages:
            conn.ack(message.headers["ack"])

        # The MQTT side came back too: the retained message is on B.
        b.wait_for_line(f"MQTT listening on 127.0.0.1:{p4}", timeout=5)
        received: list[Any] = []
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="ha-sub")
        sub.on_message = lambda client, userdata, message: received.append(message)
        sub.on_connect = lambda client, userdata, flags, rc, props: client.subscribe("ha/#", 1)
        sub.connect("127.0.0.1", p4)
        sub.loop_start()
        try:
            wait_until(lambda: received, what="the retained message on B")
        finally:
            sub.disconnect()
            sub.loop_stop()
        assert [(m.topic, m.payload, m.retain) for m in received] == [("ha/state", b"retained-on-a", True)]

        close(conn)
        conn = None
        assert b.stop(signal.SIGTERM) == 0, "".join(b.lines)
    finally:
        if conn is not None:
            close(conn)
        kill(a, *([b] if b is not None else []))


def test_standby_exits_0_on_sigterm_while_waiting_and_the_master_is_undisturbed(tmp_path):
    data = tmp_path / "shared"
    p1, p2, p3, p4 = (free_port() for _ in range(4))
    a = start(data, p1, p2, tmp_path)
    b = None
    conn = None
    try:
        a.wait_for_line(f"STOMP listening on 127.0.0.1:{p1}")
        b = start(data, p3, p4, tmp_path)
        b.wait_for_line(STANDING_BY)
        time.sleep(1.2)  # a real clock window: at least one retry of the lock (every 1 s; logged at debug only)
        assert b.stop(signal.SIGTERM, timeout=5) == 0, "".join(b.lines)
        output = "".join(b.lines)
        assert TAKING_OVER not in output and "Traceback" not in output, output
        assert refused(p3)

        # A kept its store and keeps serving.
        conn, got = stomp_client(p1)
        conn.subscribe("/queue/ha.after", id="1")
        conn.send("/queue/ha.after", "still master", headers={"persistent": "true"})
        assert got.wait_for(1)[0].body == "still master"
        close(conn)
        conn = None
        assert a.stop(signal.SIGTERM) == 0, "".join(a.lines)
    finally:
        if conn is not None:
            close(conn)
        kill(a, *([b] if b is not None else []))


def test_standby_takes_over_after_a_clean_stop_of_the_master(tmp_path):
    data = tmp_path / "shared"
    p1, p2, p3, p4 = (free_port() for _ in range(4))
    a = start(data, p1, p2, tmp_path)
    b = None
    conn = None
    try:
        a.wait_for_line(f"STOMP listening on 127.0.0.1:{p1}")
        b = start(data, p3, p4, tmp_path)
        b.wait_for_line(STANDING_BY)
        conn, got = stomp_client(p1)
        for i in range(5):
            conn.send("/queue/ha.clean", f"m{i}", headers={"persistent": "true", "receipt": f"c{i}"})
        got.wait_for(5, what="receipts")
        close(conn)
        conn = None
        assert a.stop(signal.SIGTERM) == 0, "".join(a.lines)

        b.wait_for_line(TAKING_OVER, timeout=5)
        b.wait_for_line(f"STOMP listening on 127.0.0.1:{p3}", timeout=5)
        conn, got = stomp_client(p3)
        conn.subscribe("/queue/ha.clean", id="1")
        got.wait_for(5)
        assert [m.body for m in got.settle()] == [f"m{i}" for i in range(5)]
        close(conn)
        conn = None
        assert b.stop(signal.SIGTERM) == 0, "".join(b.lines)
    finally:
        if conn is not None:
            close(conn)
        kill(a, *([b] if b is not None else []))


def test_kill_9_mid_stream_loses_no_confirmed_message_and_keeps_acks_and_delivery_state(tmp_path):
    import threading

    data = tmp_path / "shared"
    p1, p2, p3, p4 = (free_port() for _ in range(4))
    a = start(data, p1, p2, tmp_path)
    b = None
    conns: list[Any] = []
    try:
        a.wait_for_line(f"STOMP listening on 127.0.0.1:{p1}")
        b = start(data, p3, p4, tmp_path)
        b.wait_for_line(STANDING_BY)

        # A consumer on A acks half of what it got (each ack confirmed) and holds the rest.
        producer, produced = stomp_client(p1)
        consumer, consumed = stomp_client(p1)
        conns += [producer, consumer]
        for i in range(10):
            producer.send("/queue/ha.state", f"held-{i}", headers={"persistent": "true", "receipt": f"h{i}"})
        produced.wait_for(10, what="receipts")
        consumer.subscribe("/queue/ha.state", id="1", ack="client-individual")
        held = consumed.wait_for(10)
        for i, message in enumerate(held[:5]):
            consumer.ack(message.headers["ack"], receipt=f"ack{i}")
        consumed.wait_for(5, what="receipts")

        # A stream of persistent sends, killed in the middle.
        sent: list[str] = []
        stop = threading.Event()

        def stream() -> None:
            for i in range(100_000):
                if stop.is_set():
                    return
                body = f"stream-{i}"
                try:
                    producer.send("/queue/ha.stream", body, headers={"persistent": "true", "receipt": f"s{i}"})
                except stomp_errors():
                    return
                sent.append(body)

        sender = threading.Thread(target=stream, daemon=True)
        sender.start()
        produced.wait_for(10 + 100, what="receipts", timeout=10)
        a.proc.send_signal(signal.SIGKILL)
        assert a.proc.wait(5) == -signal.SIGKILL
        assert produced.disconnected.wait(5)
        stop.set()
        sender.join(5)
        confirmed = [r for r in produced.receipts if r.startswith("s")]
        assert len(confirmed) >= 100

        b.wait_for_line(f"STOMP listening on 127.0.0.1:{p3}", timeout=6)
        client, got = stomp_client(p3)
        conns.append(client)
        client.subscribe("/queue/ha.stream", id="1")
        got.wait_for(len(confirmed), timeout=5)
        stream_bodies = [m.body for m in got.settle()]
        # Every confirmed message, in order, none twice; what came after is a prefix of the rest.
        assert stream_bodies == sent[:len(stream_bodies)], "out of order, duplicated or a gap"
        assert len(stream_bodies) >= len(confirmed)
        assert {f"stream-{r[1:]}" for r in confirmed} <= set(stream_bodies)

        other, got_other = stomp_client(p3)
        conns.append(other)
        other.subscribe("/queue/ha.state", id="1", ack="client-individual")
        got_other.wait_for(5)
        back = got_other.settle()
        assert [m.body for m in back] == [f"held-{i}" for i in range(5, 10)], "acked ones came back or held ones were lost"
        assert all(m.headers.get("redelivered") == "true" for m in back)
        assert [m.headers["message-id"] for m in back] == [m.headers["message-id"] for m in held[5:]]
    finally:
        for conn in conns:
            close(conn)
        kill(a, *([b] if b is not None else []))


def test_a_second_broker_on_the_same_data_directory_says_so_once_and_names_the_holder(tmp_path):
    """86,000 identical lines a day hid the one that mattered: now one line says what, whose and why, then nothing."""
    data = tmp_path / "shared"
    fast = tmp_path / "fast-retry.toml"
    fast.write_text("[persistence]\nlock_retry_interval = 0.05\n")  # many retries within the test
    p1, p2, p3, p4 = (free_port() for _ in range(4))
    a = start(data, p1, p2, tmp_path)
    b = None
    try:
        a.wait_for_line(f"STOMP listening on 127.0.0.1:{p1}")
        b = BrokerProcess(
            "--config", str(fast), "--data-dir", str(data), "--stomp-port", str(p3), "--mqtt-port", str(p4),
            "--ws-port", "0", "--admin-port", "0", "--log-level", "debug", cwd=tmp_path,
        )
        line = b.wait_for_line(STANDING_BY)
        assert f"data directory {data} is in use" in line
        assert f"its store lock {data / 'store' / 'LOCK'} is held by pid {a.proc.pid} (" in line
        assert f"run --data-dir {data} --stomp-port {p1}" in line  # A's command line, to recognise it by
        assert "takes over as master when that broker stops" in line and "--data-dir" in line.split("Not intended?")[1]

        def retries() -> int:
            return sum("still locked: next try in 0.05s" in x for x in b.lines)

        def notices() -> list[str]:
            # What an operator sees at the default level: everything the broker logs above debug.
            return [x for x in b.lines if x.split(" ", 1)[-1].startswith("[gateway") and "#debug]" not in x]

        # Barriers on the standby's own output (its retries, at debug): no guess at how long a retry takes.
        wait_until(lambda: retries() >= 10, 10, "10 retries of the lock")
        seen = notices()
        wait_until(lambda: retries() >= 40, 10, "40 retries of the lock")
        assert notices() == seen, "the standby logs on retries"
        assert sum(STANDING_BY in x for x in seen) == 1
        assert not [x for x in b.lines if "hot path" in x or " ready" in x], "".join(b.lines)

        # The takeover is the next thing it says, once, then the start-up summary.
        assert a.stop(signal.SIGTERM) == 0, "".join(a.lines)
        b.wait_for_line(f"STOMP listening on 127.0.0.1:{p3}", timeout=5)
        b.wait_for_line("\thot path: ", timeout=5)
        after = notices()[len(seen):]
        assert sum(TAKING_OVER in x for x in b.lines) == 1 and TAKING_OVER in after[0], after
        assert sum(STANDING_BY in x for x in b.lines) == 1
        assert b.stop(signal.SIGTERM) == 0, "".join(b.lines)
    finally:
        kill(a, *([b] if b is not None else []))
