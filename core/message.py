"""The protocol-independent message and its compact binary form.

A message is immutable once routed: every protocol reads the same object and
fan-out shares it, so per-delivery state (redelivery count, holder) lives in
``core.entry.Entry`` beside it.  ``cache`` is the one mutable slot: protocols
keep their encoded form there so a message fanned out to many subscribers of
one protocol version is encoded once.
"""
from __future__ import annotations

import struct
from typing import Any

__all__ = ["Message", "encode_message", "decode_message", "MessageFormatError"]

# Headers that selectors can address by their JMS names.
_JMS_LOOKUPS = {
    "JMSPriority": lambda m: m.priority,
    "JMSMessageID": lambda m: m.id,
    "JMSTimestamp": lambda m: m.timestamp,
    "JMSCorrelationID": lambda m: m.correlation_id,
    "JMSDeliveryMode": lambda m: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSExpiration": lambda m: m.expiration,
    "JMSXGroupID": lambda m: m.group_id,
    "JMSXGroupSeq": lambda m: m.group_seq,
    "JMSType": lambda m: m.headers.get("type"),
    "JMSReplyTo": lambda m: m.reply_to,
    "JMSDestination": lambda m: m.destination,
}


# What a message is made of (its __slots__ but the cache); copy() copies these.  A module
# constant rather than __slots__ introspection, which a compiled class (mypyc) does not offer.
FIELDS = (
    "id", "destination", "body", "headers", "persistent", "priority",
    "expiration", "timestamp", "group_id", "group_seq", "correlation_id",
    "reply_to", "content_type", "origin",
)


class Message:
    """One message as routed by the core.

    ``headers`` holds user properties and protocol headers that have no field
    of their own; they pass through to consumers unchanged.
    """

    __slots__ = (*FIELDS, "cache")

    def __init__(
        self,
        id: str,
        destination: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        persistent: bool = False,
        priority: int = 4,
        expiration: int = 0,
        timestamp: int = 0,
        group_id: str | None = None,
        group_seq: int = 0,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        content_type: str | None = None,
        origin: str | None = None,
    ) -> None:
        self.id = id
        self.destination = destination
        self.body = body
        self.headers = headers if headers is not None else {}
        self.persistent = persistent
        self.priority = priority
        self.expiration = expiration
        self.timestamp = timestamp
        self.group_id = group_id
        self.group_seq = group_seq
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.content_type = content_type
        # Connection id of the producer: lets a subscription refuse its own
        # connection's messages (MQTT 5 no-local); never stored.
        self.origin = origin
        self.cache: dict[Any, Any] | None = None

    def lookup(self, name: str) -> object:
        """Selector property lookup: JMS names map to fields, the rest to headers."""
        getter = _JMS_LOOKUPS.get(name)
        if getter is not None:
            return getter(self)
        return self.headers.get(name)

    def copy(self, **changes: Any) -> "Message":
        """A new message with some fields changed (DLQ, retargeting); the cache is not shared."""
        fields = {name: getattr(self, name) for name in FIELDS}
        fields["headers"] = dict(self.headers)
        fields.update(changes)
        return Message(**fields)

    def __repr__(self) -> str:
        return f"<Message {self.id} {self.destination} {len(self.body)}B>"


class MessageFormatError(ValueError):
    """A stored message record that this version cannot read."""


# Version 1 layout: a fixed struct, then length-prefixed UTF-8 strings and the body.
_V1 = 1
_FIXED = struct.Struct(">BBBqqqI")  # version, flags, priority, expiration, timestamp, group_seq, header count
_LEN = struct.Struct(">I")
_FLAG_PERSISTENT = 1
_OPTIONAL = ("group_id", "correlation_id", "reply_to", "content_type")
_PRESENT = tuple(bytes((i,)) for i in range(1 << len(_OPTIONAL)))  # the bit set of those present


def _put_str(parts: list[bytes], value: str) -> None:
    # surrogateescape: MQTT 5 correlation data that is not UTF-8 rides in a str
    # as escaped bytes, and must come back from the store byte for byte.
    raw = value.encode("utf-8", "surrogateescape")
    parts.append(_LEN.pack(len(raw)))
    parts.append(raw)


def encode_message(message: Message) -> bytes:
    """Versioned binary (never pickle) so stores stay readable across releases."""
    parts: list[bytes] = [
        _FIXED.pack(
            _V1,
            _FLAG_PERSISTENT if message.persistent else 0,
            message.priority,
            message.expiration,
            message.timestamp,
            message.group_seq,
            len(message.headers),
        )
    ]
    _put_str(parts, message.id)
    _put_str(parts, message.destination)
    # The _OPTIONAL fields by name, not getattr: compiled, these are direct slot reads.
    group_id, correlation_id = message.group_id, message.correlation_id
    reply_to, content_type = message.reply_to, message.content_type
    present = ((0 if group_id is None else 1) | (0 if correlation_id is None else 2)
               | (0 if reply_to is None else 4) | (0 if content_type is None else 8))
    parts.append(_PRESENT[present])
    if group_id is not None:
        _put_str(parts, group_id)
    if correlation_id is not None:
        _put_str(parts, correlation_id)
    if reply_to is not None:
        _put_str(parts, reply_to)
    if content_type is not None:
        _put_str(parts, content_type)
    for key, value in message.headers.items():
        _put_str(parts, key)
        _put_str(parts, value)
    parts.append(_LEN.pack(len(message.body)))
    parts.append(message.body)
    return b"".join(parts)


def decode_message(data: bytes) -> Message:
    try:
        version, flags, priority, expiration, timestamp, group_seq, nheaders = _FIXED.unpack_from(data, 0)
        if version != _V1:
            raise MessageFormatError(f"unknown message record version {version}")
        pos = _FIXED.size
        view = memoryview(data)

        def take_str() -> str:
            nonlocal pos
            (n,) = _LEN.unpack_from(data, pos)
            pos += 4
            value = str(view[pos:pos + n], "utf-8", "surrogateescape")
            pos += n
            return value

        msg_id = take_str()
        destination = take_str()
        present = data[pos]
        pos += 1
        optional = {}
        for bit, name in enumerate(_OPTIONAL):
            optional[name] = take_str() if present & (1 << bit) else None
        headers = {}
        for _ in range(nheaders):
            key = take_str()
            headers[key] = take_str()
        (n,) = _LEN.unpack_from(data, pos)
        pos += 4
        body = bytes(view[pos:pos + n])
        if len(body) != n:
            raise MessageFormatError("truncated message body")
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MessageFormatError(f"corrupt message record: {exc}") from exc
    return Message(
        msg_id, destination, body, headers,
        persistent=bool(flags & _FLAG_PERSISTENT), priority=priority,
        expiration=expiration, timestamp=timestamp, group_seq=group_seq, **optional,
    )
