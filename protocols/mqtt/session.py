"""The MQTT state machine: packets in, calls on the core; deliveries out, PUBLISHes.

An MQTT session outlives its network connection, so its state is in two places:

- ``state.ClientSession`` is the session of one client id: its queue in the
  core (durable when the session outlives the connection), its subscriptions
  and options, the packet ids of QoS 1/2 flows in progress.  The ``MqttHub``
  keeps them by client id, shared by the TCP and WebSocket listeners.
- ``MqttSession`` is one network connection's protocol state: the decoder,
  keep-alive, the negotiated limits and its ``Phase``.  What exists only once
  CONNECT is accepted (the client session, the core connection, the outbox,
  topic aliases) is its ``Connected`` object, which every handler of a packet
  after CONNECT takes as an argument.

This module is the session itself: input, dispatch, keep-alive, output and
teardown.  The handlers are functions of ``(session, live, packet)`` in a
module per job, as Mosquitto keeps ``handle_connect.c``, ``handle_publish.c``
and ``handle_subscribe.c``: ``connect`` (CONNECT's checks, the
authenticator's answer, CONNACK), ``publish`` (client to broker),
``delivery`` (broker to client, and the acknowledgements of those flows) and
``subscriptions``.  The opening phase (connect timer, login, what arrives
meanwhile) is the ``LoginGate`` both protocols share (protocols/lifecycle.py).

Every subscription of a client feeds the client's one queue, so a message
matching several of its filters is delivered once, at the highest granted
QoS (MQTT 3.1.1 3.3.5), carrying every matching subscription identifier (5.0).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from twisted.logger import Logger

from core.access import ANONYMOUS, AllowAll, Reader
from core.connection import Connection
from protocols.admission import Refusal
from protocols.auth import Anonymous
from protocols.lifecycle import CloseReason, LoginGate, ProducerHold
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import MqttDecoder, MqttProtocolError, ReasonCode
from protocols.mqtt.connect import on_auth, on_connect, on_connect_again, on_disconnect, on_pingreq
from protocols.mqtt.connected import Connected, Phase
from protocols.mqtt.delivery import on_puback, on_pubcomp, on_pubrec, settle, update_flow
from protocols.mqtt.publish import on_publish, on_pubrel
from protocols.mqtt.state import ClientSession
from protocols.mqtt.subscriptions import leave_shared, on_subscribe, on_unsubscribe
from protocols.transport import Transport

if TYPE_CHECKING:
    from protocols.mqtt.hub import MqttHub

__all__ = ["Connected", "MqttSession", "Phase"]

log = Logger(namespace="gateway.mqtt")


class MqttSession:
    # One per connected device, so its size is the broker's memory per idle connection:
    # slots keep it a few hundred bytes where a dict of 30 attributes takes 1.5 KB.
    __slots__ = (
        "hub", "broker", "settings", "transport", "remote", "decoder", "level", "phase", "principal", "gate",
        "checked", "published_to", "published_version", "live", "will", "keep_alive", "problem_information",
        "peer_receive_maximum", "peer_max_packet", "peer_alias_max", "_deadline", "last_read", "closed",
        "normal_disconnect", "inflight", "send_quota", "transport_paused", "hold", "close_reason",
        "reader", "bridge",
    )

    def __init__(self, hub: MqttHub, transport: Transport, remote: str = "") -> None:
        self.hub = hub
        self.broker = hub.broker
        self.settings = hub.settings
        self.transport = transport
        self.remote = remote
        self.decoder = MqttDecoder(max_packet_size=self.settings.max_packet_size, server=True)
        self.level = 4
        self.phase = Phase.AWAITING_CONNECT
        self.principal = ANONYMOUS
        # With no rules everything is allowed: the checks are skipped, not made.
        self.checked = not isinstance(hub.access, AllowAll)
        # The last topic this client was allowed to publish to, under which version of the rules.
        self.published_to = ""
        self.published_version = -1
        if not isinstance(hub.authenticator, Anonymous):
            # Until it has logged in, a client may send one small packet (its CONNECT).
            self.decoder.connect_max_size = self.settings.max_connect_size
        # Phase.CLOSED as a plain attribute: read for every packet and write, where a property costs a call.
        self.closed = False
        self.live: Connected | None = None
        # A bridge from another broker (the 3.x bridge bit, or a gateway naming itself): what it
        # publishes is not sent back to it (no local) and keeps its retain flag (retain as published).
        self.bridge = False
        self.will: mq.Will | None = None
        self.keep_alive = 0
        self.last_read = self.broker.clock.seconds()
        # The opening phase (connect timer, refusal, login); None once CONNECT is accepted.
        self.gate: LoginGate | None = LoginGate(self, self.broker.clock, self.settings.connect_timeout)
        self._deadline: int | None = None  # the keep-alive's handle in hub.deadlines
        # What the client told us it accepts (5.0).
        self.peer_receive_maximum = 65535
        self.peer_max_packet = mq.MAX_PACKET_SIZE
        self.peer_alias_max = 0
        self.problem_information = True
        self.normal_disconnect = False
        # QoS 1/2 deliveries unfinished on this connection, across all its consumers:
        # the client's receive maximum bounds them all together.
        self.inflight = 0
        self.send_quota = self.settings.max_inflight
        self.transport_paused = False
        self.hold: ProducerHold | None = None  # reading paused by producer flow control
        # Why the session ended, for transports that can say (WebSocket close codes).
        self.close_reason = CloseReason.NORMAL
        # Checks deliveries of the subscriptions a deny rule overlaps, and hears of reloads;
        # made with the first subscription when there are rules (an idle device needs none).
        self.reader: Reader | None = None

    @property
    def client(self) -> ClientSession | None:
        return None if self.live is None else self.live.client

    @property
    def label(self) -> str:
        """Who, for log lines; made when logged, not kept (a string per idle connection)."""
        live = self.live
        return self.remote if live is None else f"{self.remote} {live.client.client_id}"

    @property
    def conn(self) -> Connection | None:
        """The core connection, once connected (for operators' views and tests)."""
        return None if self.live is None else self.live.conn

    # -- input ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_read = self.broker.clock.seconds()
        try:
            packets = self.decoder.feed(data)
        except MqttProtocolError as exc:
            for packet in exc.packets:
                if self.closed:
                    return
                self._dispatch(packet)
            if not self.closed:
                self.protocol_error(exc.reason_code, exc.message, exc)
            return
        for packet in packets:
            if self.closed:
                return
            if self._authenticating():
                # Handled once the credentials are checked.
                gate = self.gate
                assert gate is not None  # dropped only once connected
                gate.hold(packet)
                continue
            self._dispatch(packet)

    def _authenticating(self) -> bool:
        """CONNECT's credentials are being checked (a method: handlers change the phase under mypy's narrowing)."""
        return self.phase is Phase.AUTHENTICATING

    def _dispatch(self, packet: Any) -> None:
        try:
            live = self.live
            if live is None:
                if not isinstance(packet, mq.Connect):
                    raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "the first packet must be CONNECT")
                on_connect(self, packet)
                return
            handler = _HANDLERS.get(type(packet))
            if handler is None:
                raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
            handler(self, live, packet)
        except MqttProtocolError as exc:
            self.protocol_error(exc.reason_code, exc.message)
        except Exception:
            # A bug must cost one client its connection, never the reactor its loop.
            log.failure("[{label}] internal error handling {p}", label=self.label, p=type(packet).__name__)
            self.protocol_error(ReasonCode.UNSPECIFIED_ERROR, "internal error")

    def replay(self, waiting: list[Any]) -> None:
        """The packets read while CONNECT's credentials were checked, now that it is answered (LoginGate)."""
        for queued in waiting:
            if self.closed:
                return
            self._dispatch(queued)

    # -- the opening phase (protocols.lifecycle.LoginGate) ------------------------

    def connect_timed_out(self) -> None:
        if self.phase is Phase.AWAITING_CONNECT:
            log.info("[{label}] no CONNECT in time: closing", label=self.label)
            self.close()

    def refuse_connect(self, refusal: Refusal) -> None:
        """The connection limits refuse this client: its CONNECT gets a CONNACK saying so."""
        if self.gate is not None:
            self.gate.refusal = refusal

    def fail_unfinished(self, seconds: float) -> None:
        """Held an unfinished packet too long (the broker-wide budget for them): closed, 5.0 told why."""
        if not self.closed:
            self.server_disconnect(
                ReasonCode.QUOTA_EXCEEDED, f"no packet completed in {seconds:.0f} s while one was unfinished (partial_frame_timeout)",
            )

    # -- keep-alive ----------------------------------------------------------

    def arm_keep_alive(self) -> None:
        if not self.closed and self.keep_alive:
            self._deadline = self.hub.deadlines.watch(self.last_read + self.keep_alive * self.settings.keep_alive_grace, self)

    def deadline_reached(self) -> float | None:
        """Due when the silence would reach its limit (MQTT-3.1.2-24): closes then, not up to half an interval late.

        The hub's one timer for every keep-alive (protocols/deadlines.py) calls
        this when the deadline set from the last read comes; the read path never
        touches it, and a read since moves the deadline on.
        """
        if self.closed:
            return None
        due = self.last_read + self.keep_alive * self.settings.keep_alive_grace
        now = self.broker.clock.seconds()
        if now >= due:
            self._deadline = None
            log.info("[{label}] keep-alive timeout after {s:.1f}s", label=self.label, s=now - self.last_read)
            self.server_disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep-alive timeout")
            return None
        return due

    # -- output and teardown ---------------------------------------------------

    def send_packet(self, packet: Any) -> None:
        self.write_out(mq.encode(packet, self.level))

    def write_out(self, data: bytes) -> None:
        """Bytes to the client, now (the outbox decides when); nothing once closed."""
        if not self.closed:
            self.transport.write(data)

    def protocol_error(self, reason: ReasonCode, why: str, exc: MqttProtocolError | None = None) -> None:
        log.info("[{label}] protocol error: {why}", label=self.label, why=why)
        if self.close_reason is CloseReason.NORMAL:
            self.close_reason = CloseReason.ERROR
        if self.live is None:
            # Errors in or before CONNECT: a CONNACK where the client's version has one.
            level = getattr(exc, "protocol_level", None) or self.decoder.level
            return_code = getattr(exc, "connack_return_code", None)
            if level == 5:
                self.level = 5
                self.send_packet(mq.Connack(False, reason, {"reason_string": why}))
            elif return_code is not None:
                # An unsupported level (say 6) has no encoding of its own: answer in the
                # 3.1.1 layout, where return code 1 says "unacceptable protocol version".
                self.level = level if level in (3, 4) else 4
                self.send_packet(mq.Connack(False, return_code))
            self.close()
            return
        self.server_disconnect(reason, why)

    def internal_error(self, detail: str) -> None:
        """The broker failed this client outside its input (protocols.lifecycle.fail_soon)."""
        self.server_disconnect(ReasonCode.UNSPECIFIED_ERROR, "internal error")

    def server_disconnect(self, reason: ReasonCode, why: str) -> None:
        """5.0 gets a DISCONNECT with the reason; 3.x just a closed socket (it has no server DISCONNECT)."""
        if self.live is not None and not self.closed:
            self.live.outbox.submit()  # frames gathered before the DISCONNECT go out before it
        if self.level == 5 and not self.closed:
            props = {"reason_string": why} if self.problem_information else {}
            self.send_packet(mq.Disconnect(reason, props))
        self.close()

    def shutdown(self) -> None:
        if not self.closed:
            self.close_reason = CloseReason.SHUTDOWN
            self.server_disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "the broker is shutting down")

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (admin API): 5.0 DISCONNECT 0x98 with the reason; 3.x a close.

        Logged with the connection's label, as STOMP's is: 3.x clients are told
        nothing, so the log is the only place the reason is kept.
        """
        if not self.closed:
            self.close_reason = CloseReason.ADMIN
            log.info("[{label}] closed by an operator: {reason}", label=self.label, reason=reason)
            self.server_disconnect(ReasonCode.ADMINISTRATIVE_ACTION, reason)

    def take_over(self) -> None:
        """Another connection claims this client id (MQTT-3.1.4-3)."""
        self.server_disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")

    def close(self) -> None:
        if self.closed:
            return
        if self.live is not None:
            self.live.outbox.submit()  # what this turn gathered goes out before the close
        self._release()
        self.transport.close()

    def _release(self) -> None:
        self.phase = Phase.CLOSED
        self.closed = True
        if self.gate is not None:
            self.gate.close()
            self.gate = None
        if self.reader is not None:
            self.reader.close()  # the rules forget it: nothing left to check
        if self._deadline is not None:
            self.hub.deadlines.forget(self._deadline)
            self._deadline = None
        live = self.live
        if live is None:
            return
        client = live.client
        # Released QoS 2 deliveries are the client's: settle them, keep only
        # their packet ids for the PUBREL a reconnect will get.
        if client.has_flows:
            flows = client.flows
            for inflight in flows.released_inflight.values():
                settle(live, inflight)
            flows.released_inflight.clear()
        for mqtt_filter, (group, canonical) in list(client.shared.items()) if client.subscribed else ():
            leave_shared(self, live, mqtt_filter, group, canonical)
        live.conn.close()  # unacked deliveries go back to the session queue
        if client.has_flows:
            client.flows.outbound.clear()
        self.hub.detach(self, client, self.will, self.level)

    def connection_lost(self) -> None:
        """The socket is gone; after our own close (takeover, DISCONNECT, error) there is nothing left to do.

        Releasing twice would be harmful, not idle: after a takeover the client
        session already belongs to the new connection, and clearing its
        ``outbound`` would make the broker ignore the new connection's PUBACKs.
        """
        if self.closed:
            return
        log.info("[{label}] connection lost", label=self.label)
        self._release()

    def pause_producing(self) -> None:
        self.transport_paused = True
        if self.live is not None:
            update_flow(self, self.live)

    def resume_producing(self) -> None:
        self.transport_paused = False
        if self.live is not None:
            update_flow(self, self.live)


# What each packet does once connected; CONNECT first is handled before there is a ``live``.
_HANDLERS: dict[type, Callable[[MqttSession, Connected, Any], None]] = {
    mq.Publish: on_publish,
    mq.Puback: on_puback,
    mq.Pubrec: on_pubrec,
    mq.Pubrel: on_pubrel,
    mq.Pubcomp: on_pubcomp,
    mq.Subscribe: on_subscribe,
    mq.Unsubscribe: on_unsubscribe,
    mq.Pingreq: on_pingreq,
    mq.Disconnect: on_disconnect,
    mq.Connect: on_connect_again,
    mq.Auth: on_auth,
}
