"""Tests for the sans-IO STOMP codec (protocols.stomp.codec)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.stomp.codec import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    StompDecoder,
    StompLimits,
    StompProtocolError,
    encode_frame,
    escape_header,
    unescape_header,
)

VERSIONS = ("1.0", "1.1", "1.2")


def decode_all(data: bytes, version: str = "1.2", limits: StompLimits | None = None) -> list[Frame]:
    dec = StompDecoder(limits, version=version)
    frames = dec.feed(data)
    assert dec.buffered == 0
    return frames


def decode_bytewise(data: bytes, version: str = "1.2") -> list[Frame]:
    dec = StompDecoder(version=version)
    frames: list[Frame] = []
    for i in range(len(data)):
        frames += dec.feed(data[i : i + 1])
    assert dec.buffered == 0
    return frames


def error_of(
    data: bytes | list[bytes], version: str = "1.2", limits: StompLimits | None = None
) -> StompProtocolError:
    dec = StompDecoder(limits, version=version)
    chunks = [data] if isinstance(data, bytes) else data
    with pytest.raises(StompProtocolError) as info:
        for chunk in chunks:
            dec.feed(chunk)
    return info.value


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("command", sorted(CLIENT_COMMANDS | SERVER_COMMANDS))
@pytest.mark.parametrize("version", VERSIONS)
def test_every_command_round_trips(command: str, version: str) -> None:
    headers = {"destination": "/queue/a", "receipt": "r-1", "x-empty": ""}
    wire = encode_frame(command, headers, b"hello", version=version)
    assert wire == (command.encode() + b"\ndestination:/queue/a\nreceipt:r-1\nx-empty:\n\nhello\0")
    assert decode_all(wire, version) == [Frame(command, headers, b"hello")]


def test_body_with_nul_needs_content_length() -> None:
    body = b"a\0b\0\0c"
    wire = encode_frame("SEND", [("destination", "/q"), ("content-length", str(len(body)))], body)
    (frame,) = decode_all(wire)
    assert frame.body == body
    assert frame.headers == {"destination": "/q", "content-length": "6"}


def test_zero_content_length() -> None:
    (frame,) = decode_all(b"SEND\ncontent-length:0\n\n\0")
    assert frame.body == b""


def test_body_without_content_length_runs_to_first_nul() -> None:
    frames = decode_all(b"SEND\ndestination:/q\n\nabc\0MESSAGE\n\n\0")
    assert frames == [Frame("SEND", {"destination": "/q"}, b"abc"), Frame("MESSAGE", {}, b"")]


def test_frame_without_headers() -> None:
    assert decode_all(b"DISCONNECT\n\n\0") == [Frame("DISCONNECT")]


def test_crlf_frames() -> None:
    data = b"SEND\r\ndestination:/q\r\nfoo:bar\r\n\r\nbody\0CONNECT\r\naccept-version:1.2\r\n\r\n\0"
    assert decode_all(data) == [
        Frame("SEND", {"destination": "/q", "foo": "bar"}, b"body"),
        Frame("CONNECT", {"accept-version": "1.2"}),
    ]
    assert decode_bytewise(data) == decode_all(data)


def test_mixed_line_endings_in_one_frame() -> None:
    assert decode_all(b"SEND\r\na:1\nb:2\r\n\nx\0") == [Frame("SEND", {"a": "1", "b": "2"}, b"x")]
    assert decode_all(b"SEND\na:1\r\n\r\nx\0") == [Frame("SEND", {"a": "1"}, b"x")]


def test_only_one_cr_is_a_line_ending_and_values_are_not_trimmed() -> None:
    (frame,) = decode_all(b"SEND\na: spaced \r\nb:x\r\r\n\n\0", version="1.0")
    assert frame.headers == {"a": " spaced ", "b": "x\r"}


def test_heart_beats_before_between_and_after_frames() -> None:
    data = b"\n\r\n\n" + b"SEND\n\nA\0" + b"\n\n\r\n" + b"SEND\n\nB\0\n" + b"\r\n"
    dec = StompDecoder(version="1.2")
    assert dec.feed(data) == [Frame("SEND", {}, b"A"), Frame("SEND", {}, b"B")]
    assert dec.buffered == 0
    assert decode_bytewise(data) == [Frame("SEND", {}, b"A"), Frame("SEND", {}, b"B")]


def test_heart_beats_only() -> None:
    dec = StompDecoder()
    assert dec.feed(b"\n" * 1000) == []
    assert dec.buffered == 0
    assert dec.feed(b"\r") == []
    assert dec.buffered == 1  # could be half of a CRLF heart-beat
    assert dec.feed(b"\n\r\n") == []
    assert dec.buffered == 0


def _three_frames(version: str) -> bytes:
    return (
        b"\n"
        + encode_frame(
            "SEND",
            {"destination": "/q/\u00e9t\u00e9", "k\u00fc": "\u20ac\U0001f600"},
            b"one",
            version,
        )
        + b"\r\n"
        + encode_frame(
            "SUBSCRIBE",
            [("id", "0"), ("content-length", "3"), ("x", "\u65e5\u672c")],
            b"\0\n\0",
            version,
        )
        + encode_frame("ACK", {"id": "\u00df" * 50}, b"", version)
        + b"\n"
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_byte_at_a_time_equals_all_at_once(version: str) -> None:
    data = _three_frames(version)
    whole = decode_all(data, version)
    assert len(whole) == 3
    assert whole[0].headers["k\u00fc"] == "\u20ac\U0001f600"
    assert whole[1].body == b"\0\n\0"
    assert decode_bytewise(data, version) == whole


@pytest.mark.parametrize("version", VERSIONS)
def test_every_split_point_of_a_multibyte_stream(version: str) -> None:
    data = _three_frames(version)
    whole = decode_all(data, version)
    for cut in range(1, len(data)):
        dec = StompDecoder(version=version)
        assert dec.feed(data[:cut]) + dec.feed(data[cut:]) == whole, cut
        assert dec.buffered == 0


def test_repeated_headers_keep_first() -> None:
    wire = encode_frame("MESSAGE", [("foo", "1"), ("foo", "2"), ("bar", "x"), ("foo", "3")])
    assert wire == b"MESSAGE\nfoo:1\nfoo:2\nbar:x\nfoo:3\n\n\0"
    (frame,) = decode_all(wire)
    assert frame.headers == {"foo": "1", "bar": "x"}
    assert list(frame.headers) == ["foo", "bar"]


def test_repeated_content_length_first_wins() -> None:
    (frame,) = decode_all(b"SEND\ncontent-length:2\ncontent-length:5\n\n\0\0\0")
    assert frame.body == b"\0\0"


def test_buffered_reports_partial_data() -> None:
    dec = StompDecoder()
    assert dec.buffered == 0
    assert dec.feed(b"SEND\ndest") == []
    assert dec.buffered == 9
    assert dec.feed(b"ination:/q\n\nhel") == []
    assert dec.buffered == 24
    assert dec.feed(b"lo\0SEND\n") == [Frame("SEND", {"destination": "/q"}, b"hello")]
    assert dec.buffered == 5
    assert dec.feed(b"\n\0") == [Frame("SEND")]
    assert dec.buffered == 0


def test_feed_accepts_bytearray_and_memoryview() -> None:
    dec = StompDecoder()
    assert dec.feed(bytearray(b"SEND\n\nx")) == []
    assert dec.feed(memoryview(b"\0SEND\n\ny\0")) == [
        Frame("SEND", {}, b"x"),
        Frame("SEND", {}, b"y"),
    ]
    assert dec.feed(b"") == []


def test_large_body_in_small_chunks() -> None:
    body = bytes(range(256)) * 400
    for headers in ({}, {"content-length": str(len(body))}):
        body_ = body.replace(b"\0", b"") if not headers else body
        data = encode_frame("SEND", headers, body_) * 2
        dec = StompDecoder()
        frames = []
        for i in range(0, len(data), 1000):
            frames += dec.feed(data[i : i + 1000])
        assert frames == [Frame("SEND", headers, body_)] * 2
        assert type(frames[0].body) is bytes


def test_version_can_change_between_frames() -> None:
    dec = StompDecoder()  # starts at 1.0 before negotiation
    assert dec.feed(b"SEND\na:x\\cy\n\n\0")[0].headers == {"a": "x\\cy"}
    dec.version = "1.2"
    assert dec.version == "1.2"
    assert dec.feed(b"SEND\na:x\\cy\n\n\0")[0].headers == {"a": "x:y"}
    with pytest.raises(ValueError):
        dec.version = "2.0"


def test_frame_repr_and_equality() -> None:
    f = Frame("SEND", {"a": "b"}, b"x" * 100)
    assert "SEND" in repr(f) and "100 bytes" in repr(f)
    assert f == Frame("SEND", {"a": "b"}, b"x" * 100)
    assert f != Frame("SEND", {"a": "b"}, b"x")
    assert Frame("ACK").headers == {} and Frame("ACK").body == b""


# --------------------------------------------------------------------------- escaping


def test_escape_header_per_version() -> None:
    raw = "a\\b\nc:d\re"
    assert escape_header(raw, "1.0") == raw
    assert escape_header(raw, "1.1") == "a\\\\b\\nc\\cd\re"
    assert escape_header(raw, "1.2") == "a\\\\b\\nc\\cd\\re"
    assert escape_header("plain", "1.2") == "plain"
    with pytest.raises(ValueError):
        escape_header("x", "3.0")


def test_unescape_header_per_version() -> None:
    assert unescape_header("a\\nb", "1.0") == "a\\nb"
    assert unescape_header("a\\\\b\\nc\\cd", "1.1") == "a\\b\nc:d"
    assert unescape_header("x\\ry", "1.2") == "x\ry"
    for version in ("1.1", "1.2"):
        for bad in ("\\t", "end\\", "\\", "\\x41"):
            with pytest.raises(StompProtocolError) as info:
                unescape_header(bad, version)
            assert info.value.message == "Invalid header escape"
    with pytest.raises(StompProtocolError):
        unescape_header("x\\ry", "1.1")


def test_escaping_round_trip_by_version() -> None:
    value = "\\:\n" + "\r" + "\u00e9"
    for version in ("1.1", "1.2"):
        wire = encode_frame("MESSAGE", {"k:\n": value}, version=version)
        (frame,) = decode_all(wire, version)
        if version == "1.1":
            # No CR escape in 1.1: the raw CR survives as long as it is not
            # right before the line's LF.
            assert frame.headers == {"k:\n": value}
        else:
            assert frame.headers == {"k:\n": value}
            assert b"\\r" in wire


def test_decoder_escaping_per_version() -> None:
    data = b"MESSAGE\nkey\\c1:a\\nb\\\\c\n\n\0"
    assert decode_all(data, "1.0")[0].headers == {"key\\c1": "a\\nb\\\\c"}
    assert decode_all(data, "1.1")[0].headers == {"key:1": "a\nb\\c"}
    assert decode_all(data, "1.2")[0].headers == {"key:1": "a\nb\\c"}
    cr = b"MESSAGE\nkey:a\\rb\n\n\0"
    assert decode_all(cr, "1.0")[0].headers == {"key": "a\\rb"}
    assert error_of(cr, "1.1").message == "Invalid header escape"
    assert decode_all(cr, "1.2")[0].headers == {"key": "a\rb"}
    assert error_of(b"SEND\nkey:a\\tb\n\n\0", "1.2").message == "Invalid header escape"
    assert error_of(b"SEND\nkey:ab\\\n\n\0", "1.2").message == "Invalid header escape"


@pytest.mark.parametrize("command", ["CONNECT", "STOMP", "CONNECTED"])
def test_connect_frames_are_never_escaped(command: str) -> None:
    data = command.encode() + b"\nlogin:a\\cb\npasscode:x\\y\n\n\0"
    (frame,) = decode_all(data, "1.2")
    assert frame.headers == {"login": "a\\cb", "passcode": "x\\y"}
    wire = encode_frame(command, {"host": "a:b", "passcode": "x\\y"}, version="1.2")
    assert wire == command.encode() + b"\nhost:a:b\npasscode:x\\y\n\n\0"


def test_unescaped_encoding_refuses_header_injection() -> None:
    with pytest.raises(ValueError):
        encode_frame("MESSAGE", {"a": "x\nevil:1"}, version="1.0")
    with pytest.raises(ValueError):
        encode_frame("CONNECTED", {"a:b": "x"}, version="1.2")
    with pytest.raises(ValueError):
        encode_frame("SEND\n", {}, version="1.2")
    with pytest.raises(ValueError):
        encode_frame("SEND", {}, version="0.9")
    # Escaped versions represent the same content safely.
    assert (
        encode_frame("MESSAGE", {"a": "x\nevil:1"}, version="1.1")
        == b"MESSAGE\na:x\\nevil\\c1\n\n\0"
    )


# --------------------------------------------------------------------------- errors


def test_malformed_header() -> None:
    assert error_of(b"SEND\nnocolon\n\n\0").message == "Malformed header"


def test_empty_header_name() -> None:
    assert error_of(b"SEND\n:value\n\n\0").message == "Empty header name"


def test_invalid_utf8_in_value() -> None:
    err = error_of(b"SEND\nname:\xff\xfe\n\n\0")
    assert err.message == "Invalid UTF-8 in headers"
    assert err.detail
    assert error_of(b"SE\xc3ND\n\n\0").message == "Invalid UTF-8 in headers"


def test_invalid_utf8_in_body_is_fine() -> None:
    assert decode_all(b"SEND\n\n\xff\xfe\0")[0].body == b"\xff\xfe"


@pytest.mark.parametrize("value", [b"-1", b"abc", b"", b" 3", b"3 ", b"1.5", b"\xd9\xa3", b"+3"])
def test_invalid_content_length(value: bytes) -> None:
    assert (
        error_of(b"SEND\ncontent-length:" + value + b"\n\nabc\0").message
        == "Invalid content-length"
    )


def test_missing_nul_after_content_length_body() -> None:
    err = error_of(b"SEND\ncontent-length:2\n\nabc\0")
    assert err.message == "Frame not terminated by NUL"
    # Also when the offending byte arrives in a later chunk.
    err = error_of([b"SEND\ncontent-length:2\n\nab", b"X"])
    assert err.message == "Frame not terminated by NUL"


def test_header_too_long() -> None:
    limits = StompLimits(max_header_length=20)
    ok = b"SEND\n" + b"k:" + b"v" * 18 + b"\n\n\0"
    assert decode_all(ok, limits=limits)[0].headers == {"k": "v" * 18}
    assert error_of(b"SEND\nk:" + b"v" * 19 + b"\n\n\0", limits=limits).message == "Header too long"
    # Multi-byte characters count as bytes.
    assert (
        error_of(
            "SEND\nk:\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\n\n\0".encode(),
            limits=limits,
        ).message
        == "Header too long"
    )


def test_header_too_long_detected_while_streaming() -> None:
    limits = StompLimits(max_header_length=100)
    dec = StompDecoder(limits)
    dec.feed(b"SEND\nk:")
    with pytest.raises(StompProtocolError) as info:
        for _ in range(10):
            dec.feed(b"v" * 50)  # no LF ever arrives
    assert info.value.message == "Header too long"
    assert dec.buffered < 300


def test_too_many_headers() -> None:
    limits = StompLimits(max_headers=3)
    three = b"SEND\na:1\nb:2\nc:3\n\n\0"
    assert len(decode_all(three, limits=limits)[0].headers) == 3
    assert error_of(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\0", limits=limits).message == "Too many headers"
    # Detected before the header block is complete.
    assert (
        error_of([b"SEND\n", b"a:1\nb:2\nc:3\n", b"d:4\ne"], limits=limits).message
        == "Too many headers"
    )


def test_frame_too_large_by_content_length_before_body() -> None:
    limits = StompLimits(max_frame_size=100)
    dec = StompDecoder(limits)
    with pytest.raises(StompProtocolError) as info:
        dec.feed(b"SEND\ncontent-length:101\n\n")  # no body bytes sent yet
    assert info.value.message == "Frame too large"
    body = b"\0" * 100
    assert decode_all(b"SEND\ncontent-length:100\n\n" + body + b"\0", limits=limits)[0].body == body


def test_frame_too_large_without_content_length_while_streaming() -> None:
    limits = StompLimits(max_frame_size=100)
    dec = StompDecoder(limits)
    dec.feed(b"SEND\n\n")
    dec.feed(b"x" * 60)
    with pytest.raises(StompProtocolError) as info:
        dec.feed(b"x" * 60)  # 120 bytes, no NUL yet
    assert info.value.message == "Frame too large"
    assert decode_all(b"SEND\n\n" + b"x" * 100 + b"\0", limits=limits)[0].body == b"x" * 100
    assert error_of(b"SEND\n\n" + b"x" * 101 + b"\0", limits=limits).message == "Frame too large"


def test_overlong_command_line() -> None:
    limits = StompLimits(max_command_length=8)
    assert decode_all(b"ABCDEFGH\n\n\0", limits=limits)[0].command == "ABCDEFGH"
    assert decode_all(b"ABCDEFGH\r\n\r\n\0", limits=limits)[0].command == "ABCDEFGH"
    assert error_of(b"ABCDEFGHI\n\n\0", limits=limits).message == "Command too long"
    # Without any LF, the error comes as soon as the limit is passed.
    dec = StompDecoder(limits)
    assert dec.feed(b"ABCDEFGH\r") == []
    with pytest.raises(StompProtocolError) as info:
        dec.feed(b"X")
    assert info.value.message == "Command too long"
    assert error_of(b"x" * 100000).message == "Command too long"


def test_non_printable_command() -> None:
    assert error_of(b"SE\x01ND\n\n\0").message == "Invalid command"
    assert error_of(b"\rSEND\n\n\0").message == "Invalid command"
    assert error_of(b"\x00\n").message == "Invalid command"


def test_bad_command_rejected_before_its_headers_complete() -> None:
    dec = StompDecoder()
    with pytest.raises(StompProtocolError) as info:
        dec.feed(b"SE\x7fND\ndestination:/q\n")
    assert info.value.message == "Invalid command"


def test_error_carries_frames_completed_in_the_same_feed() -> None:
    dec = StompDecoder()
    with pytest.raises(StompProtocolError) as info:
        dec.feed(b"SEND\n\nok\0\nSEND\nbad\n\n\0")
    assert info.value.message == "Malformed header"
    assert info.value.frames == [Frame("SEND", {}, b"ok")]


def test_codec_does_not_validate_command_names() -> None:
    assert decode_all(b"FOO\n\n\0")[0].command == "FOO"


def test_error_has_message_and_detail() -> None:
    err = StompProtocolError("short", "long text")
    assert (err.message, err.detail, str(err)) == ("short", "long text", "short")
    assert StompProtocolError("x").detail == ""


# --------------------------------------------------------------------------- properties

header_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00") | st.sampled_from(":\\\n\r"), max_size=12
)
frames_strategy = st.lists(
    st.tuples(
        st.sampled_from(sorted(CLIENT_COMMANDS)),
        st.lists(st.tuples(header_text.filter(bool), header_text), max_size=5),
        st.binary(max_size=40),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=frames_strategy, data=st.data())
def test_random_frames_round_trip_through_random_splits(frames, data) -> None:
    wire = b""
    expected = []
    for command, headers, body in frames:
        if command in ("CONNECT", "STOMP"):
            # Never escaped, so only what the unescaped syntax can carry.
            headers = [
                (n.replace("\n", "_").replace(":", "_"), v.replace("\n", "_").replace("\r", "_"))
                for n, v in headers
            ]
        headers = [h for h in headers if h[0] != "content-length"] + [
            ("content-length", str(len(body)))
        ]
        wire += encode_frame(command, headers, body, version="1.2")
        first: dict[str, str] = {}
        for name, value in headers:
            first.setdefault(name, value)
        expected.append(Frame(command, first, body))
        wire += data.draw(st.sampled_from([b"", b"\n", b"\r\n", b"\n\n"]))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    dec = StompDecoder(version="1.2")
    got: list[Frame] = []
    prev = 0
    for cut in cuts + [len(wire)]:
        got += _feed_resuming(dec, wire[prev:cut])
        prev = cut
    assert got == expected
    assert dec.buffered == 0


def _feed_resuming(dec: StompDecoder, chunk: bytes) -> list[Frame]:
    """Feed as the session does: resume with feed(b"") after a CONNECT pauses decoding."""
    out = dec.feed(chunk)
    while out and out[-1].command in ("CONNECT", "STOMP"):
        more = dec.feed(b"")
        if not more:
            break
        out += more
    return out


def test_decoding_pauses_after_connect_until_the_version_is_set() -> None:
    wire = (
        encode_frame("CONNECT", [("accept-version", "1.2")])
        + encode_frame("SEND", [("k", "a:b")], b"x", version="1.2")
    )
    dec = StompDecoder(version="1.0")
    (connect,) = dec.feed(wire)
    assert connect.command == "CONNECT" and dec.buffered > 0
    dec.version = "1.2"
    (send,) = dec.feed(b"")
    assert send.headers["k"] == "a:b"  # read as 1.0 it would be a\\cb


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(
        st.binary(max_size=40)
        | st.sampled_from(
            [
                b"SEND\n",
                b"\n",
                b"\r\n",
                b"\0",
                b"a:b\n",
                b"content-length:3\n",
                b"\\",
                b"x\\c:y\n",
                b"\xc3",
            ]
        ),
        max_size=20,
    ),
    version=st.sampled_from(VERSIONS),
)
def test_random_bytes_give_frames_or_protocol_errors(chunks, version) -> None:
    dec = StompDecoder(
        StompLimits(max_frame_size=50, max_headers=4, max_header_length=16, max_command_length=8),
        version,
    )
    try:
        for chunk in chunks:
            for frame in dec.feed(chunk):
                assert isinstance(frame.command, str) and isinstance(frame.body, bytes)
            assert dec.buffered >= 0
    except StompProtocolError as exc:
        assert exc.message


def test_nul_in_a_header_is_refused() -> None:
    with pytest.raises(StompProtocolError) as info:
        StompDecoder(version="1.2").feed(b"SEND\nk:a\x00b\n\nbody\x00")
    assert info.value.message == "NUL in headers"
    assert info.value.headers == {}
