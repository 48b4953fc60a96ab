"""Fuzzing the sans-IO STOMP decoder (protocols.stomp.codec) with Hypothesis.

A STOMP peer can send anything, cut anywhere by TCP.  What the session relies
on, and what these properties check on generated, mutated and random input:

* the decoder only ever returns frames or raises ``StompProtocolError``;
* what it returns respects the configured limits, and the bytes it holds for
  an incomplete frame stay bounded by them;
* how the bytes are cut into reads never changes the outcome;
* every frame the encoder can write (all commands, STOMP 1.0/1.1/1.2 escaping,
  content-length bodies with NULs, heart-beat EOLs) decodes to itself.

The example budget scales with ``FUZZ_EXAMPLES`` (see ``tests/fuzzing.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import event, example, given
from hypothesis import strategies as st

from protocols.stomp.codec import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    StompDecoder,
    StompLimits,
    StompProtocolError,
    encode_frame,
)
from tests.fuzzing import fuzz_settings, mutate, split, timeout_mark

pytestmark = timeout_mark()

VERSIONS = ("1.0", "1.1", "1.2")
COMMANDS = sorted(CLIENT_COMMANDS | SERVER_COMMANDS)
_UNESCAPED = ("CONNECT", "STOMP", "CONNECTED")

DEFAULT_LIMITS = StompLimits()
SMALL_LIMITS = StompLimits(max_frame_size=64, max_headers=6, max_header_length=48, max_command_length=12)


# --------------------------------------------------------------------------- generated frames

_KNOWN_NAMES = (
    "destination",
    "id",
    "ack",
    "receipt",
    "receipt-id",
    "transaction",
    "subscription",
    "message-id",
    "content-type",
    "selector",
    "persistent",
    "priority",
    "expires",
    "heart-beat",
    "accept-version",
    "version",
    "host",
    "login",
    "passcode",
    "message",
    "reply-to",
    "x-custom",
)
# Every character STOMP escapes, plus anything else UTF-8 can carry except NUL;
# mostly ASCII, so that mutations reach more than the UTF-8 check.
_char = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from(":\\\n\r"),
    st.characters(codec="utf-8", exclude_characters="\x00"),
)
_text = st.text(alphabet=_char, max_size=16)
_name = st.sampled_from(_KNOWN_NAMES) | _text.filter(bool)
_command = st.sampled_from(COMMANDS) | st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,11}", fullmatch=True)
_eols = st.sampled_from([b"", b"", b"\n", b"\r\n", b"\n\n", b"\r\n\n\r\n"])


def representable(name: str, value: str, version: str, command: str) -> tuple[str, str]:
    """Make a header pair survive the trip for ``version`` and ``command``.

    Without escaping (1.0, CONNECT/STOMP/CONNECTED) LF cannot appear and ':'
    cannot be in a name; without a CR escape (1.0, 1.1) a value ending in CR
    reads as a CRLF line ending.  These are the protocol's limits, not the
    codec's, so the generator stays inside them.
    """
    if version == "1.0" or command in _UNESCAPED:
        name = name.replace("\n", "_").replace(":", "_")
        value = value.replace("\n", "_")
    if version != "1.2" or command in _UNESCAPED:
        value = value.rstrip("\r")
    if name == "content-length":  # the generator decides that header itself
        name = "x-content-length"
    return name, value


@dataclass
class GenFrame:
    """A frame as sent (header list with duplicates) and as it must be decoded."""

    command: str
    headers: list[tuple[str, str]]
    body: bytes
    crlf: bool = False

    def wire(self, version: str) -> bytes:
        data = encode_frame(self.command, self.headers, self.body, version=version)
        if self.crlf:
            # Same frame with CRLF line endings in the command and header lines.
            end = data.index(b"\n\n") + 2
            data = data[:end].replace(b"\n", b"\r\n") + data[end:]
        return data

    def expected(self) -> Frame:
        first: dict[str, str] = {}
        for name, value in self.headers:
            first.setdefault(name, value)  # STOMP 1.2: the first of repeated headers wins
        return Frame(self.command, first, self.body)


def _body(max_size: int) -> st.SearchStrategy[bytes]:
    # Binary or text: a text body keeps mutations that shift it into the headers
    # from all ending at the UTF-8 check.
    return st.binary(max_size=max_size) | st.text(
        st.characters(min_codepoint=0, max_codepoint=0x7E), max_size=max_size
    ).map(str.encode)


@st.composite
def gen_frame(draw: Callable[..., Any], version: str, max_body: int = 64) -> GenFrame:
    command = draw(_command)
    headers = [
        representable(n, v, version, command)
        for n, v in draw(st.lists(st.tuples(_name, _text), max_size=6))
    ]
    body = draw(_body(max_body))
    if draw(st.booleans()):
        # NULs allowed: content-length says where the body ends.
        at = draw(st.integers(0, len(headers)))
        headers.insert(at, ("content-length", str(len(body))))
    else:
        body = body.replace(b"\0", b"")
    return GenFrame(command, headers, body, draw(st.booleans()))


@dataclass
class GenStream:
    """Generated frames of one version and the bytes that carry them."""

    version: str
    frames: list[GenFrame]
    wire: bytes

    def expected(self) -> list[Frame]:
        return [f.expected() for f in self.frames]


@st.composite
def gen_stream(
    draw: Callable[..., Any], max_frames: int = 5, max_body: int = 64, version: str | None = None
) -> GenStream:
    """Frames of one version with heart-beat EOLs before, between and after them."""
    version = version or draw(st.sampled_from(VERSIONS))
    frames = draw(st.lists(gen_frame(version, max_body), min_size=1, max_size=max_frames))
    parts = [draw(_eols)]
    for frame in frames:
        parts.append(frame.wire(version))
        parts.append(draw(_eols))
    return GenStream(version, frames, b"".join(parts))


# --------------------------------------------------------------------------- driving the decoder


@dataclass
class Outcome:
    """Everything a session could observe from feeding one byte stream."""

    frames: list[Frame] = field(default_factory=list)
    error: StompProtocolError | None = None
    buffered: int = 0

    def same_as(self, other: "Outcome") -> bool:
        # Which check trips first may differ (a line limit can be seen before
        # the block is complete); that an error happens, and where, may not.
        return (
            self.frames == other.frames
            and (self.error is None) == (other.error is None)
            and (self.error is not None or self.buffered == other.buffered)
        )


def feed_all(chunks: list[bytes], version: str, limits: StompLimits | None = None) -> Outcome:
    """Feed ``chunks`` as the session does, resuming with ``feed(b"")`` after a CONNECT.

    Anything but a StompProtocolError escapes and fails the test.
    """
    dec = StompDecoder(limits or DEFAULT_LIMITS, version=version)
    out = Outcome()
    try:
        for chunk in chunks:
            got = dec.feed(chunk)
            out.frames += got
            while got and got[-1].command in ("CONNECT", "STOMP") and dec.buffered:
                got = dec.feed(b"")
                out.frames += got
    except StompProtocolError as exc:
        out.frames += exc.frames
        out.error = exc
        return out
    out.buffered = dec.buffered
    return out


def max_buffered(limits: StompLimits) -> int:
    """The most an incomplete frame may hold: a full header block, a full body and its NUL."""
    line = limits.max_header_length + 2
    header_block = limits.max_command_length + 2 + limits.max_headers * line + 2
    return header_block + limits.max_frame_size + 1


def check_outcome(out: Outcome, limits: StompLimits) -> None:
    """What any decoded input must look like to the session."""
    for frame in out.frames:
        assert isinstance(frame, Frame)
        assert isinstance(frame.command, str) and frame.command, frame
        assert frame.command.isprintable(), frame
        assert len(frame.command.encode()) <= limits.max_command_length, frame
        assert isinstance(frame.body, bytes), frame
        assert len(frame.body) <= limits.max_frame_size, frame
        assert len(frame.headers) <= limits.max_headers, frame
        for name, value in frame.headers.items():
            assert isinstance(name, str) and name and isinstance(value, str), frame
            assert "\0" not in name and "\0" not in value, frame
        length = frame.headers.get("content-length")
        if length is not None:
            assert int(length) == len(frame.body), frame
        else:
            assert b"\0" not in frame.body, frame
    if out.error is not None:
        event(f"error: {out.error.message}")  # shown by --hypothesis-show-statistics
        assert isinstance(out.error.message, str) and out.error.message
        assert isinstance(out.error.detail, str)
        assert isinstance(out.error.headers, dict)
    else:
        event("frames only" if not out.buffered else "frames and an incomplete frame")
        assert 0 <= out.buffered <= max_buffered(limits)


# --------------------------------------------------------------------------- valid input


@fuzz_settings(200)
@given(stream=gen_stream(max_body=300))
def test_generated_frames_round_trip(stream: GenStream) -> None:
    """Every frame the encoder writes, in every version, decodes to itself."""
    out = feed_all([stream.wire], stream.version)
    assert out.error is None, out.error
    assert out.frames == stream.expected()
    assert out.buffered == 0


@fuzz_settings(50)
@given(stream=gen_stream(max_frames=3, max_body=16))
def test_valid_stream_cut_at_any_single_point_decodes_the_same(stream: GenStream) -> None:
    """TCP may cut a stream anywhere: every one of the cut points gives the same frames."""
    expected = stream.expected()
    wire = stream.wire
    for cut in range(len(wire) + 1):
        out = feed_all([wire[:cut], wire[cut:]], stream.version)
        assert out.error is None, (cut, out.error)
        assert out.frames == expected, cut
        assert out.buffered == 0, cut


@fuzz_settings(100)
@given(stream=gen_stream(max_frames=6, max_body=600), data=st.data())
def test_valid_stream_in_random_chunks_decodes_the_same(stream: GenStream, data: st.DataObject) -> None:
    chunks = split(data.draw, stream.wire, max_cuts=12)
    out = feed_all(chunks, stream.version)
    assert out.error is None, out.error
    assert out.frames == stream.expected()
    assert out.buffered == 0


@fuzz_settings(30)
@given(stream=gen_stream(max_frames=3, max_body=8))
def test_valid_stream_byte_by_byte_decodes_the_same(stream: GenStream) -> None:
    out = feed_all([stream.wire[i : i + 1] for i in range(len(stream.wire))], stream.version)
    assert out.error is None, out.error
    assert out.frames == stream.expected()
    assert out.buffered == 0


@fuzz_settings(100)
@given(
    version=st.sampled_from(VERSIONS),
    connect=gen_frame("1.0"),
    data=st.data(),
)
def test_frames_after_connect_are_read_with_the_negotiated_version(
    version: str, connect: GenFrame, data: st.DataObject
) -> None:
    """The decoder stops after CONNECT so the session can switch the escaping before the rest.

    A decoder starts at 1.0; the CONNECT in the same read as the following
    frames must not make those frames be read as 1.0.
    """
    connect = GenFrame(data.draw(st.sampled_from(["CONNECT", "STOMP"])), connect.headers, connect.body)
    rest = data.draw(gen_stream(max_frames=4, version=version))
    dec = StompDecoder(version="1.0")
    got = dec.feed(connect.wire("1.0") + data.draw(_eols) + rest.wire)
    assert got == [connect.expected()]
    dec.version = version
    got = dec.feed(b"")
    while got and got[-1].command in ("CONNECT", "STOMP") and dec.buffered:
        got += dec.feed(b"")
    assert got == rest.expected()
    assert dec.buffered == 0


@fuzz_settings(50)
@given(eols=st.lists(st.sampled_from([b"\n", b"\r\n"]), max_size=40), cr=st.booleans(), data=st.data())
def test_heart_beats_alone_give_nothing_and_hold_at_most_a_cr(
    eols: list[bytes], cr: bool, data: st.DataObject
) -> None:
    """EOL heart-beats are not frames and are not kept; only a trailing CR (maybe half a
    CRLF) may be held, however the EOLs are cut into reads."""
    wire = b"".join(eols) + (b"\r" if cr else b"")
    out = feed_all(split(data.draw, wire), "1.2")
    assert out.error is None, out.error
    assert out.frames == []
    assert out.buffered == (1 if cr else 0)


# --------------------------------------------------------------------------- limits


def _metrics(frame: GenFrame, version: str) -> tuple[int, int, int, int]:
    """(command bytes, header lines, longest header line in bytes, body bytes) on the wire."""
    data = encode_frame(frame.command, frame.headers, frame.body, version=version)
    head = data[: data.index(b"\n\n")].split(b"\n")
    longest = max((len(line) for line in head[1:]), default=0)
    return len(head[0]), len(head) - 1, longest, len(frame.body)


@fuzz_settings(200)
@given(
    version=st.sampled_from(VERSIONS),
    data=st.data(),
    deltas=st.tuples(*[st.integers(-2, 2)] * 4),
)
def test_limits_are_enforced_exactly(version: str, data: st.DataObject, deltas: tuple[int, ...]) -> None:
    """A frame within every limit decodes; one byte, line or header over any limit is refused.

    The limits are set around the frame's own sizes, so both sides of every
    boundary are exercised, whichever way the stream is cut.
    """
    frame = data.draw(gen_frame(version, max_body=80))
    metrics = _metrics(frame, version)
    limits = StompLimits(
        max_command_length=max(1, metrics[0] + deltas[0]),
        max_headers=max(1, metrics[1] + deltas[1]),
        max_header_length=max(1, metrics[2] + deltas[2]),
        max_frame_size=max(0, metrics[3] + deltas[3]),
    )
    within = (
        metrics[0] <= limits.max_command_length
        and metrics[1] <= limits.max_headers
        and metrics[2] <= limits.max_header_length
        and metrics[3] <= limits.max_frame_size
    )
    wire = frame.wire(version)
    for chunks in ([wire], split(data.draw, wire)):
        out = feed_all(chunks, version, limits)
        if within:
            assert out.error is None, (out.error, metrics, limits)
            assert out.frames == [frame.expected()]
        else:
            assert out.error is not None, (metrics, limits)
            assert out.frames == []
            assert out.error.message in (
                "Command too long",
                "Too many headers",
                "Header too long",
                "Headers too large",
                "Frame too large",
            ), out.error.message


# --------------------------------------------------------------------------- hostile input


@fuzz_settings(300)
@given(
    stream=gen_stream(max_frames=4, max_body=48),
    limits=st.sampled_from([DEFAULT_LIMITS, SMALL_LIMITS]),
    data=st.data(),
)
def test_mutated_frames_give_frames_or_a_protocol_error_however_they_are_cut(
    stream: GenStream, limits: StompLimits, data: st.DataObject
) -> None:
    """Flipped, cut, duplicated or spliced bytes: frames or StompProtocolError, never another
    exception, the limits hold, and chunking does not change the outcome."""
    wire = data.draw(mutate(stream.wire))
    whole = feed_all([wire], stream.version, limits)
    check_outcome(whole, limits)
    chunked = feed_all(split(data.draw, wire), stream.version, limits)
    check_outcome(chunked, limits)
    assert chunked.same_as(whole), (whole, chunked)


_SOUP = st.sampled_from(
    [
        b"SEND\n",
        b"CONNECT\n",
        b"MESSAGE\r\n",
        b"\n",
        b"\r\n",
        b"\r",
        b"\0",
        b"a:b\n",
        b"content-length:3\n",
        b"content-length:0\n",
        b"content-length:-1\n",
        b"content-length:99999999999\n",
        b"\\",
        b"\\c",
        b"x\\c:y\n",
        b"\xc3",
        b"\xff",
        b"\n\n",
        b"\n\r\n",
    ]
)


@fuzz_settings(300)
@given(
    chunks=st.lists(st.binary(max_size=40) | _SOUP, max_size=24),
    version=st.sampled_from(VERSIONS),
    limits=st.sampled_from([DEFAULT_LIMITS, SMALL_LIMITS]),
    data=st.data(),
)
@example(chunks=[b"SEND\ncontent-length:99999999999\n\n"], version="1.2", limits=DEFAULT_LIMITS, data=None)
def test_random_bytes_give_frames_or_a_protocol_error_however_they_are_cut(
    chunks: list[bytes], version: str, limits: StompLimits, data: st.DataObject | None
) -> None:
    """Random bytes and framing fragments, fed as generated, whole, and cut elsewhere."""
    whole = feed_all([b"".join(chunks)], version, limits)
    check_outcome(whole, limits)
    as_sent = feed_all(chunks, version, limits)
    check_outcome(as_sent, limits)
    assert as_sent.same_as(whole), (whole, as_sent)
    if data is not None:
        recut = feed_all(split(data.draw, b"".join(chunks)), version, limits)
        assert recut.same_as(whole), (whole, recut)

