"""What a session writes to its client, gathered per reactor turn and held until it is durable.

Receipts, PUBACKs and deliveries of stored messages must not reach the
socket before the batch that holds their write (or delivered mark) is on
disk.  Frames produced in one reactor turn are gathered and, at the end of
the turn, handed to the store's ``when_durable`` as one callback with one
write: no closure and no transport call per frame, and the frames keep the
order they were produced in.  Everything gathered was produced before the
hand-over, so the store's promise covers all of it.

A delivery of an entry that is not stored (a topic's message to a
non-durable subscriber) depends on nothing on disk: when nothing it
gathered needs the disk and nothing handed over earlier is still waiting,
it is written at once, not after an fsync that only other clients (or the
stream the message was also recorded in) wait for.

What waits for the disk has not met the transport's back-pressure yet:
Twisted pauses a session (``pauseProducing``) only once bytes reach its
buffer, and deliveries made meanwhile would all land there when the sync
releases them, however long the sync took.  So a session holds at most
``HOLD_BYTES`` handed over and not yet written: at that mark its connection's
consumers lose their credit (``hold_output``) until a release brings it back
below (``release_output``, at the end of that turn).

The turn's end is the broker's ``TurnEnd`` (core/turn.py).
"""
from __future__ import annotations

from typing import Callable, Protocol

from core.turn import TurnEnd

# Bytes gathered before they are handed over without waiting for the turn's end:
# Twisted's own buffer size, so a consumer that drains a deep queue in one turn
# still meets the transport's back-pressure (pauseProducing) as it goes.
HAND_OVER_BYTES = 65536
# Bytes handed over and still waiting for the disk at which the connection's consumers get
# nothing more.  What can land in the transport's buffer beyond Twisted's high-water mark
# (64 KiB) is then this plus the hand-over that crossed it (under HAND_OVER_BYTES and one
# frame), however long the sync takes.  A consumer that keeps up is held only when more than
# this goes to it per sync: 256 KiB a sync is 700 MB/s at the 0.35 ms sync of README's figures.
HOLD_BYTES = 4 * HAND_OVER_BYTES


class Durability(Protocol):
    """The session's connection: runs a callback once everything written so far is on disk,
    and takes its consumers' credit away while too much waits for that."""

    def when_durable(self, callback: Callable[[], None]) -> None: ...

    def hold_output(self) -> None: ...

    def release_output(self) -> None: ...


class Writer(Protocol):
    """The session: puts bytes on its connection (nothing once it is closed)."""

    def write_out(self, data: bytes) -> None: ...


class Outbox:
    # The objects themselves, not their bound methods: two bound methods were 128
    # bytes of every idle connection.
    __slots__ = ("_turn", "_durability", "_writer", "_held", "_queued", "_bytes", "_durable", "_waiting")

    def __init__(self, turn: TurnEnd, durability: Durability, writer: Writer) -> None:
        self._turn = turn
        self._durability = durability
        self._writer = writer
        self._held: list[bytes] | None = None  # made per turn with its first frame
        self._queued = False
        self._bytes = 0
        self._durable = False  # something gathered must wait for the disk
        self._waiting = 0      # bytes handed over still waiting for it (later ones queue behind them)

    def add(self, data: bytes, durable: bool = True) -> None:
        """``durable``: the frame must wait for the store (False only for deliveries of unstored entries)."""
        held = self._held
        if held is None:
            self._held = [data]
        else:
            held.append(data)
        self._bytes += len(data)
        if durable:
            self._durable = True
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
        self._held = None
        self._bytes = 0
        data = held[0] if len(held) == 1 else b"".join(held)
        if not self._durable and not self._waiting:
            self._writer.write_out(data)
            return
        self._durable = False
        waiting = self._waiting
        self._waiting = waiting + len(data)
        if waiting < HOLD_BYTES <= self._waiting:
            self._durability.hold_output()
        self._durability.when_durable(lambda: self._release(data))

    def _release(self, data: bytes) -> None:
        waiting = self._waiting
        self._waiting = waiting - len(data)
        self._writer.write_out(data)
        if self._waiting < HOLD_BYTES <= waiting:
            # At the turn's end, not here inside the store's release of callbacks: the
            # dispatch could flush the store and let later batches' callbacks overtake the
            # rest of this one.
            self._turn.add(self._resume)

    def _resume(self) -> None:
        if self._waiting < HOLD_BYTES:  # not crossed again meanwhile (frames other than deliveries)
            self._durability.release_output()
