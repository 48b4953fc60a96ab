"""End-of-turn batching: one deferred call per turn, work in arrival order."""
from __future__ import annotations

from core.turn import TurnEnd


def test_without_defer_work_runs_at_once():
    ran = []
    TurnEnd(None).add(lambda: ran.append(1))
    assert ran == [1]


def test_one_deferred_call_runs_everything_in_order():
    deferred = []
    turn = TurnEnd(deferred.append)
    ran = []
    for i in range(3):
        turn.add(lambda i=i: ran.append(i))
    assert ran == [] and len(deferred) == 1
    deferred.pop()()
    assert ran == [0, 1, 2]


def test_work_added_while_running_waits_for_the_next_turn():
    deferred = []
    turn = TurnEnd(deferred.append)
    ran = []
    turn.add(lambda: (ran.append("a"), turn.add(lambda: ran.append("b"))))
    deferred.pop()()
    assert ran == ["a"] and len(deferred) == 1
    deferred.pop()()
    assert ran == ["a", "b"]
