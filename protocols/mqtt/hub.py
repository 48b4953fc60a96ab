"""MQTT sessions by client id, shared by every MQTT listener (TCP and WebSocket).

Owns what spans connections: taking a session over from an older connection,
resuming or discarding it (clean start), ending it when its expiry interval
passes, and wills (published on abnormal loss, after their delay, or when the
session ends first).
"""
from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from core.access import Access, AllowAll
from core.broker import Broker
from core.errors import BrokerError
from core.queue import MessageQueue
from core.retained import RetainedLimit
from protocols.auth import Anonymous, Authenticator
from protocols.deadlines import Deadlines
from protocols.mqtt import codec as mq
from protocols.mqtt.names import InvalidTopic, filter_to_canonical, topic_to_canonical
from protocols.mqtt.state import (
    NEVER_EXPIRES,
    AwayFilter,
    ClientSession,
    MqttSettings,
    build_message,
    options_of,
)

if TYPE_CHECKING:
    from protocols.mqtt.session import MqttSession

log = Logger(namespace="gateway.mqtt")


class MqttHub:
    def __init__(
        self, broker: Broker, settings: MqttSettings,
        authenticator: Authenticator | None = None, access: Access | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        # One user store and one set of rules for every MQTT listener (TCP, TLS, WebSocket).
        self.authenticator: Authenticator = authenticator or Anonymous()
        self.access: Access = access or AllowAll()
        # Live sessions are the listeners' (SessionFactory.sessions): the server shuts them down from there.
        self.clients: dict[str, ClientSession] = {}
        # Every connection's keep-alive on one reactor timer (an idle device holds no DelayedCall).
        self.deadlines = Deadlines(broker.clock)
        self.queue_filters = [
            tuple(filter_to_canonical(f)[8:].split(".")) for f in settings.queue_topics
        ]
        # MQTT topic -> canonical destination, so a repeated topic is mapped once.
        self.destinations: dict[str, str] = {}
        # The reverse, for deliveries: canonical destination -> MQTT topic ("": MQTT cannot name it).
        # str.translate per delivery was a fifth of mqtt-qos0 once the rest was compiled.
        self.topics: dict[str, str] = {}
        # Operators end persistent sessions through the core (the admin API imports no protocol).
        broker.sessions["mqtt"] = self

    @staticmethod
    def queue_key(client_id: str) -> str:
        return f"mqtt:{client_id}"

    def assign_client_id(self) -> str:
        return "auto-" + secrets.token_hex(8)

    # -- attaching and detaching connections --------------------------------

    def owner_of(self, client_id: str) -> tuple[bool, str | None]:
        """(whether a session of this client id exists, live or kept; the user who made it).

        A session holds what its user's subscriptions let in, so another user
        may neither resume nor take it over; without users every session is
        the anonymous user's and this never refuses.
        """
        client = self.clients.get(client_id)
        return (False, None) if client is None else (True, client.user)

    def attach(self, session: MqttSession, client_id: str, clean_start: bool, expiry: int) -> tuple[ClientSession, bool]:
        """Give a new connection its session; returns it and whether it existed (session present)."""
        client = self.clients.get(client_id)
        if client is not None and client.live is not None and client.live is not session:
            client.live.take_over()
            client = self.clients.get(client_id)  # the old connection's expiry may have ended it
        if client is not None and clean_start:
            self._end(client)
            client = None
        present = client is not None
        if client is None:
            durable = expiry > 0
            # A clean session gets its queue with its first subscription (clean_queue):
            # most idle devices never subscribe, and the queue and its consumer were a
            # fifth of the memory of an idle connection.
            queue: MessageQueue | None = None
            if durable:
                queue = self.broker.durable_queue(self.queue_key(client_id))
                queue.max_redeliveries = -1
            client = self.clients[client_id] = ClientSession(client_id, queue, durable)
            client.user = session.principal.name
        for timer in (client.expiry_timer, client.will_timer):
            if timer is not None and timer.active():
                timer.cancel()  # back in time: neither the session nor a delayed will ends
        client.expiry_timer = client.will_timer = None
        client.pending_will = None
        for sub in client.subs.values() if client.subscribed else ():
            if isinstance(sub.selector, AwayFilter):
                sub.selector = None  # back: QoS 0 messages are delivered again
        client.expiry = expiry
        client.left_at = 0
        client.live = session
        self.save(client)
        return client, present

    def clean_queue(self, client: ClientSession) -> MessageQueue:
        """The queue of a clean session, made on first use: what its subscriptions deliver to."""
        queue = client.queue
        if queue is None:
            queue = client.queue = MessageQueue(f"mqtt://{client.client_id}", self.broker)
            queue.max_redeliveries = -1  # a reconnect is not a failed delivery
        return queue

    def save(self, client: ClientSession) -> None:
        if client.durable:
            self.broker.save_state(self.queue_key(client.client_id), client.state())

    def recover(self) -> None:
        """Rebuild the persistent sessions the store remembers, as if their clients had just left."""
        for name, data in self.broker.states("mqtt:"):
            state = json.loads(data)
            client = self._recover(name[len("mqtt:"):], state)
            for sub in client.subs.values() if client.subscribed else ():
                sub.selector = AwayFilter(options_of(sub).qos)
            if client.expiry != NEVER_EXPIRES:
                # The expiry counts from the disconnect, not from this start (as Mosquitto).
                left_at = state.get("left_at") or self.broker.now_ms()
                remaining = client.expiry - (self.broker.now_ms() - left_at) / 1000
                if remaining <= 0:
                    log.info("session of {client} expired while the broker was down", client=client.client_id)
                    self._end(client)
                    continue
                client.left_at = left_at
                client.expiry_timer = self.broker.clock.callLater(remaining, self._expired, client)

    def _recover(self, client_id: str, state: dict[str, Any]) -> ClientSession:
        """A persistent session that only the store remembers (the broker restarted)."""
        queue = self.broker.durable_queue(self.queue_key(client_id))
        queue.max_redeliveries = -1
        client = self.clients[client_id] = ClientSession(client_id, queue, True)
        client.expiry = state.get("expiry", NEVER_EXPIRES)
        client.user = state.get("user")
        released = {int(pid): seq for pid, seq in state.get("released", {}).items()}
        inbound = dict.fromkeys(state.get("inbound", ()))
        if released or inbound:
            flows = client.flows
            flows.released = released
            flows.inbound_qos2 = inbound
            # The client holds these already (PUBREC was received): PUBREL, not PUBLISH, is due.
            for entry in queue.remove_seqs(set(released.values())):
                queue.settle(entry)
        for sub in self.broker.subscriptions_of(queue):
            if sub.durable_key is None:
                continue
            mqtt_filter = sub.durable_key.split("\x1f", 1)[1]
            client.filters[mqtt_filter] = options_of(sub)
            client.subs[mqtt_filter] = sub
            sub.owner_id = client_id
        return client

    def detach(self, session: MqttSession, client: ClientSession, will: mq.Will | None, level: int) -> None:
        if client.live is not session:
            return
        client.live = None
        client.left_at = self.broker.now_ms()
        if will is not None:
            delay = will.properties.get("will_delay_interval", 0) if level == 5 else 0
            if delay and client.expiry:
                client.will_timer = self.broker.clock.callLater(
                    min(delay, client.expiry), self._will_due, client, will,
                )
                client.pending_will = will
            else:
                self.publish_will(will)
        if client.expiry == 0:
            self._end(client)
            return
        # Away: keep only what will be delivered at QoS 1 or 2 (see AwayFilter).
        for sub in client.subs.values() if client.subscribed else ():
            sub.selector = AwayFilter(options_of(sub).qos)
        self.save(client)  # a 5.0 DISCONNECT may have changed the expiry
        if client.expiry != NEVER_EXPIRES:
            client.expiry_timer = self.broker.clock.callLater(client.expiry, self._expired, client)

    def _will_due(self, client: ClientSession, will: mq.Will) -> None:
        client.will_timer = None
        client.pending_will = None
        self.publish_will(will)

    def _expired(self, client: ClientSession) -> None:
        client.expiry_timer = None
        if client.live is None:
            log.info("session of {client} expired", client=client.client_id)
            self._end(client)

    def _end(self, client: ClientSession) -> None:
        """The session is over: its subscriptions and queued messages go; a pending will is sent now."""
        if self.clients.get(client.client_id) is client:
            del self.clients[client.client_id]
        for timer in (client.expiry_timer, client.will_timer):
            if timer is not None and timer.active():
                timer.cancel()
        will = client.pending_will
        if will is not None:
            client.pending_will = None
            self.publish_will(will)
        if client.durable:
            self.broker.remove_durable_queue(self.queue_key(client.client_id))
            self.broker.delete_state(self.queue_key(client.client_id))
        else:
            for sub in client.subs.values() if client.subscribed else ():
                self.broker.remove_subscription(sub)
            if client.queue is not None:
                client.queue.purge()
        if client.subscribed:
            client.subs.clear()
            client.filters.clear()

    def publish_will(self, will: mq.Will) -> None:
        try:
            destination = topic_to_canonical(will.topic)
            message = build_message(self.broker, destination, will.payload, will.qos, will.retain, will.properties)
            if will.retain:
                try:
                    self.broker.retain(message)
                except RetainedLimit as limit:  # not `exc`: compiled (mypyc), one name has one type per function
                    log.warn("will on {topic!r} published, not retained: {why}", topic=will.topic, why=str(limit))
            self.broker.send(message)
        except (InvalidTopic, BrokerError) as exc:
            log.warn("will on {topic!r} not published: {why}", topic=will.topic, why=str(exc))

    # -- for operators (core.broker.SessionKeeper) ---------------------------

    def session_live(self, client_id: str) -> bool:
        client = self.clients.get(client_id)
        return client is not None and client.live is not None

    def end_session(self, client_id: str) -> bool:
        """End a kept session (persistent, its client away): what the client asked to keep goes.

        A session that exists only while connected (clean) is never kept, so there is none to end.
        """
        client = self.clients.get(client_id)
        if client is None or not client.durable or client.live is not None:
            return False
        log.info("session of {client} ended by an operator", client=client_id)
        self._end(client)
        return True
