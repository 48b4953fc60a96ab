"""What the load generator sends and how it counts what comes back.

Frames are encoded once, before the clock starts, with the project's own
codecs; on the receiving side the generator counts with C-speed byte
searches wherever the stream is regular, and walks packet headers (never
bytes) where it must read a field such as a packet id or an ack header.
The generator must cost much less per message than any broker it measures.
"""
from __future__ import annotations

import socket
import time
from typing import Iterator

from protocols.mqtt import codec as mq
from protocols.stomp.codec import encode_frame

MQTT_LEVEL = 4  # 3.1.1: what every MQTT broker speaks
PUBACK = 0x40


class PerfError(Exception):
    """The broker refused or broke the scenario (a CONNACK code, an ERROR frame, a close)."""


class Wire:
    """A blocking socket with one receive buffer; the generator's only I/O."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> bytes:
        """Next chunk from the socket ('' on timeout); a close is a PerfError."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 18)
        except (socket.timeout, BlockingIOError):
            return b""
        if not data:
            raise PerfError("the broker closed the connection")
        return data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# -- MQTT ----------------------------------------------------------------------


def mqtt_connect_bytes(client_id: str, keep_alive: int = 60, clean: bool = True,
                       login: str | None = None, passcode: str | None = None) -> bytes:
    password = None if passcode is None else passcode.encode()
    return mq.encode(mq.Connect("MQTT", MQTT_LEVEL, clean, keep_alive, client_id, login, password), MQTT_LEVEL)


def mqtt_publish_bytes(topic: str, payload: bytes, qos: int, packet_id: int | None = None) -> bytes:
    return mq.encode_publish(topic, payload, qos, False, False, packet_id, None, MQTT_LEVEL)


def mqtt_puback_bytes(packet_id: int) -> bytes:
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


def mqtt_packets(buf: bytearray) -> Iterator[tuple[int, int, int]]:
    """(first byte, body start, body end) of each whole packet in ``buf``; consumes them.

    Reads only the fixed header, so the cost is per packet, not per byte.
    """
    p, n = 0, len(buf)
    while p + 2 <= n:
        b0 = buf[p]
        length, shift, q = 0, 0, p + 1
        while True:
            if q >= n:
                del buf[:p]
                return
            b = buf[q]
            q += 1
            length |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        if q + length > n:
            break
        yield b0, q, q + length
        p = q + length
    del buf[:p]


def mqtt_handshake(wire: Wire, client_id: str, keep_alive: int = 60,
                   login: str | None = None, passcode: str | None = None) -> None:
    wire.send(mqtt_connect_bytes(client_id, keep_alive, login=login, passcode=passcode))
    first = mqtt_expect(wire, 0x20)
    if first[1] != 0:
        raise PerfError(f"CONNACK refused {client_id}: return code {first[1]}")


def mqtt_subscribe(wire: Wire, topic: str, qos: int) -> None:
    wire.send(mq.encode(mq.Subscribe(1, [mq.SubscriptionRequest(topic, qos)]), MQTT_LEVEL))
    granted = mqtt_expect(wire, 0x90)
    if granted[-1] not in (0, 1, 2):
        raise PerfError(f"SUBACK refused {topic}: {granted[-1]:#x}")


def mqtt_expect(wire: Wire, first_byte: int, timeout: float = 10.0) -> bytes:
    """Body of the next packet, which must have this first byte (CONNACK, SUBACK)."""
    deadline = time.monotonic() + timeout
    while True:
        for b0, start, end in mqtt_packets(wire.buf):
            if b0 != first_byte:
                raise PerfError(f"expected packet {first_byte:#x}, got {b0:#x}")
            body = bytes(wire.buf[start:end])
            del wire.buf[:end]
            return body
        left = deadline - time.monotonic()
        if left <= 0:
            raise PerfError(f"no packet {first_byte:#x} within {timeout} s")
        wire.buf += wire.recv(left)


class PrefixCounter:
    """Counts identical pre-encoded packets in a stream by their common prefix.

    ``bytes.count`` runs in C; a prefix split across two chunks is caught by
    keeping the last ``len(prefix) - 1`` bytes.  The total byte count is
    checked against count x packet size at the end, so a stray or short
    packet is found, not silently counted.
    """

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.keep = len(prefix) - 1
        self.tail = b""
        self.count = 0
        self.bytes = 0

    def feed(self, data: bytes) -> int:
        self.bytes += len(data)
        window = self.tail + data if self.tail else data
        found = window.count(self.prefix)
        # The kept tail is shorter than the prefix, so nothing is counted twice.
        self.tail = window[-self.keep:] if self.keep else b""
        self.count += found
        return found


# -- STOMP ---------------------------------------------------------------------


def stomp_frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    return encode_frame(command, headers, body, "1.2")


def stomp_frames(buf: bytearray) -> Iterator[tuple[int, int]]:
    """(start, end) of each whole frame in ``buf`` (end at its NUL); consumes them.

    Bodies here never hold a NUL (the generator sends printable payloads and
    brokers add none), so a frame ends at the next NUL; heart-beat EOLs
    between frames are skipped.
    """
    p = 0
    find = buf.find
    n = len(buf)
    while p < n:
        while p < n and buf[p] in (10, 13):
            p += 1
        end = find(b"\0", p)
        if end < 0:
            break
        yield p, end
        p = end + 1
    del buf[:p]


def stomp_handshake(wire: Wire, login: str | None, passcode: str | None, client_id: str) -> None:
    headers = {"accept-version": "1.2", "host": "/", "heart-beat": "0,0", "client-id": client_id}
    if login is not None:
        headers["login"] = login
    if passcode is not None:
        headers["passcode"] = passcode
    wire.send(stomp_frame("CONNECT", headers))
    stomp_expect(wire, b"CONNECTED")


def stomp_expect(wire: Wire, command: bytes, timeout: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        for start, end in stomp_frames(wire.buf):
            frame = bytes(wire.buf[start:end])
            if not frame.startswith(command + b"\n"):
                raise PerfError(f"expected {command.decode()}, got {frame[:200]!r}")
            # stomp_frames deletes consumed bytes when the loop ends; stop early here.
            rest = wire.buf[end + 1:]
            wire.buf[:] = rest
            return frame
        left = deadline - time.monotonic()
        if left <= 0:
            raise PerfError(f"no {command.decode()} within {timeout} s")
        wire.buf += wire.recv(left)
