"""Bytes for one client that may leave only once the store has synced what came before them.

Receipts, PUBACKs and deliveries of stored messages must not reach the
socket before the batch that holds their write (or delivered mark) is on
disk.  One pending callback per client, not one closure per frame: frames
that wait for the same batch are gathered and written with one write, in
the order they were produced.  When nothing is waiting, the store calls
back at once and the frame goes out directly.

The store runs ``when_durable`` callbacks right after the synced write and
those callbacks only write bytes (they never route or dispatch), so
everything gathered here belongs to the batch that was just synced.
"""
from __future__ import annotations

from typing import Callable


class Outbox:
    __slots__ = ("_when_durable", "_write", "_held", "_waiting")

    def __init__(self, when_durable: Callable[[Callable[[], None]], None], write: Callable[[bytes], None]) -> None:
        self._when_durable = when_durable
        self._write = write
        self._held: list[bytes] = []
        self._waiting = False

    def add(self, data: bytes) -> None:
        self._held.append(data)
        if not self._waiting:
            self._waiting = True
            self._when_durable(self._release)

    def _release(self) -> None:
        self._waiting = False
        held = self._held
        self._held = []
        self._write(held[0] if len(held) == 1 else b"".join(held))

    def __len__(self) -> int:
        return len(self._held)
