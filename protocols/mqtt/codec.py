"""MQTT 3.1 / 3.1.1 / 5.0 packet codec, sans-IO (in the style of h11/wsproto).

The codec only turns bytes into packets and packets into bytes: it knows
nothing about sockets, Twisted, sessions or which packet is legal when.
Keeping it pure lets the session layer and the tests drive it with plain
bytes, and keeps the hot path (PUBLISH) free of framework overhead.

What the decoder checks is what can be checked from one packet alone:
framing, fixed-header flags, field encodings, property identifiers, value
ranges and duplicates.  Everything that needs session state or policy (client
identifier rules, topic-filter wildcard placement, ``$share``, topic aliases,
payload-format validation, the reason codes a peer may use) is the session's.

Levels: 3 is MQTT 3.1 (protocol name ``MQIsdp``), 4 is 3.1.1, 5 is 5.0.
3.x packets carry no properties or reason codes; the same packet classes are
used for every level and the fields a level cannot carry decode as their
defaults (``properties == {}``, ``reason_code == 0``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, ClassVar, Union

__all__ = [
    "MAX_PACKET_SIZE",
    "MqttProtocolError",
    "PacketType",
    "ReasonCode",
    "ConnackReturnCode",
    "Connect",
    "Will",
    "Connack",
    "Publish",
    "Puback",
    "Pubrec",
    "Pubrel",
    "Pubcomp",
    "Subscribe",
    "SubscriptionRequest",
    "Suback",
    "Unsubscribe",
    "Unsuback",
    "Pingreq",
    "Pingresp",
    "Disconnect",
    "Auth",
    "Packet",
    "MqttDecoder",
    "encode",
    "encode_publish",
    "publish_parts",
    "encode_variable_byte_integer",
]

#: Largest remaining length (and Variable Byte Integer) the protocol can express.
MAX_PACKET_SIZE = 268435455


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


# Will properties are checked like a packet of their own.
_WILL = 16
_PACKET_NAMES = {t.value: t.name for t in PacketType}
_PACKET_NAMES[0] = "reserved packet type 0"
_PACKET_NAMES[_WILL] = "Will properties"


class ReasonCode(enum.IntEnum):
    """MQTT 5 reason codes; several names share a value, as in the spec."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackReturnCode(enum.IntEnum):
    """CONNACK return codes of MQTT 3.1 and 3.1.1 (``Connack.reason_code`` there)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class MqttProtocolError(Exception):
    """The peer sent something the codec cannot accept.

    ``reason_code`` is the MQTT 5 reason code for the DISCONNECT (or, while
    connecting, the CONNACK) that reports it; ``message`` is short enough
    for a Reason String.  The decoder that raised it must be discarded.

    ``packets`` holds the packets that the failing ``feed`` call completed
    before the bad input, so a session can still act on them.  Errors raised
    inside a CONNECT carry ``protocol_level`` (the level byte, once it was
    read) so the session knows which CONNACK format the client understands;
    an unsupported protocol name or level also sets ``connack_return_code``
    to 1 (3.x "unacceptable protocol version") and ``protocol_name``.
    """

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message
        self.packets: list[Packet] = []
        self.connack_return_code: int | None = None
        self.protocol_name: str | None = None
        self.protocol_level: int | None = None

    def __repr__(self) -> str:
        return f"MqttProtocolError(0x{self.reason_code:02X}, {self.message!r})"


def _malformed(message: str) -> MqttProtocolError:
    return MqttProtocolError(0x81, message)


def _protocol(message: str) -> MqttProtocolError:
    return MqttProtocolError(0x82, message)


def _short_bytes(data: bytes) -> str:
    if len(data) > 64:
        return f"{bytes(data[:64])!r}... ({len(data)} bytes)"
    return repr(data)


# --------------------------------------------------------------------------- packets
#
# Slotted dataclasses: value equality for tests and callers, no per-instance
# dict on the hot path.  ``properties`` is always a dict (empty for 3.x).


@dataclass(slots=True, repr=False)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"Will(topic={self.topic!r}, payload={_short_bytes(self.payload)}, qos={self.qos}, "
            f"retain={self.retain}, properties={self.properties!r})"
        )


@dataclass(slots=True, repr=False)
class Connect:
    packet_type: ClassVar[int] = 1
    protocol_name: str
    level: int
    clean_start: bool
    keep_alive: int
    client_id: str
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        # The password is kept out of logs and tracebacks.
        password = None if self.password is None else f"<{len(self.password)} bytes>"
        return (
            f"Connect(protocol_name={self.protocol_name!r}, level={self.level}, "
            f"clean_start={self.clean_start}, keep_alive={self.keep_alive}, "
            f"client_id={self.client_id!r}, username={self.username!r}, password={password}, "
            f"will={self.will!r}, properties={self.properties!r})"
        )


@dataclass(slots=True)
class Connack:
    packet_type: ClassVar[int] = 2
    session_present: bool = False
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, repr=False)
class Publish:
    packet_type: ClassVar[int] = 3
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"Publish(topic={self.topic!r}, payload={_short_bytes(self.payload)}, qos={self.qos}, "
            f"retain={self.retain}, dup={self.dup}, packet_id={self.packet_id}, "
            f"properties={self.properties!r})"
        )


@dataclass(slots=True)
class Puback:
    packet_type: ClassVar[int] = 4
    packet_id: int
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Pubrec:
    packet_type: ClassVar[int] = 5
    packet_id: int
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Pubrel:
    packet_type: ClassVar[int] = 6
    packet_id: int
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Pubcomp:
    packet_type: ClassVar[int] = 7
    packet_id: int
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SubscriptionRequest:
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_type: ClassVar[int] = 8
    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    packet_type: ClassVar[int] = 9
    packet_id: int
    reason_codes: list[int]
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_type: ClassVar[int] = 10
    packet_id: int
    topic_filters: list[str]
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    packet_type: ClassVar[int] = 11
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    packet_type: ClassVar[int] = 12


@dataclass(slots=True)
class Pingresp:
    packet_type: ClassVar[int] = 13


@dataclass(slots=True)
class Disconnect:
    packet_type: ClassVar[int] = 14
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    packet_type: ClassVar[int] = 15
    reason_code: int = 0
    properties: dict[str, Any] = field(default_factory=dict)


Packet = Union[
    Connect,
    Connack,
    Publish,
    Puback,
    Pubrec,
    Pubrel,
    Pubcomp,
    Subscribe,
    Suback,
    Unsubscribe,
    Unsuback,
    Pingreq,
    Pingresp,
    Disconnect,
    Auth,
]

# --------------------------------------------------------------------------- properties

_BYTE, _U16, _U32, _VBI, _STR, _BIN, _PAIR = range(7)

_CONNECT, _CONNACK, _PUBLISH, _PUBACK, _PUBREC, _PUBREL, _PUBCOMP = range(1, 8)
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK = range(8, 12)
_DISCONNECT, _AUTH = 14, 15


_Check = Callable[[Any], "str | None"]


def _zero_or_one(value: int) -> str | None:
    return None if value in (0, 1) else f"must be 0 or 1, not {value}"


def _nonzero(value: int) -> str | None:
    return None if value else "must not be 0"


def _response_topic(value: str) -> str | None:
    # A Response Topic is a Topic Name: non-empty, no wildcards.
    if not value:
        return "must not be empty"
    if "+" in value or "#" in value:
        return "must not contain wildcards"
    return None


_ALL_WITH_PROPERTIES = (
    _CONNECT,
    _CONNACK,
    _PUBLISH,
    _PUBACK,
    _PUBREC,
    _PUBREL,
    _PUBCOMP,
    _SUBSCRIBE,
    _SUBACK,
    _UNSUBSCRIBE,
    _UNSUBACK,
    _DISCONNECT,
    _AUTH,
    _WILL,
)
_MSG = (_PUBLISH, _WILL)

# identifier, name, data type, value check, packets it may appear in
_PROPERTY_DEFS: tuple[tuple[int, str, int, _Check | None, tuple[int, ...]], ...] = (
    (0x01, "payload_format_indicator", _BYTE, _zero_or_one, _MSG),
    (0x02, "message_expiry_interval", _U32, None, _MSG),
    (0x03, "content_type", _STR, None, _MSG),
    (0x08, "response_topic", _STR, _response_topic, _MSG),
    (0x09, "correlation_data", _BIN, None, _MSG),
    (0x0B, "subscription_identifier", _VBI, _nonzero, (_PUBLISH, _SUBSCRIBE)),
    (0x11, "session_expiry_interval", _U32, None, (_CONNECT, _CONNACK, _DISCONNECT)),
    (0x12, "assigned_client_identifier", _STR, None, (_CONNACK,)),
    (0x13, "server_keep_alive", _U16, None, (_CONNACK,)),
    (0x15, "authentication_method", _STR, None, (_CONNECT, _CONNACK, _AUTH)),
    (0x16, "authentication_data", _BIN, None, (_CONNECT, _CONNACK, _AUTH)),
    (0x17, "request_problem_information", _BYTE, _zero_or_one, (_CONNECT,)),
    (0x18, "will_delay_interval", _U32, None, (_WILL,)),
    (0x19, "request_response_information", _BYTE, _zero_or_one, (_CONNECT,)),
    (0x1A, "response_information", _STR, None, (_CONNACK,)),
    (0x1C, "server_reference", _STR, None, (_CONNACK, _DISCONNECT)),
    (
        0x1F,
        "reason_string",
        _STR,
        None,
        (_CONNACK, _PUBACK, _PUBREC, _PUBREL, _PUBCOMP, _SUBACK, _UNSUBACK, _DISCONNECT, _AUTH),
    ),
    (0x21, "receive_maximum", _U16, _nonzero, (_CONNECT, _CONNACK)),
    (0x22, "topic_alias_maximum", _U16, None, (_CONNECT, _CONNACK)),
    (0x23, "topic_alias", _U16, _nonzero, (_PUBLISH,)),
    (0x24, "maximum_qos", _BYTE, _zero_or_one, (_CONNACK,)),
    (0x25, "retain_available", _BYTE, _zero_or_one, (_CONNACK,)),
    (0x26, "user_properties", _PAIR, None, _ALL_WITH_PROPERTIES),
    (0x27, "maximum_packet_size", _U32, _nonzero, (_CONNECT, _CONNACK)),
    (0x28, "wildcard_subscription_available", _BYTE, _zero_or_one, (_CONNACK,)),
    (0x29, "subscription_identifier_available", _BYTE, _zero_or_one, (_CONNACK,)),
    (0x2A, "shared_subscription_available", _BYTE, _zero_or_one, (_CONNACK,)),
)
_PROPERTY_NAMES = {ident: name for ident, name, *_ in _PROPERTY_DEFS}


def _is_multi(ident: int, packet: int) -> bool:
    # User Property may always repeat; a PUBLISH may carry one Subscription
    # Identifier per matching subscription, a SUBSCRIBE only one.
    return ident == 0x26 or (ident == 0x0B and packet == _PUBLISH)


_PropSpec = tuple[str, int, _Check | None, bool]
# Per packet type: identifier -> spec (decoding) and name -> spec (encoding).
_DECODE_PROPS: dict[int, dict[int, _PropSpec]] = {p: {} for p in _ALL_WITH_PROPERTIES}
_ENCODE_PROPS: dict[int, dict[str, tuple[int, int, _Check | None, bool]]] = {
    p: {} for p in _ALL_WITH_PROPERTIES
}
for _ident, _name, _kind, _check, _packets in _PROPERTY_DEFS:
    for _p in _packets:
        _DECODE_PROPS[_p][_ident] = (_name, _kind, _check, _is_multi(_ident, _p))
        _ENCODE_PROPS[_p][_name] = (_ident, _kind, _check, _is_multi(_ident, _p))
del _ident, _name, _kind, _check, _packets, _p

_PUBLISH_PROPS = _DECODE_PROPS[_PUBLISH]


# --------------------------------------------------------------------------- decoding helpers
#
# Every reader takes (buf, pos, end) and returns (value, new_pos).  ``end``
# is the end of the packet (or of the property block), never of ``buf``: a
# coalesced read holds the next packet right behind this one, so relying on
# IndexError would silently read into it.


def _read_vbi(buf: bytes | bytearray, p: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for i in range(p, min(p + 4, end)):
        b = buf[i]
        value |= (b & 127) << shift
        if b < 128:
            return value, i + 1
        shift += 7
    if end - p < 4:
        raise _malformed("Variable Byte Integer runs past the end of the packet")
    raise _malformed("Variable Byte Integer longer than 4 bytes")


def _read_remaining_length(buf: bytes | bytearray, p: int, n: int) -> tuple[int, int]:
    """Multi-byte remaining length at ``p``; (-1, 0) while incomplete."""
    value = 0
    shift = 0
    for i in range(p, min(p + 4, n)):
        b = buf[i]
        value |= (b & 127) << shift
        if b < 128:
            return value, i + 1
        shift += 7
    if n - p < 4:
        return -1, 0
    raise _malformed("Malformed remaining length")


def _read_u16(buf: bytes | bytearray, p: int, end: int, what: str) -> int:
    if p + 2 > end:
        raise _malformed(f"{what} runs past the end of the packet")
    return buf[p] << 8 | buf[p + 1]


def _read_packet_id(buf: bytes | bytearray, p: int, end: int) -> int:
    packet_id = _read_u16(buf, p, end, "Packet identifier")
    if not packet_id:
        raise _protocol("Packet identifier must not be 0")
    return packet_id


def _read_string(buf: bytes | bytearray, p: int, end: int, what: str) -> tuple[str, int]:
    if p + 2 > end:
        raise _malformed(f"{what} runs past the end of the packet")
    e = p + 2 + (buf[p] << 8 | buf[p + 1])
    if e > end:
        raise _malformed(f"{what} runs past the end of the packet")
    try:
        value = buf[p + 2 : e].decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"Invalid UTF-8 in {what}") from None
    if "\0" in value:
        raise _malformed(f"Invalid UTF-8 in {what}: U+0000 is not allowed")
    return value, e


def _read_binary(buf: bytes | bytearray, p: int, end: int, what: str) -> tuple[bytes, int]:
    if p + 2 > end:
        raise _malformed(f"{what} runs past the end of the packet")
    e = p + 2 + (buf[p] << 8 | buf[p + 1])
    if e > end:
        raise _malformed(f"{what} runs past the end of the packet")
    return bytes(buf[p + 2 : e]), e


def _read_properties(
    buf: bytes | bytearray, p: int, end: int, packet: int
) -> tuple[dict[str, Any], int]:
    if p >= end:
        raise _malformed("Property length missing")
    length = buf[p]
    if length < 128:
        p += 1
    else:
        length, p = _read_vbi(buf, p, end)
    pend = p + length
    if pend > end:
        raise _malformed("Properties run past the end of the packet")
    props: dict[str, Any] = {}
    if not length:
        return props, p
    table = _DECODE_PROPS[packet]
    while p < pend:
        ident = buf[p]
        spec = table.get(ident)
        if spec is None:
            raise _bad_property(ident, packet)
        name, kind, check, multi = spec
        p += 1
        if kind == _STR:
            value: Any
            value, p = _read_string(buf, p, pend, f"Property {name}")
        elif kind == _BYTE:
            if p >= pend:
                raise _malformed(f"Property {name} runs past the end of the properties")
            value = buf[p]
            p += 1
        elif kind == _U16:
            value = _read_u16(buf, p, pend, f"Property {name}")
            p += 2
        elif kind == _U32:
            if p + 4 > pend:
                raise _malformed(f"Property {name} runs past the end of the properties")
            value = int.from_bytes(buf[p : p + 4], "big")
            p += 4
        elif kind == _PAIR:
            key, p = _read_string(buf, p, pend, "User Property name")
            val, p = _read_string(buf, p, pend, "User Property value")
            value = (key, val)
        elif kind == _BIN:
            value, p = _read_binary(buf, p, pend, f"Property {name}")
        else:  # _VBI
            value, p = _read_vbi(buf, p, pend)
        if check is not None:
            problem = check(value)
            if problem is not None:
                raise _protocol(f"Property {name} {problem}")
        if name in props:
            if not multi:
                raise _protocol(f"Property {name} appears more than once")
            props[name].append(value)
        else:
            props[name] = [value] if multi else value
    return props, p


def _bad_property(ident: int, packet: int) -> MqttProtocolError:
    # The spec calls an identifier not valid for the packet type a Malformed
    # Packet (2.2.2.2), whether it is unknown or merely misplaced.
    name = _PROPERTY_NAMES.get(ident)
    where = _PACKET_NAMES[packet]
    if name is None:
        return _malformed(f"Unknown property identifier 0x{ident:02X} in {where}")
    return _malformed(f"Property {name} is not allowed in {where}")


def _check_topic_name(topic: str, what: str) -> None:
    if "\0" in topic:  # the inlined PUBLISH path decodes its topic itself
        raise _malformed(f"Invalid UTF-8 in {what}: U+0000 is not allowed")
    if "+" in topic or "#" in topic:
        raise MqttProtocolError(0x90, f"{what} must not contain wildcards")


# --------------------------------------------------------------------------- packet decoders
#
# Signature: (buf, start, end, flags, level) -> packet.  The fixed-header
# flags have already been checked against the first-byte table.


def _decode_connect(buf: bytes | bytearray, p: int, end: int) -> Connect:
    raw_name, p = _read_binary(buf, p, end, "Protocol name")
    if p >= end:
        raise _malformed("Protocol level missing")
    level = buf[p]
    if not (
        (level == 4 or level == 5) and raw_name == b"MQTT" or level == 3 and raw_name == b"MQIsdp"
    ):
        name = raw_name.decode("utf-8", "replace")
        exc = MqttProtocolError(0x84, f"Unsupported protocol {name!r} level {level}")
        exc.connack_return_code = 1
        exc.protocol_name = name
        exc.protocol_level = level
        raise exc
    try:
        return _decode_connect_body(buf, p + 1, end, raw_name.decode("ascii"), level)
    except MqttProtocolError as exc:
        exc.protocol_level = level
        raise


def _decode_connect_body(
    buf: bytes | bytearray, p: int, end: int, protocol_name: str, level: int
) -> Connect:
    if p + 3 > end:
        raise _malformed("CONNECT variable header runs past the end of the packet")
    flags = buf[p]
    keep_alive = buf[p + 1] << 8 | buf[p + 2]
    p += 3
    if flags & 0x01:
        raise _malformed("Reserved CONNECT flag must be 0")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = bool(flags & 0x20)
    if will_flag:
        if will_qos == 3:
            raise _malformed("Will QoS 3 is not allowed")
    elif will_qos or will_retain:
        raise _malformed("Will QoS and Will Retain must be 0 without a Will")
    has_username = flags & 0x80
    has_password = flags & 0x40
    if has_password and not has_username and level != 5:
        raise _malformed("Password flag set without User Name flag")
    v5 = level == 5
    props: dict[str, Any] = {}
    if v5:
        props, p = _read_properties(buf, p, end, _CONNECT)
    client_id, p = _read_string(buf, p, end, "Client identifier")
    will = None
    if will_flag:
        will_props: dict[str, Any] = {}
        if v5:
            will_props, p = _read_properties(buf, p, end, _WILL)
        will_topic, p = _read_string(buf, p, end, "Will topic")
        # The Will is a deferred PUBLISH: hold its topic to the same rules.
        if not will_topic:
            raise MqttProtocolError(0x90, "Will topic must not be empty")
        _check_topic_name(will_topic, "Will topic")
        will_payload, p = _read_binary(buf, p, end, "Will payload")
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_username:
        username, p = _read_string(buf, p, end, "User name")
    if has_password:
        password, p = _read_binary(buf, p, end, "Password")
    if p != end:
        raise _malformed("Unexpected bytes after the CONNECT payload")
    return Connect(
        protocol_name,
        level,
        bool(flags & 0x02),
        keep_alive,
        client_id,
        username,
        password,
        will,
        props,
    )


def _decode_connack(buf: bytes | bytearray, p: int, end: int, flags: int, level: int) -> Connack:
    if level == 5:
        if end - p < 2:
            raise _malformed("CONNACK too short")
        ack = buf[p]
        if ack & 0xFE:
            raise _malformed("Reserved CONNACK flags must be 0")
        reason = buf[p + 1]
        props, p = _read_properties(buf, p + 2, end, _CONNACK)
        if p != end:
            raise _malformed("Unexpected bytes after the CONNACK properties")
        return Connack(bool(ack), reason, props)
    if end - p != 2:
        raise _malformed("CONNACK must have a remaining length of 2")
    ack = buf[p]
    if level == 3:
        # 3.1 has no Session Present flag; the byte is unused there.
        return Connack(False, buf[p + 1], {})
    if ack & 0xFE:
        raise _malformed("Reserved CONNACK flags must be 0")
    return Connack(bool(ack), buf[p + 1], {})


def _make_ack_decoder(cls: type, packet: int) -> Callable[..., Any]:
    name = _PACKET_NAMES[packet]

    def decode(buf: bytes | bytearray, p: int, end: int, flags: int, level: int) -> Any:
        n = end - p
        if level != 5:
            if n != 2:
                raise _malformed(f"{name} must have a remaining length of 2")
            return cls(_read_packet_id(buf, p, end), 0, {})
        packet_id = _read_packet_id(buf, p, end)
        # Remaining length 2: Success, no properties; 3: reason code only.
        if n == 2:
            return cls(packet_id, 0, {})
        reason = buf[p + 2]
        if n == 3:
            return cls(packet_id, reason, {})
        props, q = _read_properties(buf, p + 3, end, packet)
        if q != end:
            raise _malformed(f"Unexpected bytes after the {name} properties")
        return cls(packet_id, reason, props)

    return decode


def _decode_subscribe(
    buf: bytes | bytearray, p: int, end: int, flags: int, level: int
) -> Subscribe:
    packet_id = _read_packet_id(buf, p, end)
    p += 2
    props: dict[str, Any] = {}
    v5 = level == 5
    if v5:
        props, p = _read_properties(buf, p, end, _SUBSCRIBE)
    subs = []
    append = subs.append
    while p < end:
        topic_filter, p = _read_string(buf, p, end, "Topic filter")
        if p >= end:
            raise _malformed("Subscription options missing")
        opts = buf[p]
        p += 1
        qos = opts & 3
        if qos == 3:
            raise _malformed("Subscription QoS 3 is not allowed")
        if v5:
            if opts & 0xC0:
                raise _malformed("Reserved subscription option bits must be 0")
            retain_handling = (opts >> 4) & 3
            if retain_handling == 3:
                raise _malformed("Retain Handling 3 is not allowed")
            append(
                SubscriptionRequest(
                    topic_filter, qos, bool(opts & 4), bool(opts & 8), retain_handling
                )
            )
        else:
            if opts & 0xFC:
                raise _malformed("Reserved subscription option bits must be 0")
            append(SubscriptionRequest(topic_filter, qos))
    if not subs:
        raise _protocol("SUBSCRIBE without topic filters")
    return Subscribe(packet_id, subs, props)


def _decode_suback(buf: bytes | bytearray, p: int, end: int, flags: int, level: int) -> Suback:
    packet_id = _read_packet_id(buf, p, end)
    p += 2
    props: dict[str, Any] = {}
    if level == 5:
        props, p = _read_properties(buf, p, end, _SUBACK)
    codes = list(buf[p:end])
    if not codes:
        raise _protocol("SUBACK without return codes")
    if level != 5:
        for code in codes:
            if code > 2 and code != 0x80:
                raise _malformed(f"Invalid SUBACK return code 0x{code:02X}")
    return Suback(packet_id, codes, props)


def _decode_unsubscribe(
    buf: bytes | bytearray, p: int, end: int, flags: int, level: int
) -> Unsubscribe:
    packet_id = _read_packet_id(buf, p, end)
    p += 2
    props: dict[str, Any] = {}
    if level == 5:
        props, p = _read_properties(buf, p, end, _UNSUBSCRIBE)
    filters = []
    while p < end:
        topic_filter, p = _read_string(buf, p, end, "Topic filter")
        filters.append(topic_filter)
    if not filters:
        raise _protocol("UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, filters, props)


def _decode_unsuback(
    buf: bytes | bytearray, p: int, end: int, flags: int, level: int
) -> Unsuback:
    if level != 5:
        if end - p != 2:
            raise _malformed("UNSUBACK must have a remaining length of 2")
        return Unsuback(_read_packet_id(buf, p, end), [], {})
    packet_id = _read_packet_id(buf, p, end)
    props, p = _read_properties(buf, p + 2, end, _UNSUBACK)
    codes = list(buf[p:end])
    if not codes:
        raise _protocol("UNSUBACK without reason codes")
    return Unsuback(packet_id, codes, props)


def _decode_pingreq(buf: bytes | bytearray, p: int, end: int, flags: int, level: int) -> Pingreq:
    if end != p:
        raise _malformed("PINGREQ must have a remaining length of 0")
    return Pingreq()


def _decode_pingresp(
    buf: bytes | bytearray, p: int, end: int, flags: int, level: int
) -> Pingresp:
    if end != p:
        raise _malformed("PINGRESP must have a remaining length of 0")
    return Pingresp()


def _make_reason_decoder(cls: type, packet: int) -> Callable[..., Any]:
    name = _PACKET_NAMES[packet]

    def decode(buf: bytes | bytearray, p: int, end: int, flags: int, level: int) -> Any:
        n = end - p
        if not n:  # Success, no properties
            return cls(0, {})
        if level != 5:
            raise _malformed(f"{name} must have a remaining length of 0")
        reason = buf[p]
        if n == 1:
            return cls(reason, {})
        props, q = _read_properties(buf, p + 1, end, packet)
        if q != end:
            raise _malformed(f"Unexpected bytes after the {name} properties")
        return cls(reason, props)

    return decode


# Index: packet type.  CONNECT and PUBLISH are handled inline in ``feed``.
_DECODERS: tuple[Callable[..., Any] | None, ...] = (
    None,
    None,
    _decode_connack,
    None,
    _make_ack_decoder(Puback, _PUBACK),
    _make_ack_decoder(Pubrec, _PUBREC),
    _make_ack_decoder(Pubrel, _PUBREL),
    _make_ack_decoder(Pubcomp, _PUBCOMP),
    _decode_subscribe,
    _decode_suback,
    _decode_unsubscribe,
    _decode_unsuback,
    _decode_pingreq,
    _decode_pingresp,
    _make_reason_decoder(Disconnect, _DISCONNECT),
    _make_reason_decoder(Auth, _AUTH),
)

_FROM_CLIENT = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_FROM_SERVER = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})


def _first_byte_error(b0: int, level: int | None, server: bool) -> tuple[int, str] | None:
    ptype = b0 >> 4
    flags = b0 & 15
    name = _PACKET_NAMES[ptype]
    if ptype == 0:
        return 0x81, "Reserved packet type 0"
    if server and level is None and ptype != 1:
        return 0x82, f"Expected CONNECT as the first packet, got {name}"
    if ptype == 15 and level is not None and level < 5:
        return 0x81, "AUTH (packet type 15) requires MQTT 5"
    if server and ptype not in _FROM_CLIENT:
        return 0x82, f"{name} is sent by servers only"
    if not server and ptype not in _FROM_SERVER:
        return 0x82, f"{name} is sent by clients only"
    if ptype == 3:
        qos = (flags >> 1) & 3
        if qos == 3:
            return 0x81, "PUBLISH with QoS 3"
        if flags & 8 and not qos:
            return 0x81, "PUBLISH with DUP set at QoS 0"
        return None
    if ptype in (6, 8, 10):
        # MQTT 3.1 let a retransmitted PUBREL/SUBSCRIBE/UNSUBSCRIBE carry DUP.
        if flags == 2 or (level == 3 and flags == 10):
            return None
        return 0x81, f"Invalid fixed header flags 0x{flags:X} for {name}"
    if flags:
        return 0x81, f"Invalid fixed header flags 0x{flags:X} for {name}"
    return None


@lru_cache(maxsize=None)
def _first_byte_table(level: int | None, server: bool) -> tuple[tuple[int, str] | None, ...]:
    # One lookup per packet rejects bad types, directions and flags before the
    # body is waited for (an HTTP request fails on its first byte).
    return tuple(_first_byte_error(b0, level, server) for b0 in range(256))


class MqttDecoder:
    """Incremental MQTT packet parser: ``feed`` bytes, get complete packets.

    When nothing is buffered the incoming ``bytes`` object is parsed in place
    and only an incomplete tail is copied into the one bytearray buffer.  The
    size of a pending packet is remembered, so a large PUBLISH arriving in
    many pieces is neither re-parsed nor re-checked until it is complete.
    PUBLISH decoding is inlined in ``feed``: per-packet calls and attribute
    lookups are a measurable share of the cost on the hot path.

    Server side (``server=True``), ``level`` stays None until a CONNECT is
    decoded; until then anything but CONNECT is a protocol error.  A later
    CONNECT is still decoded (by its own level) but does not change
    ``level``: the session rejects it.
    """

    __slots__ = ("max_packet_size", "_level", "_server", "_first", "_buf", "_need")

    def __init__(
        self, max_packet_size: int = MAX_PACKET_SIZE, level: int | None = None, server: bool = True
    ) -> None:
        if level not in (None, 3, 4, 5):
            raise ValueError(f"unknown MQTT level {level!r}")
        if level is None and not server:
            raise ValueError("a client-side decoder needs the level it connected with")
        self.max_packet_size = max_packet_size
        self._level = level
        self._server = server
        self._first = _first_byte_table(level, server)
        self._buf = bytearray()
        self._need = 0

    @property
    def level(self) -> int | None:
        """3, 4 or 5; decides which fields and properties are parsed."""
        return self._level

    @level.setter
    def level(self, level: int | None) -> None:
        if level not in (None, 3, 4, 5):
            raise ValueError(f"unknown MQTT level {level!r}")
        self._level = level
        self._first = _first_byte_table(level, self._server)

    @property
    def server(self) -> bool:
        """True when decoding what clients send."""
        return self._server

    @server.setter
    def server(self, server: bool) -> None:
        self._server = server
        self._first = _first_byte_table(self._level, server)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete packet, for the session's memory accounting."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Packet]:
        """Consume ``data`` and return every packet it completes, in order.

        Raises MqttProtocolError on bad input (with ``packets`` set to what
        this call completed before it); the decoder is then unusable.
        """
        own = self._buf
        if own:
            own += data
            n = len(own)
            if n < self._need:
                return []
            buf: bytes | bytearray = own
        elif not data:
            return []
        else:
            buf = data if type(data) is bytes else bytes(data)
            n = len(buf)
        pos = 0
        need = 0
        packets: list[Packet] = []
        append = packets.append
        first = self._first
        limit = self.max_packet_size
        level = self._level
        server = self._server
        try:
            while pos < n:
                b0 = buf[pos]
                err = first[b0]
                if err is not None:
                    raise MqttProtocolError(*err)
                if pos + 1 >= n:
                    break
                rl = buf[pos + 1]
                if rl < 128:
                    start = pos + 2
                else:
                    rl, start = _read_remaining_length(buf, pos + 1, n)
                    if rl < 0:
                        break
                end = start + rl
                if end - pos > limit:
                    raise MqttProtocolError(
                        0x95,
                        f"Packet of {end - pos} bytes exceeds the maximum packet size {limit}",
                    )
                if end > n:
                    need = end - pos
                    break

                if b0 >> 4 == 3:  # PUBLISH, inlined
                    qos = (b0 >> 1) & 3
                    p = start + 2
                    if p > end:
                        raise _malformed("Topic name runs past the end of the packet")
                    tend = p + (buf[start] << 8 | buf[start + 1])
                    if tend > end:
                        raise _malformed("Topic name runs past the end of the packet")
                    try:
                        topic = buf[p:tend].decode("utf-8")
                    except UnicodeDecodeError:
                        raise _malformed("Invalid UTF-8 in topic name") from None
                    if "+" in topic or "#" in topic or "\0" in topic:
                        _check_topic_name(topic, "Topic name")
                    if qos:
                        p = tend + 2
                        if p > end:
                            raise _malformed("Packet identifier runs past the end of the packet")
                        packet_id = buf[tend] << 8 | buf[tend + 1]
                        if not packet_id:
                            raise _protocol("Packet identifier must not be 0")
                    else:
                        p = tend
                        packet_id = None
                    if level == 5:
                        if p < end and not buf[p]:
                            props: dict[str, Any] = {}
                            p += 1
                        else:
                            props, p = _read_properties(buf, p, end, _PUBLISH)
                            if server and "subscription_identifier" in props:
                                # [MQTT-3.3.4-6]: only a server attaches them.
                                raise _protocol("Subscription Identifier sent by a client")
                        if not topic and "topic_alias" not in props:
                            raise _protocol("Empty topic name without a Topic Alias")
                    else:
                        props = {}
                        if not topic:
                            raise _protocol("Empty topic name")
                    if buf is not own:
                        payload = buf[p:end]
                    elif end - p > 256:
                        payload = bytes(memoryview(buf)[p:end])  # one copy, not two
                    else:
                        payload = bytes(buf[p:end])
                    append(Publish(topic, payload, qos, b0 & 1 == 1, b0 & 8 == 8, packet_id, props))
                elif b0 == 0x10:
                    packet = _decode_connect(buf, start, end)
                    append(packet)
                    if level is None:
                        # What follows the CONNECT is parsed by its level.
                        self.level = level = packet.level
                        first = self._first
                else:
                    decode = _DECODERS[b0 >> 4]
                    append(decode(buf, start, end, b0 & 15, level))  # type: ignore[misc]
                pos = end
        except MqttProtocolError as exc:
            exc.packets = packets
            raise

        self._need = need
        if buf is own:
            if pos >= n:
                self._buf = bytearray()  # also releases a large packet's capacity
            elif pos:
                del own[:pos]  # cheap: CPython just advances the buffer's start
        elif pos < n:
            own += memoryview(buf)[pos:]
        return packets


# --------------------------------------------------------------------------- encoding

_VBI_SMALL = tuple(bytes((i,)) for i in range(128))


def encode_variable_byte_integer(value: int) -> bytes:
    """Spec-form Variable Byte Integer, exposed for callers that size or build
    packet parts themselves (e.g. around ``publish_parts``)."""
    if 0 <= value < 128:
        return _VBI_SMALL[value]
    if not 0 <= value <= MAX_PACKET_SIZE:
        raise ValueError(f"{value} cannot be encoded as a Variable Byte Integer")
    out = bytearray()
    while True:
        b = value & 127
        value >>= 7
        if value:
            out.append(b | 128)
        else:
            out.append(b)
            return bytes(out)


def _header(b0: int, remaining: int) -> bytes:
    if remaining < 128:
        return bytes((b0, remaining))
    if remaining > MAX_PACKET_SIZE:
        raise ValueError(f"remaining length {remaining} exceeds {MAX_PACKET_SIZE}")
    return bytes((b0,)) + encode_variable_byte_integer(remaining)


def _string_bytes(value: str, what: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"{what} is longer than 65535 bytes")
    if "\0" in value:
        raise ValueError(f"{what} must not contain U+0000")
    return len(raw).to_bytes(2, "big") + raw


def _binary_bytes(value: bytes, what: str) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError(f"{what} is longer than 65535 bytes")
    return len(value).to_bytes(2, "big") + bytes(value)


def _packet_id_bytes(packet_id: int | None) -> bytes:
    if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"packet identifier must be 1..65535, not {packet_id!r}")
    return packet_id.to_bytes(2, "big")


def _encode_properties(props: dict[str, Any] | None, packet: int) -> bytes:
    """The property block with its length prefix; None values are skipped."""
    if not props:
        return b"\x00"
    table = _ENCODE_PROPS[packet]
    parts = []
    append = parts.append
    for name, value in props.items():
        if value is None:
            continue
        spec = table.get(name)
        if spec is None:
            if any(name in t for t in _ENCODE_PROPS.values()):
                raise ValueError(f"property {name} is not allowed in {_PACKET_NAMES[packet]}")
            raise ValueError(f"unknown property {name!r}")
        ident, kind, check, multi = spec
        if multi:
            if isinstance(value, int):
                values: Any = (value,)
            elif isinstance(value, dict):
                values = value.items()
            else:
                values = value
        else:
            values = (value,)
        try:
            for v in values:
                if check is not None:
                    problem = check(v)
                    if problem is not None:
                        raise ValueError(f"property {name} {problem}")
                if kind == _STR:
                    append(bytes((ident,)) + _string_bytes(v, f"property {name}"))
                elif kind == _BYTE:
                    append(bytes((ident, v)))
                elif kind == _U16:
                    append(bytes((ident,)) + v.to_bytes(2, "big"))
                elif kind == _U32:
                    append(bytes((ident,)) + v.to_bytes(4, "big"))
                elif kind == _PAIR:
                    key, val = v
                    append(
                        bytes((ident,))
                        + _string_bytes(key, "User Property name")
                        + _string_bytes(val, "User Property value")
                    )
                elif kind == _BIN:
                    append(bytes((ident,)) + _binary_bytes(v, f"property {name}"))
                else:
                    append(bytes((ident,)) + encode_variable_byte_integer(v))
        except (OverflowError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad value for property {name}: {value!r} ({exc})") from None
    body = b"".join(parts)
    return encode_variable_byte_integer(len(body)) + body


def _publish_flags(qos: int, retain: bool, dup: bool) -> int:
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS must be 0, 1 or 2, not {qos!r}")
    if dup and not qos:
        raise ValueError("DUP must not be set at QoS 0")
    return 0x30 | qos << 1 | (1 if retain else 0) | (8 if dup else 0)


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: dict[str, Any] | None,
    level: int,
) -> bytes:
    """PUBLISH bytes in one join: the broker's delivery path.

    No defaults, so a forgotten ``level`` cannot silently produce 3.1.1
    bytes for a 5.0 session.  The topic is trusted (it comes from a decoded,
    validated packet); only what would make the output undecodable is checked.
    """
    b0 = _publish_flags(qos, retain, dup)
    t = topic.encode("utf-8")
    tl = len(t)
    if tl > 0xFFFF:
        raise ValueError("topic is longer than 65535 bytes")
    pid = _packet_id_bytes(packet_id) if qos else b""
    if level == 5:
        props = _encode_properties(properties, _PUBLISH) if properties else b"\x00"
    else:
        props = b""
    remaining = 2 + tl + len(pid) + len(props) + len(payload)
    return b"".join((_header(b0, remaining), tl.to_bytes(2, "big"), t, pid, props, payload))


def publish_parts(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    properties: dict[str, Any] | None,
    level: int,
    dup: bool = False,
) -> tuple[bytes, bytes]:
    """A PUBLISH split around its packet identifier, to encode once per message.

    ``prefix`` is the fixed header, topic length and topic; ``suffix`` is the
    property block (5.0) and the payload.  For QoS 1/2 the remaining length
    in ``prefix`` already counts the two packet-identifier bytes, so the
    packet is ``prefix + packet_id.to_bytes(2, "big") + suffix``; for QoS 0
    it is ``prefix + suffix``.  Passing the three parts to
    ``transport.writeSequence`` avoids copying the payload per subscriber.
    DUP is bit 3 of ``prefix[0]``.
    """
    b0 = _publish_flags(qos, retain, dup)
    t = topic.encode("utf-8")
    tl = len(t)
    if tl > 0xFFFF:
        raise ValueError("topic is longer than 65535 bytes")
    if level == 5:
        props = _encode_properties(properties, _PUBLISH) if properties else b"\x00"
    else:
        props = b""
    remaining = 2 + tl + (2 if qos else 0) + len(props) + len(payload)
    return (
        b"".join((_header(b0, remaining), tl.to_bytes(2, "big"), t)),
        b"".join((props, payload)),
    )


def _check_level(level: int) -> None:
    if level not in (3, 4, 5):
        raise ValueError(f"unknown MQTT level {level!r}")


def _encode_connect(packet: Connect, level: int) -> bytes:
    # protocol_name and level are written as given, so a CONNECT for an
    # unsupported version can be built; ``level`` picks the layout.
    flags = 0x02 if packet.clean_start else 0
    v5 = level == 5
    parts = [
        b"",  # header
        _string_bytes(packet.protocol_name, "protocol name"),
        bytes((packet.level,)),
        b"",  # flags
        packet.keep_alive.to_bytes(2, "big"),
    ]
    if v5:
        parts.append(_encode_properties(packet.properties, _CONNECT))
    parts.append(_string_bytes(packet.client_id, "client identifier"))
    will = packet.will
    if will is not None:
        if will.qos not in (0, 1, 2):
            raise ValueError(f"Will QoS must be 0, 1 or 2, not {will.qos!r}")
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
        if v5:
            parts.append(_encode_properties(will.properties, _WILL))
        parts.append(_string_bytes(will.topic, "Will topic"))
        parts.append(_binary_bytes(will.payload, "Will payload"))
    if packet.username is not None:
        flags |= 0x80
        parts.append(_string_bytes(packet.username, "user name"))
    if packet.password is not None:
        if packet.username is None and not v5:
            raise ValueError("MQTT 3.x requires a user name with a password")
        flags |= 0x40
        parts.append(_binary_bytes(packet.password, "password"))
    parts[3] = bytes((flags,))
    return _assemble(0x10, parts)


def _assemble(b0: int, parts: list[bytes]) -> bytes:
    # parts[0] is a placeholder for the fixed header.
    parts[0] = _header(b0, sum(map(len, parts)))
    return b"".join(parts)


def _encode_connack(packet: Connack, level: int) -> bytes:
    if level == 5:
        props = _encode_properties(packet.properties, _CONNACK)
        return b"".join(
            (
                _header(0x20, 2 + len(props)),
                bytes((1 if packet.session_present else 0, packet.reason_code)),
                props,
            )
        )
    session_present = 1 if packet.session_present and level == 4 else 0
    return bytes((0x20, 2, session_present, packet.reason_code))


def _encode_publish_packet(packet: Publish, level: int) -> bytes:
    return encode_publish(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        packet.properties,
        level,
    )


def _make_ack_encoder(b0: int, packet_type: int) -> Callable[[Any, int], bytes]:
    def encode(packet: Any, level: int) -> bytes:
        pid = _packet_id_bytes(packet.packet_id)
        if level != 5:
            return bytes((b0, 2)) + pid
        props = packet.properties
        if not props:
            if not packet.reason_code:
                return bytes((b0, 2)) + pid
            return bytes((b0, 3)) + pid + bytes((packet.reason_code,))
        block = _encode_properties(props, packet_type)
        return b"".join(
            (_header(b0, 3 + len(block)), pid, bytes((packet.reason_code,)), block)
        )

    return encode


def _encode_subscribe(packet: Subscribe, level: int) -> bytes:
    parts = [b"", _packet_id_bytes(packet.packet_id)]
    v5 = level == 5
    if v5:
        parts.append(_encode_properties(packet.properties, _SUBSCRIBE))
    if not packet.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one topic filter")
    for sub in packet.subscriptions:
        if sub.qos not in (0, 1, 2):
            raise ValueError(f"subscription QoS must be 0, 1 or 2, not {sub.qos!r}")
        opts = sub.qos
        if v5:
            if sub.retain_handling not in (0, 1, 2):
                raise ValueError(f"Retain Handling must be 0, 1 or 2, not {sub.retain_handling!r}")
            opts |= (
                (4 if sub.no_local else 0)
                | (8 if sub.retain_as_published else 0)
                | sub.retain_handling << 4
            )
        parts.append(_string_bytes(sub.topic_filter, "topic filter"))
        parts.append(bytes((opts,)))
    return _assemble(0x82, parts)


def _encode_suback(packet: Suback, level: int) -> bytes:
    codes = packet.reason_codes
    if not codes:
        raise ValueError("SUBACK needs at least one reason code")
    if level == 5:
        props = _encode_properties(packet.properties, _SUBACK)
        body = bytes(codes)
    else:
        # 3.x knows only the granted QoS or a generic failure.
        props = b""
        mapped = []
        for code in codes:
            if code >= 0x80:
                mapped.append(0x80)
            elif code in (0, 1, 2):
                mapped.append(code)
            else:
                raise ValueError(f"SUBACK code 0x{code:02X} has no MQTT 3.x equivalent")
        body = bytes(mapped)
    return _assemble(0x90, [b"", _packet_id_bytes(packet.packet_id), props, body])


def _encode_unsubscribe(packet: Unsubscribe, level: int) -> bytes:
    if not packet.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter")
    parts = [b"", _packet_id_bytes(packet.packet_id)]
    if level == 5:
        parts.append(_encode_properties(packet.properties, _UNSUBSCRIBE))
    for topic_filter in packet.topic_filters:
        parts.append(_string_bytes(topic_filter, "topic filter"))
    return _assemble(0xA2, parts)


def _encode_unsuback(packet: Unsuback, level: int) -> bytes:
    pid = _packet_id_bytes(packet.packet_id)
    if level != 5:
        return b"\xb0\x02" + pid
    if not packet.reason_codes:
        raise ValueError("UNSUBACK needs at least one reason code in MQTT 5")
    return _assemble(
        0xB0,
        [b"", pid, _encode_properties(packet.properties, _UNSUBACK), bytes(packet.reason_codes)],
    )


def _encode_pingreq(packet: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(packet: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _make_reason_encoder(b0: int, packet_type: int) -> Callable[[Any, int], bytes]:
    def encode(packet: Any, level: int) -> bytes:
        if level != 5:
            if packet_type == _AUTH:
                raise ValueError("AUTH requires MQTT 5")
            return bytes((b0, 0))
        props = packet.properties
        if not props:
            if not packet.reason_code:
                return bytes((b0, 0))
            if packet_type == _DISCONNECT:
                return bytes((b0, 1, packet.reason_code))
        block = _encode_properties(props, packet_type)
        return b"".join((_header(b0, 1 + len(block)), bytes((packet.reason_code,)), block))

    return encode


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish_packet,
    Puback: _make_ack_encoder(0x40, _PUBACK),
    Pubrec: _make_ack_encoder(0x50, _PUBREC),
    Pubrel: _make_ack_encoder(0x62, _PUBREL),
    Pubcomp: _make_ack_encoder(0x70, _PUBCOMP),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _make_reason_encoder(0xE0, _DISCONNECT),
    Auth: _make_reason_encoder(0xF0, _AUTH),
}


def encode(packet: Packet, level: int) -> bytes:
    """Serialise ``packet`` for protocol ``level`` (3, 4 or 5).

    3.x has no properties or v5-only fields; they are dropped, not refused,
    so one packet object can be sent to sessions of any level.  Values the
    wire cannot carry (out-of-range ids, QoS, unknown or misplaced
    properties, over-long strings) raise ValueError.
    """
    _check_level(level)
    try:
        encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    try:
        return encoder(packet, level)
    except (OverflowError, AttributeError, TypeError) as exc:
        raise ValueError(f"cannot encode {type(packet).__name__}: {exc}") from None
