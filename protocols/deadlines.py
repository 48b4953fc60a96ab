"""One timer for many connections' deadlines (MQTT keep-alive): a heap instead of a DelayedCall each.

An idle device is mostly its keep-alive timer: Twisted's DelayedCall with its
arguments is about 600 bytes per connection.  A heap entry is a tuple of 64.
The heap keeps the same precision (each entry is due at its own time, as a
timer of its own would be): the one reactor timer is set for the earliest
deadline and moved when an earlier one arrives.  An entry is never removed
when its connection closes; the connection answers "no further deadline"
when it comes due.  Entries hold their connection by a weak reference, so a
closed session is freed at once rather than held for up to a keep-alive
interval (a reconnect storm would otherwise keep every closed session alive);
once most entries are dead ones the heap is rebuilt without them, as Twisted
does with cancelled calls, so churn does not grow it either.
"""
from __future__ import annotations

import heapq
import itertools
import weakref
from typing import Any, Protocol

from twisted.logger import Logger

from core.broker import Clock

log = Logger(namespace="gateway.protocols")


class Watched(Protocol):
    def deadline_reached(self) -> float | None:
        """Called when due: the next absolute deadline to be called at, or None for none."""


class Deadlines:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, weakref.ReferenceType[Watched]]] = []
        self._order = itertools.count()  # ties: first come, first called; sessions never compared
        self._timer: Any = None
        self._timer_at = 0.0
        self._dead = 0  # entries whose watcher is gone
        self._on_death = self._died  # one bound method for every weak reference's callback

    def __len__(self) -> int:
        return len(self._heap)

    def watch(self, at: float, watched: Watched) -> None:
        """Call ``watched.deadline_reached()`` at the clock time ``at`` (or as soon after as the reactor can)."""
        self._compact()
        heapq.heappush(self._heap, (at, next(self._order), weakref.ref(watched, self._on_death)))
        if self._timer is None or at < self._timer_at:
            self._schedule(at)

    def _died(self, ref: weakref.ReferenceType[Watched]) -> None:
        # Only counted here: a weak reference's callback can run inside any allocation,
        # so the heap is compacted by watch() and _fire(), never under their feet.
        self._dead += 1

    def _compact(self) -> None:
        if self._dead > 1000 and self._dead * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2]() is not None]
            heapq.heapify(self._heap)
            self._dead = 0

    def _schedule(self, at: float) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.callLater(max(0.0, at - self.clock.seconds()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._compact()
        heap = self._heap
        now = self.clock.seconds()
        due = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        for ref in due:  # each called once per firing, whatever it answers
            watched = ref()
            if watched is None:
                self._dead = max(0, self._dead - 1)
                continue  # its connection is gone
            try:
                again = watched.deadline_reached()
            except Exception:
                log.failure("a deadline's check failed; it is dropped")
                continue
            if again is not None:
                # self._heap, not the local: a check may have watched something new (and compacted).
                heapq.heappush(self._heap, (again, next(self._order), ref))
        if self._heap and (self._timer is None or self._heap[0][0] < self._timer_at):
            self._schedule(self._heap[0][0])

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._heap.clear()
