"""A bridge's link to a remote STOMP broker (1.2): another gateway, ActiveMQ, Artemis or RabbitMQ.

The frames are the listeners' codec's.  Out: each message is a SEND with a
``receipt``, and leaves the outbound queue only on its RECEIPT; a persistent
message is sent ``persistent:true``.  In: the bridge subscribes with
``ack:client-individual`` (and, with ``clean_session = false``, durably under
ActiveMQ's, Artemis's and RabbitMQ's headers), and ACKs a MESSAGE only once it
is stored here.  Heart-beats both ways every ``keepalive`` seconds.
"""
from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from core.consumer import Consumer
from core.duplicates import forwarding_headers
from core.entry import Entry
from core.errors import BrokerError
from core.message import Message
from protocols.bridge.bridge import Bridge
from protocols.bridge.link import Link
from protocols.stomp.session import BROKER_HEADER
from protocols.stomp.codec import Frame, StompDecoder, StompLimits, StompProtocolError, encode_frame

log = Logger(namespace="gateway.bridge")

# What a MESSAGE carries about its delivery, not about the message: not passed on.
_DELIVERY_HEADERS = frozenset({
    "destination", "message-id", "subscription", "ack", "content-length", "redelivered", "redelivery-count",
    "persistent", "priority", "expires", "correlation-id", "reply-to", "content-type", "timestamp",
})
_TRUE = ("true", "1", "yes")


class StompLink(Link):
    """One connection of a bridge to a STOMP broker."""

    answer = "CONNECTED"

    def __init__(self, bridge: Bridge, clock: Any, password: bytes | None) -> None:
        super().__init__(bridge, clock, password)
        self.decoder = StompDecoder(StompLimits(max_frame_size=64 * 1024 * 1024), "1.2")
        # Out: receipt id -> (consumer, the local delivery's tag), awaiting RECEIPT.
        self.receipts: dict[str, tuple[Consumer, int]] = {}
        self._receipt_no = 0
        self._heartbeat: Any = None
        self._beat_out = self._beat_in = 0.0

    def connectionMade(self) -> None:
        bridge = self.bridge
        settings = bridge.settings
        beat = settings.keepalive * 1000
        headers = [
            ("accept-version", "1.2"), ("host", settings.virtual_host), ("client-id", bridge.client_id),
            ("heart-beat", f"{beat},{beat}"), (BROKER_HEADER, bridge.broker_name),
        ]
        if settings.user is not None:
            headers.append(("login", settings.user))
        if self.password is not None:
            headers.append(("passcode", self.password.decode("utf-8", "replace")))
        self.opened(encode_frame("CONNECT", headers, version="1.2"))

    def forget(self) -> None:
        if self._heartbeat is not None and self._heartbeat.active():
            self._heartbeat.cancel()
        self._heartbeat = None
        self.receipts.clear()

    # -- from the remote --------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        self.last_in = self.clock.seconds()
        try:
            frames = self.decoder.feed(data)
        except StompProtocolError as exc:
            self.fail(f"the remote sent a malformed frame: {exc}")
            return
        for frame in frames:
            if self.lost:
                return
            self._handle(frame)

    def _handle(self, frame: Frame) -> None:
        command = frame.command
        if command == "MESSAGE":
            self._inbound(frame)
        elif command == "RECEIPT":
            self._confirmed(frame.headers.get("receipt-id", ""))
        elif command == "CONNECTED":
            self._connected(frame)
        elif command == "ERROR":
            detail = frame.body.decode("utf-8", "replace").strip()
            self.fail(f"the remote sent ERROR: {frame.headers.get('message', '')}" + (f" ({detail})" if detail else ""))
        elif command:  # a heart-beat is an empty frame
            self.fail(f"the remote sent an unexpected {command}")

    def _connected(self, frame: Frame) -> None:
        bridge = self.bridge
        if self.accepted:
            self.fail("the remote sent a second CONNECTED")
            return
        bridge.remote_name = frame.headers.get(BROKER_HEADER)
        self.accept()
        log.info("bridge {bridge}: connected to {url} as {client} (STOMP 1.2, {server})", bridge=bridge.name,
                 url=bridge.settings.url, client=bridge.client_id, server=frame.headers.get("server", "a STOMP broker"))
        self._subscribe()
        self._start_heartbeat(frame.headers.get("heart-beat", "0,0"))
        self.start_consuming(self._deliver)

    def _subscribe(self) -> None:
        bridge = self.bridge
        for number, topic in enumerate(bridge.in_rules, 1):
            remote = bridge.remote_name_of(topic)
            headers = [("id", str(number)), ("destination", remote), ("ack", "client-individual"),
                       ("activemq.prefetchSize", str(bridge.settings.max_inflight)),
                       ("prefetch-count", str(bridge.settings.max_inflight))]
            if not bridge.settings.clean_session and remote.startswith("/topic/"):
                # A durable subscription, named the way ActiveMQ, Artemis and RabbitMQ each read it.
                name = f"{bridge.client_id}-{number}"
                headers += [("activemq.subscriptionName", name), ("durable-subscription-name", name),
                            ("durable", "true"), ("auto-delete", "false"), ("x-queue-name", name)]
            self.write(encode_frame("SUBSCRIBE", headers, version="1.2"))

    def _start_heartbeat(self, answer: str) -> None:
        """Send every ``keepalive`` seconds what the remote agreed to take, and expect the same of it."""
        keepalive = self.bridge.settings.keepalive
        if not keepalive:
            return
        try:
            sx, sy = (int(v) for v in answer.split(","))
        except ValueError:
            sx = sy = 0
        self._beat_out = max(keepalive * 1000, sy) / 1000 if sy else 0.0
        self._beat_in = max(keepalive * 1000, sx) / 1000 if sx else 0.0
        if self._beat_out or self._beat_in:
            period = min(v for v in (self._beat_out, self._beat_in) if v)
            self._heartbeat = self.clock.callLater(period, self._beat, period)

    def _beat(self, period: float) -> None:
        self._heartbeat = None
        if self.lost:
            return
        if self._beat_in and self.clock.seconds() - self.last_in > 2 * self._beat_in:
            self.fail(f"the remote sent nothing for {2 * self._beat_in:g} s (heart-beat)")
            return
        if self._beat_out:
            self.write(b"\n")
        self._heartbeat = self.clock.callLater(period, self._beat, period)

    # -- out: local messages to the remote --------------------------------------

    def _deliver(self, consumer: Consumer, entry: Entry, tag: int) -> bool | None:
        bridge = self.bridge
        message = entry.message
        route = bridge.route_for(message.destination)
        if route is None:
            return True
        if bridge.goes_back(message):
            bridge.loops_dropped += 1
            return True
        _, remote = route
        self._receipt_no += 1
        receipt = str(self._receipt_no)
        self.receipts[receipt] = (consumer, tag)
        self.write(encode_frame("SEND", self._send_headers(message, remote, receipt), message.body, version="1.2"))
        return None

    def _send_headers(self, message: Message, remote: str, receipt: str) -> list[tuple[str, str]]:
        headers = [("destination", remote), ("receipt", receipt), ("content-length", str(len(message.body)))]
        if message.persistent:
            headers.append(("persistent", "true"))
        if message.priority != 4:
            headers.append(("priority", str(message.priority)))
        if message.expiration:
            headers.append(("expires", str(message.expiration)))
        if message.correlation_id is not None:
            headers.append(("correlation-id", message.correlation_id))
        if message.content_type is not None:
            headers.append(("content-type", message.content_type))
        if message.group_id is not None:
            headers.append(("JMSXGroupID", message.group_id))
        headers += [(k, v) for k, v in message.headers.items() if k not in _DELIVERY_HEADERS and k != "receipt"
                    and k not in ("_AMQ_DUPL_ID", "gateway-path")]
        headers += forwarding_headers(message, self.bridge.broker_name)
        return headers

    def _confirmed(self, receipt: str) -> None:
        held = self.receipts.pop(receipt, None)
        if held is None:
            return
        consumer, tag = held
        self.bridge.forwarded += 1
        try:
            self.bridge.connection.ack(consumer, tag)
        except BrokerError:
            pass

    # -- in: remote messages to local subscribers -------------------------------

    def _inbound(self, frame: Frame) -> None:
        bridge = self.bridge
        h = frame.headers
        destination = bridge.local_destination(h.get("destination", ""))
        if destination is not None:
            broker = bridge.broker
            custom = {k: v for k, v in h.items() if k not in _DELIVERY_HEADERS}
            message = Message(
                broker.new_message_id(), destination, frame.body, custom,
                persistent=h.get("persistent", "").lower() in _TRUE, priority=_int(h.get("priority"), 4, 0, 9),
                expiration=_int(h.get("expires"), 0, 0, 2**63 - 1), timestamp=broker.now_ms(),
                correlation_id=h.get("correlation-id"), content_type=h.get("content-type"), group_id=h.get("JMSXGroupID"),
            )
            if bridge.arrived(message):
                try:
                    bridge.connection.send(message)
                    bridge.received += 1
                except BrokerError as exc:
                    self.fail(f"a message from the remote on {h.get('destination')!r} could not be published here: {exc}")
                    return
        ack = h.get("ack") or h.get("message-id")
        if ack is None:
            return
        self.hold_if_full()

        def answer() -> None:
            if not self.lost:
                self.write(encode_frame("ACK", [("id", ack)], version="1.2"))

        bridge.connection.when_durable(answer)


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        return default
    return min(max(value, low), high)
