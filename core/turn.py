"""Work batched to the end of the current reactor turn.

Frames for one client produced while one read is handled go out as one
write, after the turn's store batch: ``defer`` runs a callable once the
turn's I/O callbacks are done (``callLater(0)`` in the gateway).  Without
``defer`` every callback runs at once, which is what tests that drive the
core or a session by hand, with no reactor, expect.
"""
from __future__ import annotations

from typing import Callable

from twisted.logger import Logger

log = Logger(namespace="gateway.core")

Defer = Callable[[Callable[[], None]], None]


class TurnEnd:
    """One end-of-turn call for every outbox that gathered something in this turn."""

    __slots__ = ("_defer", "_due")

    def __init__(self, defer: Defer | None) -> None:
        self._defer = defer
        self._due: list[Callable[[], None]] = []

    def add(self, callback: Callable[[], None]) -> None:
        if self._defer is None:
            callback()
            return
        self._due.append(callback)
        if len(self._due) == 1:
            self._defer(self._run)

    def _run(self) -> None:
        due, self._due = self._due, []
        for callback in due:
            try:
                callback()
            except Exception:
                # One client's failure must not cost the others their writes.
                log.failure("end-of-turn work failed")


