"""One reactor timer for many deadlines (protocols/deadlines.py): each called at its own time, in order."""
from __future__ import annotations

from twisted.internet.task import Clock

from protocols.deadlines import Deadlines


class Watch:
    def __init__(self, name, log, again=None, boom=False):
        self.name, self.log, self.again, self.boom = name, log, list(again or []), boom

    def deadline_reached(self):
        self.log.append((self.name, self.clock.seconds()))
        if self.boom:
            raise RuntimeError("boom")
        return self.again.pop(0) if self.again else None


def watches(clock, *specs):
    log = []
    out = []
    for spec in specs:
        w = Watch(*spec[:1], log, *spec[1:])
        w.clock = clock
        out.append(w)
    return log, out


def test_each_deadline_comes_at_its_own_time_with_one_timer():
    clock = Clock()
    deadlines = Deadlines(clock)
    log, (a, b, c) = watches(clock, ("a",), ("b", [25.0]), ("c",))
    deadlines.watch(15.0, a)
    deadlines.watch(10.0, b)  # earlier: the one timer moves forward
    deadlines.watch(15.0, c)
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(9.9)
    assert log == []
    clock.advance(0.1)
    assert log == [("b", 10.0)]
    clock.advance(5)
    assert log == [("b", 10.0), ("a", 15.0), ("c", 15.0)]  # ties in the order they came
    clock.advance(10)
    assert log[-1] == ("b", 25.0) and len(deadlines) == 0 and clock.getDelayedCalls() == []


def test_a_failing_check_is_dropped_and_the_others_still_come():
    clock = Clock()
    deadlines = Deadlines(clock)
    log, (bad, good) = watches(clock, ("bad", None, True), ("good", [7.0]))
    deadlines.watch(5.0, bad)
    deadlines.watch(5.0, good)
    clock.advance(5)
    clock.advance(2)
    assert log == [("bad", 5.0), ("good", 5.0), ("good", 7.0)] and len(deadlines) == 0


def test_stop_forgets_everything():
    clock = Clock()
    deadlines = Deadlines(clock)
    log, (a,) = watches(clock, ("a",))
    deadlines.watch(1.0, a)
    deadlines.stop()
    clock.advance(2)
    assert log == [] and clock.getDelayedCalls() == []


def test_a_forgotten_watcher_is_freed_at_once_and_skipped():
    """A closed session is not kept alive by its pending keep-alive deadline."""
    import gc
    import weakref

    clock = Clock()
    deadlines = Deadlines(clock)
    log, (gone, kept) = watches(clock, ("gone", [99.0]), ("kept",))
    handle = deadlines.watch(5.0, gone)
    deadlines.watch(5.0, kept)
    alive = weakref.ref(gone)
    deadlines.forget(handle)
    deadlines.forget(handle)  # twice (a close after a close) is harmless
    del gone
    gc.collect()
    assert alive() is None  # freed while its deadline is still pending
    clock.advance(5)
    assert log == [("kept", 5.0)] and len(deadlines) == 0


def test_a_watcher_that_answers_again_keeps_its_handle():
    clock = Clock()
    deadlines = Deadlines(clock)
    log, (a,) = watches(clock, ("a", [7.0, 9.0]))
    handle = deadlines.watch(5.0, a)
    clock.advance(5)
    clock.advance(2)
    deadlines.forget(handle)  # forgotten after two firings: the third does not come
    clock.advance(5)
    assert log == [("a", 5.0), ("a", 7.0)] and len(deadlines) == 0


def test_churn_does_not_grow_the_heap():
    """Closed sessions' entries go once they are most of the heap (a reconnect storm)."""
    clock = Clock()
    deadlines = Deadlines(clock)
    log, (kept,) = watches(clock, ("kept",))
    deadlines.watch(90.0, kept)
    for _ in range(5000):
        _, (gone,) = watches(clock, ("gone",))
        deadlines.forget(deadlines.watch(90.0, gone))
    assert len(deadlines) < 2500
    clock.advance(90)
    assert log == [("kept", 90.0)] and len(deadlines) == 0
