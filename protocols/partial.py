"""Bytes held in unfinished frames, across every connection, against one budget.

A client may announce a 4 MiB frame and send its body a byte at a time;
every protocol's decoder must keep what arrived until the frame is whole.
One such client is bounded by the frame size limit, but a hundred of them
held 400 MiB once.  Every connection therefore reports what its decoder
holds after each read (``update``); past ``limit`` bytes in all, reading
stops for the connections holding unfinished frames, the largest first,
until others finish theirs or are dropped (their data waits in the kernel's
socket buffers, and TCP pushes back on the sender).  A connection that has
held an unfinished frame for ``timeout`` seconds without completing one is
dropped with its protocol's error, so a stalled sender cannot keep the
budget forever.  Connections whose frames complete within a read never
appear here: the common path costs one dict lookup.
"""
from __future__ import annotations

from typing import Any, Protocol

from twisted.logger import Logger

log = Logger(namespace="gateway.protocols")

READ_HOLD = "partial frames"


class Holder(Protocol):
    """What the budget needs of a connection: stop and start reading, and end it."""

    @property
    def label(self) -> str: ...

    def pause_reading(self, reason: str) -> None: ...

    def resume_reading(self, reason: str) -> None: ...

    def drop_unfinished(self, seconds: float) -> None: ...


class _Held:
    __slots__ = ("bytes", "since", "paused")

    def __init__(self, since: float) -> None:
        self.bytes = 0
        self.since = since
        self.paused = False


class PartialBudget:
    def __init__(self, limit: int, timeout: float, clock: Any) -> None:
        self.limit = limit
        self.timeout = timeout
        self.clock = clock
        self.total = 0
        self.holders: dict[Any, _Held] = {}
        self.paused = 0
        self._sweeper: Any = None
        self.dropped = 0

    def update(self, holder: Holder, held: int, progressed: bool) -> None:
        """After a read: ``held`` bytes wait in the decoder; ``progressed`` if a frame completed."""
        entry = self.holders.get(holder)
        if entry is None:
            if not held:
                return
            entry = self.holders[holder] = _Held(self.clock.seconds())
            self._arm()
        elif progressed:
            entry.since = self.clock.seconds()
        self.total += held - entry.bytes
        entry.bytes = held
        if not held:
            del self.holders[holder]
            if entry.paused:
                self.paused -= 1
                holder.resume_reading(READ_HOLD)
        if self.total > self.limit:
            self._pause_largest()
        elif self.paused and self.total < self.limit * 0.8:
            self._resume_all()

    def forget(self, holder: Any) -> None:
        """The connection is gone: what it held is freed."""
        entry = self.holders.pop(holder, None)
        if entry is not None:
            self.total -= entry.bytes
            if entry.paused:
                self.paused -= 1
            if self.paused and self.total < self.limit * 0.8:
                self._resume_all()

    def _pause_largest(self) -> None:
        # Stop every unpaused holder, largest first: each of them could grow the total further.
        for holder, entry in sorted(self.holders.items(), key=lambda item: -item[1].bytes):
            if not entry.paused:
                entry.paused = True
                self.paused += 1
                holder.pause_reading(READ_HOLD)
        log.info(
            "{n} connections hold {mib:.1f} MiB of unfinished frames (limit {limit:.1f} MiB): reading paused",
            n=len(self.holders), mib=self.total / 2**20, limit=self.limit / 2**20,
        )

    def _resume_all(self) -> None:
        for holder, entry in list(self.holders.items()):
            if entry.paused:
                entry.paused = False
                holder.resume_reading(READ_HOLD)
        self.paused = 0

    def _arm(self) -> None:
        if self._sweeper is None and self.timeout > 0:
            self._sweeper = self.clock.callLater(min(1.0, self.timeout), self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.clock.seconds()
        for holder, entry in list(self.holders.items()):
            if now - entry.since >= self.timeout:
                self.dropped += 1
                log.info(
                    "[{label}] dropped: held {n} bytes of an unfinished frame for {s:.0f} s (partial_frame_timeout)",
                    label=getattr(holder, "label", "?"), n=entry.bytes, s=now - entry.since,
                )
                self.forget(holder)
                holder.drop_unfinished(now - entry.since)
        if self.holders:
            self._arm()

    def stop(self) -> None:
        if self._sweeper is not None and self._sweeper.active():
            self._sweeper.cancel()
        self._sweeper = None
