"""MQTT packets as values: packet types, the packet classes, reason codes, the error.

This is the codec's vocabulary and holds no parsing (h11's ``_events``):
every other codec module builds on it, and it imports none of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

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


# Packet types as plain ints, for the tables indexed by packet type (which
# properties it may carry, which decoder reads it).
_CONNECT, _CONNACK, _PUBLISH, _PUBACK, _PUBREC, _PUBREL, _PUBCOMP = range(1, 8)
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK = range(8, 12)
_DISCONNECT, _AUTH = 14, 15

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

    def __init__(self, reason_code: ReasonCode, message: str) -> None:
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
    return MqttProtocolError(ReasonCode.MALFORMED_PACKET, message)


def _protocol(message: str) -> MqttProtocolError:
    return MqttProtocolError(ReasonCode.PROTOCOL_ERROR, message)


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
    # The bridge bit of a 3.x protocol level (0x83, 0x84: Mosquitto's try_private); ``level`` is without it.
    bridge: bool = False

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
