"""Crash cycles: ``gateway run`` killed with SIGKILL while producers write to it.

Usable from tests (``run_cycles``, ``Broker``, the producers) and from the
command line, for the long run DESIGN.md's "kill -9 at any moment loses no
message whose receipt/PUBACK was sent" calls for::

    python -m tests.system.crash --cycles 100 --data-dir DIR

One cycle: start the broker on the data directory (RocksDB under DIR/store,
sync=true, the default), run two producers against it at once, and after a
random 0.2-1.5 s ``kill -9`` it.

- STOMP 1.2 (stomp.py): ``persistent:true`` SENDs to ``/queue/crash``, each
  with a ``receipt``, at most ``WINDOW`` receipts outstanding.  A message is
  CONFIRMED when its RECEIPT arrived.
- MQTT 3.1.1 (paho-mqtt): QoS 1 publishes to ``crash/mqtt``, at most
  ``WINDOW`` in flight.  CONFIRMED when paho reports it published (PUBACK).
  They queue for the persistent session ``crash-sub`` (clean_session=False,
  subscribed at QoS 1 to ``crash/#`` before the first cycle, then away).

Bodies are unique ids, ``stomp-<cycle>-<n>`` and ``mqtt-<cycle>-<n>``.

With ``--consume`` (``run_cycles(consume=True)``) consumers run during the
cycles too: a client-individual STOMP consumer acking each message and
``crash-sub`` connected, so kills also land between deliveries and acks.

At the end the broker is started once more, ``/queue/crash`` is drained by a
client-individual consumer (each message acked) and ``crash-sub`` reconnects
(clean_session=False) and takes its backlog (paho acks QoS 1).  Each drain
ends at a sentinel sent after the consumer is attached: a queue is FIFO, so
everything stored comes before it.  Then:

- lost: CONFIRMED ids that never arrived (must be 0);
- duplicated: an id arriving again without ``redelivered:true`` (STOMP) or
  the DUP flag (MQTT) on the later copy (must be 0);
- recovered: distinct sent ids that arrived (unconfirmed ones may or may not);
- redelivered_again: later copies that carried the flag (allowed);
  flagged_on_first_arrival: first copies flagged (allowed: handed to a socket
  the kill then reset, so never received);
- out_of_order: arrivals whose id was sent before an id that already arrived
  (one producer at a time per destination, so FIFO means 0);
- unexpected: bodies that no producer sent;
- resurrected: once everything is acked (and the acks are known durable), the
  broker is killed once more and restarted: whatever comes back had been acked.

With ``--stream`` (``run_cycles(stream=True)``) the broker also keeps a stream
``crash`` of both destinations (two partitions), read back over the admin
HTTP API at the end: every confirmed id must be in it exactly once, every
id at most once, and each partition's offsets dense from 0 (a kill may cut a
turn's records, never leave a hole or reuse an offset).
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import stomp
from paho.mqtt.enums import CallbackAPIVersion

from tests.system.test_cli import BrokerProcess, free_port

HOST = "127.0.0.1"
QUEUE = "/queue/crash"
MQTT_TOPIC = "crash/mqtt"
MQTT_FILTER = "crash/#"
SUB_ID = "crash-sub"
WINDOW = 50
SENTINEL = "sentinel"


class CrashError(AssertionError):
    """The harness could not do its part (a broker that does not start, a client that cannot connect)."""


# -- the broker process ---------------------------------------------------------


class Broker:
    """``gateway run`` on one data directory; fresh loopback ports at every start."""

    def __init__(
        self, data_dir: str | os.PathLike, log_level: str = "warn", config: str | None = None, keep_ports: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.log_level = log_level
        self.config = config
        # Restart on the same ports (clients that reconnect to one address: a Spark query's url).
        self.keep_ports = keep_ports
        self.process: BrokerProcess | None = None
        self.stomp_port = 0
        self.mqtt_port = 0
        self.admin_port = 0
        self.starts = 0
        self.start_seconds: list[float] = []  # launch to listening (recovery included), per start
        self.output: list[str] = []  # every line any incarnation printed

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.proc.pid

    def running(self) -> bool:
        return self.process is not None and self.process.proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """Start and return once both listeners accept (they open only after recovery)."""
        assert not self.running(), "broker already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last = ""
        for _ in range(3):  # a port free_port() picked may be taken by the time we bind
            if not (self.keep_ports and self.stomp_port):
                ports: set[int] = set()
                while len(ports) < 3:
                    ports.add(free_port())
                self.stomp_port, self.mqtt_port, self.admin_port = ports
            self.process = BrokerProcess(
                "--data-dir", str(self.data_dir), "--stomp-port", str(self.stomp_port),
                "--mqtt-port", str(self.mqtt_port), "--ws-port", "0", "--admin-port", str(self.admin_port),
                "--log-level", self.log_level, *(["--config", self.config] if self.config else []),
                cwd=self.data_dir.parent,
            )
            self.starts += 1
            launched = time.monotonic()
            deadline = launched + timeout
            while time.monotonic() < deadline:
                if self.process.proc.poll() is not None:
                    break
                if _accepts(self.stomp_port) and _accepts(self.mqtt_port):
                    self.start_seconds.append(time.monotonic() - launched)
                    return
                time.sleep(0.02)  # a poll: a port starting to accept has no event (the process's exit ends it too)
            code = self.process.proc.poll()
            if code is None:
                self.kill()
                raise CrashError(f"broker did not listen within {timeout}s:\n{''.join(self.process.lines)}")
            self.process._reader.join(5)
            last = "".join(self.process.lines)
            self._collect(code)
            if "cannot start" not in last or "address" not in last.lower():
                break
            if self.keep_ports:
                time.sleep(0.5)  # a real clock window: our own port, still held by the killed process's sockets for a moment
        raise CrashError(f"broker exited at start ({self.process.proc.returncode}):\n{last}")

    def kill(self) -> int:
        """SIGKILL: the process dies at once, no shutdown code runs; returns the exit status."""
        assert self.process is not None
        proc = self.process.proc
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        code = proc.wait(15)
        self.process._reader.join(5)
        self._collect(code)
        return code

    def stop(self) -> int:
        """A clean SIGTERM shutdown (falls back to SIGKILL)."""
        assert self.process is not None
        try:
            code = self.process.stop(signal.SIGTERM, timeout=20)
        except Exception:
            code = self.kill()
        self._collect(code)
        return code

    def ensure_dead(self) -> None:
        if self.running():
            self.kill()

    def _collect(self, code: int | None) -> None:
        if self.process is not None and not getattr(self.process, "_collected", False):
            self.process._collected = True  # type: ignore[attr-defined]
            self.output.extend(self.process.lines)

    def tail(self, n: int = 40) -> str:
        lines = list(self.output)
        if self.process is not None and not getattr(self.process, "_collected", False):
            lines += self.process.lines
        return "".join(lines[-n:])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


# -- what was sent and confirmed ------------------------------------------------


@dataclass
class Ledger:
    """One producer's ids, in send order, and the confirmed ones."""

    name: str
    sent: list[str] = field(default_factory=list)
    confirmed: set[str] = field(default_factory=set)


def _order_key(mid: str) -> tuple[int, int]:
    _, cycle, n = mid.rsplit("-", 2)
    return int(cycle), int(n)


@dataclass
class Arrival:
    body: str
    flagged: bool  # redelivered:true (STOMP) or DUP (MQTT)


def reconcile(ledger: Ledger, arrivals: list[Arrival]) -> dict[str, Any]:
    """Compare what arrived with what was sent and confirmed."""
    sent = set(ledger.sent)
    seen: set[str] = set()
    duplicated = flagged_again = flagged = flagged_first = unexpected = out_of_order = 0
    duplicate_ids: list[str] = []
    highest: tuple[int, int] | None = None
    for arrival in arrivals:
        body = arrival.body
        if arrival.flagged:
            flagged += 1
        if body not in sent:
            unexpected += 1
            continue
        if body not in seen and arrival.flagged:
            flagged_first += 1
        if body in seen:
            if arrival.flagged:
                flagged_again += 1
            else:
                duplicated += 1
                duplicate_ids.append(body)
            continue
        seen.add(body)
        key = _order_key(body)
        if highest is not None and key < highest:
            out_of_order += 1
        highest = key if highest is None or key > highest else highest
    lost = sorted(ledger.confirmed - seen, key=_order_key)
    return {
        "sent": len(ledger.sent),
        "confirmed": len(ledger.confirmed),
        "recovered": len(seen),
        "recovered_unconfirmed": len(seen - ledger.confirmed),
        "lost": len(lost),
        "duplicated": duplicated,
        "redelivered_again": flagged_again,
        "flagged_redelivered": flagged,
        "flagged_on_first_arrival": flagged_first,
        "out_of_order": out_of_order,
        "unexpected": unexpected,
        "lost_ids": lost[:10],
        "duplicate_ids": duplicate_ids[:10],
    }


class Pace:
    """At most ``rate`` sends a second (0: as fast as the window allows)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    def wait(self) -> None:
        if self.interval:
            self.next += self.interval
            delay = self.next - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the load under test: a producer paced at its rate


# -- producers ---------------------------------------------------------------------


class StompProducer(threading.Thread):
    """persistent:true SENDs to QUEUE, each with a receipt; at most WINDOW outstanding."""

    def __init__(
        self, port: int, cycle: int, ledger: Ledger, prefix: str = "stomp", limit: int | None = None, rate: float = 0,
    ) -> None:
        super().__init__(daemon=True, name=f"stomp-producer-{cycle}")
        self.port = port
        self.cycle = cycle
        self.ledger = ledger
        self.prefix = prefix
        self.limit = limit
        self.pace = Pace(rate)
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.gone = threading.Event()
        self.errors: list[str] = []
        self.problem: str | None = None
        self._cond = threading.Condition()
        self._outstanding: set[str] = set()
        self.conn: Any = None

    # stomp.py listener callbacks (its io thread)
    def on_connected(self, frame: Any) -> None:
        self.connected.set()

    def on_receipt(self, frame: Any) -> None:
        rid = frame.headers.get("receipt-id", "")
        with self._cond:
            if rid in self._outstanding:
                self._outstanding.discard(rid)
                self.ledger.confirmed.add(rid)
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        self.errors.append(f"{frame.headers.get('message')}: {frame.body!r}")

    def on_disconnected(self) -> None:
        self.gone.set()
        with self._cond:
            self._cond.notify_all()

    def outstanding(self) -> int:
        with self._cond:
            return len(self._outstanding)

    def run(self) -> None:
        try:
            self.conn = stomp.Connection12([(HOST, self.port)], heartbeats=(0, 0), reconnect_attempts_max=1)
            self.conn.set_listener("producer", self)
            self.conn.connect(wait=False)
        except Exception as exc:
            if not self.stopping.is_set():
                self.problem = f"connect: {exc!r}"
            self.gone.set()
            return
        if not _wait_any(self.connected, self.gone, self.stopping, timeout=15):
            self.problem = "no CONNECTED frame in 15 s"
        if not self.connected.is_set():
            return  # killed before it could start: the caller checks the broker did not die early
        n = 0
        while self.limit is None or n < self.limit:
            with self._cond:
                while len(self._outstanding) >= WINDOW and not self._done():
                    self._cond.wait(0.2)
                if self._done():
                    return
                mid = f"{self.prefix}-{self.cycle}-{n}"
                self._outstanding.add(mid)
                self.ledger.sent.append(mid)
            try:
                self.conn.send(QUEUE, mid, headers={"persistent": "true", "receipt": mid})
            except Exception:
                return  # the broker died under us: mid is sent but not confirmed
            n += 1
            self.pace.wait()

    def _done(self) -> bool:
        return self.stopping.is_set() or self.gone.is_set()

    def wait_confirmed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._outstanding or self.is_alive():
                left = deadline - time.monotonic()
                if left <= 0 or self.gone.is_set():
                    return False
                self._cond.wait(min(left, 0.2))
            return True

    def finish(self, timeout: float = 10.0) -> None:
        """Stop sending; wait until every send has its receipt or the connection is gone (a killed
        broker: the io thread has then read every receipt it sent).  What is confirmed is final then."""
        self.stopping.set()
        with self._cond:
            self._cond.notify_all()
        self.join(timeout)
        if self.conn is not None:
            if self.connected.is_set():
                deadline = time.monotonic() + timeout
                with self._cond:
                    while self._outstanding and not self.gone.is_set() and time.monotonic() < deadline:
                        self._cond.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            try:
                self.conn.transport.disconnect_socket()
            except Exception:
                pass


class MqttProducer(threading.Thread):
    """QoS 1 publishes to MQTT_TOPIC (MQTT 3.1.1, clean session); at most WINDOW in flight."""

    def __init__(
        self, port: int, cycle: int, ledger: Ledger, prefix: str = "mqtt", limit: int | None = None, rate: float = 0,
    ) -> None:
        super().__init__(daemon=True, name=f"mqtt-producer-{cycle}")
        self.port = port
        self.cycle = cycle
        self.ledger = ledger
        self.prefix = prefix
        self.limit = limit
        self.pace = Pace(rate)
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.gone = threading.Event()
        self.problem: str | None = None
        self._cond = threading.Condition()
        self._infos: list[tuple[str, Any]] = []  # (id, MQTTMessageInfo) not yet seen published
        # No reconnecting by itself: a producer lives for one broker start (paho's wait before a
        # reconnect would also hold loop_stop() for a second).
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"crash-pub-{cycle}-{os.getpid()}",
            protocol=mqtt.MQTTv311, clean_session=True, reconnect_on_failure=False,
        )
        self.client.max_inflight_messages_set(WINDOW)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        if not reason_code.is_failure:
            self.connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self.gone.set()
        self._wake()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        # Called under paho's locks: only wake the producer; is_published() is the record.
        self._wake()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _settle(self) -> int:
        """Move published ids to confirmed; returns how many are still in flight."""
        keep = []
        for mid, info in self._infos:
            state = _published(info)
            if state:
                self.ledger.confirmed.add(mid)
            elif state is None:
                keep.append((mid, info))
        self._infos = keep
        return len(keep)

    def outstanding(self) -> int:
        with self._cond:
            return self._settle()

    def run(self) -> None:
        try:
            self.client.connect(HOST, self.port, keepalive=60)
            self.client.loop_start()
        except Exception as exc:
            if not self.stopping.is_set():
                self.problem = f"connect: {exc!r}"
            self.gone.set()
            return
        if not _wait_any(self.connected, self.gone, self.stopping, timeout=15):
            self.problem = "no CONNACK in 15 s"
        if not self.connected.is_set():
            return
        n = 0
        while self.limit is None or n < self.limit:
            with self._cond:
                while self._settle() >= WINDOW and not self._done():
                    self._cond.wait(0.2)
                if self._done():
                    return
            mid = f"{self.prefix}-{self.cycle}-{n}"
            self.ledger.sent.append(mid)
            try:
                info = self.client.publish(MQTT_TOPIC, mid.encode(), qos=1)
            except Exception:
                return
            with self._cond:
                self._infos.append((mid, info))
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                return  # not connected any more: queued by paho, never to be published by this client
            n += 1
            self.pace.wait()

    def _done(self) -> bool:
        return self.stopping.is_set() or self.gone.is_set()

    def wait_confirmed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._settle() or self.is_alive():
                left = deadline - time.monotonic()
                if left <= 0 or self.gone.is_set():
                    return False
                self._cond.wait(min(left, 0.2))
            return True

    def finish(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self._wake()
        self.join(timeout)
        with self._cond:
            if self.connected.is_set():
                # Every publish PUBACKed, or the connection gone (a killed broker: every PUBACK it sent has been read).
                deadline = time.monotonic() + timeout
                while self._settle() and not self.gone.is_set() and time.monotonic() < deadline:
                    self._cond.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            self._settle()
        try:
            self.client.disconnect()
        except Exception:
            pass
        self.client.loop_stop()


def _published(info: Any) -> bool | None:
    """True once PUBACKed, None while it may still be, False if paho never sent it (not connected)."""
    try:
        return True if info.is_published() else None
    except RuntimeError:  # paho raises for a publish refused with rc != success
        return False


def _wait_any(*events: threading.Event, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.is_set() for e in events):
            return True
        time.sleep(0.01)  # a poll over several events (threading has no wait for any of them)
    return False


# -- the persistent MQTT subscriber and the drains -------------------------------------


class MqttSubscriber:
    """The ``crash-sub`` persistent session (MQTT 3.1.1, clean_session=False)."""

    def __init__(self, port: int, client_id: str = SUB_ID) -> None:
        self.arrivals: list[Arrival] = []
        self.sentinels = 0
        self.present: bool | None = None
        self.subacks: list[Any] = []
        self._cond = threading.Condition()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, clean_session=False,
            reconnect_on_failure=False,  # one connection: a reconnect would take the session back from the next one
        )
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = lambda *a: self._notify()
        self.gone = threading.Event()
        self.client.on_disconnect = lambda *a: (self.gone.set(), self._notify())
        self.client.connect(HOST, port, keepalive=60)
        self.client.loop_start()
        self._wait(lambda: self.present is not None, 15, "CONNACK for crash-sub")

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        with self._cond:
            self.present = bool(flags.session_present)
            self._cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        body = message.payload.decode("utf-8", "replace")
        with self._cond:
            self.arrivals.append(Arrival(body, bool(message.dup)))
            if body == SENTINEL:
                self.sentinels += 1
            self._cond.notify_all()

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        with self._cond:
            self.subacks.append(list(reason_codes))
            self._cond.notify_all()

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CrashError(f"timed out waiting for {what}")
                self._cond.wait(min(left, 0.2))

    def subscribe(self) -> None:
        self.client.subscribe(MQTT_FILTER, qos=1)
        self._wait(lambda: self.subacks, 10, "SUBACK")
        (codes,) = self.subacks
        if any(c.is_failure for c in codes):
            raise CrashError(f"subscription refused: {codes}")

    def barrier(self, timeout: float = 30) -> None:
        """A QoS 1 publish of its own, outside crash/#: its PUBACK waits for a store batch
        holding everything this connection did before (its PUBACKs, its subscription)."""
        info = self.client.publish("crash-barrier/x", b"barrier", qos=1)
        self._wait(lambda: _published(info) is not None, timeout, "barrier PUBACK")
        if not info.is_published():
            raise CrashError(f"barrier not published (rc {info.rc})")

    def until_sentinel(self, timeout: float) -> list[Arrival]:
        return _until_sentinel(self, timeout, "MQTT")

    def close(self) -> None:
        try:
            self.client.disconnect()
        except Exception:
            pass
        self.gone.wait(5)
        self.client.loop_stop()

    def abandon(self, timeout: float = 10.0) -> list[Arrival]:
        """After the broker was killed: read what it sent before dying, then let go."""
        self.gone.wait(timeout)
        self.close()
        with self._cond:
            return list(self.arrivals)


class StompConsumer(stomp.ConnectionListener):
    """A client-individual consumer of QUEUE that acks every message as it comes."""

    def __init__(self, port: int) -> None:
        self.arrivals: list[Arrival] = []
        self.sentinels = 0
        self.receipts: set[str] = set()
        self.errors: list[str] = []
        self.connected = threading.Event()
        self.gone = threading.Event()
        self._cond = threading.Condition()
        self.conn = stomp.Connection12([(HOST, port)], heartbeats=(0, 0), reconnect_attempts_max=3)
        self.conn.set_listener("consumer", self)
        self.conn.connect(wait=False)
        if not self.connected.wait(15):
            raise CrashError("no CONNECTED frame for the STOMP consumer")

    def on_connected(self, frame: Any) -> None:
        self.connected.set()

    def on_message(self, frame: Any) -> None:
        headers = frame.headers
        try:
            self.conn.ack(headers["ack"])
        except Exception:
            pass  # the broker is gone (crash cycles with --consume): it comes back, flagged
        with self._cond:
            self.arrivals.append(Arrival(frame.body, headers.get("redelivered") == "true"))
            if frame.body == SENTINEL:
                self.sentinels += 1
            self._cond.notify_all()

    def on_disconnected(self) -> None:
        self.gone.set()

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self._cond:
            self.errors.append(f"{frame.headers.get('message')}: {frame.body!r}")
            self._cond.notify_all()

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not ready():
                if self.errors:
                    raise CrashError(f"STOMP ERROR while waiting for {what}: {self.errors}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CrashError(f"timed out waiting for {what}")
                self._cond.wait(min(left, 0.2))

    def subscribe(self) -> None:
        self.conn.subscribe(QUEUE, id="drain", ack="client-individual")

    def send(self, body: str, timeout: float = 30) -> None:
        rid = f"r-{body}"
        self.conn.send(QUEUE, body, headers={"persistent": "true", "receipt": rid})
        self._wait(lambda: rid in self.receipts, timeout, f"receipt {rid}")

    def barrier(self, timeout: float = 30) -> None:
        """A receipt after every ACK sent so far: once it is here, the acks are on disk."""
        rid = f"barrier-{time.monotonic_ns()}"
        self.conn.begin(transaction=rid)
        self.conn.abort(rid, headers={"receipt": rid})
        self._wait(lambda: rid in self.receipts, timeout, "ack barrier receipt")

    def until_sentinel(self, timeout: float) -> list[Arrival]:
        return _until_sentinel(self, timeout, "STOMP")

    def close(self) -> None:
        try:
            self.conn.disconnect(receipt=f"bye-{time.monotonic_ns()}")
        except Exception:
            pass
        self.abandon()

    def abandon(self, timeout: float = 10.0) -> list[Arrival]:
        """After the broker was killed: read what it sent before dying, then let go."""
        self.gone.wait(timeout)
        try:
            self.conn.transport.disconnect_socket()
        except Exception:
            pass
        with self._cond:
            return list(self.arrivals)


def _until_sentinel(client: Any, timeout: float, what: str, stall: float = 30.0) -> list[Arrival]:
    """Wait for the sentinel while messages keep coming: fail after ``stall`` seconds without
    one, or ``timeout`` in all (a backlog of a long run takes minutes, a stuck drain does not)."""
    deadline = time.monotonic() + timeout
    last, progress = -1, time.monotonic()
    with client._cond:
        while not client.sentinels:
            now = time.monotonic()
            if len(client.arrivals) != last:
                last, progress = len(client.arrivals), now
            if now > deadline or now - progress > stall:
                raise CrashError(
                    f"no {what} {SENTINEL!r} after {now - deadline + timeout:.0f}s: {last} messages arrived, "
                    f"the last {now - progress:.0f}s ago"
                )
            if getattr(client, "errors", None):
                raise CrashError(f"{what} ERROR while draining: {client.errors}")
            client._cond.wait(0.5)
        return list(client.arrivals)


def setup_subscriber(port: int) -> None:
    """crash-sub: a persistent session subscribed to crash/# at QoS 1, then away."""
    sub = MqttSubscriber(port)
    try:
        sub.subscribe()
        sub.barrier()  # the subscription is on disk before anything is killed
    finally:
        sub.close()


def drain_stomp(broker: Broker, timeout: float) -> list[Arrival]:
    consumer = StompConsumer(broker.stomp_port)
    try:
        consumer.subscribe()
        consumer.send(SENTINEL)
        arrivals = consumer.until_sentinel(timeout)
        time.sleep(0.3)  # waiting for an absence: anything after the sentinel would be a surprise worth seeing
        consumer.barrier()
        with consumer._cond:
            arrivals = list(consumer.arrivals)
    finally:
        consumer.close()
    return [a for a in arrivals if a.body != SENTINEL]


def drain_mqtt(broker: Broker, timeout: float) -> tuple[list[Arrival], bool]:
    sub = MqttSubscriber(broker.mqtt_port)
    try:
        present = bool(sub.present)
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"crash-sentinel-{os.getpid()}", protocol=mqtt.MQTTv311)
        pub.connect(HOST, broker.mqtt_port)
        pub.loop_start()
        try:
            info = pub.publish(MQTT_TOPIC, SENTINEL.encode(), qos=1)
            info.wait_for_publish(15)
        finally:
            pub.disconnect()
            pub.loop_stop()
        sub.until_sentinel(timeout)
        time.sleep(0.3)  # waiting for an absence: anything after the sentinel would be a surprise worth seeing
        sub.barrier()  # paho acked each QoS 1 message before this publish: the acks are on disk
        with sub._cond:
            arrivals = list(sub.arrivals)
    finally:
        sub.close()
    return [a for a in arrivals if a.body != SENTINEL], present


# -- the stream ------------------------------------------------------------------------

STREAM_CONFIG = """
[streams.crash]
destinations = ["queue://crash", "topic://crash.>"]
partitions = 2
"""


def read_stream(broker: Broker, name: str = "crash") -> dict[int, list[tuple[int, str]]]:
    """Every record of a stream over the admin API: partition -> [(offset, body)]."""
    import urllib.error

    base = f"http://{HOST}:{broker.admin_port}/api/v1/streams/{name}"
    try:
        return _read_stream(base)
    except urllib.error.HTTPError as exc:
        raise CrashError(f"reading the stream failed: {exc} {exc.read()!r}\nbroker output:\n{broker.tail(80)}") from None


def _read_stream(base: str) -> dict[int, list[tuple[int, str]]]:
    import urllib.request

    import pyarrow as pa

    with urllib.request.urlopen(base, timeout=30) as answer:
        info = json.load(answer)
    found: dict[int, list[tuple[int, str]]] = {}
    for part in info["partitions"]:
        index, position, latest = part["partition"], part["earliest"], part["latest"]
        records: list[tuple[int, str]] = []
        while position < latest:
            with urllib.request.urlopen(f"{base}/partitions/{index}/records?from={position}&to={latest}", timeout=30) as answer:
                table = pa.ipc.open_stream(io.BytesIO(answer.read())).read_all()
                position = int(answer.headers["X-Stream-Next-Offset"])
            records.extend(zip(table.column("offset").to_pylist(), (b.decode() for b in table.column("body").to_pylist())))
        found[index] = records
    return found


def reconcile_stream(ledgers: list[Ledger], partitions: dict[int, list[tuple[int, str]]]) -> dict[str, Any]:
    sent = {mid for ledger in ledgers for mid in ledger.sent}
    confirmed = {mid for ledger in ledgers for mid in ledger.confirmed}
    bodies: list[str] = []
    holes = 0
    for records in partitions.values():
        offsets = [offset for offset, _ in records]
        if offsets != list(range(len(offsets))):
            holes += 1
        bodies.extend(body for _, body in records if body != SENTINEL)
    counts: dict[str, int] = {}
    for body in bodies:
        counts[body] = counts.get(body, 0) + 1
    lost = sorted(confirmed - set(counts), key=_order_key)
    return {
        "records": len(bodies),
        "lost": len(lost),
        "lost_ids": lost[:10],
        "duplicated": sum(1 for n in counts.values() if n > 1),
        "unexpected": sum(1 for body in counts if body not in sent),
        "partitions_with_holes": holes,
        "recovered_unconfirmed": len(set(counts) - confirmed),
    }


# -- the cycles --------------------------------------------------------------------------


def run_cycles(
    data_dir: str | os.PathLike,
    cycles: int,
    *,
    seed: int | None = None,
    min_delay: float = 0.2,
    max_delay: float = 1.5,
    drain_timeout: float = 1800.0,
    check_resurrection: bool = True,
    consume: bool = False,
    stream: bool = False,
    log: Any = None,
) -> dict[str, Any]:
    """Run ``cycles`` crash cycles on a fresh data directory and reconcile; returns the summary.

    ``consume``: also run consumers during the cycles (a client-individual STOMP
    consumer acking each message, and ``crash-sub`` connected), so that kills
    land between deliveries and acks; what they got counts as arrived.  A copy
    arriving again after a kill must then carry redelivered:true / DUP.
    """
    data_dir = Path(data_dir)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise CrashError(f"{data_dir} is not empty: the driver needs a fresh data directory")
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    say = log or (lambda *a: None)
    stomp_ledger, mqtt_ledger = Ledger("stomp"), Ledger("mqtt")
    config = None
    if stream:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        config = str(data_dir.parent / "crash-stream.toml")
        Path(config).write_text(STREAM_CONFIG)
    broker = Broker(data_dir, config=config)
    stream_report: dict[str, Any] | None = None
    started = time.monotonic()
    problems: list[str] = []
    stomp_arrivals: list[Arrival] = []
    mqtt_arrivals: list[Arrival] = []
    resurrected = {"stomp": 0, "mqtt": 0}
    session_present = None
    try:
        broker.start()
        setup_subscriber(broker.mqtt_port)
        for cycle in range(1, cycles + 1):
            if not broker.running():
                broker.start()
            consumers: list[Any] = []
            if consume:
                stomp_consumer = StompConsumer(broker.stomp_port)
                stomp_consumer.subscribe()
                consumers = [stomp_consumer, MqttSubscriber(broker.mqtt_port)]
            producers = [StompProducer(broker.stomp_port, cycle, stomp_ledger), MqttProducer(broker.mqtt_port, cycle, mqtt_ledger)]
            for p in producers:
                p.start()
            delay = rng.uniform(min_delay, max_delay)
            time.sleep(delay)  # the fault's timing under test: a kill -9 at a random point of the load
            code = broker.kill()
            for p in producers:
                p.finish()
                if p.problem:
                    problems.append(f"cycle {cycle} {p.name}: {p.problem}")
            if consumers:
                stomp_arrivals.extend(consumers[0].abandon())
                mqtt_arrivals.extend(consumers[1].abandon())
            if code != -signal.SIGKILL:
                problems.append(f"cycle {cycle}: broker had exited ({code}) before the kill:\n{broker.tail()}")
            say(
                f"cycle {cycle}: killed after {delay:.2f}s; stomp sent {len(stomp_ledger.sent)} "
                f"confirmed {len(stomp_ledger.confirmed)}, mqtt sent {len(mqtt_ledger.sent)} "
                f"confirmed {len(mqtt_ledger.confirmed)}"
            )
        broker.start()
        stomp_arrivals.extend(drain_stomp(broker, drain_timeout))
        drained, session_present = drain_mqtt(broker, drain_timeout)
        mqtt_arrivals.extend(drained)
        if stream:
            stream_report = reconcile_stream([stomp_ledger, mqtt_ledger], read_stream(broker))
        if check_resurrection:
            # Every ack is known to be on disk (barriers above): a kill now must bring nothing back.
            broker.kill()
            broker.start()
            resurrected["stomp"] = len(drain_stomp(broker, 60))
            again, _ = drain_mqtt(broker, 60)
            resurrected["mqtt"] = len(again)
        code = broker.stop()
        if code != 0:
            problems.append(f"clean shutdown (SIGTERM) exited {code}:\n{broker.tail()}")
    finally:
        broker.ensure_dead()
    stomp_report = reconcile(stomp_ledger, stomp_arrivals)
    mqtt_report = reconcile(mqtt_ledger, mqtt_arrivals)
    stomp_report["resurrected"] = resurrected["stomp"]
    mqtt_report["resurrected"] = resurrected["mqtt"]
    mqtt_report["session_present"] = session_present
    summary: dict[str, Any] = {"cycles": cycles, "seed": seed}
    for key in ("sent", "confirmed", "recovered", "lost", "duplicated", "out_of_order", "unexpected", "resurrected"):
        summary[key] = stomp_report[key] + mqtt_report[key]
    summary["stomp"] = stomp_report
    summary["mqtt"] = mqtt_report
    summary["consume"] = consume
    if stream_report is not None:
        summary["stream"] = stream_report
    summary["broker_starts"] = broker.starts
    summary["max_start_seconds"] = round(max(broker.start_seconds, default=0.0), 2)
    summary["problems"] = problems
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.crash", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--data-dir", help="a fresh (absent or empty) directory; default: a temporary one")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--min-delay", type=float, default=0.2)
    parser.add_argument("--max-delay", type=float, default=1.5)
    parser.add_argument("--consume", action="store_true", help="consumers run during the cycles too (see run_cycles)")
    parser.add_argument("--stream", action="store_true", help="the broker also keeps a stream of both destinations, checked at the end")
    parser.add_argument("--quiet", action="store_true", help="no per-cycle lines on stderr")
    args = parser.parse_args(argv)
    logging.getLogger("stomp.py").setLevel(logging.CRITICAL)
    logging.getLogger("stomp").setLevel(logging.CRITICAL)
    options = {"seed": args.seed, "min_delay": args.min_delay, "max_delay": args.max_delay, "consume": args.consume, "stream": args.stream}
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    if args.data_dir:
        summary = run_cycles(args.data_dir, args.cycles, log=say, **options)
    else:
        with tempfile.TemporaryDirectory(prefix="crash-") as tmp:
            summary = run_cycles(Path(tmp) / "data", args.cycles, log=say, **options)
    print(json.dumps(summary, indent=2))
    ok = summary["lost"] == 0 and summary["duplicated"] == 0 and summary["resurrected"] == 0
    if "stream" in summary:
        figures = summary["stream"]
        ok = ok and not (figures["lost"] or figures["duplicated"] or figures["unexpected"] or figures["partitions_with_holes"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
