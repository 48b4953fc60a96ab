"""STOMP framing over a real socket: everything a correct client may send.

Version negotiation, CONNECT/STOMP, bodies with and without content-length,
line endings, header escaping per version, repeated headers, receipts,
split and coalesced frames, heart-beats.  Raw sockets, because these are
the details client libraries hide.
"""
from __future__ import annotations

import socket
import time
from typing import Any, Iterator

import pytest

from protocols.stomp.codec import Frame, unescape_header
from tests.support import BrokerHandle, RawStomp, make_config


class Client(RawStomp):
    """RawStomp that also keeps every byte the broker sent, to check the wire form."""

    def __init__(self, handle: BrokerHandle, version: str = "1.2") -> None:
        super().__init__(handle, version)
        self.raw = bytearray()

    def _recv(self, timeout: float) -> bytes:
        self.sock.settimeout(max(0.01, timeout))
        data = self.sock.recv(65536)
        self.raw += data
        return data

    def read(self, timeout: float = 5.0) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no frame from the broker in time")
            data = self._recv(left)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self._recv(deadline - time.monotonic())
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not data:
                return True
            self.frames.extend(self.decoder.feed(data))
        return False

    def expect(self, command: str, timeout: float = 5.0) -> Frame:
        frame = self.read(timeout)
        assert frame.command == command, frame
        return frame


def client(handle: BrokerHandle, version: str = "1.2", **headers: str) -> Client:
    c = Client(handle, version)
    c.connect(version, **headers)
    return c


def subscribe(c: Client, destination: str, sub_id: str = "s1", ack: str = "auto", **headers: str) -> None:
    c.frame("SUBSCRIBE", {"destination": destination, "id": sub_id, "ack": ack, "receipt": "sub-" + sub_id, **headers})
    assert c.expect("RECEIPT").headers["receipt-id"] == "sub-" + sub_id


# -- version negotiation ------------------------------------------------------


def test_no_accept_version_means_1_0(broker):
    c = Client(broker, "1.0")
    c.frame("CONNECT", {"host": "localhost"})
    connected = c.expect("CONNECTED")
    assert connected.headers["version"] == "1.0"
    assert "heart-beat" not in connected.headers  # heart-beating is 1.1+
    # Behaves as 1.0: SUBSCRIBE without id is fine there.
    c.frame("SUBSCRIBE", {"destination": "/queue/v10", "receipt": "r"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r"
    c.frame("SEND", {"destination": "/queue/v10"}, b"hi")
    message = c.expect("MESSAGE")
    assert message.body == b"hi"
    c.close()


@pytest.mark.parametrize("offered, agreed", [("1.0", "1.0"), ("1.0,1.1", "1.1"), ("1.1,1.2", "1.2"), ("1.2,1.0,1.1", "1.2"), ("1.1, 2.0", "1.1")])
def test_version_negotiation_picks_highest_common(broker, offered, agreed):
    c = Client(broker, agreed)
    c.frame("CONNECT", {"accept-version": offered, "host": "localhost"})
    assert c.expect("CONNECTED").headers["version"] == agreed
    c.close()


def test_unsupported_version_is_refused_with_supported_list(broker):
    c = Client(broker, "1.2")
    c.frame("CONNECT", {"accept-version": "2.0", "host": "localhost"})
    error = c.expect_error_and_close()
    assert set(error.headers["version"].split(",")) == {"1.0", "1.1", "1.2"}
    assert error.body  # says why


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
def test_connect_and_stomp_commands_both_connect(broker, command):
    c = Client(broker, "1.2")
    c.frame(command, {"accept-version": "1.2", "host": "localhost"})
    connected = c.expect("CONNECTED")
    assert connected.headers["version"] == "1.2"
    assert connected.headers["server"]
    assert connected.headers["session"]
    subscribe(c, "/queue/cmd")
    c.frame("SEND", {"destination": "/queue/cmd"}, b"x")
    assert c.expect("MESSAGE").body == b"x"
    c.close()


def test_connected_has_server_and_distinct_sessions(broker):
    a, b = Client(broker), Client(broker)
    ha = a.connect("1.2").headers
    hb = b.connect("1.2").headers
    assert ha["server"] and hb["server"]
    assert ha["session"] and hb["session"] and ha["session"] != hb["session"]
    a.close()
    b.close()


# -- bodies -------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_binary_body_with_nul_bytes_arrives_intact(broker, version):
    body = bytes(range(256)) * 3
    consumer = client(broker, version)
    subscribe(consumer, "/queue/bin")
    producer = client(broker, version)
    producer.frame("SEND", {"destination": "/queue/bin", "content-length": str(len(body)), "content-type": "application/octet-stream"}, body)
    message = consumer.expect("MESSAGE")
    assert message.body == body
    assert message.headers["content-length"] == str(len(body))
    assert message.headers["content-type"] == "application/octet-stream"
    consumer.close()
    producer.close()


def test_body_without_content_length_ends_at_nul(broker):
    c = client(broker)
    subscribe(c, "/queue/plain")
    c.send(b"SEND\ndestination:/queue/plain\n\nhello world\nsecond line\0")
    c.send(b"SEND\ndestination:/queue/plain\n\n\0")  # empty body
    first = c.expect("MESSAGE")
    assert first.body == b"hello world\nsecond line"
    assert c.expect("MESSAGE").body == b""
    c.close()


def test_utf8_text_body(broker):
    c = client(broker)
    subscribe(c, "/queue/utf8")
    text = "héllo wörld ✓ 日本".encode()
    c.frame("SEND", {"destination": "/queue/utf8", "content-type": "text/plain;charset=utf-8"}, text)
    assert c.expect("MESSAGE").body == text
    c.close()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_crlf_line_endings(broker, version):
    c = Client(broker, version)
    accept = "" if version == "1.0" else f"accept-version:{version}\r\n"
    c.send(f"CONNECT\r\n{accept}host:localhost\r\n\r\n\0".encode())
    assert c.expect("CONNECTED").headers["version"] == version
    c.send(b"SUBSCRIBE\r\ndestination:/queue/crlf\r\nid:s1\r\nreceipt:r1\r\n\r\n\0")
    assert c.expect("RECEIPT").headers["receipt-id"] == "r1"
    c.send(b"SEND\r\ndestination:/queue/crlf\r\nx-h:v\r\n\r\nline1\r\nline2\0\r\n")
    message = c.expect("MESSAGE")
    assert message.headers["x-h"] == "v"  # no stray CR kept in a value
    assert message.headers["destination"] == "/queue/crlf"
    assert message.body == b"line1\r\nline2"  # the body is not touched
    c.close()


# -- headers --------------------------------------------------------------------


@pytest.mark.parametrize("consumer_version", ["1.1", "1.2"])
def test_escaped_header_reaches_escaping_consumer_escaped_the_same_way(broker, consumer_version):
    value = "a:b\nc\\d"
    consumer = client(broker, consumer_version)
    subscribe(consumer, "/queue/esc")
    producer = client(broker, "1.2")
    producer.send(b"SEND\ndestination:/queue/esc\nx-h:a\\cb\\nc\\\\d\nx\\cname:v\n\nbody\0")
    message = consumer.expect("MESSAGE")
    assert b"\nx-h:a\\cb\\nc\\\\d\n" in consumer.raw  # escaped on the wire
    assert message.headers["x-h"] == value
    assert unescape_header("a\\cb\\nc\\\\d", consumer_version) == value
    assert message.headers["x:name"] == "v"  # escapes apply to names too
    consumer.close()
    producer.close()


def test_escaped_colon_reaches_1_0_consumer_raw(broker):
    consumer = client(broker, "1.0")
    subscribe(consumer, "/queue/esc10")
    producer = client(broker, "1.2")
    producer.send(b"SEND\ndestination:/queue/esc10\nx-h:a\\cb\\\\c\n\nbody\0")
    message = consumer.expect("MESSAGE")
    # 1.0 has no escaping: the value arrives as it is, the first ':' splits.
    assert b"\nx-h:a:b\\c\n" in consumer.raw
    assert message.headers["x-h"] == "a:b\\c"
    consumer.close()
    producer.close()


def test_1_0_sender_colon_and_backslash_are_literal(broker):
    consumer = client(broker, "1.2")
    subscribe(consumer, "/queue/lit10")
    producer = client(broker, "1.0")
    producer.send(b"SEND\ndestination:/queue/lit10\nx-h:a:b\\c\n\nbody\0")
    message = consumer.expect("MESSAGE")
    assert message.headers["x-h"] == "a:b\\c"
    assert b"\nx-h:a\\cb\\\\c\n" in consumer.raw
    consumer.close()
    producer.close()


def test_header_with_newline_to_1_0_consumer_is_left_out_not_fatal(broker):
    # 1.0 cannot carry a newline in a header; the message must still be delivered.
    consumer = client(broker, "1.0")
    subscribe(consumer, "/queue/nl10")
    producer = client(broker, "1.2")
    producer.send(b"SEND\ndestination:/queue/nl10\nx-nl:a\\nb\nx-ok:fine\nreceipt:r\n\nbody\0")
    assert producer.expect("RECEIPT").headers["receipt-id"] == "r"
    message = consumer.expect("MESSAGE")
    assert message.body == b"body"
    assert message.headers["x-ok"] == "fine"
    assert "x-nl" not in message.headers
    producer.frame("SEND", {"destination": "/queue/nl10"}, b"next")
    assert consumer.expect("MESSAGE").body == b"next"
    consumer.close()
    producer.close()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_repeated_header_first_wins(broker, version):
    c = client(broker, version)
    subscribe(c, "/queue/rep")
    c.send(b"SEND\ndestination:/queue/rep\nx:1\nx:2\n\nb\0")
    message = c.expect("MESSAGE")
    assert message.headers["x"] == "1"
    assert c.raw.count(b"\nx:") == 1  # the broker does not pass the loser on
    c.close()


def test_repeated_destination_first_wins(broker):
    c = client(broker)
    c.send(b"SEND\ndestination:/queue/first\ndestination:/queue/second\nreceipt:r\n\nb\0")
    assert c.expect("RECEIPT").headers["receipt-id"] == "r"
    assert broker.queue_depth("queue://first") == 1
    assert broker.queue_depth("queue://second") == 0
    c.close()


def test_header_value_may_be_empty_and_contain_spaces(broker):
    c = client(broker)
    subscribe(c, "/queue/sp")
    c.send(b"SEND\ndestination:/queue/sp\nx-empty:\nx-sp: padded value \n\nb\0")
    message = c.expect("MESSAGE")
    assert message.headers["x-empty"] == ""
    assert message.headers["x-sp"] == " padded value "  # not trimmed
    c.close()


# -- receipts -------------------------------------------------------------------


def test_receipt_for_every_command(broker):
    c = client(broker)
    c.frame("SUBSCRIBE", {"destination": "/queue/rc", "id": "s1", "ack": "client-individual", "receipt": "r-sub"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-sub"
    c.frame("SEND", {"destination": "/queue/rc", "receipt": "r-send"}, b"m")
    got = [c.read(), c.read()]
    receipts = [f for f in got if f.command == "RECEIPT"]
    (message,) = [f for f in got if f.command == "MESSAGE"]
    assert [r.headers["receipt-id"] for r in receipts] == ["r-send"]
    c.frame("BEGIN", {"transaction": "t1", "receipt": "r-begin"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-begin"
    c.frame("ACK", {"id": message.headers["ack"], "transaction": "t1", "receipt": "r-ack"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-ack"
    c.frame("COMMIT", {"transaction": "t1", "receipt": "r-commit"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-commit"
    c.frame("BEGIN", {"transaction": "t2"})
    c.frame("ABORT", {"transaction": "t2", "receipt": "r-abort"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-abort"
    c.frame("UNSUBSCRIBE", {"id": "s1", "receipt": "r-unsub"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-unsub"
    assert broker.queue_depth("queue://rc") == 0  # the committed ACK took effect
    c.frame("DISCONNECT", {"receipt": "r-bye"})
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-bye"
    assert c.closed_by_peer(2.0), "the broker kept the socket open after DISCONNECT's receipt"


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_ack_receipt_older_versions(broker, version):
    c = client(broker, version)
    c.frame("SUBSCRIBE", {"destination": "/queue/rc-old", "id": "s1", "ack": "client"})
    c.frame("SEND", {"destination": "/queue/rc-old"}, b"m")
    message = c.expect("MESSAGE")
    assert "ack" not in message.headers  # the 1.2 ack header is not sent to older clients
    ack = {"message-id": message.headers["message-id"], "receipt": "r-ack"}
    if version == "1.1":
        ack["subscription"] = "s1"
    c.frame("ACK", ack)
    assert c.expect("RECEIPT").headers["receipt-id"] == "r-ack"
    assert broker.queue_depth("queue://rc-old") == 0
    c.close()


def test_receipt_id_with_special_characters_round_trips(broker):
    c = client(broker)
    c.send(b"SEND\ndestination:/queue/rcs\nreceipt:a\\cb\\\\c\n\nm\0")
    receipt = c.expect("RECEIPT")
    assert receipt.headers["receipt-id"] == "a:b\\c"
    c.close()


def test_disconnect_without_receipt_closes(broker):
    c = client(broker)
    c.frame("DISCONNECT")
    assert c.closed_by_peer(2.0)


@pytest.mark.parametrize("ack, present", [("client", True), ("client-individual", True), ("auto", False)])
def test_ack_header_in_1_2(broker, ack, present):
    c = client(broker, "1.2")
    subscribe(c, "/queue/ackh", ack=ack)
    c.frame("SEND", {"destination": "/queue/ackh"}, b"m")
    message = c.expect("MESSAGE")
    assert ("ack" in message.headers) is present
    assert message.headers["subscription"] == "s1"
    if present:
        c.frame("ACK", {"id": message.headers["ack"], "receipt": "r"})
        assert c.expect("RECEIPT").headers["receipt-id"] == "r"
        assert broker.queue_depth("queue://ackh") == 0
    c.close()


# -- how bytes arrive -------------------------------------------------------------


def test_frames_sent_one_byte_at_a_time(broker):
    c = Client(broker, "1.2")
    data = (
        b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0"
        b"SUBSCRIBE\ndestination:/queue/drip\nid:s1\n\n\0"
        b"SEND\ndestination:/queue/drip\ncontent-length:5\nx-h:a\\cb\n\nab\0cd\0"
        b"SEND\r\ndestination:/queue/drip\r\n\r\nplain\0"
    )
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(len(data)):
        c.send(data[i : i + 1])
        time.sleep(0.002)  # pacing, so the broker reads byte by byte: it reports no reads to wait for
    assert c.expect("CONNECTED").headers["version"] == "1.2"
    first = c.expect("MESSAGE")
    assert first.body == b"ab\0cd"
    assert first.headers["x-h"] == "a:b"
    assert c.expect("MESSAGE").body == b"plain"
    c.close()


def test_coalesced_frames_in_one_write(broker):
    c = Client(broker, "1.2")
    c.send(
        b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0"
        b"SUBSCRIBE\ndestination:/queue/burst\nid:s1\n\n\0"
        + b"".join(b"SEND\ndestination:/queue/burst\ncontent-length:2\n\nm%d\0" % i for i in range(3))
    )
    assert c.expect("CONNECTED").headers["version"] == "1.2"
    assert [c.expect("MESSAGE").body for _ in range(3)] == [b"m0", b"m1", b"m2"]
    c.close()


def test_frames_split_at_awkward_places(broker):
    c = Client(broker, "1.2")
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pieces = [
        b"CONNECT\r", b"\naccept-version:1.2\r\nhost:localhost\r\n\r", b"\n\0\r", b"\nSUBSCRIBE\ndestina",
        b"tion:/queue/split\nid:s1\n", b"\n\0SEND\ndestination:/queue/split\ncontent-length:4\n\nab", b"\0d\0\n",
    ]
    for piece in pieces:
        c.send(piece)
        time.sleep(0.02)  # pacing, so each piece is a read of its own: the broker reports no reads to wait for
    c.expect("CONNECTED")
    assert c.expect("MESSAGE").body == b"ab\0d"
    c.close()


def test_heart_beat_eols_between_frames_are_ignored(broker):
    c = Client(broker, "1.2")
    c.send(b"\n\r\n\n")  # before CONNECT too
    c.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0\n\n")
    c.expect("CONNECTED")
    c.send(b"\r\n\nSUBSCRIBE\ndestination:/queue/eol\nid:s1\n\n\0\n")
    c.send(b"\n" * 100)
    c.send(b"SEND\ndestination:/queue/eol\n\none\0\r\n\r\nSEND\ndestination:/queue/eol\n\ntwo\0")
    assert [c.expect("MESSAGE").body, c.expect("MESSAGE").body] == [b"one", b"two"]
    c.frame("SEND", {"destination": "/queue/eol", "receipt": "r"}, b"three")
    got = {f.command for f in (c.read(), c.read())}
    assert got == {"MESSAGE", "RECEIPT"}
    c.close()


# -- heart-beating ------------------------------------------------------------------


@pytest.fixture
def fast_hb(tmp_path: Any) -> Iterator[BrokerHandle]:
    config = make_config(tmp_path)
    config.stomp_settings.heartbeat_send_ms = 100
    config.stomp_settings.heartbeat_receive_ms = 200
    handle = BrokerHandle(config)
    yield handle
    handle.stop()


def _heart_beat(frame: Frame) -> tuple[int, int]:
    sx, sy = frame.headers["heart-beat"].split(",")
    return int(sx), int(sy)


def test_heart_beat_negotiation_default_broker(broker):
    c = Client(broker)
    sx, sy = _heart_beat(c.connect("1.2", **{"heart-beat": "100,100"}))
    # The broker never promises more often than it can, nor wants to hear more often than it asked.
    assert sx >= 100 and sy >= 100
    c.close()
    c = Client(broker)
    assert _heart_beat(c.connect("1.2")) == (0, 0)  # no heart-beat header: none either way
    c.close()
    c = Client(broker)
    assert _heart_beat(c.connect("1.2", **{"heart-beat": "0,0"})) == (0, 0)
    c.close()


def test_heart_beat_negotiation_and_broker_sends_eols(fast_hb):
    c = Client(fast_hb)
    sx, sy = _heart_beat(c.connect("1.2", **{"heart-beat": "100,100"}))
    assert (sx, sy) == (100, 200)  # sends every max(100,100) ms, wants to hear every max(200,100) ms
    c.raw.clear()
    received = bytearray()
    end = time.monotonic() + 1.0
    next_beat = time.monotonic()
    c.sock.settimeout(0.02)
    while time.monotonic() < end:
        if time.monotonic() >= next_beat:
            c.send(b"\n")  # keep the broker happy while we count
            next_beat += 0.1
        try:
            data = c.sock.recv(4096)
        except socket.timeout:
            continue
        assert data, "the broker closed a connection that heart-beats"
        received += data
    assert set(received) <= {10}, received  # nothing but EOLs while idle
    beats = received.count(b"\n")
    assert 5 <= beats <= 15, f"expected about 10 heart-beats in 1 s at 100 ms, got {beats}"
    c.close()


def test_silent_client_is_disconnected_after_grace(fast_hb):
    c = Client(fast_hb)
    c.connect("1.2", **{"heart-beat": "100,0"})  # promises to send every 100 ms, then does not
    start = time.monotonic()
    assert not c.closed_by_peer(0.25), "closed before the grace period (2 x 200 ms)"
    error = c.expect_error_and_close(timeout=5.0)
    # Not before the grace period: a lower bound no slow machine can break (no upper one to flake).
    assert time.monotonic() - start >= 0.35
    assert "heart" in error.headers["message"].lower()


def test_client_sending_eols_is_kept(fast_hb):
    c = Client(fast_hb)
    c.connect("1.2", **{"heart-beat": "100,0"})
    subscribe(c, "/queue/hb-alive")
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        c.send(b"\n")
        time.sleep(0.1)  # the broker's own timer under test: a heart-beat every 100 ms, for longer than its grace
    c.frame("SEND", {"destination": "/queue/hb-alive"}, b"still here")
    assert c.expect("MESSAGE").body == b"still here"
    c.close()


def test_client_sending_frames_is_kept_without_eols(fast_hb):
    c = Client(fast_hb)
    c.connect("1.2", **{"heart-beat": "100,0"})
    end = time.monotonic() + 1.0
    n = 0
    while time.monotonic() < end:
        c.frame("SEND", {"destination": "/queue/hb-busy"}, b"x")
        n += 1
        time.sleep(0.1)  # the broker's own timer under test: a frame every 100 ms, for longer than its grace
    c.frame("SEND", {"destination": "/queue/hb-busy", "receipt": "r"}, b"x")
    assert c.expect("RECEIPT").headers["receipt-id"] == "r"
    assert fast_hb.queue_depth("queue://hb-busy") == n + 1
    c.close()


def test_heart_beat_off_by_client_means_no_timeout(fast_hb):
    c = Client(fast_hb)
    assert _heart_beat(c.connect("1.2", **{"heart-beat": "0,0"})) == (0, 0)
    time.sleep(0.6)  # waiting for an absence: no timeout, longer than the grace period the broker would use
    c.frame("SEND", {"destination": "/queue/hb-off", "receipt": "r"}, b"x")
    assert c.expect("RECEIPT").headers["receipt-id"] == "r"
    after_connected = bytes(c.raw).split(b"\0", 1)[1]
    assert after_connected.startswith(b"RECEIPT"), after_connected  # no heart-beats were sent either
    c.close()


# -- isolation ------------------------------------------------------------------------


def test_bad_client_does_not_disturb_another(broker):
    good = client(broker)
    subscribe(good, "/queue/iso")
    producer = client(broker)
    producer.frame("SEND", {"destination": "/queue/iso"}, b"before")
    assert good.expect("MESSAGE").body == b"before"
    bad = client(broker)
    bad.send(b"GARBAGE\n\n\0")
    bad.expect_error_and_close()
    bad2 = Client(broker)
    bad2.send(b"\xff\xfe\n\n\0")
    bad2.expect_error_and_close()
    producer.frame("SEND", {"destination": "/queue/iso"}, b"after")
    assert good.expect("MESSAGE").body == b"after"
    good.close()
    producer.close()
