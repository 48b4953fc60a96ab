"""What every connection's life has whatever its protocol: the opening, producer flow control, the end.

STOMP and MQTT sessions are different state machines, but they open, hold
and end their connections the same way, so that is written once, here:

- ``LoginGate``: the opening phase, from accept to the authenticator's
  answer, as wsproto's ``H11Handshake`` owns a WebSocket's opening and then
  hands over a ``Connection``.  It keeps what only an unconnected client
  needs: the connect timer, the refusal of the connection limits, and, while
  the credentials are being checked (a slow hash, off the reactor thread),
  reading paused and what was already on its way held.  When the answer has
  made the session's ``Connected`` (or refused it), the gate resumes reading
  and hands what it held back to the session (``Opening.replay``); the session
  drops the gate once connected, so an idle connection does not keep it.
- ``ProducerHold``: producer flow control.  ``store_refusal`` (before routing)
  and ``hold_if_stored`` (after) are the one policy test: under
  ``store_full_policy = "fail"`` a message the store would keep is refused;
  under ``"block"`` a producer whose message was stored while the store is
  full reads nothing more until it has room, and under the disk alarm so does
  one whose message became a stream record, by either policy.  The bridges'
  links hold the same way, with their own test (they never refuse).
- ``fail_soon``: a failure in work done for a client outside its own input (a
  delivery of a fan-out, a reload of the rules) is logged with its traceback
  and closes that client on the next turn, never the others.
- ``CloseReason``: why a session ended, for transports that can say
  (WebSocket close codes).

Nothing here runs per message unless the store is full: the sessions test
``usage.full`` inline and call in only then.
"""
from __future__ import annotations

import enum
from functools import partial
from typing import Any, Protocol

from twisted.logger import Logger

from core.access import Principal
from core.broker import Broker, Clock
from core.storage import StoreUsage
from protocols.admission import Refusal
from protocols.auth import Answer, Authenticator, Credentials
from protocols.transport import Transport

__all__ = [
    "CloseReason", "LoginGate", "Opening", "ProducerHold", "Reading", "fail_soon", "hold_if_stored", "store_refusal",
]


class CloseReason(enum.Enum):
    """Why a session ended; the value is what a WebSocket Close frame says."""

    NORMAL = "normal"      # the client left, or the connection was lost
    ERROR = "error"        # the client broke the protocol (or the broker failed it)
    SHUTDOWN = "shutdown"  # the broker is stopping
    ADMIN = "admin"        # an operator closed it


# -- the opening ------------------------------------------------------------------


class Opening(Protocol):
    """A session as its ``LoginGate`` sees it."""

    @property
    def closed(self) -> bool: ...

    @property
    def transport(self) -> Transport: ...

    def connect_timed_out(self) -> None:
        """No CONNECT in time (the session says so in its protocol, and closes)."""

    def replay(self, waiting: list[Any]) -> None:
        """Handle what arrived while the credentials were checked (what ``LoginGate.hold`` kept), in order."""


class LoginGate:
    """One connection's opening phase: the connect timer, the connection limits' refusal, the login.

    Made with the session and dropped by it once CONNECT is accepted (``stop``);
    ``close`` when the connection closes first.
    """

    __slots__ = ("_session", "_timer", "refusal", "_waiting", "_paused", "_asking")

    def __init__(self, session: Opening, clock: Clock, timeout: float) -> None:
        self._session = session
        self.refusal: Refusal | None = None  # why this connection may not CONNECT (connection limits)
        self._waiting: list[Any] | None = None  # what arrived while the credentials were checked
        self._paused = False  # reading paused for the answer
        self._asking = False  # the authenticator has not answered yet
        self._timer: Any = clock.callLater(timeout, self._timed_out) if timeout > 0 else None

    def _timed_out(self) -> None:
        self._timer = None
        self._session.connect_timed_out()

    def stop(self) -> None:
        """CONNECT is accepted: no more timer (the session then lets go of the gate)."""
        timer = self._timer
        if timer is not None and timer.active():
            timer.cancel()
        self._timer = None

    def close(self) -> None:
        """The connection closed before the gate was done: no timer, and an answer still to come changes nothing."""
        self.stop()
        self._asking = False
        self._waiting = None

    def ask(self, authenticator: Authenticator, credentials: Credentials, answer: Answer) -> None:
        """Ask ``authenticator``; ``answer`` gets the principal (or None and why), now or in a later turn.

        While the answer is pending, reading is paused; what was already on
        its way is kept by ``hold`` and given to the session's ``replay`` once
        ``answer`` has run, with reading resumed.  An answer given at once (no
        users, a cached login) pauses nothing.
        """
        self._asking = True
        authenticator.authenticate(credentials, partial(self._answered, answer))
        if self._asking:
            self._paused = True
            self._session.transport.pause_reading("authenticating")

    def hold(self, item: Any) -> None:
        """Keep what arrived while the credentials are checked (frames or bytes, as the session reads them)."""
        waiting = self._waiting
        if waiting is None:
            self._waiting = [item]
        else:
            waiting.append(item)

    def _answered(self, answer: Answer, principal: Principal | None, why: str) -> None:
        if not self._asking:
            return  # closed meanwhile
        self._asking = False
        resume = self._paused
        self._paused = False
        answer(principal, why)
        waiting = self._waiting
        self._waiting = None
        session = self._session
        if resume and not session.closed:
            session.transport.resume_reading("authenticating")
            session.replay([] if waiting is None else waiting)


# -- producer flow control --------------------------------------------------------


class Reading(Protocol):
    """What a hold pauses: a session's transport, or a bridge's link."""

    def pause_reading(self, reason: str) -> None: ...

    def resume_reading(self, reason: str) -> None: ...


class Producer(Protocol):
    """A connection that producer flow control can hold: it keeps its ``hold`` while held."""

    hold: ProducerHold | None

    @property
    def closed(self) -> bool: ...

    @property
    def label(self) -> str: ...


def store_refusal(broker: Broker, stored: bool) -> tuple[str, str] | None:
    """Before routing: what a message the store would keep (``stored``) is refused with while the store is
    full under ``store_full_policy = "fail"`` (a short title and the reason); None when it is not."""
    usage = broker.store_usage
    if stored and usage.full and broker.policy.store_full_policy == "fail":
        return usage.refusal()
    return None


def hold_if_stored(
    producer: Producer, reading: Reading, broker: Broker, stored: bool, stored_before: int, appended_before: int,
    log: Logger, noun: str,
) -> None:
    """After routing, with the store full and ``producer`` not held yet: hold it if what it sent was stored.

    Only a send that was stored holds its producer (``stored`` and the store's
    bytes grew, under ``"block"``): a persistent message to a topic nobody
    durably follows costs the store nothing.  Under the disk alarm a stream
    record is stored too, whatever the message, and cannot be refused once
    routed: its producer is held by either policy.
    """
    usage = broker.store_usage
    if (stored and usage.bytes > stored_before and broker.policy.store_full_policy == "block") or (
        usage.alarm is not None and broker.streams.appended > appended_before
    ):
        producer.hold = ProducerHold(producer, reading, usage, log, noun)


class ProducerHold:
    """Read nothing more from a producer until the store has room (``StoreUsage.when_space``).

    Made when a producer is held and kept by it as ``hold`` until released,
    so a producer that is not held pays nothing for it.
    """

    __slots__ = ("_producer", "_reading", "_log", "_noun")

    def __init__(self, producer: Producer, reading: Reading, usage: StoreUsage, log: Logger, noun: str) -> None:
        self._producer = producer
        self._reading = reading
        self._log = log
        self._noun = noun
        log.info("[{label}] {why}: holding this {noun}", label=producer.label, why=usage.refusal()[1], noun=noun)
        reading.pause_reading("store limit")
        usage.when_space(self._release)

    def _release(self) -> None:
        producer = self._producer
        producer.hold = None
        if not producer.closed:
            self._log.info("[{label}] store has room again: resuming this {noun}", label=producer.label, noun=self._noun)
            self._reading.resume_reading("store limit")


# -- failures outside the client's own input ----------------------------------------


class Failing(Protocol):
    @property
    def label(self) -> str: ...

    def internal_error(self, detail: str) -> None:
        """Close the client on a broker failure, telling it what its protocol can say (``detail``)."""


def fail_soon(session: Failing, clock: Clock, log: Logger, doing: str, detail: str) -> None:
    """In an ``except`` block of work done for a client outside its own input: log, and close it next turn.

    A delivery is one of a fan-out and a reload of the rules one of many
    clients: the failure costs this client its connection on the next turn
    (its delivery stays unacknowledged and goes back to the queue), never the
    others, and never inside the dispatch that called.
    """
    log.failure("[{label}] internal error {doing}", label=session.label, doing=doing)
    clock.callLater(0, session.internal_error, detail)
