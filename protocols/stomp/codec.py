"""STOMP 1.0/1.1/1.2 framing, sans-IO (in the style of h11/wsproto).

The codec only turns bytes into frames and frames into bytes: it knows
nothing about sockets, Twisted, sessions or which command is legal when.
Keeping it pure lets the session layer and the tests drive it with plain
bytes, and keeps the hot path free of framework overhead.  This module is
its public face and its reading half (``StompDecoder``); the writing half,
``encode_frame`` and the MESSAGE a fan-out shares (``message_tail``), is in
``protocols.stomp.encoding``, as h11 keeps its writers in ``_writers.py``.

Parsing is deliberately lenient where real clients differ (CR before any LF
in every version, heart-beat EOLs anywhere between frames) and strict where
leniency would be dangerous (limits are enforced before memory is spent,
undefined escapes and malformed UTF-8 are rejected).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from protocols.stomp.encoding import UNESCAPED_COMMANDS, encode_frame, escape_header, message_tail

__all__ = [
    "SERVER_COMMANDS",
    "CLIENT_COMMANDS",
    "StompProtocolError",
    "StompLimits",
    "Frame",
    "StompDecoder",
    "encode_frame",
    "escape_header",
    "message_tail",
    "unescape_header",
]

SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
CLIENT_COMMANDS = frozenset(
    {
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    }
)

_CONNECT_COMMANDS = frozenset({"CONNECT", "STOMP"})

_UNESCAPES: dict[str, dict[str, str] | None] = {
    "1.0": None,
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"n": "\n", "c": ":", "\\": "\\", "r": "\r"},
}

# One C-level match beats a Python loop when a peer floods heart-beats.
_skip_eols = re.compile(rb"(?:\r?\n)*").match


def _max_header_block(limits: StompLimits) -> int:
    # Command line, every header line and the blank line, each with CRLF.
    return limits.max_command_length + 2 + limits.max_headers * (limits.max_header_length + 2) + 2


class StompProtocolError(Exception):
    """The peer sent something the codec cannot accept.

    ``message`` is short enough for the ERROR frame's ``message`` header;
    ``detail`` is meant for the ERROR frame's body.  The decoder that raised
    it must be discarded (the session closes the connection).  ``frames``
    holds the frames that the failing ``feed`` call had completed before the
    bad input, so a session can still act on them (e.g. a SEND followed by
    garbage in the same read) before reporting the error.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.frames: list[Frame] = []
        self.headers: dict[str, str] = {}


@dataclass(slots=True)
class StompLimits:
    """Caps that bound the memory a single peer can make us allocate."""

    max_frame_size: int = 4 * 1024 * 1024  # body bytes
    max_headers: int = 1000  # header lines per frame
    max_header_length: int = 10240  # bytes in one header line (name:value)
    max_command_length: int = 64  # bytes in the command line


class Frame:
    """A decoded or to-be-encoded frame.

    Plain slots instead of a dataclass: frames are created once per message
    on the hot path.  Equality is by value so tests and callers can compare
    frames directly.
    """

    __slots__ = ("command", "headers", "body")

    def __init__(
        self,
        command: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> None:
        self.command = command
        self.headers = {} if headers is None else headers
        self.body = body

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (
            self.command == other.command
            and self.headers == other.headers
            and self.body == other.body
        )

    __hash__ = None  # type: ignore[assignment]  # mutable value object

    def __repr__(self) -> str:
        body = self.body
        if len(body) > 64:
            shown = f"{body[:64]!r}... ({len(body)} bytes)"
        else:
            shown = repr(body)
        return f"Frame({self.command!r}, {self.headers!r}, body={shown})"


def _unescape_table(version: str) -> dict[str, str] | None:
    try:
        return _UNESCAPES[version]
    except KeyError:
        raise ValueError(f"unknown STOMP version {version!r}") from None


def _unescape(value: str, table: dict[str, str]) -> str:
    # Only called when a backslash is present, so the split-free loop runs
    # once per escape, not once per character.
    out = []
    i = 0
    end = len(value)
    find = value.find
    while True:
        j = find("\\", i)
        if j < 0:
            out.append(value[i:])
            return "".join(out)
        out.append(value[i:j])
        if j + 1 >= end:
            raise StompProtocolError(
                "Invalid header escape",
                f"header {value!r} ends with a lone backslash",
            )
        rep = table.get(value[j + 1])
        if rep is None:
            raise StompProtocolError(
                "Invalid header escape",
                f"undefined escape sequence \\{value[j + 1]} in header {value!r}",
            )
        out.append(rep)
        i = j + 2


def unescape_header(value: str, version: str) -> str:
    """Undo header escaping for ``version``.

    Raises StompProtocolError on an escape the version does not define,
    because the spec says such frames must be treated as fatal errors.
    """
    table = _unescape_table(version)
    if table is None or "\\" not in value:
        return value
    return _unescape(value, table)


class StompDecoder:
    """Incremental STOMP frame parser: ``feed`` bytes, get complete frames.

    Data is kept in one bytearray that is compacted once per ``feed``.  When
    nothing is buffered, the incoming ``bytes`` object is parsed in place and
    only an incomplete tail is copied.  Scan positions of a partial frame are
    stored relative to the frame's start, so compaction never has to fix them
    up, and a frame split into many pieces is not rescanned from its start
    for every piece.  The common case (a whole header block available) is
    inlined in ``feed``: method calls and attribute lookups per frame are a
    measurable share of the cost on the hot path.
    """

    __slots__ = (
        "limits",
        "_version",
        "_table",
        "_buf",
        # body phase (``_cmd`` is None while the headers are incomplete)
        "_cmd",
        "_headers",
        "_bstart",
        "_clen",
        "_nscan",
        # header phase; non-zero only while a header block arrives in pieces
        "_hscan",
        "_lscan",
        "_lcount",
    )

    def __init__(self, limits: StompLimits | None = None, version: str = "1.0") -> None:
        self.limits = StompLimits() if limits is None else limits
        self._table = _unescape_table(version)
        self._version = version
        self._buf = bytearray()
        self._cmd: str | None = None
        self._headers: dict[str, str] = {}
        self._bstart = 0
        self._clen = -1
        self._nscan = 0
        self._hscan = 0
        self._lscan = 0
        self._lcount = 0

    @property
    def version(self) -> str:
        """Negotiated version; it only decides how headers are unescaped."""
        return self._version

    @version.setter
    def version(self, version: str) -> None:
        self._table = _unescape_table(version)
        self._version = version

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame, for the session's memory accounting."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Consume ``data`` and return every frame it completes, in order.

        Raises StompProtocolError on bad input; the decoder is then unusable.
        """
        if not isinstance(data, bytes):
            data = bytes(data)  # a transport may hand a bytearray or memoryview; one copy per read
        if not data and not self._buf:
            return []
        own = self._buf
        buf: bytes | bytearray
        if own:
            own += data
            buf = own
        else:
            buf = data if type(data) is bytes else bytes(data)
        n = len(buf)
        pos = 0
        frames: list[Frame] = []
        append = frames.append
        find = buf.find
        limits = self.limits
        max_body = limits.max_frame_size
        max_cmd = limits.max_command_length
        max_line = limits.max_header_length
        max_headers = limits.max_headers
        max_block = _max_header_block(limits)
        table = self._table

        headers: dict[str, str] | None = None
        try:
            while pos < n:
                cmd = self._cmd
                headers = None
                if cmd is None:
                    # header phase
                    c = buf[pos]
                    if c == 10 or c == 13:  # heart-beats
                        if c == 10:
                            # The usual single LF after a NUL skips the regex.
                            pos += 1
                            if pos < n and (buf[pos] == 10 or buf[pos] == 13):
                                pos = _skip_eols(buf, pos).end()  # type: ignore[union-attr]  # matches the empty string
                        else:
                            pos = _skip_eols(buf, pos).end()  # type: ignore[union-attr]  # matches the empty string
                        if pos >= n:
                            break
                        if buf[pos] == 13 and pos + 1 == n:
                            break  # maybe the first half of a CRLF heart-beat
                    nl = find(b"\n", pos, pos + max_cmd + 2)
                    if nl < 0:
                        if n - pos > max_cmd + 1:
                            raise StompProtocolError(
                                "Command too long",
                                f"no end of line within {max_cmd} bytes of a frame start",
                            )
                        break
                    cr = buf[nl - 1] == 13
                    if nl - pos - cr > max_cmd:
                        raise StompProtocolError(
                            "Command too long", f"command line exceeds {max_cmd} bytes"
                        )
                    # The header block ends at the first LF followed by LF or
                    # CRLF.  Search the form the command line used first and
                    # bound the other search by its hit, so coalesced frames
                    # are not scanned past their own headers.
                    hs = self._hscan
                    scan = pos + hs if hs else nl
                    lim = pos + max_block
                    if cr:
                        k = find(b"\n\r\n", scan, lim)
                        j = find(b"\n\n", scan, k + 2 if k >= 0 else lim)
                    else:
                        j = find(b"\n\n", scan, lim)
                        k = find(b"\n\r\n", scan, j + 2 if j >= 0 else lim)
                    if j >= 0 and (k < 0 or j < k):
                        hend = j
                        bstart = j + 2
                    elif k >= 0:
                        hend = k
                        bstart = k + 3
                    else:
                        if not hs:  # reject a bad command before its headers
                            _check_command(buf[pos : nl - cr])
                        self._incomplete_headers(buf, pos, n, nl - pos)
                        break
                    if hs:
                        self._hscan = self._lscan = self._lcount = 0

                    try:
                        text = buf[pos : hend + 1].decode("utf-8")
                    except UnicodeDecodeError as bad:  # a name of its own: compiled, `exc` below is typed
                        raise StompProtocolError("Invalid UTF-8 in headers", str(bad)) from None
                    if "\0" in text:
                        # Legal UTF-8, but a peer that splits frames at NUL would misread it.
                        raise StompProtocolError("NUL in headers", "a header contains a NUL byte")
                    if "\r" in text:
                        text = text.replace("\r\n", "\n")
                    lines = text.split("\n")
                    lines.pop()  # the empty remainder after the last LF
                    cmd = lines[0]
                    if not cmd.isprintable():
                        _check_command(cmd.encode("utf-8"))
                    if len(lines) > max_headers + 1:
                        raise StompProtocolError(
                            "Too many headers",
                            f"{len(lines) - 1} header lines, at most {max_headers} allowed",
                        )
                    if hend - nl > max_line:  # only then can a line be too long
                        _check_line_lengths(lines, text.isascii(), max_line)

                    headers = {}
                    it = iter(lines)
                    next(it)
                    if table is None or "\\" not in text or cmd in UNESCAPED_COMMANDS:
                        for line in it:
                            name, sep, value = line.partition(":")
                            if not (sep and name):
                                _bad_header(line)
                            if name not in headers:  # STOMP 1.2: first one wins
                                headers[name] = value
                    else:
                        for line in it:
                            name, sep, value = line.partition(":")
                            if not (sep and name):
                                _bad_header(line)
                            if "\\" in name:
                                name = _unescape(name, table)
                            if "\\" in value:
                                value = _unescape(value, table)
                            if name not in headers:
                                headers[name] = value

                    cl = headers.get("content-length")
                    if cl is None:
                        clen = -1
                    else:
                        if not (cl.isascii() and cl.isdigit()):
                            raise StompProtocolError(
                                "Invalid content-length",
                                f"content-length {cl!r} is not a non-negative integer",
                            )
                        clen = int(cl)
                        if clen > max_body:
                            raise StompProtocolError(
                                "Frame too large",
                                f"content-length {clen} exceeds {max_body} bytes",
                            )
                    nscan = bstart
                else:
                    headers = self._headers
                    bstart = pos + self._bstart
                    clen = self._clen
                    nscan = pos + self._nscan

                # body phase
                if clen >= 0:
                    end = bstart + clen
                    if end >= n:
                        self._save_body_state(cmd, headers, bstart - pos, clen, 0)
                        break
                    if buf[end] != 0:
                        raise StompProtocolError(
                            "Frame not terminated by NUL",
                            f"expected NUL after {clen} body bytes (content-length)",
                        )
                else:
                    end = find(b"\0", nscan, bstart + max_body + 1)
                    if end < 0:
                        if n - bstart > max_body:
                            raise StompProtocolError(
                                "Frame too large", f"body exceeds {max_body} bytes without a NUL"
                            )
                        self._save_body_state(cmd, headers, bstart - pos, -1, n - pos)
                        break
                if buf is own:
                    if end - bstart > 256:
                        body = bytes(memoryview(buf)[bstart:end])  # one copy, not two
                    else:
                        body = bytes(buf[bstart:end])
                else:
                    body = buf[bstart:end]  # type: ignore[assignment]  # buf is the caller's bytes here, not our bytearray
                append(Frame(cmd, headers, body))
                pos = end + 1
                if self._cmd is not None:
                    self._cmd = None
                    self._headers = {}
                if cmd in _CONNECT_COMMANDS:
                    # What follows a CONNECT is unescaped by the version it
                    # negotiates: stop here; the session sets the version and
                    # calls feed(b"") for the rest.
                    break
        except StompProtocolError as exc:
            exc.frames = frames
            # The refused frame's headers, when they were read: its receipt
            # header still deserves a receipt-id on the ERROR.
            exc.headers = headers or {}
            raise

        if buf is own:
            if pos >= n:
                self._buf = bytearray()  # also releases a large frame's capacity
            elif pos:
                del own[:pos]
        elif pos < n:
            own += memoryview(buf)[pos:]
        return frames

    def _save_body_state(
        self, cmd: str, headers: dict[str, str], bstart: int, clen: int, nscan: int
    ) -> None:
        self._cmd = cmd
        self._headers = headers
        self._bstart = bstart
        self._clen = clen
        self._nscan = nscan

    def _incomplete_headers(self, buf: bytes | bytearray, start: int, n: int, nl: int) -> None:
        """Check the limits on a partial header block and remember progress.

        Lines are checked as they complete, so an oversized line or too many
        lines fail as soon as they arrive rather than when (if ever) the
        block is finished.  ``nl`` is the command line's LF, relative.
        """
        limits = self.limits
        max_line = limits.max_header_length
        max_headers = limits.max_headers
        ls = start + (self._lscan if self._lscan > nl else nl + 1)
        count = self._lcount
        find = buf.find
        while True:
            e = find(b"\n", ls, n)
            if e < 0:
                break
            if e - ls - (buf[e - 1] == 13) > max_line:
                raise StompProtocolError("Header too long", f"header line exceeds {max_line} bytes")
            count += 1
            if count > max_headers:
                raise StompProtocolError(
                    "Too many headers", f"more than {max_headers} header lines"
                )
            ls = e + 1
        if n - ls > max_line + 1:  # +1: the last byte may be half of a CRLF
            raise StompProtocolError("Header too long", f"header line exceeds {max_line} bytes")
        if n - start > _max_header_block(limits):  # unreachable while the above hold
            raise StompProtocolError("Headers too large", "header block exceeds the limits")
        self._lscan = ls - start
        self._lcount = count
        # A terminator may straddle the boundary by up to two bytes.
        self._hscan = max(nl, n - start - 2)


def _check_command(raw: bytes | bytearray) -> None:
    try:
        cmd = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StompProtocolError("Invalid UTF-8 in headers", str(exc)) from None
    if not cmd.isprintable():
        raise StompProtocolError("Invalid command", f"command {cmd!r} is not printable")


def _check_line_lengths(lines: list[str], ascii_only: bool, max_line: int) -> None:
    # The limit is in bytes; characters equal bytes only for ASCII.
    for idx in range(1, len(lines)):
        line = lines[idx]
        if (len(line) if ascii_only else len(line.encode("utf-8"))) > max_line:
            raise StompProtocolError("Header too long", f"header line exceeds {max_line} bytes")


def _bad_header(line: str) -> None:
    if ":" not in line:
        raise StompProtocolError("Malformed header", f"header line {line!r} has no ':'")
    raise StompProtocolError("Empty header name", f"header line {line!r} has no name")
