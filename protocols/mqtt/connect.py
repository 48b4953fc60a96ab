"""MQTT CONNECT, and the packets about the connection itself: PINGREQ, DISCONNECT, AUTH.

CONNECT is checked here (client id, version, keep-alive, will topic), its
credentials go to the authenticator through the session's ``LoginGate``, and
the answer either refuses the client with a CONNACK that says why or makes the
session's ``Connected``: the client session from the hub, the core
connection, the outbox, the CONNACK's properties, and what a resumed session
brings back (PUBRELs, its queue, its shared subscriptions).
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from core.access import Permission, Principal
from core.destination import InvalidDestination
from core.errors import UserLimit
from protocols.auth import Credentials
from protocols.mqtt import codec as mq
from protocols.mqtt.codec import ConnackReturnCode, MqttProtocolError, ReasonCode
from protocols.mqtt.connected import Connected, Phase
from protocols.mqtt.names import InvalidTopic, topic_to_canonical
from protocols.mqtt.state import BROKER_PROPERTY, NEVER_EXPIRES
from protocols.mqtt.subscriptions import join_shared, reader_of, review, session_queue
from protocols.outbox import Outbox

if TYPE_CHECKING:
    from protocols.mqtt.session import MqttSession

log = Logger(namespace="gateway.mqtt")

# The core connection's protocol, one string per level rather than one per connection.
PROTOCOL_NAMES = {3: "mqtt/3", 4: "mqtt/4", 5: "mqtt/5"}


def on_connect(session: MqttSession, packet: mq.Connect) -> None:
    session.level = packet.level
    props = packet.properties
    gate = session.gate
    refusal = None if gate is None else gate.refusal
    if refusal is not None:
        # 3.x: server unavailable; 5.0: quota exceeded, or connection rate exceeded.
        reason = ReasonCode.CONNECTION_RATE_EXCEEDED if refusal.rate else ReasonCode.QUOTA_EXCEEDED
        refuse(session, ConnackReturnCode.SERVER_UNAVAILABLE, reason, refusal.why)
        return
    client_id = packet.client_id
    assigned = None
    if not client_id:
        if session.level == 3:
            # MQTT 3.1 (3.1 spec, CONNECT payload) has no assigned ids: 1-23 characters, or return code 2.
            refuse(session, ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client ids are 1-23 characters")
            return
        if session.level < 5 and not packet.clean_start:
            refuse(session, ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs a clean session")
            return
        client_id = assigned = session.hub.assign_client_id()
    if session.level == 3 and len(client_id) > 23:
        refuse(session, ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client ids are 1-23 characters")
        return
    if session.level == 5 and props.get("authentication_method"):
        refuse(session, ConnackReturnCode.NOT_AUTHORIZED, ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured")
        return
    if session.level == 5:
        session.peer_receive_maximum = props.get("receive_maximum", 65535)
        session.peer_max_packet = props.get("maximum_packet_size", mq.MAX_PACKET_SIZE)
        session.peer_alias_max = props.get("topic_alias_maximum", 0)
        session.problem_information = props.get("request_problem_information", 1) == 1
        expiry = props.get("session_expiry_interval", 0)
    else:
        expiry = 0 if packet.clean_start else NEVER_EXPIRES
    limit = session.settings.server_keep_alive
    if session.level < 5 and limit and (packet.keep_alive == 0 or packet.keep_alive > limit):
        # 3.x has no way to be told a server keep-alive: refused, as Mosquitto's
        # max_keepalive does, rather than dropped later for a silence it was allowed.
        refuse(
            session, ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.UNSPECIFIED_ERROR,
            f"keep-alive {packet.keep_alive} s is outside this server's limit of {limit} s (server_keep_alive)",
        )
        return
    if packet.will is not None:
        try:
            session.broker.check_name(topic_to_canonical(packet.will.topic), allow_wildcards=False)
        except (InvalidTopic, InvalidDestination) as exc:
            # Refused now, not silently dropped when the will is due: 5.0 says why in
            # the CONNACK (0x90); 3.x has no return code for it and gets a close.
            if session.level == 5:
                refuse(session, ConnackReturnCode.SERVER_UNAVAILABLE, ReasonCode.TOPIC_NAME_INVALID, f"will topic: {exc}")  # 5.0 only
            else:
                log.info("[{label}] CONNECT refused: will topic: {why}", label=session.label, why=str(exc))
                session.close()
            return
    credentials = Credentials(
        packet.username, packet.password, session.transport.certificate_user(), session.remote,
        PROTOCOL_NAMES[session.level], client_id,
    )
    assert gate is not None  # dropped only once connected, and a second CONNECT is on_connect_again's
    session.phase = Phase.AUTHENTICATING
    # The answer may come later (a slow hash, off the reactor thread): the gate reads nothing meanwhile.
    gate.ask(session.hub.authenticator, credentials, partial(authenticated, session, packet, client_id, assigned, expiry))


def authenticated(
    session: MqttSession, packet: mq.Connect, client_id: str, assigned: str | None, expiry: int,
    principal: Principal | None, why: str,
) -> None:
    """The authenticator's answer to this connection's CONNECT (now, or in a later turn)."""
    try:
        if principal is None:
            # 3.x: 4 for a bad user name or password, 5 for no credentials at all; 5.0: 0x86 / 0x87.
            given = packet.username is not None or packet.password is not None
            refuse(
                session,
                ConnackReturnCode.BAD_USERNAME_OR_PASSWORD if given else ConnackReturnCode.NOT_AUTHORIZED,
                ReasonCode.BAD_USER_NAME_OR_PASSWORD if given else ReasonCode.NOT_AUTHORIZED,
                why or "bad user name or password",
            )
            return
        session.principal = principal
        will = packet.will
        hub = session.hub
        exists, owner = hub.owner_of(client_id)
        if will is not None and not hub.access.allowed(principal, Permission.WRITE, topic_to_canonical(will.topic), client_id):
            refuse(
                session, ConnackReturnCode.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED,
                f"publishing the will to {will.topic} is not allowed for this user",
            )
        elif exists and owner != principal.name:
            log.warn("[{label}] user {user!r} refused the session of client id {client} (another user's)",
                     label=session.label, user=principal.name, client=client_id)
            refuse(
                session, ConnackReturnCode.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                f"client id {client_id} is another user's session",
            )
        else:
            connected(session, packet, client_id, assigned, expiry)
    except Exception:
        log.failure("[{label}] internal error handling CONNECT", label=session.label)
        session.protocol_error(ReasonCode.UNSPECIFIED_ERROR, "internal error")


def connected(session: MqttSession, packet: mq.Connect, client_id: str, assigned: str | None, expiry: int) -> None:
    """CONNECT accepted: the session's ``Connected``, the CONNACK, and what a resumed session brings back."""
    props = packet.properties
    gate = session.gate
    if gate is not None:
        gate.stop()
        session.gate = None  # the opening is over: an idle connection keeps no gate
    broker = session.broker
    settings = session.settings
    level = session.level
    try:
        conn = broker.connect(client_id, protocol=PROTOCOL_NAMES[level], remote=session.remote, user=session.principal.name)
    except UserLimit as exc:
        refuse(session, ConnackReturnCode.SERVER_UNAVAILABLE, ReasonCode.QUOTA_EXCEEDED, str(exc))
        return
    conn.closer = session
    client, present = session.hub.attach(session, client_id, packet.clean_start, expiry)
    session.will = packet.will
    live = session.live = Connected(client, conn, Outbox(broker.turn_end, conn, session))
    session.phase = Phase.CONNECTED
    keep_alive = packet.keep_alive
    server_keep_alive = None
    limit = settings.server_keep_alive
    if limit and (keep_alive == 0 or keep_alive > limit):
        keep_alive = server_keep_alive = limit
    session.keep_alive = keep_alive

    peer_broker = None
    for key, _ in props.get("user_properties", ()):
        if key == BROKER_PROPERTY:
            peer_broker = key
    session.bridge = packet.bridge or peer_broker is not None
    ack_props: dict[str, Any] = {}
    if level == 5:
        ack_props = {
            "receive_maximum": settings.receive_maximum,
            "maximum_packet_size": settings.max_packet_size,
            "topic_alias_maximum": settings.topic_alias_maximum,
        }
        if assigned is not None:
            ack_props["assigned_client_identifier"] = assigned
        if server_keep_alive is not None:
            ack_props["server_keep_alive"] = server_keep_alive
        if props.get("request_response_information"):
            ack_props["response_information"] = f"response/{client_id}"
        if peer_broker is not None:
            ack_props["user_properties"] = [(BROKER_PROPERTY, broker.node_name)]
    session.send_packet(mq.Connack(present, 0, ack_props))
    log.info("[{label}] connected with MQTT level {mqtt_level}, session present: {p}", label=session.label, mqtt_level=level, p=present)

    if client.has_flows:
        for pid in sorted(client.flows.released):
            session.send_packet(mq.Pubrel(pid))
    session.send_quota = min(session.peer_receive_maximum, settings.max_inflight)
    if session.checked and client.subscribed and client.filters and reader_of(session, client_id) is not None:
        # A resumed session's subscriptions, under today's rules (a reload or a restart
        # since they were granted): decided before its queue's backlog flows.
        review(session, live)
    if client.queue is not None:  # persistent, or a clean session's taken over
        session_queue(session, live)
    for mqtt_filter, (group, canonical) in client.shared.items() if client.subscribed else ():
        join_shared(session, live, mqtt_filter, group, canonical)
    if keep_alive:
        session.arm_keep_alive()


def refuse(session: MqttSession, return_code: ConnackReturnCode, reason: ReasonCode, why: str) -> None:
    log.info("[{label}] CONNECT refused: {why}", label=session.label, why=why)
    code = reason if session.level == 5 else return_code
    props = {"reason_string": why} if session.level == 5 else {}
    session.send_packet(mq.Connack(False, code, props))
    session.close()


# -- the other packets about the connection -----------------------------------------


def on_pingreq(session: MqttSession, live: Connected, packet: mq.Pingreq) -> None:
    session.send_packet(mq.Pingresp())


def on_connect_again(session: MqttSession, live: Connected, packet: mq.Connect) -> None:
    raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "a second CONNECT")


def on_disconnect(session: MqttSession, live: Connected, packet: mq.Disconnect) -> None:
    client = live.client
    if session.level == 5:
        new_expiry = packet.properties.get("session_expiry_interval")
        if new_expiry is not None:
            if client.expiry == 0 and new_expiry:
                raise MqttProtocolError(ReasonCode.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 at CONNECT")
            client.expiry = new_expiry
        if packet.reason_code != ReasonCode.NORMAL_DISCONNECTION:
            # Only a normal disconnection deletes the will (MQTT-3.1.2-10, 3.14.4):
            # 0x04 asks for it, and a client ending on an error (0x80 and up) gets it too.
            session.close()
            return
    session.normal_disconnect = True
    session.will = None
    session.close()


def on_auth(session: MqttSession, live: Connected, packet: mq.Auth) -> None:
    raise MqttProtocolError(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not configured")
