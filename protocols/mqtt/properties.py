"""MQTT 5 properties: the table of identifiers, and reading and writing a property block.

One table (identifier, name, data type, value check, the packets it may
appear in) drives both directions, so decoding and encoding cannot disagree
about which property goes where; it is kept apart from the per-packet code
as Mosquitto keeps ``property_mosq.c`` apart from its packet handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocols.mqtt.datatypes import (
    _binary_bytes,
    _read_binary,
    _read_string,
    _read_u16,
    _read_vbi,
    _string_bytes,
    encode_variable_byte_integer,
)
from protocols.mqtt.packets import (
    _AUTH,
    _CONNACK,
    _CONNECT,
    _DISCONNECT,
    _PACKET_NAMES,
    _PUBACK,
    _PUBCOMP,
    _PUBLISH,
    _PUBREC,
    _PUBREL,
    _SUBACK,
    _SUBSCRIBE,
    _UNSUBACK,
    _UNSUBSCRIBE,
    _WILL,
    MqttProtocolError,
    _malformed,
    _protocol,
)

# Data types of property values.
_BYTE, _U16, _U32, _VBI, _STR, _BIN, _PAIR = range(7)

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
_IDENT_BYTES = tuple(bytes((i,)) for i in range(256))  # a byte's bytes, without building them each time
_ENCODE_PROPS: dict[int, dict[str, tuple[int, int, _Check | None, bool]]] = {
    p: {} for p in _ALL_WITH_PROPERTIES
}
for _ident, _name, _kind, _check, _packets in _PROPERTY_DEFS:
    for _p in _packets:
        _DECODE_PROPS[_p][_ident] = (_name, _kind, _check, _is_multi(_ident, _p))
        _ENCODE_PROPS[_p][_name] = (_ident, _kind, _check, _is_multi(_ident, _p))
del _ident, _name, _kind, _check, _packets, _p



# --------------------------------------------------------------------------- reading


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


# --------------------------------------------------------------------------- writing


def _pairs(parts: list[bytes], head: bytes, pairs: list[tuple[str, str]]) -> None:
    """User properties given as a list of pairs; a pair that is not two strings fails as in the loop below."""
    for key, val in pairs:
        parts.append(head)
        parts.append(_string_bytes(key, "User Property name"))
        parts.append(_string_bytes(val, "User Property value"))


def _encode_properties(props: dict[str, Any] | None, packet: int) -> bytes:
    """The property block with its length prefix; None values are skipped."""
    if not props:
        return b"\x00"
    table = _ENCODE_PROPS[packet]
    parts: list[bytes] = []
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
        head = _IDENT_BYTES[ident]
        try:
            if kind == _PAIR and check is None and type(values) is list:
                _pairs(parts, head, values)  # the common form: typed, so compiled it unpacks natively
                continue
            for v in values:
                if check is not None:
                    problem = check(v)
                    if problem is not None:
                        raise ValueError(f"property {name} {problem}")
                # Pieces appended, not concatenated: one join at the end (a user property
                # per forwarded message, at least, on a bridge's link).
                append(head)
                if kind == _STR:
                    append(_string_bytes(v, f"property {name}"))
                elif kind == _BYTE:
                    append(bytes((v,)))  # not the table: a value out of range must raise
                elif kind == _U16:
                    append(v.to_bytes(2, "big"))
                elif kind == _U32:
                    append(v.to_bytes(4, "big"))
                elif kind == _PAIR:
                    key, val = v
                    append(_string_bytes(key, "User Property name"))
                    append(_string_bytes(val, "User Property value"))
                elif kind == _BIN:
                    append(_binary_bytes(v, f"property {name}"))
                else:
                    append(encode_variable_byte_integer(v))
        except (OverflowError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad value for property {name}: {value!r} ({exc})") from None
    body = b"".join(parts)
    return encode_variable_byte_integer(len(body)) + body
