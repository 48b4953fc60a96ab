"""Delivery state kept beside a message, one per message per queue or subscription."""
from __future__ import annotations

from core.message import Message


class Entry:
    __slots__ = ("message", "seq", "redeliveries", "stored", "via")

    def __init__(
        self, message: Message, seq: int, redeliveries: int = 0, stored: bool = False, via: object = None,
    ) -> None:
        self.message = message
        # Broker-wide sequence: the message's key in the store and its FIFO rank.
        self.seq = seq
        self.redeliveries = redeliveries
        # Whether this entry's queue holds it in the store (to delete it on ack).
        self.stored = stored
        # The topic subscription(s) that brought the message to this queue: one
        # Subscription, or a tuple when several filters of one queue matched
        # (MQTT needs them for the granted QoS and subscription identifiers).
        self.via = via

    def __repr__(self) -> str:
        return f"<Entry {self.seq} {self.message.id} r={self.redeliveries}>"
