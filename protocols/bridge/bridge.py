"""One bridge's side in this broker: its outbound queue, its connection to the core, its figures.

It outlives every link to the remote.  The outbound queue is an ordinary queue
(``queue://$bridge.NAME``) fed by one subscription per outward pattern, so a
message is queued for the remote in the same store batch as its publish (a copy
under the queue's own key, as a virtual topic's consumer queue has it: no
reference count per message held in memory), paged past the memory limit,
counted against ``store_limit``, recovered after a restart and shown, browsed
and purged in the admin API like any queue.  A link, while
connected, is that queue's one consumer: what it sends and the remote has not
confirmed is unacknowledged, and goes back to the head of the queue, marked
redelivered, when the link drops.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from core import destination as dest
from core.consumer import AckMode, Consumer, Sink
from core.duplicates import BROKER_PATH_HEADER as PATH_HEADER
from core.message import Message
from core.queue import MessageQueue
from core.topic import Subscription
from core.trie import filter_matches
from protocols.bridge.settings import BridgeSettings, BridgeTopic
from protocols.mqtt.names import canonical_to_topic, filter_to_canonical, topic_to_canonical

if TYPE_CHECKING:
    from core.broker import Broker

log = Logger(namespace="gateway.bridge")

QUEUE_PREFIX = "queue://$bridge."


def queue_name(bridge: str) -> str:
    """A bridge's outbound queue: an ordinary queue, so the admin API, paging, limits and recovery are a queue's."""
    return QUEUE_PREFIX + bridge


def path_of(message: Message) -> list[str]:
    text = message.headers.get(PATH_HEADER)
    return text.split(",") if text else []


def stomp_parts(pattern: str) -> tuple[str, str]:
    """``/topic/a.b`` -> ("topic://", "a.b"); a STOMP bridge's patterns name topics or queues."""
    for prefix, kind in (("/topic/", "topic://"), ("/queue/", "queue://")):
        if pattern.startswith(prefix):
            return kind, pattern[len(prefix):]
    raise ValueError(f"a STOMP bridge's pattern starts with /topic/ or /queue/, got {pattern!r}")


class OutRule:
    """An outward pattern: which local destinations it takes and the remote name of each.

    MQTT (``stomp`` False): names are MQTT topics, the prefixes prepended to them.
    STOMP: ``/topic/NAME`` or ``/queue/NAME``, the prefixes prepended to NAME.
    """

    __slots__ = ("topic", "stomp", "kind", "local_filter", "levels")

    def __init__(self, topic: BridgeTopic, stomp: bool = False) -> None:
        self.topic = topic
        self.stomp = stomp
        if stomp:
            self.kind, name = stomp_parts(topic.pattern)
            self.local_filter = self.kind + topic.local_prefix + name
        else:
            self.kind = "topic://"
            self.local_filter = filter_to_canonical(topic.local_prefix + topic.pattern)
        self.levels = dest.topic_levels(dest.name_of(self.local_filter))

    def remote_topic(self, destination: str) -> str | None:
        """The remote name of a local destination this rule matched, or None when it cannot be named there."""
        topic = self.topic
        if self.stomp:
            name = destination[len(self.kind):]
            if not destination.startswith(self.kind) or not name.startswith(topic.local_prefix):
                return None
            return ("/topic/" if self.kind == "topic://" else "/queue/") + topic.remote_prefix + name[len(topic.local_prefix):]
        local = canonical_to_topic(destination)
        if local is None or not local.startswith(topic.local_prefix):
            return None
        return topic.remote_prefix + local[len(topic.local_prefix):]


class Bridge:
    """The broker side of one configured bridge (see the module's docstring)."""

    def __init__(self, broker: "Broker", settings: BridgeSettings, broker_name: str) -> None:
        self.broker = broker
        self.settings = settings
        self.name = settings.name
        self.broker_name = broker_name
        self.client_id = settings.client_id or f"{broker_name}-{settings.name}"
        self.stomp = settings.protocol == "stomp"
        self.out_rules = [OutRule(t, self.stomp) for t in settings.topics if t.outward]
        self.in_rules = [t for t in settings.topics if t.inward]
        self.queue_name = queue_name(settings.name)
        self.subscriptions: list[Subscription] = []
        # The core's view of the bridge: one connection, whose identity is what no-local compares.
        self.connection = broker.connect(client_id="$bridge:" + settings.name, protocol="bridge", remote=settings.url)
        self.queue: MessageQueue | None = None
        self._routes: dict[str, tuple[BridgeTopic, str] | None] = {}
        # For operators: the link's state since when, its last error, and traffic per direction.
        self.state = "connecting"
        self.since_ms = broker.now_ms()
        self.last_error: str | None = None
        self.last_error_is_new = False  # set by a link that closes for a reason of its own
        self.remote_name: str | None = None  # the remote gateway's name, when it tells it
        # MQTT 3.1.1: the remote refused the bridge bit (try_private), so the links connect without it.
        self.plain_mqtt = False
        self.forwarded = 0  # out: confirmed by the remote
        self.received = 0  # in: stored here and acknowledged to the remote
        self.loops_dropped = 0  # either way: a message whose path names the broker it would go to
        self.refused = 0  # out: the remote answered with an error code
        self.connects = 0
        self._subscribe_out()

    # -- the outbound queue ---------------------------------------------------

    def _subscribe_out(self) -> None:
        """The outbound queue, and the subscriptions that feed it (made again at each start, from the configuration)."""
        topics = [rule for rule in self.out_rules if rule.kind == "topic://"]
        if not topics:
            return
        broker = self.broker
        queue = self.queue = broker.queue(self.queue_name)
        for rule in topics:
            # No local: what came in over this bridge is not sent back over it.
            self.subscriptions.append(broker.add_subscription(
                queue, rule.local_filter, no_local=True, owner_id=self.connection.identity,
            ))

    def route_for(self, destination: str) -> tuple[BridgeTopic, str] | None:
        """The outward rule that takes ``destination`` and its remote topic (cached per destination)."""
        routes = self._routes
        if destination in routes:
            return routes[destination]
        found = None
        kind = "topic://" if destination.startswith("topic://") else "queue://" if destination.startswith("queue://") else None
        if kind is not None:
            levels = dest.topic_levels(dest.name_of(destination))
            for rule in self.out_rules:
                if rule.kind == kind and filter_matches(rule.levels, levels):
                    remote = rule.remote_topic(destination)
                    if remote is not None:
                        found = (rule.topic, remote)
                        break
        if len(routes) > 10_000:
            routes.clear()
        routes[destination] = found
        return found

    def out_queues(self) -> list[MessageQueue]:
        """What a link consumes: the outbound queue, and the local queues a STOMP bridge moves to the remote."""
        queues = [self.queue] if self.queue is not None else []
        return queues + [self.broker.queue(rule.local_filter) for rule in self.out_rules if rule.kind == "queue://"]

    def consume_queue(self, queue: MessageQueue, sink: Sink, window: int) -> Consumer:
        return self.connection.consume(queue, sink, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=window)

    def stop_consuming(self, consumer: Consumer | None) -> None:
        """The link is gone: what it had not got confirmed goes back to the head of the queue."""
        if consumer is not None:
            self.connection.unsubscribe(consumer)

    def goes_back(self, message: Message) -> bool:
        """Whether forwarding would send the message to a broker it has already crossed."""
        if self.remote_name is None:
            return False
        return self.remote_name in path_of(message)

    # -- inbound ----------------------------------------------------------------

    def remote_name_of(self, topic: BridgeTopic) -> str:
        """What an inward pattern subscribes to at the remote."""
        if self.stomp:
            kind, name = stomp_parts(topic.pattern)
            return ("/topic/" if kind == "topic://" else "/queue/") + topic.remote_prefix + name
        return topic.remote_prefix + topic.pattern

    def local_destination(self, remote: str) -> str | None:
        """The local destination of a message the remote sent to ``remote`` (None: no inward rule gives one)."""
        for topic in self.in_rules:
            if self.stomp:
                kind, _ = stomp_parts(topic.pattern)
                prefix = ("/topic/" if kind == "topic://" else "/queue/") + topic.remote_prefix
                if remote.startswith(prefix):
                    return kind + topic.local_prefix + remote[len(prefix):]
            elif remote.startswith(topic.remote_prefix):
                local = topic.local_prefix + remote[len(topic.remote_prefix):]
                try:
                    return topic_to_canonical(local)
                except ValueError:
                    return None
        return None

    def arrived(self, message: Message) -> bool:
        """Whether an inbound message is to be published here (False: it has been here already: a loop).

        The remote is put on its path when the remote did not (a subscriber's delivery, a
        3.1.1 link), so that nothing forwards it back there.
        """
        path = path_of(message)
        if self.broker_name in path:
            self.loops_dropped += 1
            return False
        remote = self.remote_name
        if remote is not None and (not path or path[-1] != remote):
            path.append(remote)
            # New headers, not a change to the map: a plain PUBLISH's is shared (protocols/mqtt/state.py).
            message.headers = {**message.headers, PATH_HEADER: ",".join(path)}
        return True

    # -- state, for operators ---------------------------------------------------

    def set_state(self, state: str, error: str | None = None) -> None:
        if state != self.state:
            self.state = state
            self.since_ms = self.broker.now_ms()
        if error is not None:
            self.last_error = error

    def status(self) -> dict[str, Any]:
        queue = self.queue
        consumers = queue.consumers if queue is not None else []
        return {
            "name": self.name,
            "url": self.settings.url,
            "protocol": self.settings.protocol,
            "version": self.settings.version,
            "client_id": self.client_id,
            "state": self.state,
            "since": self.since_ms,
            "last_error": self.last_error,
            "remote_broker": self.remote_name,
            "connects": self.connects,
            "out": {
                "patterns": [r.topic.pattern for r in self.out_rules],
                "queued": len(queue) if queue is not None else 0,
                "inflight": sum(len(c.unacked) for c in consumers),
                "forwarded": self.forwarded,
                "refused": self.refused,
            },
            "in": {
                "patterns": [t.pattern for t in self.in_rules],
                "received": self.received,
            },
            "loops_dropped": self.loops_dropped,
        }

    def remove(self) -> int:
        """The bridge is configured no longer: its subscriptions and queue go; returns the messages dropped."""
        dropped = len(self.queue) if self.queue is not None else 0
        self.close()
        if self.queue is not None:
            self.broker.delete_queue(self.queue_name)
        return dropped

    def close(self) -> None:
        """This bridge object is done (a stop, a restart with new settings): the queue stays for the next."""
        for sub in self.subscriptions:
            self.broker.remove_subscription(sub)
        self.subscriptions = []
        connection = self.connection
        if not connection.closed:
            connection.close()
