"""What both protocols' connections share (protocols/lifecycle.py): the login gate, the producer hold, the end.

The gate and the hold are driven here with a stand-in session and a virtual
clock; the sessions' own tests (test_stomp_session.py, test_mqtt_session.py)
drive them through real CONNECTs and SENDs.
"""
from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger

from core.access import ANONYMOUS, Principal
from core.broker import Broker
from core.policy import Policy
from persistence.memory import MemoryStore
from protocols.auth import Credentials
from protocols.lifecycle import CloseReason, LoginGate, ProducerHold, fail_soon, hold_if_stored, store_refusal

log = Logger(namespace="test")


class Transport:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def pause_reading(self, reason: str = "") -> None:
        self.events.append(("pause", reason))

    def resume_reading(self, reason: str = "") -> None:
        self.events.append(("resume", reason))

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def certificate_user(self) -> None:
        return None


class Session:
    """What a LoginGate and a ProducerHold see of a session."""

    def __init__(self, clock: Clock, timeout: float = 10.0) -> None:
        self.transport = Transport()
        self.closed = False
        self.label = "1.2.3.4:5 dev"
        self.hold: ProducerHold | None = None
        self.replayed: list[list[Any]] = []
        self.timed_out = 0
        self.errors: list[str] = []
        self.gate = LoginGate(self, clock, timeout)

    def connect_timed_out(self) -> None:
        self.timed_out += 1

    def replay(self, waiting: list[Any]) -> None:
        self.transport.events.append(("replay", ",".join(waiting)))
        self.replayed.append(waiting)

    def internal_error(self, detail: str) -> None:
        self.errors.append(detail)


class Later:
    """An authenticator whose answer comes when the test says (a slow hash)."""

    def __init__(self) -> None:
        self.pending: list[Any] = []

    def authenticate(self, credentials: Credentials, answer: Any) -> None:
        self.pending.append(answer)


class AtOnce:
    def authenticate(self, credentials: Credentials, answer: Any) -> None:
        answer(ANONYMOUS, "")


CREDENTIALS = Credentials("alice", b"pw", None, "1.2.3.4:5", "stomp/1.2", None)


# -- the login gate ---------------------------------------------------------------


def test_a_late_answer_pauses_reading_and_replays_what_came_meanwhile_after_it():
    clock = Clock()
    s = Session(clock)
    auth = Later()
    answers: list[tuple[Any, str]] = []

    def answer(principal: Any, why: str) -> None:
        s.transport.events.append(("answer", why))
        answers.append((principal, why))

    s.gate.ask(auth, CREDENTIALS, answer)
    assert s.transport.events == [("pause", "authenticating")]
    s.gate.hold("a")
    s.gate.hold("b")
    (later,) = auth.pending
    later(Principal("alice"), "ok")
    # The answer first (it makes the Connected), then reading resumes, then what came meanwhile, in order.
    assert s.transport.events == [("pause", "authenticating"), ("answer", "ok"), ("resume", "authenticating"), ("replay", "a,b")]
    assert answers == [(Principal("alice"), "ok")]


def test_an_answer_at_once_pauses_nothing():
    s = Session(Clock())
    got: list[Any] = []
    s.gate.ask(AtOnce(), CREDENTIALS, lambda principal, why: got.append(principal))
    assert got == [ANONYMOUS] and s.transport.events == [] and s.replayed == []


def test_an_answer_after_the_close_changes_nothing():
    s = Session(Clock())
    auth = Later()
    got: list[Any] = []
    s.gate.ask(auth, CREDENTIALS, lambda principal, why: got.append(principal))
    s.gate.hold("a")
    s.closed = True
    s.gate.close()
    auth.pending[0](Principal("alice"), "")
    assert got == [] and s.replayed == [] and s.transport.events == [("pause", "authenticating")]


def test_a_refused_client_is_not_resumed_nor_replayed():
    s = Session(Clock())
    auth = Later()

    def refuse(principal: Any, why: str) -> None:
        s.closed = True  # the session answers a refusal with its error and a close

    s.gate.ask(auth, CREDENTIALS, refuse)
    s.gate.hold("a")
    auth.pending[0](None, "bad user name or password")
    assert s.replayed == [] and s.transport.events == [("pause", "authenticating")]


def test_a_second_answer_is_ignored():
    s = Session(Clock())
    auth = Later()
    got: list[Any] = []
    s.gate.ask(auth, CREDENTIALS, lambda principal, why: got.append(why))
    auth.pending[0](ANONYMOUS, "first")
    auth.pending[0](ANONYMOUS, "second")
    assert got == ["first"] and len(s.replayed) == 1


def test_the_connect_timer():
    clock = Clock()
    s = Session(clock, timeout=5.0)
    clock.advance(4.9)
    assert s.timed_out == 0
    clock.advance(0.1)
    assert s.timed_out == 1 and clock.getDelayedCalls() == []

    accepted = Session(clock, timeout=5.0)
    accepted.gate.stop()  # CONNECT accepted in time
    clock.advance(10)
    assert accepted.timed_out == 0 and clock.getDelayedCalls() == []

    closed = Session(clock, timeout=5.0)
    closed.gate.close()
    assert clock.getDelayedCalls() == []

    unlimited = Session(clock, timeout=0)  # 0: no limit
    assert clock.getDelayedCalls() == []
    clock.advance(1000)
    assert unlimited.timed_out == 0


def test_the_refusal_of_the_connection_limits_is_kept_until_connect():
    from protocols.admission import Refusal

    s = Session(Clock())
    assert s.gate.refusal is None
    s.gate.refusal = Refusal("too many connections from 1.2.3.4", False)
    assert s.gate.refusal.why == "too many connections from 1.2.3.4"


# -- the producer hold --------------------------------------------------------------


def full_broker(store_full_policy: str = "block") -> Broker:
    broker = Broker(MemoryStore(), Clock(), Policy(store_full_policy=store_full_policy))
    broker.start()
    broker.store_usage.set_alarm("Disk space low", "free disk space is below the floor")
    assert broker.store_usage.full
    return broker


def test_store_refusal_only_under_fail_and_only_what_would_be_stored():
    assert store_refusal(full_broker("fail"), True) == ("Disk space low", "free disk space is below the floor")
    assert store_refusal(full_broker("fail"), False) is None  # QoS 0, non-persistent: nothing to refuse
    assert store_refusal(full_broker("block"), True) is None
    room = Broker(MemoryStore(), Clock(), Policy(store_full_policy="fail"))
    assert store_refusal(room, True) is None


def test_a_stored_message_holds_its_producer_until_the_store_has_room():
    broker = full_broker()
    s = Session(Clock())
    usage = broker.store_usage
    before = usage.bytes
    usage.add(100)  # what the SEND stored
    hold_if_stored(s, s.transport, broker, True, before, broker.streams.appended, log, "producer")
    assert isinstance(s.hold, ProducerHold) and s.transport.events == [("pause", "store limit")]
    usage.set_alarm("", None)  # room again
    assert s.hold is None and s.transport.events == [("pause", "store limit"), ("resume", "store limit")]


def test_nothing_stored_holds_nobody():
    broker = full_broker()
    s = Session(Clock())
    usage = broker.store_usage
    hold_if_stored(s, s.transport, broker, True, usage.bytes, broker.streams.appended, log, "producer")  # stored nothing
    usage.add(100)
    hold_if_stored(s, s.transport, broker, False, 0, broker.streams.appended, log, "producer")  # not persistent
    assert s.hold is None and s.transport.events == []


def test_under_fail_a_stream_record_holds_its_producer_under_the_alarm():
    broker = full_broker("fail")
    s = Session(Clock())
    broker.streams.appended += 1  # what the SEND appended to a stream (any message, persistent or not)
    hold_if_stored(s, s.transport, broker, False, broker.store_usage.bytes, broker.streams.appended - 1, log, "publisher")
    assert s.hold is not None and s.transport.events == [("pause", "store limit")]


def test_a_producer_closed_while_held_is_not_resumed():
    broker = full_broker()
    s = Session(Clock())
    usage = broker.store_usage
    usage.add(100)
    hold_if_stored(s, s.transport, broker, True, 0, broker.streams.appended, log, "producer")
    s.closed = True
    usage.set_alarm("", None)
    assert s.hold is None and s.transport.events == [("pause", "store limit")]


# -- failures outside the client's input, and the end ------------------------------------------


def test_fail_soon_logs_and_closes_on_the_next_turn():
    clock = Clock()
    s = Session(clock)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        fail_soon(s, clock, log, "delivering ID:1", "the broker failed to deliver a message")
    assert s.errors == []  # not inside the caller's dispatch
    clock.advance(0)
    assert s.errors == ["the broker failed to deliver a message"]


def test_close_reasons_say_what_a_websocket_close_frame_says():
    assert [r.value for r in CloseReason] == ["normal", "error", "shutdown", "admin"]
