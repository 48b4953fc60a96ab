"""What every bridge link does whatever its protocol: its life, its failures, its flow control.

A link is one connection to the remote.  It opens by sending its protocol's
CONNECT and waits ``CONNECT_TIMEOUT`` for the answer; it closes by itself
(``fail``) with the reason kept for operators, and the bridge's service
reconnects after its backoff.  While the socket to the remote is full, the
bridge's connection has no credit (its consumers stop); while the local store
is full, nothing more is read from the remote, which keeps what it has not
been told is stored (the producers' ``ProducerHold``, protocols/lifecycle.py).
"""
from __future__ import annotations

from typing import Any

from twisted.internet import interfaces, protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from core.consumer import Consumer
from protocols.bridge.bridge import Bridge
from protocols.lifecycle import ProducerHold
from protocols.twisted_types import connected

log = Logger(namespace="gateway.bridge")

CONNECT_TIMEOUT = 10.0


@implementer(interfaces.IPushProducer)
class Link(protocol.Protocol):
    """The protocol-independent part of a link; subclasses speak MQTT or STOMP."""

    answer = "the answer to CONNECT"  # what the remote sends to accept, named in the timeout's error

    def __init__(self, bridge: Bridge, clock: Any, password: bytes | None) -> None:
        self.bridge = bridge
        self.clock = clock
        self.password = password
        self.consumers: list[Consumer] = []
        self.accepted = False  # the remote accepted the connection
        self.lost = False
        self.last_in = 0.0
        self._timer: Any = None
        self.hold: ProducerHold | None = None  # reading paused while the store is full
        # What this turn has for the remote, written as one at the turn's end (see write).
        self._pending: list[bytes] = []

    def opened(self, connect: bytes) -> None:
        """From connectionMade: send the CONNECT and wait for its answer."""
        self.bridge.set_state("connecting")
        self.last_in = self.clock.seconds()
        connected(self.transport).registerProducer(self, True)
        self.write(connect)
        self._timer = self.clock.callLater(CONNECT_TIMEOUT, self._connect_timeout)

    def _connect_timeout(self) -> None:
        self._timer = None
        if not self.accepted:
            self.fail(f"no {self.answer} from {self.bridge.settings.url} within {CONNECT_TIMEOUT:g} s")

    def accept(self) -> None:
        """The remote said yes: count it, and stop waiting."""
        self.accepted = True
        self.cancel_timer()
        self.bridge.connects += 1
        self.bridge.set_state("connected")

    def start_consuming(self, sink: Any) -> None:
        """Be the consumer of what goes out (the outbound queue, and a STOMP bridge's queues)."""
        bridge = self.bridge
        for queue in bridge.out_queues():
            self.consumers.append(bridge.consume_queue(queue, sink, self.window()))
        bridge.connection.resume()  # a link that dropped while the socket was full left it paused

    def window(self) -> int:
        return self.bridge.settings.max_inflight

    def cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.lost = True
        self.cancel_timer()
        self.forget()
        bridge = self.bridge
        for consumer in self.consumers:
            bridge.stop_consuming(consumer)  # what the remote did not confirm goes back to the head
        self.consumers = []
        if bridge.state == "stopped":
            return  # stopped by the broker (shutdown, reload): nothing went wrong
        error = None if bridge.last_error_is_new else reason.getErrorMessage()
        bridge.set_state("disconnected", error)
        bridge.last_error_is_new = False
        if self.accepted:
            log.warn("bridge {bridge}: link to {url} lost ({why}); reconnecting", bridge=bridge.name,
                     url=bridge.settings.url, why=bridge.last_error or "closed")

    def forget(self) -> None:
        """The link is gone: drop what only it could have completed (a subclass's flows)."""

    def fail(self, why: str) -> None:
        """Drop the link (the service reconnects after its backoff), keeping ``why`` for operators."""
        bridge = self.bridge
        if not self.lost:
            bridge.set_state(bridge.state, why)
            bridge.last_error_is_new = True
            log.warn("bridge {bridge}: {why}", bridge=bridge.name, why=why)
            connected(self.transport).abortConnection()

    def write(self, data: bytes) -> None:
        """Send ``data`` at the end of this turn, with everything else the turn has for the remote.

        As the listeners' outboxes do: a bridge forwards a turn's messages one
        by one, and each write into Twisted's transport cost about half as much
        as encoding the message (4% of the bridging broker's samples under
        ``bridge-qos1``, profiled).  The order of the link's frames is kept.
        """
        if self.lost:
            return
        pending = self._pending
        pending.append(data)
        if len(pending) == 1:
            self.bridge.broker.turn_end.add(self._write_pending)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        if not self.lost and pending:
            connected(self.transport).write(pending[0] if len(pending) == 1 else b"".join(pending))

    # IPushProducer: the socket to the remote is full, or has room again.
    def pauseProducing(self) -> None:
        self.bridge.connection.pause()

    def resumeProducing(self) -> None:
        if not self.lost:
            self.bridge.connection.resume()

    def stopProducing(self) -> None:
        pass

    def hold_if_full(self) -> None:
        """At the store limit or the disk's floor: read nothing more from the remote until there is room.

        The producers' hold (protocols/lifecycle.py), with the link's own test: it
        refuses nothing, since the remote keeps what it has not been told is stored.
        """
        usage = self.bridge.broker.store_usage
        if usage.full and self.hold is None and not self.lost:
            self.hold = ProducerHold(self, self, usage, log, "link")

    # What the hold sees of a link.
    @property
    def closed(self) -> bool:
        return self.lost

    @property
    def label(self) -> str:
        return f"bridge {self.bridge.name}"

    def pause_reading(self, reason: str = "store limit") -> None:
        connected(self.transport).pauseProducing()

    def resume_reading(self, reason: str = "store limit") -> None:
        connected(self.transport).resumeProducing()


class LinkFactory(protocol.Factory):
    """Makes a link of one class for each connection the bridge's service opens."""

    noisy = False  # "Starting factory" at every reconnect says nothing an operator needs

    def __init__(self, link: type[Link], bridge: Bridge, clock: Any, password: bytes | None) -> None:
        self.link = link
        self.bridge = bridge
        self.clock = clock
        self.password = password

    def buildProtocol(self, addr: Any) -> Link:
        return self.link(self.bridge, self.clock, self.password)
