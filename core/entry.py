"""Delivery state kept beside a message, one per message per queue or subscription."""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from core.message import Message
from core.via import ViaMarker

if TYPE_CHECKING:
    from core.topic import Subscription


# What brought an entry to its queue: the topic subscription that matched, a
# tuple of them when several filters of one queue matched (MQTT needs them for
# the granted QoS and subscription identifiers), a protocol's marker, or None
# (sent to a queue, or recovered from the store).
Via: TypeAlias = "Subscription | tuple[Subscription, ...] | ViaMarker | None"


class Entry:
    __slots__ = ("message", "seq", "redeliveries", "stored", "via")

    def __init__(
        self, message: Message, seq: int, redeliveries: int = 0, stored: bool = False, via: Via = None,
    ) -> None:
        self.message = message
        # Broker-wide sequence: the message's key in the store and its FIFO rank.
        self.seq = seq
        self.redeliveries = redeliveries
        # Whether this entry's queue holds it in the store (to delete it on ack).
        self.stored = stored
        self.via: Via = via

    def __repr__(self) -> str:
        return f"<Entry {self.seq} {self.message.id} r={self.redeliveries}>"
