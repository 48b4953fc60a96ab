"""The generator's roles: each runs in its own process and reports counts and times.

A role connects and subscribes first, says it is ready, and starts its clock
only when the parent says go, so setup never counts.  Times are
``time.monotonic()``, one clock for every process on the machine, so a
publisher's first send and a subscriber's last receive can be subtracted.
CPU is the role's own rusage over the timed part.
"""
from __future__ import annotations

import resource
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable, cast

from gateway.clients.perf.wire import (
    PUBACK,
    PerfError,
    PrefixCounter,
    Wire,
    mqtt_connect_bytes,
    mqtt_handshake,
    mqtt_packets,
    mqtt_puback_bytes,
    mqtt_publish_bytes,
    mqtt_subscribe,
    stomp_expect,
    stomp_frame,
    stomp_frames,
    stomp_handshake,
)

BATCH = 1000  # messages per write when nothing limits the window
IDLE = 15.0  # seconds without progress before a receiver gives up and reports what it has


@dataclass
class Target:
    host: str
    stomp_port: int
    mqtt_port: int
    login: str | None = None
    passcode: str | None = None


def _socket(key: selectors.SelectorKey) -> socket.socket:
    """The socket a selector key stands for: only sockets are registered (typeshed allows any file)."""
    return cast(socket.socket, key.fileobj)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Run:
    """The role's side of the handshake with the parent: ready, go, result."""

    def __init__(self, pipe: Any, go: Any) -> None:
        self.pipe = pipe
        self.go = go
        self.cpu0 = 0.0

    def ready_and_wait(self) -> None:
        self.pipe.send(("ready", None))
        if not self.go.wait(120):
            raise PerfError("the run never started")
        self.cpu0 = _cpu()

    def result(self, **fields: Any) -> None:
        fields["cpu"] = _cpu() - self.cpu0
        self.pipe.send(("result", fields))


def payload_of(size: int) -> bytes:
    """Printable, NUL-free, and unlike any packet header, so byte counting stays exact."""
    return (b"perf-payload-" * (size // 13 + 1))[:size]


def send_windowed(wire: Wire, frames: list[bytes], inflight: int, confirmations: Callable[[bytes], int]) -> tuple[int, int]:
    """Send with at most ``inflight`` unconfirmed, topping the window up in one write;
    ``confirmations`` counts the PUBACKs or RECEIPTs in what came back.  (sent, confirmed)."""
    count = len(frames)
    sent = acked = 0
    while acked < count:
        if sent < count and sent - acked < inflight:
            n = min(inflight - (sent - acked), count - sent)
            wire.send(b"".join(frames[sent:sent + n]))
            sent += n
        data = wire.recv(IDLE)
        if not data:
            break
        acked += confirmations(data)
    return sent, acked


# -- MQTT ----------------------------------------------------------------------


def mqtt_qos0_subscriber(run: Run, target: Target, topic: str, count: int, size: int, client_id: str) -> None:
    wire = Wire(target.host, target.mqtt_port)
    mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
    mqtt_subscribe(wire, topic, 0)
    packet = mqtt_publish_bytes(topic, payload_of(size), 0)
    counter = PrefixCounter(packet[: len(packet) - size])
    run.ready_and_wait()
    t_last = None
    while counter.count < count:
        data = wire.recv(IDLE)
        if not data:
            break
        counter.feed(data)
        t_last = time.monotonic()
    exact = counter.bytes == counter.count * len(packet)
    run.result(received=counter.count, t_last=t_last, exact=exact, bytes=counter.bytes - counter.count * (len(packet) - size))
    wire.close()


def mqtt_fanout_subscribers(run: Run, target: Target, topic: str, count: int, size: int, ids: list[str]) -> None:
    """Several subscribers in one process: one selector, one counter per socket."""
    packet = mqtt_publish_bytes(topic, payload_of(size), 0)
    prefix = packet[: len(packet) - size]
    wires = []
    for client_id in ids:
        wire = Wire(target.host, target.mqtt_port)
        mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
        mqtt_subscribe(wire, topic, 0)
        wires.append(wire)
    counters = [PrefixCounter(prefix) for _ in wires]
    sel = selectors.DefaultSelector()
    for i, wire in enumerate(wires):
        wire.sock.setblocking(False)
        sel.register(wire.sock, selectors.EVENT_READ, i)
    run.ready_and_wait()
    open_, t_last = len(wires), None
    last_progress = time.monotonic()
    while open_:
        events = sel.select(1.0)
        now = time.monotonic()
        if not events and now - last_progress > IDLE:
            break
        for key, _ in events:
            i = key.data
            data = wires[i].sock.recv(1 << 18)
            if not data:
                raise PerfError("the broker closed a fan-out subscriber")
            counters[i].feed(data)
            last_progress = t_last = now
            if counters[i].count >= count:
                sel.unregister(wires[i].sock)
                open_ -= 1
    received = sum(c.count for c in counters)
    exact = all(c.bytes == c.count * len(packet) for c in counters)
    run.result(received=received, t_last=t_last, exact=exact, bytes=received * size)
    for wire in wires:
        wire.close()


def mqtt_qos0_publisher(run: Run, target: Target, topic: str, count: int, size: int, client_id: str) -> None:
    wire = Wire(target.host, target.mqtt_port)
    mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
    packet = mqtt_publish_bytes(topic, payload_of(size), 0)
    batch = packet * BATCH
    run.ready_and_wait()
    t_first = time.monotonic()
    full, rest = divmod(count, BATCH)
    for _ in range(full):
        wire.send(batch)
    wire.send(packet * rest + b"\xe0\x00")  # DISCONNECT: the broker reads everything before it
    run.result(sent=count, t_first=t_first, t_done=time.monotonic())
    wire.close()


def mqtt_qos1_subscriber(run: Run, target: Target, topic: str, count: int, size: int, client_id: str, latency: bool = False) -> None:
    wire = Wire(target.host, target.mqtt_port)
    mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
    mqtt_subscribe(wire, topic, 1)
    run.ready_and_wait()
    received = wrong = 0
    delays: list[int] = []
    t_last = None
    buf = wire.buf
    while received < count:
        data = wire.recv(IDLE)
        if not data:
            break
        now_ns = time.monotonic_ns()
        buf += data
        acks = []
        for b0, start, end in mqtt_packets(buf):
            if b0 & 0xF0 != 0x30:
                continue
            topic_len = (buf[start] << 8) | buf[start + 1]
            p = start + 2 + topic_len
            if b0 & 0x06:
                acks.append(mqtt_puback_bytes((buf[p] << 8) | buf[p + 1]))
                p += 2
            if end - p != size:
                wrong += 1
            if latency:
                delays.append(now_ns - struct.unpack_from(">Q", buf, p)[0])
            received += 1
        if acks:
            wire.send(b"".join(acks))
        t_last = time.monotonic()
    run.result(received=received, t_last=t_last, exact=wrong == 0, bytes=received * size, delays=delays)
    wire.close()


def mqtt_qos1_publisher(run: Run, target: Target, topic: str, count: int, size: int, client_id: str, inflight: int) -> None:
    wire = Wire(target.host, target.mqtt_port)
    mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
    payload = payload_of(size)
    packets = [mqtt_publish_bytes(topic, payload, 1, i % 65535 + 1) for i in range(count)]
    buf = wire.buf

    def pubacks(data: bytes) -> int:
        buf.extend(data)
        return sum(1 for b0, _, _ in mqtt_packets(buf) if b0 == PUBACK)

    run.ready_and_wait()
    t_first = time.monotonic()
    sent, acked = send_windowed(wire, packets, inflight, pubacks)
    t_done = time.monotonic()
    wire.send(b"\xe0\x00")
    run.result(sent=sent, acked=acked, t_first=t_first, t_done=t_done)
    wire.close()


def mqtt_paced_publisher(run: Run, target: Target, topic: str, rate: int, duration: float, size: int, client_id: str) -> None:
    """QoS 1 at a fixed rate, each payload starting with its send time (ns)."""
    wire = Wire(target.host, target.mqtt_port)
    mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
    count = int(rate * duration)
    pad = payload_of(max(0, size - 8))
    run.ready_and_wait()
    t_first = time.monotonic()
    acked = 0
    buf = wire.buf
    for i in range(count):
        due = t_first + i / rate
        while True:
            left = due - time.monotonic()
            if left <= 0:
                break
            data = wire.recv(left)  # read PUBACKs while waiting for the slot
            if data:
                buf += data
                acked += sum(1 for b0, _, _ in mqtt_packets(buf) if b0 == PUBACK)
        payload = struct.pack(">Q", time.monotonic_ns()) + pad
        wire.send(mqtt_publish_bytes(topic, payload, 1, i % 65535 + 1))
    deadline = time.monotonic() + IDLE
    while acked < count and time.monotonic() < deadline:
        data = wire.recv(1.0)
        if data:
            buf += data
            acked += sum(1 for b0, _, _ in mqtt_packets(buf) if b0 == PUBACK)
    wire.send(b"\xe0\x00")
    run.result(sent=count, acked=acked, t_first=t_first, t_done=time.monotonic())
    wire.close()


def mqtt_storm(run: Run, target: Target, count: int, prefix: str, finished: Any, release: Any, delay: float = 0.0) -> None:
    """A reconnect storm: ``count`` clients connect at once (no window), as a site's devices do
    after a network blip, each with a 60 s keep-alive.

    Every connect is started before any CONNACK is awaited, so the broker's
    accept queue sees the whole burst.  Once every client has its CONNACK (or
    failed), each sends a PINGREQ: a PINGRESP proves the connection outlived
    the storm.  ``finished`` counts the storm processes that are done (the
    watcher stops on it); the sockets stay open until ``release``.  The storm
    starts ``delay`` seconds after go, so the watcher measures a quiet broker
    first.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    connects = [mqtt_connect_bytes(f"{prefix}-{i}", keep_alive=60, login=target.login, passcode=target.passcode) for i in range(count)]
    run.ready_and_wait()
    time.sleep(delay)  # the watcher's quiet baseline first
    t_first = time.monotonic()
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((target.host, target.mqtt_port))
        sel.register(s, selectors.EVENT_WRITE, [i, b"", 0.0])
        socks.append(s)
    accepted = refused = failed = 0
    connect_times: list[float] = []
    alive: list[socket.socket] = []
    pending = count
    deadline = time.monotonic() + 180
    while pending and time.monotonic() < deadline:
        for key, mask in sel.select(1.0):
            s, state = _socket(key), key.data
            if mask & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    failed += 1
                    pending -= 1
                    sel.unregister(s)
                    continue
                s.send(connects[state[0]])
                sel.modify(s, selectors.EVENT_READ, state)
                continue
            try:
                data = s.recv(16)
            except OSError:
                data = b""
            if not data:
                failed += 1
                pending -= 1
                sel.unregister(s)
                continue
            state[1] += data
            if len(state[1]) >= 4:
                pending -= 1
                sel.unregister(s)
                if state[1][0] == 0x20 and state[1][3] == 0:
                    accepted += 1
                    connect_times.append(time.monotonic() - t_first)
                    alive.append(s)
                else:
                    refused += 1
    t_done = time.monotonic()
    # Still connected afterwards?  One PINGREQ each, and count the PINGRESPs.
    pongs = 0
    for s in alive:
        try:
            s.send(b"\xc0\x00")
            sel.register(s, selectors.EVENT_READ)
        except OSError:
            pass
    deadline = time.monotonic() + 30
    while pongs < len(alive) and time.monotonic() < deadline:
        for key, _ in sel.select(1.0):
            try:
                data = _socket(key).recv(16)
            except OSError:
                data = b""
            sel.unregister(key.fileobj)
            if data.startswith(b"\xd0\x00"):
                pongs += 1
    with finished.get_lock():
        finished.value += 1
    connect_times.sort()
    run.result(
        sent=count, received=accepted, refused=refused, failed=failed, alive=pongs, t_first=t_first, t_done=t_done,
        connect_p50=connect_times[len(connect_times) // 2] if connect_times else None,
        connect_max=connect_times[-1] if connect_times else None,
    )
    release.wait(120)
    for s in socks:
        s.close()


def mqtt_watcher(run: Run, target: Target, topic: str, client_id: str, rate: int, finished: Any, storms: int) -> None:
    """A client connected before the storm: QoS 0 round trips through the broker at ``rate``/s.

    It subscribes to its own topic and times each message from its publish to
    its delivery, until every storm process is done and a second after, so
    the parent can compare the latency before and during the storm.
    """
    wire = Wire(target.host, target.mqtt_port)
    mqtt_handshake(wire, client_id, login=target.login, passcode=target.passcode)
    mqtt_subscribe(wire, topic, 0)
    run.ready_and_wait()
    samples: list[tuple[float, float]] = []  # (send time, round trip) in seconds
    buf = wire.buf
    interval = 1.0 / rate
    t_first = time.monotonic()
    stop_at: float | None = None
    next_send = t_first
    sent = 0
    while stop_at is None or time.monotonic() < stop_at:
        now = time.monotonic()
        if now >= next_send:
            wire.send(mqtt_publish_bytes(topic, struct.pack(">d", now), 0))
            sent += 1
            next_send += interval
        data = wire.recv(max(0.0005, next_send - time.monotonic()))
        if data:
            buf += data
            arrived = time.monotonic()
            for b0, _, end in mqtt_packets(buf):
                if b0 >> 4 == 3:  # a PUBLISH back: its payload is the send time, in its last 8 bytes
                    sent_at = struct.unpack(">d", bytes(buf[end - 8:end]))[0]
                    samples.append((sent_at, arrived - sent_at))
        if stop_at is None and finished.value >= storms:
            stop_at = time.monotonic() + 1.0
    wire.send(b"\xe0\x00")
    run.result(sent=sent, received=len(samples), samples=samples, t_first=t_first, t_done=time.monotonic())
    wire.close()


# -- STOMP ---------------------------------------------------------------------


def stomp_consumer(run: Run, target: Target, queue: str, count: int, ack: str, client_id: str) -> None:
    wire = Wire(target.host, target.stomp_port)
    stomp_handshake(wire, target.login, target.passcode, client_id)
    wire.send(stomp_frame("SUBSCRIBE", {"destination": queue, "id": "1", "ack": ack, "receipt": "sub"}))
    stomp_expect(wire, b"RECEIPT")
    run.ready_and_wait()
    received = 0
    t_last = None
    if ack == "auto":
        # Every frame from here is a MESSAGE ending in one NUL: count NULs in C.
        heads = PrefixCounter(b"MESSAGE\n")
        while received < count:
            data = wire.recv(IDLE)
            if not data:
                break
            received += data.count(b"\0")
            heads.feed(data)
            t_last = time.monotonic()
        exact = heads.count == received
    else:
        buf = wire.buf
        exact = True
        while received < count:
            data = wire.recv(IDLE)
            if not data:
                break
            buf += data
            acks = []
            for start, end in stomp_frames(buf):
                if buf[start:start + 8] != b"MESSAGE\n":
                    raise PerfError(f"unexpected frame {bytes(buf[start:end])[:200]!r}")
                i = buf.find(b"\nack:", start, end)
                if i < 0:
                    exact = False
                    continue
                j = buf.find(b"\n", i + 5, end)
                acks.append(b"ACK\nid:" + bytes(buf[i + 5:j]) + b"\n\n\0")
                received += 1
            if acks:
                wire.send(b"".join(acks))
            t_last = time.monotonic()
    wire.send(stomp_frame("DISCONNECT", {"receipt": "bye"}))
    run.result(received=received, t_last=t_last, exact=exact, bytes=None)
    wire.close()


def stomp_producer(run: Run, target: Target, queue: str, count: int, size: int, client_id: str, persistent: bool, inflight: int) -> None:
    wire = Wire(target.host, target.stomp_port)
    stomp_handshake(wire, target.login, target.passcode, client_id)
    body = payload_of(size)
    headers = {"destination": queue, "content-length": str(size), "persistent": "true" if persistent else "false"}
    if not persistent:
        frame = stomp_frame("SEND", headers, body)
        batch = frame * BATCH
        run.ready_and_wait()
        t_first = time.monotonic()
        full, rest = divmod(count, BATCH)
        for _ in range(full):
            wire.send(batch)
        # The DISCONNECT receipt comes once the broker has read every SEND before it.
        wire.send(frame * rest + stomp_frame("DISCONNECT", {"receipt": "done"}))
        stomp_expect(wire, b"RECEIPT", timeout=300)
        run.result(sent=count, acked=count, t_first=t_first, t_done=time.monotonic())
        wire.close()
        return
    frames = [stomp_frame("SEND", {**headers, "receipt": str(i)}, body) for i in range(count)]

    def receipts(data: bytes) -> int:
        if b"ERROR" in data:
            raise PerfError(f"the broker refused a SEND: {data[:300]!r}")
        return data.count(b"\0")  # every frame back is a RECEIPT ending in one NUL

    run.ready_and_wait()
    t_first = time.monotonic()
    sent, acked = send_windowed(wire, frames, inflight, receipts)
    t_done = time.monotonic()
    wire.send(stomp_frame("DISCONNECT", {}))
    run.result(sent=sent, acked=acked, t_first=t_first, t_done=t_done)
    wire.close()
