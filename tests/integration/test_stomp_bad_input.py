"""Bad STOMP input over a real socket: an ERROR that says why, a close, and nothing else hurt.

Every case runs against a broker with small limits that already holds a few
messages; after the bad client is thrown out, those messages must still be
there and a fresh client must still be able to send and receive.
"""
from __future__ import annotations

import re
import socket
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from protocols.stomp.codec import Frame
from tests.support import BrokerHandle, RawStomp, connect, disconnect, make_config, wait_until

MAX_FRAME = 1024
MAX_HEADERS = 20
MAX_LINE = 256

KEEP = "/queue/keep"
KEPT = [b"kept-0", b"kept-1", b"kept-2"]


@pytest.fixture
def small(tmp_path: Any) -> Iterator[BrokerHandle]:
    """A broker with small limits that holds three messages on /queue/keep."""
    config = make_config(tmp_path)
    limits = config.stomp_settings.limits
    limits.max_frame_size = MAX_FRAME
    limits.max_headers = MAX_HEADERS
    limits.max_header_length = MAX_LINE
    handle = BrokerHandle(config)
    c = RawStomp(handle)
    c.connect("1.2")
    for i, body in enumerate(KEPT):
        c.frame("SEND", {"destination": KEEP, "receipt": f"k{i}"}, body)
        assert c.read().headers["receipt-id"] == f"k{i}"
    c.frame("DISCONNECT", {"receipt": "bye"})
    assert c.read().command == "RECEIPT"
    c.close()
    assert handle.queue_depth("queue://keep") == len(KEPT)
    yield handle
    handle.stop()


def assert_still_serving(handle: BrokerHandle, kept: list[bytes] = KEPT) -> None:
    """What was stored is still there and a new client can send and receive."""
    assert handle.queue_bodies("queue://keep") == kept
    conn, got = connect(handle, "1.2")
    conn.subscribe("/queue/probe", id="p", ack="auto")
    conn.send("/queue/probe", "ping")
    (message,) = got.wait_for(1)
    assert message.body == "ping"
    disconnect(conn)


def bad_client(handle: BrokerHandle, version: str | None) -> RawStomp:
    """Connected with ``version``, or not connected at all for None."""
    c = RawStomp(handle, version or "1.0")
    if version is not None:
        c.connect(version)
    return c


def send_ignoring_close(c: RawStomp, data: bytes) -> None:
    try:
        c.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the broker may already have closed on the first bad byte


@dataclass
class Case:
    id: str
    data: bytes
    message: str  # regex the ERROR's message header must match (case-insensitive)
    version: str | None = "1.2"  # None: do not CONNECT first
    body: str = ""  # regex the ERROR's body must match


def _headers(n: int) -> bytes:
    return b"".join(b"h%d:v\n" % i for i in range(n))


UNKNOWN_ACK = "unknown|not outstanding|no unacknowledged"

CASES = [
    Case("send-before-connect", b"SEND\ndestination:/queue/a\n\nx\0", "not connected", None, "CONNECT"),
    Case("subscribe-before-connect", b"SUBSCRIBE\ndestination:/queue/a\nid:1\n\n\0", "not connected", None),
    Case("unknown-command", b"FROB\n\n\0", "unknown command", body="FROB"),
    Case("lowercase-command", b"send\ndestination:/queue/a\n\nx\0", "unknown command"),
    Case("unknown-command-before-connect", b"HELLO\n\n\0", "unknown command", None),
    Case("nack-in-1.0", b"NACK\nmessage-id:ID:x\n\n\0", "unknown command", "1.0"),
    Case("header-without-colon", b"SEND\ndestination:/queue/a\nnocolon\n\nx\0", "malformed header", body="nocolon"),
    Case("header-without-name", b"SEND\ndestination:/queue/a\n:value\n\nx\0", "header"),
    Case("invalid-utf8-header-value", b"SEND\ndestination:/queue/a\nx-h:\xff\xfe\n\nx\0", "utf-8"),
    Case("invalid-utf8-header-name", b"SEND\ndestination:/queue/a\nx-\xc3(:v\n\nx\0", "utf-8"),
    Case("invalid-utf8-command", b"SE\xffND\ndestination:/queue/a\n\nx\0", "utf-8"),
    Case("invalid-utf8-before-connect", b"\xc3\x28\n\n\0", "utf-8", None),
    Case("control-char-command", b"SE\x01ND\n\n\0", "command"),
    Case("bad-escape-tab-1.2", b"SEND\ndestination:/queue/a\nx-h:a\\tb\n\nx\0", "escape", "1.2", r"\\t"),
    Case("bad-escape-cr-1.1", b"SEND\ndestination:/queue/a\nx-h:a\\rb\n\nx\0", "escape", "1.1", r"\\r"),
    Case("lone-backslash-1.2", b"SEND\ndestination:/queue/a\nx-h:ab\\\n\nx\0", "escape", "1.2"),
    Case("content-length-not-a-number", b"SEND\ndestination:/queue/a\ncontent-length:abc\n\nabc\0", "content-length", body="abc"),
    Case("content-length-negative", b"SEND\ndestination:/queue/a\ncontent-length:-1\n\n\0", "content-length"),
    Case("content-length-no-nul", b"SEND\ndestination:/queue/a\ncontent-length:3\n\nabcdef\0", "nul"),
    Case("too-many-headers", b"SEND\ndestination:/queue/a\n" + _headers(MAX_HEADERS) + b"\nx\0", "too many headers"),
    Case("header-line-too-long", b"SEND\ndestination:/queue/a\nx-h:" + b"v" * MAX_LINE + b"\n\nx\0", "too long"),
    Case("command-too-long", b"X" * 100 + b"\n\n\0", "command"),
    Case("send-without-destination", b"SEND\nx-h:1\n\nx\0", "destination"),
    Case("send-empty-destination", b"SEND\ndestination:\n\nx\0", "destination"),
    Case("send-unknown-prefix", b"SEND\ndestination:/foo/bar\n\nx\0", "destination", body="/foo/bar"),
    Case("send-empty-queue-name", b"SEND\ndestination:/queue/\n\nx\0", "destination"),
    Case("send-wildcard-star", b"SEND\ndestination:/topic/a.*\n\nx\0", "wildcard"),
    Case("send-wildcard-gt", b"SEND\ndestination:/topic/a.>\n\nx\0", "wildcard"),
    Case("subscribe-without-id-1.1", b"SUBSCRIBE\ndestination:/queue/a\n\n\0", "id", "1.1"),
    Case("subscribe-without-id-1.2", b"SUBSCRIBE\ndestination:/queue/a\n\n\0", "id", "1.2"),
    Case("subscribe-without-destination", b"SUBSCRIBE\nid:1\n\n\0", "destination"),
    Case("subscribe-unknown-prefix", b"SUBSCRIBE\nid:1\ndestination:/foo/bar\n\n\0", "destination"),
    Case("subscribe-gt-not-last", b"SUBSCRIBE\nid:1\ndestination:/topic/a.>.b\n\n\0", "destination|>"),
    Case(
        "duplicate-subscription-id",
        b"SUBSCRIBE\nid:s\ndestination:/queue/a\n\n\0SUBSCRIBE\nid:s\ndestination:/queue/b\n\n\0",
        "duplicate",
    ),
    Case("invalid-ack-mode", b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:sometimes\n\n\0", "ack", body="sometimes"),
    Case("invalid-selector", b"SUBSCRIBE\nid:1\ndestination:/queue/a\nselector:a = = b\n\n\0", "selector"),
    Case(
        "ack-unknown-id-1.2",
        b"SUBSCRIBE\nid:s\ndestination:/queue/a\nack:client\n\n\0ACK\nid:1:999\n\n\0",
        UNKNOWN_ACK,
    ),
    Case("ack-garbage-id-1.2", b"ACK\nid:nonsense\n\n\0", UNKNOWN_ACK),
    Case("ack-without-id-1.2", b"ACK\nmessage-id:ID:x\n\n\0", "id"),
    Case(
        "ack-unknown-message-id-1.1",
        b"SUBSCRIBE\nid:s\ndestination:/queue/a\nack:client\n\n\0ACK\nsubscription:s\nmessage-id:ID:nope\n\n\0",
        UNKNOWN_ACK, "1.1",
    ),
    Case("ack-unknown-message-id-1.0", b"ACK\nmessage-id:ID:nope\n\n\0", UNKNOWN_ACK, "1.0"),
    Case("nack-unknown-id-1.2", b"NACK\nid:1:1\n\n\0", UNKNOWN_ACK),
    Case("unsubscribe-unknown-id", b"UNSUBSCRIBE\nid:nope\n\n\0", "unknown|subscription"),
    Case("unsubscribe-without-id", b"UNSUBSCRIBE\n\n\0", "id"),
    Case("begin-twice", b"BEGIN\ntransaction:t\n\n\0BEGIN\ntransaction:t\n\n\0", "already|transaction"),
    Case("begin-without-transaction", b"BEGIN\n\n\0", "transaction"),
    Case("commit-unknown-transaction", b"COMMIT\ntransaction:nope\n\n\0", "transaction"),
    Case("abort-unknown-transaction", b"ABORT\ntransaction:nope\n\n\0", "transaction"),
    Case("commit-twice", b"BEGIN\ntransaction:t\n\n\0COMMIT\ntransaction:t\n\n\0COMMIT\ntransaction:t\n\n\0", "transaction"),
    Case("send-in-unknown-transaction", b"SEND\ndestination:/queue/a\ntransaction:nope\n\nx\0", "transaction"),
    Case("priority-too-high", b"SEND\ndestination:/queue/a\npriority:12\n\nx\0", "priority", body="12"),
    Case("priority-negative", b"SEND\ndestination:/queue/a\npriority:-1\n\nx\0", "priority"),
    Case("priority-not-a-number", b"SEND\ndestination:/queue/a\npriority:high\n\nx\0", "priority", body="high"),
    Case("expires-not-a-number", b"SEND\ndestination:/queue/a\nexpires:soon\n\nx\0", "expires", body="soon"),
    Case("expires-negative", b"SEND\ndestination:/queue/a\nexpires:-5\n\nx\0", "expires"),
    Case("prefetch-zero", b"SUBSCRIBE\nid:1\ndestination:/queue/a\nactivemq.prefetchSize:0\n\n\0", "prefetch"),
    Case("heart-beat-not-numbers", b"CONNECT\naccept-version:1.2\nheart-beat:abc\n\n\0", "heart-beat", None),
    Case("heart-beat-three-values", b"CONNECT\naccept-version:1.2\nheart-beat:1,2,3\n\n\0", "heart-beat", None),
    Case("heart-beat-negative", b"CONNECT\naccept-version:1.1\nheart-beat:-1,0\n\n\0", "heart-beat", None),
    Case("second-connect", b"CONNECT\naccept-version:1.2\n\n\0", "already connected"),
    Case("stomp-after-connect", b"STOMP\naccept-version:1.2\n\n\0", "already connected"),
    Case("unsupported-version", b"CONNECT\naccept-version:3.0\n\n\0", "version", None),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_error_and_close(small, case):
    c = bad_client(small, case.version)
    send_ignoring_close(c, case.data)
    error = c.expect_error_and_close()
    message = error.headers["message"]
    assert re.search(case.message, message, re.I), message
    text = error.body.decode("utf-8")
    assert text.strip(), "the ERROR body should say what was wrong"
    if case.body:
        assert re.search(case.body, text, re.I), text
    assert_still_serving(small)


@pytest.mark.parametrize(
    "header",
    [b"expires:99999999999999999999999999", b"JMSXGroupID:g\nJMSXGroupSeq:99999999999999999999999999"],
    ids=["expires", "group-seq"],
)
def test_out_of_range_number_on_persistent_send_gets_error(small, header):
    c = bad_client(small, "1.2")
    c.send(b"SEND\ndestination:/queue/a\npersistent:true\n" + header + b"\n\nx\0")
    error = c.expect_error_and_close()
    assert re.search("Invalid (expires|JMSXGroupSeq) header", error.headers["message"]), error
    assert small.queue_depth("queue://a") == 0
    assert_still_serving(small)


def test_frame_over_limit_by_content_length_refused_before_the_body(small):
    c = bad_client(small, "1.2")
    # Only the headers: the broker must not wait for (and buffer) 10 MB.
    c.send(b"SEND\ndestination:/queue/big\ncontent-length:%d\n\n" % (10 * 1024 * 1024))
    error = c.expect_error_and_close(timeout=2.0)
    assert re.search("too large", error.headers["message"], re.I), error
    assert str(MAX_FRAME) in error.body.decode()
    assert small.queue_depth("queue://big") == 0
    assert_still_serving(small)


def test_frame_just_at_the_limit_is_accepted(small):
    c = bad_client(small, "1.2")
    body = bytes(range(256)) * (MAX_FRAME // 256)
    c.frame("SUBSCRIBE", {"destination": "/queue/edge", "id": "s"})
    c.frame("SEND", {"destination": "/queue/edge", "content-length": str(len(body))}, body)
    c.send(b"SEND\ndestination:/queue/edge\n\n" + b"a" * MAX_FRAME + b"\0")
    assert c.read().body == body
    assert c.read().body == b"a" * MAX_FRAME
    c.close()


def test_frame_over_limit_without_content_length_refused_while_streaming(small):
    c = bad_client(small, "1.2")
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.send(b"SEND\ndestination:/queue/big\n\n")
    chunk = b"z" * 100
    sent = 0
    error: Frame | None = None
    while sent < 10 * MAX_FRAME and error is None:
        try:
            c.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(chunk)
        try:
            error = c.read(timeout=0.05)
        except (AssertionError, TimeoutError):
            continue  # nothing yet
    if error is None:
        error = c.read(timeout=1.0)
    assert error.command == "ERROR", error
    assert re.search("too large", error.headers["message"], re.I), error
    # Refused as soon as the limit was passed, without a NUL ever arriving.
    assert MAX_FRAME < sent <= MAX_FRAME + 3 * len(chunk), sent
    assert c.closed_by_peer(2.0)
    assert small.queue_depth("queue://big") == 0
    assert_still_serving(small)


def test_too_many_headers_refused_before_the_header_block_ends(small):
    c = bad_client(small, "1.2")
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.send(b"SEND\ndestination:/queue/a\n")
    sent = 1
    error = None
    while sent < 5 * MAX_HEADERS and error is None:
        try:
            c.send(b"h%d:v\n" % sent)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 1
        try:
            error = c.read(timeout=0.03)
        except (AssertionError, TimeoutError):
            pass
    if error is None:
        error = c.read(timeout=1.0)
    assert error.command == "ERROR" and re.search("too many headers", error.headers["message"], re.I), error
    assert MAX_HEADERS < sent <= MAX_HEADERS + 3, sent
    assert c.closed_by_peer(2.0)
    assert_still_serving(small)


def test_overlong_header_line_refused_before_its_end(small):
    c = bad_client(small, "1.2")
    c.send(b"SEND\ndestination:/queue/a\nx-h:" + b"v" * (2 * MAX_LINE))  # no LF ever
    error = c.expect_error_and_close(timeout=2.0)
    assert re.search("too long", error.headers["message"], re.I), error
    assert_still_serving(small)


def test_headers_exactly_at_limits_are_accepted(small):
    c = bad_client(small, "1.2")
    c.frame("SUBSCRIBE", {"destination": "/queue/lim", "id": "s"})
    value = "v" * (MAX_LINE - len("x-long:"))
    headers = {"destination": "/queue/lim", "x-long": value}
    headers.update({f"h{i}": "v" for i in range(MAX_HEADERS - len(headers))})
    c.frame("SEND", headers, b"ok")
    message = c.read()
    assert message.command == "MESSAGE", message
    assert message.headers["x-long"] == value
    c.close()


# -- receipts on ERROR ------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"SEND\ndestination:/foo/bar\nreceipt:r-bad\n\nx\0",
        b"SEND\nreceipt:r-bad\n\nx\0",
        b"SEND\ndestination:/queue/a\npriority:high\nreceipt:r-bad\n\nx\0",
        b"SUBSCRIBE\ndestination:/queue/a\nreceipt:r-bad\n\n\0",
        b"UNSUBSCRIBE\nid:nope\nreceipt:r-bad\n\n\0",
        b"ACK\nid:9:9\nreceipt:r-bad\n\n\0",
        b"COMMIT\ntransaction:nope\nreceipt:r-bad\n\n\0",
        b"ABORT\ntransaction:nope\nreceipt:r-bad\n\n\0",
        b"BEGIN\ntransaction:t\n\n\0BEGIN\ntransaction:t\nreceipt:r-bad\n\n\0",
        b"CONNECT\naccept-version:1.2\nreceipt:r-bad\n\n\0",
    ],
    ids=["unknown-prefix", "no-destination", "priority", "no-id", "unsubscribe", "ack", "commit", "abort", "begin-twice", "second-connect"],
)
def test_error_for_frame_with_receipt_carries_receipt_id(small, data):
    c = bad_client(small, "1.2")
    c.send(data)
    error = c.expect_error_and_close()
    assert error.headers.get("receipt-id") == "r-bad", error
    assert_still_serving(small)


@pytest.mark.parametrize(
    "data",
    [
        b"SEND\ndestination:/queue/a\ncontent-length:99999\nreceipt:r-bad\n\n",
        b"SEND\ndestination:/queue/a\ncontent-length:abc\nreceipt:r-bad\n\nabc\0",
        b"SEND\ndestination:/queue/a\ncontent-length:1\nreceipt:r-bad\n\nxy\0",
    ],
    ids=["too-large", "content-length-nan", "no-nul"],
)
def test_codec_error_for_parsed_frame_with_receipt_carries_receipt_id(small, data):
    c = bad_client(small, "1.2")
    c.send(data)
    error = c.expect_error_and_close()
    assert error.headers.get("receipt-id") == "r-bad", error


def test_error_receipt_id_is_escaped_for_the_version(small):
    c = bad_client(small, "1.2")
    c.send(b"SEND\ndestination:/foo/bar\nreceipt:a\\cb\\nc\n\nx\0")
    error = c.expect_error_and_close()
    assert error.headers.get("receipt-id") == "a:b\nc", error


# -- what happens around the bad frame -----------------------------------------------


def test_good_frames_before_the_bad_one_in_separate_writes_take_effect(small):
    c = bad_client(small, "1.2")
    c.frame("SEND", {"destination": KEEP, "receipt": "r"}, b"kept-3")
    assert c.read().headers["receipt-id"] == "r"
    c.send(b"BOGUS\n\n\0")
    c.expect_error_and_close()
    assert_still_serving(small, KEPT + [b"kept-3"])


def test_good_frame_coalesced_with_bad_input_still_takes_effect(small):
    c = bad_client(small, "1.2")
    # One write: a SEND that asks for a receipt, then a header block the codec refuses.
    c.send(b"SEND\ndestination:/queue/keep\nreceipt:r\n\nkept-3\0SEND\ndestination:/queue/a\ncontent-length:zz\n\n\0")
    first = c.read()
    assert first.command == "RECEIPT" and first.headers["receipt-id"] == "r", first
    c.expect_error_and_close()
    assert_still_serving(small, KEPT + [b"kept-3"])


def test_nothing_after_the_bad_frame_is_processed(small):
    c = bad_client(small, "1.2")
    c.send(b"SEND\ndestination:/foo/bar\n\nx\0SEND\ndestination:/queue/keep\n\nafter-error\0")
    c.expect_error_and_close()
    assert_still_serving(small)  # the SEND after the bad one did not land


def test_bad_client_does_not_disturb_a_connected_consumer(small):
    conn, got = connect(small, "1.2")
    conn.subscribe("/queue/live", id="l", ack="auto")
    producer, _ = connect(small, "1.2")
    producer.send("/queue/live", "one")
    got.wait_for(1)
    for data in (b"FROB\n\n\0", b"SEND\ndestination:/queue/a\ncontent-length:99999\n\n", b"\xff\n\n\0"):
        c = bad_client(small, "1.2")
        c.send(data)
        c.expect_error_and_close()
    producer.send("/queue/live", "two")
    got.wait_for(2)
    assert got.bodies() == ["one", "two"]
    assert not got.errors
    disconnect(conn)
    disconnect(producer)
    assert_still_serving(small)


# -- abrupt disconnects -------------------------------------------------------------


def _reset(c: RawStomp) -> None:
    """Close with RST instead of FIN, as a crashed client's kernel would."""
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.sock.close()


def _all_gone(handle: BrokerHandle) -> None:
    """The barrier after a client's close or reset: the broker has handled every connection's loss."""
    wait_until(lambda: handle.sessions() == 0, what="the broker to see the connection lost")


@pytest.mark.parametrize(
    "partial",
    [
        b"SEND\ndestination:/queue/keep\ncontent-length:100\n\nhalf a bo",
        b"SEND\ndestination:/queue/keep\n\nno nul yet",
        b"SEND\ndestination:/queue/ke",
        b"SE",
    ],
    ids=["content-length-body", "nul-body", "headers", "command"],
)
@pytest.mark.parametrize("how", ["close", "reset"])
def test_socket_closed_mid_frame_loses_nothing_and_stores_nothing(small, partial, how):
    c = bad_client(small, "1.2")
    c.send(partial)
    wait_until(lambda: len(partial) in small.unfinished(), what="the broker to hold the unfinished frame")
    if how == "reset":
        _reset(c)
    else:
        c.close()
    _all_gone(small)
    assert_still_serving(small)  # the partial SEND was not stored, the kept ones are intact


@pytest.mark.parametrize("ack", ["client", "client-individual"])
@pytest.mark.parametrize("how", ["close", "reset"])
def test_consumer_gone_with_unacked_messages_they_are_redelivered(small, ack, how):
    c = bad_client(small, "1.2")
    c.frame("SUBSCRIBE", {"destination": KEEP, "id": "s", "ack": ack})
    held = [c.read() for _ in KEPT]
    assert [m.body for m in held] == KEPT
    if how == "reset":
        _reset(c)
    else:
        c.close()
    nxt = bad_client(small, "1.2")
    nxt.frame("SUBSCRIBE", {"destination": KEEP, "id": "s", "ack": "client-individual"})
    again = [nxt.read() for _ in KEPT]
    assert [m.body for m in again] == KEPT  # all of them, in order
    assert all(m.headers.get("redelivered") == "true" for m in again), again
    for m in again:
        nxt.frame("ACK", {"id": m.headers["ack"]})
    nxt.frame("DISCONNECT", {"receipt": "bye"})
    assert nxt.read().headers["receipt-id"] == "bye"
    assert small.queue_depth("queue://keep") == 0


def test_consumer_gone_mid_transaction_its_acks_are_undone_and_sends_dropped(small):
    c = bad_client(small, "1.2")
    c.frame("SUBSCRIBE", {"destination": KEEP, "id": "s", "ack": "client-individual"})
    held = [c.read() for _ in KEPT]
    c.frame("BEGIN", {"transaction": "t"})
    for m in held:
        c.frame("ACK", {"id": m.headers["ack"], "transaction": "t"})
    c.frame("SEND", {"destination": KEEP, "transaction": "t", "receipt": "r"}, b"uncommitted")
    assert c.read().headers["receipt-id"] == "r"
    _reset(c)
    _all_gone(small)
    assert_still_serving(small)  # the acks never committed, the send never happened


def test_consumer_gone_after_acking_some_only_the_rest_come_back(small):
    c = bad_client(small, "1.2")
    c.frame("SUBSCRIBE", {"destination": KEEP, "id": "s", "ack": "client-individual"})
    held = [c.read() for _ in KEPT]
    c.frame("ACK", {"id": held[1].headers["ack"], "receipt": "r"})
    assert c.read().headers["receipt-id"] == "r"
    c.close()
    _all_gone(small)
    assert small.queue_bodies("queue://keep") == [KEPT[0], KEPT[2]]


def test_nul_inside_a_header_is_refused(small):
    c = bad_client(small, "1.2")
    c.send(b"SEND\ndestination:/queue/a\nx-h:a\x00b\ncontent-length:1\n\nx\0")
    error = c.expect_error_and_close()
    assert error.headers["message"] == "NUL in headers"
    assert small.queue_depth("queue://a") == 0
    assert_still_serving(small)


def test_connection_that_never_sends_connect_is_closed(tmp_path):
    from tests.support import BrokerHandle, RawStomp, make_config

    config = make_config(tmp_path)
    config.stomp_settings.connect_timeout = 0.3
    handle = BrokerHandle(config)
    try:
        idle = RawStomp(handle)
        error = idle.expect_error_and_close(timeout=3)
        assert error.headers["message"] == "Connect timeout"
        quick = RawStomp(handle)
        quick.connect()
        assert not quick.closed_by_peer(timeout=0.6), "a connected client must not be timed out"
    finally:
        handle.stop()


def test_a_client_still_sending_after_its_error_reads_the_error(small):
    """The ERROR frame reaches a client that goes on sending, and its sends do not fail
    meanwhile (a library would report the broken pipe, not the ERROR): the broker shuts
    its side and drops what still comes, instead of a close that resets the connection."""
    for attempt in range(5):
        c = RawStomp(small)
        c.connect("1.2")
        flood = b"SEND\ndestination:/queue/a\n\n" + b"x" * 1000 + b"\0"
        c.send(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nactivemq.prefetchSize:0\n\n\0")
        frame = c.read(10)  # the ERROR is out and the broker is closing
        assert frame.command == "ERROR" and "prefetch" in frame.headers["message"].lower(), frame
        for _ in range(200):
            c.send(flood * 10)  # still sending: no broken pipe, no reset
        assert c.closed_by_peer(5)
        c.close()
