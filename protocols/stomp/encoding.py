"""STOMP frames to bytes, sans-IO: any frame (``encode_frame``), and a MESSAGE built once for a fan-out.

The writing half of the codec (h11 keeps its writers in ``_writers.py``);
``protocols.stomp.codec`` is the codec's public face and re-exports what is
public here.  A ``MESSAGE`` is the per-subscription headers (``subscription``,
``ack``, redelivery), which the session writes, followed by a tail that
depends only on the message and the version's escaping: ``message_tail``
builds that once per message and version and keeps it in ``Message.cache``,
so a message fanned out to many subscribers costs one encoding plus a small
join each.
"""
from __future__ import annotations

from typing import Iterable

from core.message import Message
from protocols.stomp import names

__all__ = ["UNESCAPED_COMMANDS", "encode_frame", "escape_header", "message_tail"]

# The spec exempts these from header escaping so that a client can connect
# before any version (and therefore any escaping scheme) has been agreed.
UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
_VERSIONS = frozenset({"1.0", "1.1", "1.2"})

# Message.cache keys of the tails: one per escaping (1.0 none, 1.1 without CR, 1.2 all), made once.
_TAIL_KEYS = {"1.0": ("stomp", True, False), "1.1": ("stomp", False, False), "1.2": ("stomp", False, True)}
_SPECIAL = ("\\", "\n", ":", "\r")


def escape_header(value: str, version: str) -> str:
    """Escape a header name or value for ``version``.

    1.1 has no CR escape, so CR is passed through there; 1.0 has no escaping
    at all.
    """
    if version == "1.2":
        if "\\" in value:
            value = value.replace("\\", "\\\\")
        if "\n" in value:
            value = value.replace("\n", "\\n")
        if ":" in value:
            value = value.replace(":", "\\c")
        if "\r" in value:
            value = value.replace("\r", "\\r")
        return value
    if version == "1.1":
        if "\\" in value:
            value = value.replace("\\", "\\\\")
        if "\n" in value:
            value = value.replace("\n", "\\n")
        if ":" in value:
            value = value.replace(":", "\\c")
        return value
    if version == "1.0":
        return value
    raise ValueError(f"unknown STOMP version {version!r}")


def encode_frame(
    command: str,
    headers: Iterable[tuple[str, str]] | dict[str, str] = (),
    body: bytes = b"",
    version: str = "1.2",
) -> bytes:
    """Serialise one frame.

    Header order and duplicates are preserved because the caller may rely
    on first-wins semantics at the receiver.  content-length is not added
    implicitly: whether to send it is the session's decision.

    Where no escaping applies (version 1.0, or CONNECT/STOMP/CONNECTED) a
    header containing LF (or a name containing ':') cannot be represented;
    it raises ValueError rather than letting one peer inject headers or
    frames into another peer's stream.
    """
    if "\n" in command:
        raise ValueError(f"command {command!r} contains LF")
    items = headers.items() if isinstance(headers, dict) else headers
    parts = [command, "\n"]
    append = parts.append
    if version != "1.0" and command not in UNESCAPED_COMMANDS:
        if version == "1.2":
            for name, value in items:
                append(escape_header(name, "1.2"))
                append(":")
                append(escape_header(value, "1.2"))
                append("\n")
        elif version == "1.1":
            for name, value in items:
                append(escape_header(name, "1.1"))
                append(":")
                append(escape_header(value, "1.1"))
                append("\n")
        else:
            raise ValueError(f"unknown STOMP version {version!r}")
    else:
        if version not in _VERSIONS:
            raise ValueError(f"unknown STOMP version {version!r}")
        for name, value in items:
            if "\n" in name or ":" in name or "\n" in value:
                raise ValueError(
                    f"header {name!r}:{value!r} cannot be sent unescaped "
                    f"(version {version}, command {command})"
                )
            append(name)
            append(":")
            append(value)
            append("\n")
    append("\n")
    return b"".join(("".join(parts).encode("utf-8"), body, b"\0"))


def message_tail(message: Message, version: str) -> bytes:
    """Everything of a MESSAGE after the per-subscriber headers: built once per message and escaping."""
    cache = message.cache
    if cache is None:
        cache = message.cache = {}
    key = _TAIL_KEYS[version]
    tail = cache.get(key)
    if tail is None:
        headers = [
            ("destination", names.from_canonical(message.destination)),
            ("timestamp", str(message.timestamp)),
            ("priority", str(message.priority)),
        ]
        if message.persistent:
            headers.append(("persistent", "true"))
        if message.expiration:
            headers.append(("expires", str(message.expiration)))
        if message.content_type is not None:
            headers.append(("content-type", message.content_type))
        if message.correlation_id is not None:
            headers.append(("correlation-id", message.correlation_id))
        if message.reply_to is not None:
            headers.append(("reply-to", names.from_canonical(message.reply_to)))
        if message.group_id is not None:
            headers.append(("JMSXGroupID", message.group_id))
            headers.append(("JMSXGroupSeq", str(message.group_seq)))
        reserved = {name for name, _ in headers}
        reserved.add("message-id")
        reserved.add("")  # an MQTT 5 user property may have an empty name; STOMP headers may not
        headers.extend((k, v) for k, v in message.headers.items() if k not in reserved)
        if version == "1.0":
            # 1.0 has no escaping: a header another client sent with a newline
            # (or a colon in its name) cannot be written, so it is left out.
            headers = [(k, v) for k, v in headers if "\n" not in k and "\n" not in v and ":" not in k]
        headers.append(("content-length", str(len(message.body))))
        # Every id has a colon ("ID:..."): escaped on its own, so the other
        # headers usually need no escaping at all.
        first = "message-id:" + (message.id if version == "1.0" else escape_header(message.id, version)) + "\n"
        tail = cache[key] = _encode_tail(first, headers, message.body, version)
    return tail


def _encode_tail(first: str, headers: list[tuple[str, str]], body: bytes, version: str) -> bytes:
    """Header lines, blank line, body and NUL of a MESSAGE, built once per message.

    Escaping runs only when some name or value needs it: usually none does,
    and then the frame is one join.  1.0 headers were filtered by the caller.
    """
    if version != "1.0":
        joined = "".join(name + value for name, value in headers)
        if any(c in joined for c in _SPECIAL):
            headers = [(escape_header(name, version), escape_header(value, version)) for name, value in headers]
    text = first + "".join([f"{name}:{value}\n" for name, value in headers])
    if "\0" in text:
        # No STOMP header may hold a NUL (a reader without content-length would end
        # the frame there); MQTT 5 correlation data and user properties may.
        text = text.replace("\0", "?")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        # Bytes that are not UTF-8 (MQTT 5 binary correlation data) cannot be a
        # STOMP header value: they arrive as U+FFFD-free '?' rather than break the frame.
        raw = text.encode("utf-8", "replace")
    return b"".join((raw, b"\n", body, b"\0"))
