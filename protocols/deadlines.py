"""One timer for many connections' deadlines (MQTT keep-alive, STOMP heart-beats): a heap instead of a DelayedCall each.

An idle device is mostly its keep-alive timer: Twisted's DelayedCall with its
arguments is about 600 bytes per connection.  A heap entry is a tuple of 56
bytes and a dict slot.  The heap keeps the same precision (each entry is due at
its own time, as a timer of its own would be): the one reactor timer is set for
the earliest deadline and moved when an earlier one arrives.

A closing connection forgets its entry, which lets go of the connection at
once (a reconnect storm would otherwise keep every closed session alive for a
keep-alive interval); the heap entry itself stays until it comes due or most
entries are dead ones, when the heap is rebuilt without them, as Twisted does
with cancelled calls, so churn does not grow it either.  Forgetting is explicit
rather than a weak reference because the sessions are compiled (mypyc) classes,
which take no weak references.  Once nothing is watched the heap is emptied and
its timer cancelled.

The MQTT hub keeps a heap of its own (``MqttHub.deadlines``, stopped with it);
STOMP sessions, which have no hub, share one heap per clock (``shared``), which
lets go of itself once nothing is watched.
"""
from __future__ import annotations

import heapq
import itertools
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
        self._heap: list[tuple[float, int]] = []  # (due, handle); ties: the first watched is called first
        self._watched: dict[int, Watched] = {}  # handle -> watcher, until it is forgotten or done
        self._handles = itertools.count()
        self._timer: Any = None
        self._timer_at = 0.0
        self._dead = 0  # heap entries whose watcher was forgotten
        self._firing = False  # in _fire: a watcher may be out of the table while it is called

    def __len__(self) -> int:
        return len(self._heap)

    def watch(self, at: float, watched: Watched) -> int:
        """Call ``watched.deadline_reached()`` at the clock time ``at`` (or as soon after as the reactor can).

        Returns the handle to ``forget`` it by; it stays valid while the watcher keeps
        answering with further deadlines.
        """
        self._compact()
        handle = next(self._handles)
        self._watched[handle] = watched
        self._push(at, handle)
        return handle

    def forget(self, handle: int) -> None:
        """Let go of a watcher now (its connection closed); it will not be called."""
        watched = self._watched
        if watched.pop(handle, None) is not None:
            self._dead += 1
            if not watched and not self._firing:
                self._idle()

    def _push(self, at: float, handle: int) -> None:
        heapq.heappush(self._heap, (at, handle))
        if self._timer is None or at < self._timer_at:
            self._schedule(at)

    def _compact(self) -> None:
        if self._dead > 1000 and self._dead * 2 > len(self._heap):
            watched = self._watched
            self._heap = [entry for entry in self._heap if entry[1] in watched]
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
            due.append(heapq.heappop(heap)[1])
        self._firing = True
        try:
            for handle in due:  # each called once per firing, whatever it answers
                # Out of the table while it is called: a close inside the call forgets nothing twice.
                watched = self._watched.pop(handle, None)
                if watched is None:
                    self._dead = max(0, self._dead - 1)
                    continue  # its connection is gone
                try:
                    again = watched.deadline_reached()
                except Exception:
                    log.failure("a deadline's check failed; it is dropped")
                    continue
                if again is not None:
                    self._watched[handle] = watched
                    # self._heap, not the local: a check may have watched something new (and compacted).
                    heapq.heappush(self._heap, (again, handle))
        finally:
            self._firing = False
        if not self._watched:
            self._idle()
        elif self._heap and (self._timer is None or self._heap[0][0] < self._timer_at):
            self._schedule(self._heap[0][0])

    def _idle(self) -> None:
        """Nothing is watched: no timer, no dead entries; a shared heap lets go of its clock."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._heap.clear()
        self._dead = 0
        if _shared.get(self.clock) is self:
            del _shared[self.clock]

    def stop(self) -> None:
        self._watched.clear()
        self._idle()


# One heap per clock for the sessions that have no hub of their own to keep one (STOMP's),
# while anything is watched on it.
_shared: dict[object, Deadlines] = {}


def shared(clock: Clock) -> Deadlines:
    """The heap every session on ``clock`` without a heap of its own watches its deadlines on."""
    found = _shared.get(clock)
    if found is None:
        found = _shared[clock] = Deadlines(clock)
    return found
