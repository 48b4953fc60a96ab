"""What a session writes to its client, gathered per reactor turn and held until it is durable.

Receipts, PUBACKs and deliveries of stored messages must not reach the
socket before the batch that holds their write (or delivered mark) is on
disk.  Frames produced in one reactor turn are gathered and, at the end of
the turn, handed to the store's ``when_durable`` as one callback with one
write: no closure and no transport call per frame, and the frames keep the
order they were produced in.  Everything gathered was produced before the
hand-over, so the store's promise covers all of it.

The turn's end is the broker's ``TurnEnd`` (core/turn.py).
"""
from __future__ import annotations

from typing import Callable

from core.turn import TurnEnd

# Bytes gathered before they are handed over without waiting for the turn's end:
# Twisted's own buffer size, so a consumer that drains a deep queue in one turn
# still meets the transport's back-pressure (pauseProducing) as it goes.
HAND_OVER_BYTES = 65536


class Outbox:
    __slots__ = ("_turn", "_when_durable", "_write", "_held", "_queued", "_bytes")

    def __init__(self, turn: TurnEnd, when_durable: Callable[[Callable[[], None]], None], write: Callable[[bytes], None]) -> None:
        self._turn = turn
        self._when_durable = when_durable
        self._write = write
        self._held: list[bytes] = []
        self._queued = False
        self._bytes = 0

    def add(self, data: bytes) -> None:
        self._held.append(data)
        self._bytes += len(data)
        if self._bytes >= HAND_OVER_BYTES:
            self.submit()
        elif not self._queued:
            self._queued = True
            self._turn.add(self.submit)

    def submit(self) -> None:
        """Hand what was gathered to the store now (also before an error closes the connection)."""
        self._queued = False
        held = self._held
        if not held:
            return
        self._held = []
        self._bytes = 0
        data = held[0] if len(held) == 1 else b"".join(held)
        write = self._write
        self._when_durable(lambda: write(data))