"""The load generator's counting: exact at every chunk boundary, and a wrong stream is caught."""
from __future__ import annotations

from gateway.clients.perf.roles import payload_of
from gateway.clients.perf.wire import (
    PrefixCounter,
    mqtt_packets,
    mqtt_publish_bytes,
    stomp_frames,
)

TOPIC = "perf/qos0/t"


def publish_stream(count: int, size: int = 64) -> tuple[bytes, bytes]:
    packet = mqtt_publish_bytes(TOPIC, payload_of(size), 0)
    return packet, packet * count


def test_prefix_counter_counts_every_packet_whatever_the_chunking():
    packet, stream = publish_stream(50)
    prefix = packet[: len(packet) - 64]
    for chunk in (1, 2, 3, len(prefix) - 1, len(prefix), len(packet) - 1, len(packet) + 1, 997, len(stream)):
        counter = PrefixCounter(prefix)
        for i in range(0, len(stream), chunk):
            counter.feed(stream[i:i + chunk])
        assert counter.count == 50, chunk
        assert counter.bytes == 50 * len(packet)


def test_a_foreign_packet_breaks_the_byte_check():
    """A PINGRESP (or a short PUBLISH) in the stream must not pass as a clean run."""
    packet, stream = publish_stream(10)
    counter = PrefixCounter(packet[: len(packet) - 64])
    counter.feed(stream[:200] + b"\xd0\x00" + stream[200:])
    assert counter.count == 10
    assert counter.bytes != counter.count * len(packet)


def test_payload_never_contains_the_prefix():
    packet, _ = publish_stream(1)
    prefix = packet[:-64]
    for size in (8, 64, 1000):
        assert prefix not in payload_of(size) * 3
        assert b"\0" not in payload_of(size)


def test_mqtt_packets_walks_headers_and_keeps_a_partial_tail():
    big = mqtt_publish_bytes(TOPIC, b"x" * 300, 1, 7)  # two-byte remaining length
    stream = bytearray(b"\x40\x02\x00\x01" + big + b"\x40\x02\x00")
    found = [(b0, end - start) for b0, start, end in mqtt_packets(stream)]
    assert found == [(0x40, 2), (0x32, len(big) - 3)]
    assert stream == bytearray(b"\x40\x02\x00")  # the incomplete PUBACK waits for its last byte
    stream += b"\x02"
    assert [b0 for b0, _, _ in mqtt_packets(stream)] == [0x40]
    assert stream == bytearray()


def test_stomp_frames_skip_heartbeats_and_wait_for_the_nul():
    buf = bytearray(b"\nMESSAGE\nack:1\n\nhello\0\r\nRECEIPT\nreceipt-id:9\n\n\0MESS")
    frames = [bytes(buf[s:e]) for s, e in stomp_frames(buf)]
    assert frames == [b"MESSAGE\nack:1\n\nhello", b"RECEIPT\nreceipt-id:9\n\n"]
    assert buf == bytearray(b"MESS")
