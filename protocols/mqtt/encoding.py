"""Packets to bytes: ``encode`` and the PUBLISH fast paths (``encode_publish``, ``publish_parts``).

The per-packet writers (h11's ``_writers``), on top of the data types and
properties.  Nothing here decodes, and nothing below imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocols.mqtt.datatypes import (
    _binary_bytes,
    _header,
    _packet_id_bytes,
    _string_bytes,
)
from protocols.mqtt.packets import (
    _AUTH,
    _CONNACK,
    _CONNECT,
    _DISCONNECT,
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
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from protocols.mqtt.properties import _encode_properties


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
