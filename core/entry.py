"""Delivery state kept beside a message, one per message per queue or subscription."""
from __future__ import annotations

from core.message import Message


class Entry:
    __slots__ = ("message", "seq", "redeliveries", "stored")

    def __init__(self, message: Message, seq: int, redeliveries: int = 0, stored: bool = False) -> None:
        self.message = message
        # Broker-wide sequence: the message's key in the store and its FIFO rank.
        self.seq = seq
        self.redeliveries = redeliveries
        # Whether this entry's queue holds it in the store (to delete it on ack).
        self.stored = stored

    def __repr__(self) -> str:
        return f"<Entry {self.seq} {self.message.id} r={self.redeliveries}>"
