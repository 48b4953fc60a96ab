"""The MQTT data types (spec section 1.5), read from a buffer and written as bytes.

Two Byte Integer, UTF-8 Encoded String, Binary Data and Variable Byte
Integer, with the bounds check against the end of the packet done once, here.
The properties, the packet decoders and the packet encoders all build on
these, so they sit below all three (Mosquitto's ``packet_datatypes.c``).
"""

from __future__ import annotations

from protocols.mqtt.packets import MAX_PACKET_SIZE, _malformed, _protocol

# --------------------------------------------------------------------------- readers
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


# --------------------------------------------------------------------------- writers

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
