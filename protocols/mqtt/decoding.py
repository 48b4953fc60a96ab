"""Bytes to packets: the per-packet decoders and the incremental ``MqttDecoder``.

Framing, the first-byte table and each packet's body layout (h11's
``_readers``), on top of the data types and properties.  Nothing here
encodes, and nothing below imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from protocols.mqtt.datatypes import (
    _read_binary,
    _read_packet_id,
    _read_remaining_length,
    _read_string,
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
    MAX_PACKET_SIZE,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttProtocolError,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    _malformed,
    _protocol,
)
from protocols.mqtt.properties import _read_properties


def _check_topic_name(topic: str, what: str) -> None:
    if "\0" in topic:  # the inlined PUBLISH path decodes its topic itself
        raise _malformed(f"Invalid UTF-8 in {what}: U+0000 is not allowed")
    if "+" in topic or "#" in topic:
        raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID, f"{what} must not contain wildcards")


# --------------------------------------------------------------------------- packet decoders
#
# Signature: (buf, start, end, flags, level) -> packet.  The fixed-header
# flags have already been checked against the first-byte table.


def _decode_connect(buf: bytes | bytearray, p: int, end: int) -> Connect:
    raw_name, p = _read_binary(buf, p, end, "Protocol name")
    if p >= end:
        raise _malformed("Protocol level missing")
    level = buf[p]
    bridge = level == 0x84 or level == 0x83  # a bridge (Mosquitto's try_private): 3.x plus the bridge bit
    if bridge:
        level &= 0x7F
    if not (
        (level == 4 or level == 5) and raw_name == b"MQTT" or level == 3 and raw_name == b"MQIsdp"
    ):
        name = raw_name.decode("utf-8", "replace")
        exc = MqttProtocolError(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"Unsupported protocol {name!r} level {level}")
        exc.connack_return_code = 1
        exc.protocol_name = name
        exc.protocol_level = level
        raise exc
    try:
        connect = _decode_connect_body(buf, p + 1, end, raw_name.decode("ascii"), level)
        connect.bridge = bridge
        return connect
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
            raise MqttProtocolError(ReasonCode.TOPIC_NAME_INVALID, "Will topic must not be empty")
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
    subs: list[SubscriptionRequest] = []
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


def _decoded_inline(buf: bytes | bytearray, p: int, end: int, flags: int, level: int) -> Any:
    # The slots of packet types 0, 1 and 3 (a function rather than None keeps
    # the table's type callable): the first-byte table rejects type 0 and a
    # CONNECT with flags set, and ``feed`` decodes CONNECT and PUBLISH itself.
    raise AssertionError("decoded inline by MqttDecoder.feed")


# Index: packet type.  CONNECT and PUBLISH are handled inline in ``feed``.
_DECODERS: tuple[Callable[..., Any], ...] = (
    _decoded_inline,
    _decoded_inline,
    _decode_connack,
    _decoded_inline,
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


def _first_byte_error(b0: int, level: int | None, server: bool) -> tuple[ReasonCode, str] | None:
    ptype = b0 >> 4
    flags = b0 & 15
    name = _PACKET_NAMES[ptype]
    if ptype == 0:
        return ReasonCode.MALFORMED_PACKET, "Reserved packet type 0"
    if server and level is None and ptype != 1:
        return ReasonCode.PROTOCOL_ERROR, f"Expected CONNECT as the first packet, got {name}"
    if ptype == 15 and level is not None and level < 5:
        return ReasonCode.MALFORMED_PACKET, "AUTH (packet type 15) requires MQTT 5"
    if server and ptype not in _FROM_CLIENT:
        return ReasonCode.PROTOCOL_ERROR, f"{name} is sent by servers only"
    if not server and ptype not in _FROM_SERVER:
        return ReasonCode.PROTOCOL_ERROR, f"{name} is sent by clients only"
    if ptype == 3:
        qos = (flags >> 1) & 3
        if qos == 3:
            return ReasonCode.MALFORMED_PACKET, "PUBLISH with QoS 3"
        if flags & 8 and not qos:
            return ReasonCode.MALFORMED_PACKET, "PUBLISH with DUP set at QoS 0"
        return None
    if ptype in (6, 8, 10):
        # MQTT 3.1 let a retransmitted PUBREL/SUBSCRIBE/UNSUBSCRIBE carry DUP.
        if flags == 2 or (level == 3 and flags == 10):
            return None
        return ReasonCode.MALFORMED_PACKET, f"Invalid fixed header flags 0x{flags:X} for {name}"
    if flags:
        return ReasonCode.MALFORMED_PACKET, f"Invalid fixed header flags 0x{flags:X} for {name}"
    return None


@lru_cache(maxsize=None)
def _first_byte_table(level: int | None, server: bool) -> tuple[tuple[ReasonCode, str] | None, ...]:
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

    __slots__ = ("max_packet_size", "connect_max_size", "_level", "_server", "_first", "_buf", "_need")

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
        # A tighter bound on the first packet (CONNECT) while nobody is logged in yet (0: none).
        self.connect_max_size = 0
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

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Consume ``data`` and return every packet it completes, in order.

        Raises MqttProtocolError on bad input (with ``packets`` set to what
        this call completed before it); the decoder is then unusable.
        """
        if not isinstance(data, bytes):
            data = bytes(data)  # a transport may hand a bytearray or memoryview; one copy per read
        own = self._buf
        if own:
            own += data
            n = len(own)
            if n < self._need:
                return []
            buf: bytes | bytearray = own
            in_place = b""  # not read: payloads are copied out of ``own``
        elif not data:
            return []
        else:
            # ``in_place`` is ``buf`` typed as bytes, so a payload sliced from
            # it is bytes without a per-PUBLISH check or cast.
            buf = in_place = data if type(data) is bytes else bytes(data)
            n = len(buf)
        pos = 0
        need = 0
        packets: list[Packet] = []
        append = packets.append
        first = self._first
        limit = self.max_packet_size
        level = self._level
        if level is None and self.connect_max_size:
            limit = min(limit, self.connect_max_size)  # only CONNECT can come first: it is the client before it logs in
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
                        ReasonCode.PACKET_TOO_LARGE,
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
                        payload = in_place[p:end]
                    elif end - p > 256:
                        payload = bytes(memoryview(buf)[p:end])  # one copy, not two
                    else:
                        payload = bytes(buf[p:end])
                    append(Publish(topic, payload, qos, b0 & 1 == 1, b0 & 8 == 8, packet_id, props))
                elif b0 == 0x10:
                    packet = _decode_connect(buf, start, end)
                    append(packet)
                    if level is None:
                        # What follows the CONNECT is parsed by its level, and bounded as usual.
                        self.level = level = packet.level
                        first = self._first
                        limit = self.max_packet_size
                else:
                    decode = _DECODERS[b0 >> 4]
                    append(decode(buf, start, end, b0 & 15, level))
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
