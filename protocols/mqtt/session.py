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

Every subscription of a client feeds the client's one queue, so a message
matching several of its filters is delivered once, at the highest granted
QoS (MQTT 3.1.1 3.3.5), carrying every matching subscription identifier (5.0).
"""
from __future__ import annotations

import enum
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from twisted.logger import Logger

from core import destination as dest
from core.access import ANONYMOUS, AllowAll, Permission, Principal, Reader, Reading
from core.connection import Connection
from core.consumer import AckMode, Consumer
from core.destination import InvalidDestination
from core.duplicates import forwarding_headers
from core.entry import Entry
from core.errors import BrokerError, UserLimit
from core.message import Message
from core.queue import MessageQueue
from core.retained import RetainedLimit
from core.topic import Subscription
from core.trie import filter_matches
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import (
    ConnackReturnCode,
    MqttDecoder,
    MqttProtocolError,
    ReasonCode,
)
from protocols.mqtt.names import (
    InvalidTopic,
    canonical_to_topic,
    filter_to_canonical,
    split_shared,
    topic_to_canonical,
)
from protocols.mqtt.state import (
    MQTT3_CACHE_KEY,
    NEVER_EXPIRES,
    NO_OPTIONS,
    PUBACK_HEAD,
    RETAIN_HEADER,
    ClientSession,
    Inflight,
    RetainedVia,
    SubscriptionOptions,
    build_message,
    message_qos,
    BROKER_PROPERTY,
    options_of,
    publish_properties,
)
from protocols.auth import Anonymous, Credentials
from protocols.outbox import Outbox
from protocols.transport import Transport

if TYPE_CHECKING:
    from protocols.mqtt.hub import MqttHub

__all__ = ["Connected", "MqttSession", "Phase"]

log = Logger(namespace="gateway.mqtt")

# The core connection's protocol, one string per level rather than one per connection.
PROTOCOL_NAMES = {3: "mqtt/3", 4: "mqtt/4", 5: "mqtt/5"}

# MQTT 3.1.1 3.9.3: the SUBACK return code of a refused filter (5.0 says why with a reason code).
SUBACK_FAILURE = 0x80


class Phase(enum.Enum):
    """Where a connection is (wsproto's ``ConnectionState``); MQTT has no closing handshake."""

    AWAITING_CONNECT = "awaiting CONNECT"
    AUTHENTICATING = "authenticating"  # CONNECT read, its credentials being checked: reading paused
    CONNECTED = "connected"
    CLOSED = "closed"


class Connected:
    """What exists only once CONNECT is accepted: the client's session, the core connection, the outbox."""

    __slots__ = ("client", "conn", "outbox", "consumer", "_shared_consumers", "_in_aliases", "_out_aliases", "filtered")

    def __init__(self, client: ClientSession, conn: Connection, outbox: Outbox) -> None:
        self.client = client
        self.conn = conn
        self.outbox = outbox
        self.consumer: Consumer | None = None  # on the client's queue, from its first subscription
        # MQTT filters that a deny rule overlaps (granted, checked at delivery); None: none.
        self.filtered: dict[str, None] | None = None
        # The rest is made on first use: most connections never need them, and an empty dict is 64 bytes.
        self._shared_consumers: dict[str, Consumer] | None = None
        self._in_aliases: dict[int, str] | None = None
        self._out_aliases: dict[str, int] | None = None

    @property
    def shared_consumers(self) -> dict[str, Consumer]:
        """MQTT filter -> this connection's consumer of its shared group's queue."""
        found = self._shared_consumers
        if found is None:
            found = self._shared_consumers = {}
        return found

    @property
    def in_aliases(self) -> dict[int, str]:
        """Topic aliases the client set (MQTT 5 3.3.2.3.4)."""
        found = self._in_aliases
        if found is None:
            found = self._in_aliases = {}
        return found

    @property
    def out_aliases(self) -> dict[str, int]:
        """Topic aliases this broker set for the client."""
        found = self._out_aliases
        if found is None:
            found = self._out_aliases = {}
        return found


class MqttSession:
    # One per connected device, so its size is the broker's memory per idle connection:
    # slots keep it a few hundred bytes where a dict of 30 attributes takes 1.5 KB.
    __slots__ = (
        "hub", "broker", "settings", "transport", "remote", "decoder", "level", "phase", "principal", "_waiting",
        "_auth_paused", "_checked", "_published_to", "_published_version", "live", "will", "keep_alive",
        "problem_information",
        "peer_receive_maximum", "peer_max_packet", "peer_alias_max", "_timer", "_deadline", "_last_read", "closed",
        "normal_disconnect", "_inflight", "_send_quota", "_transport_paused", "_held", "_refusal", "close_reason",
        "_reader", "bridge",
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
        self._waiting: list[Any] | None = None  # packets read while authenticating, handled once connected
        self._auth_paused = False
        # With no rules everything is allowed: the checks are skipped, not made.
        self._checked = not isinstance(hub.access, AllowAll)
        # The last topic this client was allowed to publish to, under which version of the rules.
        self._published_to = ""
        self._published_version = -1
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
        self._last_read = self.broker.clock.seconds()
        self._timer: Any = self.broker.clock.callLater(self.settings.connect_timeout, self._connect_timed_out)
        self._deadline: int | None = None  # the keep-alive's handle in hub.deadlines
        # What the client told us it accepts (5.0).
        self.peer_receive_maximum = 65535
        self.peer_max_packet = mq.MAX_PACKET_SIZE
        self.peer_alias_max = 0
        self.problem_information = True
        self.normal_disconnect = False
        # QoS 1/2 deliveries unfinished on this connection, across all its consumers:
        # the client's receive maximum bounds them all together.
        self._inflight = 0
        self._send_quota = self.settings.max_inflight
        self._transport_paused = False
        self._held = False  # reading paused by producer flow control
        self._refusal: Any = None  # why this connection may not CONNECT (connection limits)
        # Why the session ended, for transports that can say (WebSocket close codes).
        self.close_reason = "normal"
        # Checks deliveries of the subscriptions a deny rule overlaps, and hears of reloads;
        # made with the first subscription when there are rules (an idle device needs none).
        self._reader: Reader | None = None

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
        self._last_read = self.broker.clock.seconds()
        try:
            packets = self.decoder.feed(data)
        except MqttProtocolError as exc:
            for packet in exc.packets:
                if self.closed:
                    return
                self._dispatch(packet)
            if not self.closed:
                self._protocol_error(exc.reason_code, exc.message, exc)
            return
        for packet in packets:
            if self.closed:
                return
            if self._authenticating():
                # Handled once the credentials are checked.
                if self._waiting is None:
                    self._waiting = [packet]
                else:
                    self._waiting.append(packet)
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
                self._on_connect(packet)
                return
            handler = _HANDLERS.get(type(packet))
            if handler is None:
                raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
            handler(self, live, packet)
        except MqttProtocolError as exc:
            self._protocol_error(exc.reason_code, exc.message)
        except Exception:
            # A bug must cost one client its connection, never the reactor its loop.
            log.failure("[{label}] internal error handling {p}", label=self.label, p=type(packet).__name__)
            self._protocol_error(ReasonCode.UNSPECIFIED_ERROR, "internal error")

    # -- connecting -------------------------------------------------------

    def _connect_timed_out(self) -> None:
        self._timer = None
        if self.phase is Phase.AWAITING_CONNECT:
            log.info("[{label}] no CONNECT in time: closing", label=self.label)
            self._close()

    def refuse_connect(self, refusal: Any) -> None:
        """The connection limits refuse this client: its CONNECT gets a CONNACK saying so."""
        self._refusal = refusal

    def fail_unfinished(self, seconds: float) -> None:
        """Held an unfinished packet too long (the broker-wide budget for them): closed, 5.0 told why."""
        if not self.closed:
            self._server_disconnect(
                ReasonCode.QUOTA_EXCEEDED, f"no packet completed in {seconds:.0f} s while one was unfinished (partial_frame_timeout)",
            )

    def _on_connect(self, packet: mq.Connect) -> None:
        self.level = packet.level
        props = packet.properties
        if self._refusal is not None:
            # 3.x: server unavailable; 5.0: quota exceeded, or connection rate exceeded.
            reason = ReasonCode.CONNECTION_RATE_EXCEEDED if self._refusal.rate else ReasonCode.QUOTA_EXCEEDED
            self._refuse(ConnackReturnCode.SERVER_UNAVAILABLE, reason, self._refusal.why)
            return
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if self.level == 3:
                # MQTT 3.1 (3.1 spec, CONNECT payload) has no assigned ids: 1-23 characters, or return code 2.
                self._refuse(ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client ids are 1-23 characters")
                return
            if self.level < 5 and not packet.clean_start:
                self._refuse(ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs a clean session")
                return
            client_id = assigned = self.hub.assign_client_id()
        if self.level == 3 and len(client_id) > 23:
            self._refuse(ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client ids are 1-23 characters")
            return
        if self.level == 5 and props.get("authentication_method"):
            self._refuse(ConnackReturnCode.NOT_AUTHORIZED, ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured")
            return
        if self.level == 5:
            self.peer_receive_maximum = props.get("receive_maximum", 65535)
            self.peer_max_packet = props.get("maximum_packet_size", mq.MAX_PACKET_SIZE)
            self.peer_alias_max = props.get("topic_alias_maximum", 0)
            self.problem_information = props.get("request_problem_information", 1) == 1
            expiry = props.get("session_expiry_interval", 0)
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
        limit = self.settings.server_keep_alive
        if self.level < 5 and limit and (packet.keep_alive == 0 or packet.keep_alive > limit):
            # 3.x has no way to be told a server keep-alive: refused, as Mosquitto's
            # max_keepalive does, rather than dropped later for a silence it was allowed.
            self._refuse(
                ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.UNSPECIFIED_ERROR,
                f"keep-alive {packet.keep_alive} s is outside this server's limit of {limit} s (server_keep_alive)",
            )
            return
        if packet.will is not None:
            try:
                self.broker.check_name(topic_to_canonical(packet.will.topic), allow_wildcards=False)
            except (InvalidTopic, InvalidDestination) as exc:
                # Refused now, not silently dropped when the will is due: 5.0 says why in
                # the CONNACK (0x90); 3.x has no return code for it and gets a close.
                if self.level == 5:
                    self._refuse(ConnackReturnCode.SERVER_UNAVAILABLE, ReasonCode.TOPIC_NAME_INVALID, f"will topic: {exc}")  # 5.0 only
                else:
                    log.info("[{label}] CONNECT refused: will topic: {why}", label=self.label, why=str(exc))
                    self._close()
                return
        credentials = Credentials(
            packet.username, packet.password, self.transport.certificate_user(), self.remote, PROTOCOL_NAMES[self.level], client_id,
        )
        self.phase = Phase.AUTHENTICATING
        self.hub.authenticator.authenticate(credentials, partial(self._authenticated, packet, client_id, assigned, expiry))
        if self.phase is Phase.AUTHENTICATING:
            # The answer comes later (a slow hash, off the reactor thread): read nothing meanwhile.
            self._auth_paused = True
            self.transport.pause_reading("authenticating")

    def _authenticated(
        self, packet: mq.Connect, client_id: str, assigned: str | None, expiry: int, principal: Principal | None, why: str,
    ) -> None:
        """The authenticator's answer to this connection's CONNECT (now, or in a later turn)."""
        if self.phase is not Phase.AUTHENTICATING:
            return  # closed meanwhile
        resume = self._auth_paused
        self._auth_paused = False
        try:
            if principal is None:
                # 3.x: 4 for a bad user name or password, 5 for no credentials at all; 5.0: 0x86 / 0x87.
                given = packet.username is not None or packet.password is not None
                self._refuse(
                    ConnackReturnCode.BAD_USERNAME_OR_PASSWORD if given else ConnackReturnCode.NOT_AUTHORIZED,
                    ReasonCode.BAD_USER_NAME_OR_PASSWORD if given else ReasonCode.NOT_AUTHORIZED,
                    why or "bad user name or password",
                )
            else:
                self.principal = principal
                will = packet.will
                exists, owner = self.hub.owner_of(client_id)
                if will is not None and not self.hub.access.allowed(
                    principal, Permission.WRITE, topic_to_canonical(will.topic), client_id,
                ):
                    self._refuse(
                        ConnackReturnCode.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED,
                        f"publishing the will to {will.topic} is not allowed for this user",
                    )
                elif exists and owner != principal.name:
                    log.warn("[{label}] user {user!r} refused the session of client id {client} (another user's)",
                             label=self.label, user=principal.name, client=client_id)
                    self._refuse(
                        ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                        f"client id {client_id} is another user's session",
                    )
                else:
                    self._connected(packet, client_id, assigned, expiry)
        except Exception:
            log.failure("[{label}] internal error handling CONNECT", label=self.label)
            self._protocol_error(ReasonCode.UNSPECIFIED_ERROR, "internal error")
        waiting, self._waiting = self._waiting, None
        if resume and not self.closed:
            self.transport.resume_reading("authenticating")
        for queued in waiting or ():
            if self.closed:
                return
            self._dispatch(queued)

    def _connected(self, packet: mq.Connect, client_id: str, assigned: str | None, expiry: int) -> None:
        props = packet.properties
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

        try:
            conn = self.broker.connect(client_id, protocol=PROTOCOL_NAMES[self.level], remote=self.remote, user=self.principal.name)
        except UserLimit as exc:
            self._refuse(ConnackReturnCode.SERVER_UNAVAILABLE, ReasonCode.QUOTA_EXCEEDED, str(exc))
            return
        conn.closer = self
        client, present = self.hub.attach(self, client_id, packet.clean_start, expiry)
        self.will = packet.will
        live = self.live = Connected(client, conn, Outbox(self.broker.turn_end, conn, self))
        self.phase = Phase.CONNECTED
        keep_alive = packet.keep_alive
        server_keep_alive = None
        limit = self.settings.server_keep_alive
        if limit and (keep_alive == 0 or keep_alive > limit):
            keep_alive = server_keep_alive = limit
        self.keep_alive = keep_alive

        peer_broker = None
        for key, _ in props.get("user_properties", ()):
            if key == BROKER_PROPERTY:
                peer_broker = key
        self.bridge = packet.bridge or peer_broker is not None
        ack_props: dict[str, Any] = {}
        if self.level == 5:
            ack_props = {
                "receive_maximum": self.settings.receive_maximum,
                "maximum_packet_size": self.settings.max_packet_size,
                "topic_alias_maximum": self.settings.topic_alias_maximum,
            }
            if assigned is not None:
                ack_props["assigned_client_identifier"] = assigned
            if server_keep_alive is not None:
                ack_props["server_keep_alive"] = server_keep_alive
            if props.get("request_response_information"):
                ack_props["response_information"] = f"response/{client_id}"
            if peer_broker is not None:
                ack_props["user_properties"] = [(BROKER_PROPERTY, self.broker.node_name)]
        self._send(mq.Connack(present, 0, ack_props))
        log.info("[{label}] connected with MQTT level {mqtt_level}, session present: {p}", label=self.label, mqtt_level=self.level, p=present)

        if client.has_flows:
            for pid in sorted(client.flows.released):
                self._send(mq.Pubrel(pid))
        self._send_quota = min(self.peer_receive_maximum, self.settings.max_inflight)
        if self._checked and client.subscribed and client.filters and self._reader_of(client_id) is not None:
            # A resumed session's subscriptions, under today's rules (a reload or a restart
            # since they were granted): decided before its queue's backlog flows.
            self._review(live)
        if client.queue is not None:  # persistent, or a clean session's taken over
            self._session_queue(live)
        for mqtt_filter, (group, canonical) in client.shared.items() if client.subscribed else ():
            self._join_shared(live, mqtt_filter, group, canonical)
        if keep_alive:
            self._arm_keep_alive()

    def _refuse(self, return_code: ConnackReturnCode, reason: ReasonCode, why: str) -> None:
        log.info("[{label}] CONNECT refused: {why}", label=self.label, why=why)
        code = reason if self.level == 5 else return_code
        props = {"reason_string": why} if self.level == 5 else {}
        self._send(mq.Connack(False, code, props))
        self._close()

    def _arm_keep_alive(self) -> None:
        if not self.closed and self.keep_alive:
            self._deadline = self.hub.deadlines.watch(self._last_read + self.keep_alive * self.settings.keep_alive_grace, self)

    def deadline_reached(self) -> float | None:
        """Due when the silence would reach its limit (MQTT-3.1.2-24): closes then, not up to half an interval late.

        The hub's one timer for every keep-alive (protocols/deadlines.py) calls
        this when the deadline set from the last read comes; the read path never
        touches it, and a read since moves the deadline on.
        """
        if self.closed:
            return None
        due = self._last_read + self.keep_alive * self.settings.keep_alive_grace
        now = self.broker.clock.seconds()
        if now >= due:
            self._deadline = None
            log.info("[{label}] keep-alive timeout after {s:.1f}s", label=self.label, s=now - self._last_read)
            self._server_disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep-alive timeout")
            return None
        return due

    # -- publishing (client -> broker) -------------------------------------

    def _may_publish(self, destination: str, client_id: str) -> bool:
        """The rules' WRITE check, remembered for the last topic allowed.

        A device publishes to one topic over and over, and for a topic the
        decision depends on nothing but the rules (queues also on whether
        they exist, and DLQs on admin), so it stands until they are reloaded.
        """
        access = self.hub.access
        version = access.version
        if destination == self._published_to and version == self._published_version:
            return True
        if not access.allowed(self.principal, Permission.WRITE, destination, client_id):
            return False
        if destination.startswith("topic://"):
            self._published_to = destination
            self._published_version = version
        return True

    def _on_publish(self, live: Connected, packet: mq.Publish) -> None:
        props = packet.properties
        topic = packet.topic
        if self.level == 5:
            alias = props.get("topic_alias")
            if alias is not None:
                if alias > self.settings.topic_alias_maximum:
                    raise MqttProtocolError(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} is above the maximum")
                if topic:
                    live.in_aliases[alias] = topic
                else:
                    topic = live.in_aliases.get(alias, "")
                    if not topic:
                        raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set")
        qos = packet.qos
        pid = packet.packet_id or 0  # set whenever qos > 0 (the decoder checks)
        if qos == 2 and pid in live.client.flows.inbound_qos2:
            # A retransmission of something already routed: acknowledge, do not route twice.
            self._send(mq.Pubrec(pid))
            return
        if qos and len(live.client.flows.inbound_qos2) >= self.settings.receive_maximum:
            raise MqttProtocolError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS 2 messages awaiting PUBREL")
        if props.get("payload_format_indicator") == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._reject_publish(packet, ReasonCode.PAYLOAD_FORMAT_INVALID, "payload is not UTF-8 as its format indicator says")
                return
        usage = self.broker.store_usage
        if qos and usage.full and self.broker.policy.store_full_policy == "fail":
            self._reject_publish(packet, ReasonCode.QUOTA_EXCEEDED, usage.refusal()[1])
            return
        stored_before = usage.bytes
        appended_before = self.broker.streams.appended
        try:
            destination = self._publish_destination(topic)
            if self._checked and not self._may_publish(destination, live.client.client_id):
                log.info(
                    "[{label}] {user} may not publish to {topic!r}: dropped", label=self.label,
                    user=self.principal.name or "anonymous", topic=topic,
                )
                if self.level == 5 and qos:
                    self._reject_publish(packet, ReasonCode.NOT_AUTHORIZED, f"publishing to {topic} is not allowed for this user")
                    return
                # 3.x has no way to say so (and 5.0 QoS 0 no answer): acknowledged, not routed,
                # so the client does not resend it forever (as Mosquitto).
            else:
                message = self._message(destination, packet, props)
                try:
                    live.conn.send(message, retain=packet.retain and destination.startswith("topic://"))
                except RetainedLimit as limit:  # not `exc`: compiled (mypyc), one name has one type per function
                    if self.level == 5 and qos:
                        self._reject_publish(packet, ReasonCode.QUOTA_EXCEEDED, str(limit))  # PUBACK/PUBREC 0x97: not published
                        return
                    # 3.x (and a 5.0 QoS 0 publish, which has no answer): published, not retained.
                    log.info("[{label}] retained flag dropped on {topic!r}: {why}", label=self.label, topic=topic, why=str(limit))
                    message = build_message(self.broker, destination, packet.payload, qos, False, props)
                    live.conn.send(message)
        except (InvalidTopic, BrokerError) as exc:
            self._reject_publish(packet, ReasonCode.TOPIC_NAME_INVALID, str(exc))
            return
        if usage.full and not self._held and (
            (qos and usage.bytes > stored_before and self.broker.policy.store_full_policy == "block")
            or (usage.alarm is not None and self.broker.streams.appended > appended_before)
        ):
            # Producer flow control: read nothing more from this client until there is room.
            # Under the disk alarm a stream record (QoS 0 too) holds its publisher by either
            # policy: it is stored, and there is nothing to refuse it with once routed.
            self._held = True
            log.info("[{label}] {why}: holding this publisher", label=self.label, why=usage.refusal()[1])
            self.transport.pause_reading("store limit")
            usage.when_space(self._release_hold)
        if qos == 1:
            live.outbox.add(PUBACK_HEAD + pid.to_bytes(2, "big") if self.level < 5 else mq.encode(mq.Puback(pid), 5))
        elif qos == 2:
            live.client.flows.inbound_qos2[pid] = None
            self.hub.save(live.client)  # in the message's batch, before PUBREC
            live.outbox.add(mq.encode(mq.Pubrec(pid), self.level))

    def _release_hold(self) -> None:
        self._held = False
        if not self.closed:
            log.info("[{label}] store has room again: resuming this publisher", label=self.label)
            self.transport.resume_reading("store limit")

    def _reject_publish(self, packet: mq.Publish, reason: ReasonCode, why: str) -> None:
        if packet.qos and self.level == 5:
            props = {"reason_string": why} if self.problem_information else {}
            ack = mq.Puback if packet.qos == 1 else mq.Pubrec
            self._send(ack(packet.packet_id or 0, reason, props))
            return
        raise MqttProtocolError(reason, why)

    def _publish_destination(self, topic: str) -> str:
        names = self.hub.destinations
        destination = names.get(topic)
        if destination is None:
            canonical = topic_to_canonical(topic)
            destination = canonical
            for levels in self.hub.queue_filters:
                if filter_matches(levels, tuple(canonical[8:].split("."))):
                    destination = "queue://" + canonical[8:]
                    break
            if len(names) >= 10_000:
                names.clear()  # bounded: a device fleet publishing to a million topics
            names[topic] = destination
        return destination

    def _topic_of(self, destination: str) -> str | None:
        topics = self.hub.topics
        topic = topics.get(destination)
        if topic is None:
            if len(topics) >= 10_000:
                topics.clear()  # bounded, as the publish side's names
            topic = topics[destination] = canonical_to_topic(destination) or ""
        return topic or None  # "": MQTT cannot name it

    def _message(self, destination: str, packet: mq.Publish, props: dict[str, Any]) -> Message:
        return build_message(self.broker, destination, packet.payload, packet.qos, packet.retain, props)

    def _on_pubrel(self, live: Connected, packet: mq.Pubrel) -> None:
        inbound = live.client.flows.inbound_qos2
        known = packet.packet_id in inbound
        if known:
            del inbound[packet.packet_id]
            self.hub.save(live.client)
        reason = 0 if known or self.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self._send(mq.Pubcomp(packet.packet_id, reason))

    # -- delivering (broker -> client) --------------------------------------

    def _deliver(self, live: Connected, consumer: Consumer, entry: Entry, tag: int) -> bool:
        """Write one delivery; True when it needs no acknowledgement (QoS 0).

        A failure here (a bug, a message this client cannot be sent) costs this
        client its connection on the next turn, never the other subscribers of
        the fan-out: the delivery stays unacknowledged and goes back to the queue.
        """
        try:
            return self._deliver_one(live, consumer, entry, tag)
        except Exception:
            log.failure("[{label}] internal error delivering {id}", label=self.label, id=entry.message.id)
            self.broker.clock.callLater(0, self._server_disconnect, ReasonCode.UNSPECIFIED_ERROR, "internal error")
            return False

    def _deliver_one(self, live: Connected, consumer: Consumer, entry: Entry, tag: int) -> bool:
        message = entry.message
        via = entry.via
        options_all: tuple[SubscriptionOptions, ...]
        if type(via) is Subscription:
            options = via.options
            if options.__class__ is not SubscriptionOptions:  # the usual case costs one test, no call
                options = self._options(live, consumer, via)
            granted = options.qos
            retain = options.retain_as_published and bool(message.headers.get(RETAIN_HEADER))
            options_all = (options,)
        else:
            if isinstance(via, RetainedVia):
                options_all = (via.options,)
                retain = True
            else:
                if isinstance(via, tuple):
                    options_all = tuple(self._options(live, consumer, s) for s in via)
                else:  # rebuilt from the store: no record of what matched
                    options_all = self._recovered_options(live, message)
                retain = bool(message.headers.get(RETAIN_HEADER)) and any(o.retain_as_published for o in options_all)
            granted = max((o.qos for o in options_all), default=0)
        qos = min(message_qos(message), granted)
        if self.level == 5:
            encoded = self._encode_v5(live, message, entry, options_all, qos, retain)
            if encoded is None:
                return True
        else:
            # 3.x: the bytes depend only on the message, QoS, retain and DUP, so they are
            # built once per message and shared by every 3.x subscriber.
            cache = message.cache
            if cache is None:
                cache = message.cache = {}
            dup = bool(qos and entry.redeliveries)
            key = (MQTT3_CACHE_KEY, qos, retain, dup)
            parts = cache.get(key)
            if parts is None:
                topic = self._topic_of(message.destination)
                if topic is None:
                    parts = cache[key] = ()
                else:
                    parts = cache[key] = mq.publish_parts(topic, message.body, qos, retain, None, self.level, dup)
            if not parts:
                return True  # a STOMP topic with a level MQTT reserves for wildcards
            if not qos:
                data = parts[0] + parts[1]
                if len(data) > self.peer_max_packet:
                    return True
                # A stored entry's delivery waits for its delivered mark; any waits behind what went before.
                live.outbox.add(data, entry.stored)
                return True
            pid = live.client.flows.packet_id_for(entry.seq)
            data = b"".join((parts[0], pid.to_bytes(2, "big"), parts[1]))
            if len(data) > self.peer_max_packet:
                return True
            live.outbox.add(data, entry.stored)
            self._track(live, consumer, tag, entry, pid)
            return False
        # After the batch holding its delivered mark (and anything before it) is on disk.
        live.outbox.add(encoded[0], entry.stored)
        if not qos:
            return True
        self._track(live, consumer, tag, entry, encoded[1])
        return False

    def _track(self, live: Connected, consumer: Consumer, tag: int, entry: Entry, pid: int) -> None:
        flows = live.client.flows
        flows.outbound[pid] = Inflight(consumer, tag, entry.seq)
        flows.ids_by_seq[entry.seq] = pid
        self._inflight += 1
        if self._inflight >= self._send_quota:
            self._update_flow(live)

    def _encode_v5(self, live: Connected, message: Message, entry: Entry, options: tuple[SubscriptionOptions, ...], qos: int, retain: bool) -> tuple[bytes, int] | None:
        """5.0 bytes for one subscriber (its subscription identifiers and topic alias), or None to skip."""
        topic = self._topic_of(message.destination)
        if topic is None:
            return None
        properties = self._properties(message, options)
        pid = live.client.flows.packet_id_for(entry.seq) if qos else None
        new_alias = None
        if self.peer_alias_max:
            topic, new_alias = self._alias(live, topic, properties)
        data = mq.encode_publish(topic, message.body, qos, retain, bool(qos and entry.redeliveries), pid, properties, 5)
        if len(data) > self.peer_max_packet:
            # MQTT-3.1.2-25: too large for the client: discard as if delivered,
            # and do not keep an alias the client never learned.
            if new_alias is not None:
                del live.out_aliases[new_alias]
            return None
        return data, pid or 0

    def _recovered_options(self, live: Connected, message: Message) -> tuple[SubscriptionOptions, ...]:
        """The options of this client's filters that match a message whose entry has no ``via``.

        Entries rebuilt from the store after a restart do not say which
        subscription matched them; without this they would go out at QoS 0
        (acknowledged at once, so a crash of the client loses them).
        """
        levels = dest.topic_levels(dest.name_of(message.destination))
        return tuple(options_of(sub) for sub in live.client.subs.values() if filter_matches(sub.levels, levels))

    def _options(self, live: Connected, consumer: Consumer, sub: Subscription) -> SubscriptionOptions:
        if sub.options is not None:
            return options_of(sub)
        # A shared subscription's queue is common; the options are this member's.
        for mqtt_filter, member in live.shared_consumers.items():
            if member is consumer:
                return live.client.filters.get(mqtt_filter, NO_OPTIONS)
        return NO_OPTIONS

    def _properties(self, message: Message, options: tuple[SubscriptionOptions, ...]) -> dict[str, Any]:
        props = publish_properties(self.broker, message)
        if self.bridge:
            # To another gateway's bridge: the id it drops repeats by and the path it stops loops by.
            props["user_properties"] = [*props.get("user_properties", ()), *forwarding_headers(message, self.broker.node_name)]
        ids = [o.identifier for o in options if o.identifier]
        if ids:
            props["subscription_identifier"] = ids
        return props

    def _alias(self, live: Connected, topic: str, properties: dict[str, Any]) -> tuple[str, str | None]:
        """The topic to send (empty once aliased) and the topic newly given an alias, if any."""
        alias = live.out_aliases.get(topic)
        if alias is not None:
            properties["topic_alias"] = alias
            return "", None
        if len(live.out_aliases) < self.peer_alias_max:
            alias = live.out_aliases[topic] = len(live.out_aliases) + 1
            properties["topic_alias"] = alias
            return topic, topic
        return topic, None

    def _on_puback(self, live: Connected, packet: mq.Puback) -> None:
        flows = live.client.flows
        inflight = flows.outbound.pop(packet.packet_id, None)
        if inflight is not None:
            flows.ids_by_seq.pop(inflight.seq, None)
            self._finish(live, inflight)

    def _on_pubrec(self, live: Connected, packet: mq.Pubrec) -> None:
        client = live.client
        flows = client.flows
        inflight = flows.outbound.pop(packet.packet_id, None)
        if inflight is not None:
            flows.ids_by_seq.pop(inflight.seq, None)
        if packet.reason_code >= ReasonCode.UNSPECIFIED_ERROR:  # 0x80 and up: the client refused it
            if inflight is not None:
                self._finish(live, inflight)  # the client refused it: the flow ends here
            return
        # The client has it; only PUBREL/PUBCOMP remain, and the slot stays taken until PUBCOMP.
        if inflight is not None:
            flows.released[packet.packet_id] = inflight.seq
            flows.released_inflight[packet.packet_id] = inflight
            self.hub.save(client)
        self._send(mq.Pubrel(packet.packet_id, 0 if inflight is not None or self.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    def _on_pubcomp(self, live: Connected, packet: mq.Pubcomp) -> None:
        client = live.client
        flows = client.flows
        if flows.released.pop(packet.packet_id, None) is not None:
            self.hub.save(client)
        inflight = flows.released_inflight.pop(packet.packet_id, None)
        if inflight is not None:
            self._finish(live, inflight)

    def _finish(self, live: Connected, inflight: Inflight) -> None:
        """A QoS 1/2 flow completed: settle it in the core and give its slot back."""
        self._inflight -= 1
        self._settle(live, inflight)
        if self._inflight < self._send_quota:
            self._update_flow(live)

    def _settle(self, live: Connected, inflight: Inflight) -> None:
        if inflight.consumer.closed:
            return
        try:
            live.conn.ack(inflight.consumer, inflight.tag)
        except BrokerError:
            pass  # already settled (e.g. redelivered after a takeover)

    def _update_flow(self, live: Connected) -> None:
        """Deliveries stop while the socket is full or the client's receive maximum is reached."""
        conn = live.conn
        if conn is None or self.closed:
            return
        stop = self._transport_paused or self._inflight >= self._send_quota
        if stop and conn.writable:
            conn.pause()
        elif not stop and not conn.writable:
            conn.resume()

    # -- subscriptions -------------------------------------------------------

    def _session_queue(self, live: Connected) -> MessageQueue:
        """The client's own queue, and this connection's consumer of it; a clean session
        gets both with its first subscription, not at CONNECT."""
        queue = self.hub.clean_queue(live.client)
        if live.consumer is None:
            live.consumer = live.conn.consume(
                queue, partial(self._deliver, live), ack_mode=AckMode.CLIENT_INDIVIDUAL,
                prefetch=min(self.peer_receive_maximum, self.settings.max_inflight), check=self._check_for(live, None),
            )
        return queue

    def _reader_of(self, client_id: str) -> Reader | None:
        reader = self._reader
        if reader is None:
            reader = self._reader = self.hub.access.reader(self.principal, client_id)
            if reader is not None:
                reader.listen(self._rules_changed)
        return reader

    def _check_for(self, live: Connected, shared_filter: str | None) -> Reader | None:
        """The check a consumer carries: the consumer of a shared filter's group, or (None) of the
        session's own queue, which every other filter feeds; None when no deny overlaps what it gets."""
        filtered = live.filtered
        if filtered is None:
            return None
        if shared_filter is not None:
            return self._reader if shared_filter in filtered else None
        client = live.client
        shared = client.shared if client.subscribed else {}
        return self._reader if any(f not in shared for f in filtered) else None

    def _apply_checks(self, live: Connected) -> None:
        if live.consumer is not None:
            live.consumer.check = self._check_for(live, None)
        client = live.client
        if client.subscribed and client.shared:
            for mqtt_filter, consumer in live.shared_consumers.items():
                consumer.check = self._check_for(live, mqtt_filter)

    def _mark(self, live: Connected, mqtt_filter: str, filtered: bool) -> None:
        if filtered:
            if live.filtered is None:
                live.filtered = {}
            live.filtered[mqtt_filter] = None
        elif live.filtered is not None:
            live.filtered.pop(mqtt_filter, None)
            if not live.filtered:
                live.filtered = None

    def _review(self, live: Connected) -> None:
        """Which of the session's filters the current rules only partly let through.

        A filter they refuse outright now (granted before a reload) is checked
        too: each of its deliveries is then skipped, rather than the client cut off.
        """
        reader = self._reader
        client = live.client
        if reader is None or not client.subscribed:
            return
        filtered: dict[str, None] = {}
        for mqtt_filter, sub in client.subs.items():
            if reader.reading(sub.destination) is not Reading.WHOLE:
                filtered[mqtt_filter] = None
        for mqtt_filter, (_, canonical) in client.shared.items():
            if reader.reading(canonical) is not Reading.WHOLE:
                filtered[mqtt_filter] = None
        live.filtered = filtered or None

    def _rules_changed(self) -> None:
        """The rules were reloaded (SIGHUP): the next delivery of every subscription is checked by them."""
        live = self.live
        if live is None or self.closed:
            return
        before = live.filtered
        try:
            self._review(live)
            self._apply_checks(live)
        except Exception:
            # Its subscriptions may no longer match the rules: this client goes, not the reload.
            log.failure("[{label}] internal error applying reloaded rules", label=self.label)
            self.broker.clock.callLater(0, self._server_disconnect, ReasonCode.UNSPECIFIED_ERROR, "internal error")
            return
        if before != live.filtered:
            log.info(
                "[{label}] rules reloaded: {n} of its subscriptions checked at delivery", label=self.label,
                n=len(live.filtered or ()),
            )

    def _on_subscribe(self, live: Connected, packet: mq.Subscribe) -> None:
        sub_id = packet.properties.get("subscription_identifier") if self.level == 5 else None
        codes = []
        retained: list[Entry] = []
        for request in packet.subscriptions:
            codes.append(self._subscribe_one(live, request, sub_id, retained))
        self._send(mq.Suback(packet.packet_id, codes))
        # Retained messages follow the SUBACK, through the queue like any delivery (flow control, QoS).
        if retained:
            queue = self._session_queue(live)
            for entry in retained:
                queue.enqueue(entry)

    def _subscribe_one(
        self, live: Connected, request: mq.SubscriptionRequest, sub_id: int | None, retained: list[Entry],
    ) -> int:
        client = live.client
        mqtt_filter = request.topic_filter
        try:
            group, inner = split_shared(mqtt_filter)
            canonical = filter_to_canonical(inner)
            self.broker.check_name(canonical, allow_wildcards=True)
        except (InvalidTopic, InvalidDestination) as exc:
            log.info("[{label}] SUBSCRIBE {f!r} refused: {why}", label=self.label, f=mqtt_filter, why=str(exc))
            return ReasonCode.TOPIC_FILTER_INVALID if self.level == 5 else SUBACK_FAILURE
        reading = Reading.WHOLE
        if self._checked:
            reading = self.hub.access.reading(self.principal, canonical, client.client_id)
            # A granted subscription hears of a reload through the session's reader, a whole one too.
            if reading is not Reading.REFUSED and self._reader_of(client.client_id) is None and reading is Reading.FILTERED:
                reading = Reading.REFUSED  # nothing to check its deliveries with (an Access without readers)
            if reading is Reading.REFUSED:
                log.info(
                    "[{label}] {user} may not subscribe to {f!r}", label=self.label,
                    user=self.principal.name or "anonymous", f=mqtt_filter,
                )
                return ReasonCode.NOT_AUTHORIZED if self.level == 5 else SUBACK_FAILURE
        if group is not None and request.no_local and self.level == 5:
            raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription")
        existed = mqtt_filter in client.filters
        if not existed and len(client.filters) >= self.settings.max_subscriptions:
            return ReasonCode.QUOTA_EXCEEDED if self.level == 5 else SUBACK_FAILURE
        no_local = bool(request.no_local) or self.bridge
        options = SubscriptionOptions(
            request.qos, no_local, bool(request.retain_as_published) or self.bridge, request.retain_handling, sub_id or None,
        )
        client.filters[mqtt_filter] = options
        checks = reading is Reading.FILTERED or live.filtered is not None
        if checks:
            if reading is Reading.FILTERED:
                log.debug(
                    "[{label}] {f!r} granted: a deny rule overlaps it, so each of its messages is checked at delivery",
                    label=self.label, f=mqtt_filter,
                )
            self._mark(live, mqtt_filter, reading is Reading.FILTERED)
        if group is not None:
            if not existed:
                client.shared[mqtt_filter] = (group, canonical)
                self._join_shared(live, mqtt_filter, group, canonical)
            if checks:
                self._apply_checks(live)
            return request.qos
        broker = self.broker
        if client.durable:
            sub = broker.durable_subscription(
                f"{self.hub.queue_key(client.client_id)}\x1f{mqtt_filter}", canonical, None, None, no_local,
                queue_key=self.hub.queue_key(client.client_id), options=options, user=client.user,
            )
        else:
            old = client.subs.get(mqtt_filter)
            if old is not None:
                old.options = options
                sub = old
            else:
                sub = broker.add_subscription(self._session_queue(live), canonical, no_local=no_local, options=options)
        sub.owner_id = client.client_id
        client.subs[mqtt_filter] = sub
        if checks:
            self._apply_checks(live)  # before the retained messages below are queued
        if request.retain_handling == 0 or (request.retain_handling == 1 and not existed):
            for message in broker.retained_for(canonical):
                if no_local and message.origin == client.client_id:
                    continue
                retained.append(Entry(message, broker.next_seq(), via=RetainedVia(options)))
        return request.qos

    def _join_shared(self, live: Connected, mqtt_filter: str, group: str, canonical: str) -> None:
        sub = self.broker.shared_subscription(group, canonical)
        prefetch = min(self.peer_receive_maximum, self.settings.max_inflight)
        live.shared_consumers[mqtt_filter] = live.conn.consume(
            sub.queue, partial(self._deliver, live), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=prefetch,
            check=self._check_for(live, mqtt_filter),
        )

    def _leave_shared(self, live: Connected, mqtt_filter: str, group: str, canonical: str) -> None:
        consumer = live.shared_consumers.pop(mqtt_filter, None)
        if consumer is not None:
            live.conn.unsubscribe(consumer)
            self.broker.leave_shared(group, canonical)

    def _on_unsubscribe(self, live: Connected, packet: mq.Unsubscribe) -> None:
        client = live.client
        codes: list[int] = []
        for mqtt_filter in packet.topic_filters:
            options = client.filters.pop(mqtt_filter, None)
            if options is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            shared = client.shared.pop(mqtt_filter, None)
            if shared is not None:
                self._leave_shared(live, mqtt_filter, *shared)
            sub = client.subs.pop(mqtt_filter, None)
            if sub is not None:
                if sub.durable_key is not None:
                    self.broker.remove_durable(sub.durable_key)
                else:
                    self.broker.remove_subscription(sub)
            if live.filtered is not None:
                self._mark(live, mqtt_filter, False)
                self._apply_checks(live)
            codes.append(0)
        self._send(mq.Unsuback(packet.packet_id, codes))

    # -- the rest of the protocol ----------------------------------------------

    def _on_pingreq(self, live: Connected, packet: mq.Pingreq) -> None:
        self._send(mq.Pingresp())

    def _on_connect_again(self, live: Connected, packet: mq.Connect) -> None:
        raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "a second CONNECT")

    def _on_disconnect(self, live: Connected, packet: mq.Disconnect) -> None:
        client = live.client
        if self.level == 5:
            new_expiry = packet.properties.get("session_expiry_interval")
            if new_expiry is not None:
                if client.expiry == 0 and new_expiry:
                    raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 at CONNECT")
                client.expiry = new_expiry
            if packet.reason_code != ReasonCode.NORMAL_DISCONNECTION:
                # Only a normal disconnection deletes the will (MQTT-3.1.2-10, 3.14.4):
                # 0x04 asks for it, and a client ending on an error (0x80 and up) gets it too.
                self._close()
                return
        self.normal_disconnect = True
        self.will = None
        self._close()

    def _on_auth(self, live: Connected, packet: mq.Auth) -> None:
        raise MqttProtocolError(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured")


    # -- output and teardown ---------------------------------------------------

    def _send(self, packet: Any) -> None:
        self.write_out(mq.encode(packet, self.level))

    def write_out(self, data: bytes) -> None:
        """Bytes to the client, now (the outbox decides when); nothing once closed."""
        if not self.closed:
            self.transport.write(data)

    def _protocol_error(self, reason: ReasonCode, why: str, exc: MqttProtocolError | None = None) -> None:
        log.info("[{label}] protocol error: {why}", label=self.label, why=why)
        if self.close_reason == "normal":
            self.close_reason = "error"
        if self.live is None:
            # Errors in or before CONNECT: a CONNACK where the client's version has one.
            level = getattr(exc, "protocol_level", None) or self.decoder.level
            return_code = getattr(exc, "connack_return_code", None)
            if level == 5:
                self.level = 5
                self._send(mq.Connack(False, reason, {"reason_string": why}))
            elif return_code is not None:
                # An unsupported level (say 6) has no encoding of its own: answer in the
                # 3.1.1 layout, where return code 1 says "unacceptable protocol version".
                self.level = level if level in (3, 4) else 4
                self._send(mq.Connack(False, return_code))
            self._close()
            return
        self._server_disconnect(reason, why)

    def _server_disconnect(self, reason: ReasonCode, why: str) -> None:
        """5.0 gets a DISCONNECT with the reason; 3.x just a closed socket (it has no server DISCONNECT)."""
        if self.live is not None and not self.closed:
            self.live.outbox.submit()  # frames gathered before the DISCONNECT go out before it
        if self.level == 5 and not self.closed:
            props = {"reason_string": why} if self.problem_information else {}
            self._send(mq.Disconnect(reason, props))
        self._close()

    def shutdown(self) -> None:
        if not self.closed:
            self.close_reason = "shutdown"
            self._server_disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "the broker is shutting down")

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (admin API): 5.0 DISCONNECT 0x98 with the reason; 3.x a close.

        Logged with the connection's label, as STOMP's is: 3.x clients are told
        nothing, so the log is the only place the reason is kept.
        """
        if not self.closed:
            self.close_reason = "admin"
            log.info("[{label}] closed by an operator: {reason}", label=self.label, reason=reason)
            self._server_disconnect(ReasonCode.ADMINISTRATIVE_ACTION, reason)

    def take_over(self) -> None:
        """Another connection claims this client id (MQTT-3.1.4-3)."""
        self._server_disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")

    def _close(self) -> None:
        if self.closed:
            return
        if self.live is not None:
            self.live.outbox.submit()  # what this turn gathered goes out before the close
        self._release()
        self.transport.close()

    def _release(self) -> None:
        self.phase = Phase.CLOSED
        self.closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._reader is not None:
            self._reader.close()  # the rules forget it: nothing left to check
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
                self._settle(live, inflight)
            flows.released_inflight.clear()
        for mqtt_filter, (group, canonical) in list(client.shared.items()) if client.subscribed else ():
            self._leave_shared(live, mqtt_filter, group, canonical)
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
        self._transport_paused = True
        if self.live is not None:
            self._update_flow(self.live)

    def resume_producing(self) -> None:
        self._transport_paused = False
        if self.live is not None:
            self._update_flow(self.live)


# What each packet does once connected; CONNECT first is handled before there is a ``live``.
_HANDLERS: dict[type, Callable[[MqttSession, Connected, Any], None]] = {
    mq.Publish: MqttSession._on_publish,
    mq.Puback: MqttSession._on_puback,
    mq.Pubrec: MqttSession._on_pubrec,
    mq.Pubrel: MqttSession._on_pubrel,
    mq.Pubcomp: MqttSession._on_pubcomp,
    mq.Subscribe: MqttSession._on_subscribe,
    mq.Unsubscribe: MqttSession._on_unsubscribe,
    mq.Pingreq: MqttSession._on_pingreq,
    mq.Disconnect: MqttSession._on_disconnect,
    mq.Connect: MqttSession._on_connect_again,
    mq.Auth: MqttSession._on_auth,
}
