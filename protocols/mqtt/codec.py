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

The codec is split by layer, as h11 is, and this module is its public face:
import from here.  ``packets`` holds the packet classes, reason codes and the
error; ``datatypes`` reads and writes the spec's data types; ``properties``
holds the MQTT 5 property table and reads and writes property blocks;
``decoding`` turns bytes into packets and ``encoding`` packets into bytes.
Each imports only the ones listed before it.
"""

from __future__ import annotations

from protocols.mqtt.datatypes import encode_variable_byte_integer
from protocols.mqtt.decoding import MqttDecoder
from protocols.mqtt.encoding import encode, encode_publish, publish_parts
from protocols.mqtt.packets import (
    MAX_PACKET_SIZE,
    Auth,
    Connack,
    ConnackReturnCode,
    Connect,
    Disconnect,
    MqttProtocolError,
    Packet,
    PacketType,
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
)

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
