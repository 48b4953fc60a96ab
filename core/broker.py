"""The broker: routing, destinations, dead letters, scheduling and recovery.

Protocol sessions talk to it through ``Connection`` objects (core.connection);
it talks to storage through ``persistence.store.Store`` and to time through a
clock with Twisted's IReactorTime shape (``seconds``, ``callLater``), so tests
can drive it with ``twisted.internet.task.Clock`` and no sockets.
"""
from __future__ import annotations

import itertools
import json
import time
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, overload

from twisted.logger import Logger

from core import destination as dest
from core.duplicates import BROKER_PATH_HEADER, DUPLICATE_ID_HEADER, DuplicateCache
from core.entry import Entry
from core.errors import BrokerError, SubscriptionError, UnknownDestination, UserLimit
from core.history import TrafficHistory
from core.message import Message, decode_message, encode_message
from core.policy import Policy
from core.queue import MemoryUsage, MessageQueue
from core.retained import RetainedMessages
from core.storage import (
    DELIVERED_KIND,
    DURABLE_KIND,
    DURABLE_REF_KIND,
    META_KIND,
    RECORD_OVERHEAD,
    SCHEDULED_KIND,
    STATE_KIND,
    DurableStorage,
    QueueStorage,
    StoreUsage,
    TopicMessages,
    seq_key,
    stored_size,
)
from core.stream_config import NoStreams, StreamSpec
from core.stream_history import StreamHistory
from core.topic import MessageFilter, Options, Subscription, TopicSpace, VirtualTopics
from core.turn import Defer, TurnEnd
from persistence.store import Store, StoreUnavailable

if TYPE_CHECKING:
    from core.connection import Connection
    from core.stream import Stream, StreamSet

log = Logger(namespace="gateway.core")

# Sequence numbers reserved per store write (see next_seq).
SEQ_BLOCK = 10_000

# key: a virtual topic's consumer queue -> b"" (it exists even while empty, as in ActiveMQ)
CONSUMER_QUEUE_KIND = "consumer-queue"
# key: a queue an operator created (admin API) -> b"": it exists, empty or not, until deleted
DECLARED_QUEUE_KIND = "declared-queue"
# The header a consumer queue's copy of a virtual topic message names its topic in
# (the same one a dead letter names its queue in).
ORIGINAL_DESTINATION = "originalDestination"
# Why a dead letter is one (ActiveMQ's header); a replay from the DLQ strips both.
DEAD_LETTER_CAUSE = "dlqDeliveryFailureCause"


class Clock(Protocol):
    def seconds(self) -> float: ...

    def callLater(self, delay: float, f: Callable[..., Any], *args: Any, **kw: Any) -> Any: ...


class SessionKeeper(Protocol):
    """A protocol's persistent sessions (MQTT's), which an operator may end: the protocol
    registers itself (``Broker.sessions``), so the core ends them without importing it."""

    def session_live(self, client_id: str) -> bool:
        """Whether a client is connected to its session now."""

    def end_session(self, client_id: str) -> bool:
        """End a session that is not live: its subscriptions, queued messages and state go; False if none."""


class Broker:
    def __init__(
        self, store: Store, clock: Clock, policy: Policy | None = None, name: str = "gateway",
        spill: Store | None = None, defer: Defer | None = None, streams: list[StreamSpec] | None = None,
    ) -> None:
        self.store = store
        # Sessions gather their writes per reactor turn here (see protocols/outbox.py).
        self.turn_end = TurnEnd(defer)
        # Where non-persistent messages beyond a queue's memory limit wait (wiped at start).
        self.spill = spill
        self.clock = clock
        self.policy = policy or Policy()
        self.name = name
        # Its name on the paths of forwarded messages (the gateway sets it: gateway.bridges.node_name).
        self.node_name = name
        self.loops_dropped = 0
        self.queues: dict[str, MessageQueue] = {}
        self.topics = TopicSpace(self.policy.retroactive_count, self.policy.retroactive_memory)
        # Consumer queues of virtual topics, by the topic they copy; route() tests a
        # topic against the prefixes (none when the feature is off) before looking.
        self.virtual = VirtualTopics(self.policy.virtual_topic_prefix, self.policy.virtual_topic_consumer_prefix)
        self._virtual_prefix = self.virtual.prefix
        self.durables: dict[str, Subscription] = {}         # subscription key -> subscription
        self.durable_queues: dict[str, MessageQueue] = {}    # queue key -> queue fed by durables
        self.shared: dict[str, tuple[Subscription, int]] = {}  # shared subscription -> (sub, members)
        self.retained = RetainedMessages(store, self.policy.max_retained_messages, self.policy.max_retained_bytes, self.now_ms)
        self.store_usage = StoreUsage(self.policy.store_limit)
        self.memory = MemoryUsage(self.policy.memory_limit)
        self.topic_messages = TopicMessages(store, self.store_usage)
        self.connections: dict[str, "Connection"] = {}
        # client id -> its registered connections (MQTT may briefly have two: a take-over)
        # Client id -> its connection, or a set while an MQTT takeover briefly overlaps two (no set
        # of 216 bytes per idle client otherwise).
        self._by_client: dict[str, Connection | set[Connection]] = {}
        self._by_user: dict[str, int] = {}  # authenticated user -> open connections
        self.temp_owners: dict[str, str] = {}  # temp queue -> owning connection id
        self._seq = 1
        self._seq_reserved = 0
        self._ids = itertools.count(1)
        self._conn_ids = itertools.count(1)
        self._id_prefix = f"ID:{name}-{int(time.time() * 1000)}-"
        self._scheduled: dict[str, Any] = {}  # record key -> delayed call
        self._sweeper: Any = None
        self.messages_received = 0
        # protocol ("stomp/1.2", "mqtt/5", "http") -> [messages in, messages out] of closed connections
        self.closed_traffic: dict[str, list[int]] = {}
        # Deliveries that closed connections' rules denied (Connection.messages_denied).
        self.closed_denied = 0
        self._marks: set[MessageQueue] = set()
        self._checked: set[str] = set()  # destinations that passed validate()
        self.started_at = 0.0
        self.duplicates = DuplicateCache(store, self.policy.duplicate_cache_size)
        self.streams: StreamSet | NoStreams = NoStreams()
        if streams:
            from core.stream import StreamSet  # pyarrow: only for brokers that keep streams

            self.streams = StreamSet(list(streams), store, self.now_ms)
        self._retention: Any = None
        self.history = TrafficHistory(self.policy.traffic_history_interval)
        # Partition ends and reader lag, sampled in the same job (core/stream_history.py).
        self.stream_history = StreamHistory(self.policy.traffic_history_interval)
        self._history_call: Any = None
        # Protocol name -> its persistent sessions, for operators (registered by the protocol).
        self.sessions: dict[str, SessionKeeper] = {}

    # -- lifecycle ------------------------------------------------------

    def start(self) -> None:
        self.started_at = self.clock.seconds()
        self.recover()
        self._schedule_sweep()
        self._schedule_retention()
        if self.history.interval:
            self._sample_traffic()

    def stop(self) -> None:
        if self._sweeper is not None and self._sweeper.active():
            self._sweeper.cancel()
        self._sweeper = None
        if self._history_call is not None and self._history_call.active():
            self._history_call.cancel()
        self._history_call = None
        if self._retention is not None and self._retention.active():
            self._retention.cancel()
        self._retention = None
        for call in self._scheduled.values():
            if call.active():
                call.cancel()
        self._scheduled.clear()
        try:
            self.store.flush()
        except StoreUnavailable:
            pass  # the store says what it could not write when it closes

    def store_recovered(self) -> None:
        """The store writes again after a fault: queues that could not page in meanwhile go on.

        (A non-durable topic subscriber's queue goes on with its next message.)
        """
        for queues in (self.queues, self.durable_queues):
            for queue in list(queues.values()):
                if queue.paged:
                    queue.dispatch()

    def _schedule_sweep(self) -> None:
        interval = self.policy.expiry_check_interval
        if interval > 0:
            self._sweeper = self.clock.callLater(interval, self._sweep)

    def _sweep(self) -> None:
        now = self.now_ms()
        for queue in list(self.queues.values()):
            queue.sweep_expired(now)
        for queue in list(self.durable_queues.values()):
            queue.sweep_expired(now)
        self._schedule_sweep()

    def _schedule_retention(self) -> None:
        interval = self.policy.stream_retention_interval
        if self.streams.active and interval > 0:
            self._retention = self.clock.callLater(interval, self._apply_retention)

    def _sample_traffic(self) -> None:
        """One sample of the totals into the history (the first at start), then the next in ``interval``;
        the streams' partition ends and readers' lag are sampled with them."""
        received, sent = self.traffic_totals()
        now = self.now_ms()
        self.history.add(now, received, sent)
        self._history_call = self.clock.callLater(self.history.interval, self._sample_traffic)
        if self.streams.active:
            try:
                self.stream_history.sample(self.streams.streams, now)
            except Exception:
                log.failure("stream history: a sample failed")

    def _apply_retention(self) -> None:
        try:
            self.streams.sweep()
        except Exception:
            log.failure("stream retention failed")
        self._schedule_retention()

    # -- identities and time --------------------------------------------

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    def new_message_id(self) -> str:
        return self._id_prefix + str(next(self._ids))

    def next_seq(self) -> int:
        seq = self._seq
        self._seq = seq + 1
        if seq >= self._seq_reserved:
            # Reserve a block in the store before using it, so no number is ever
            # handed out twice, even when everything numbered before a restart is
            # gone (MQTT state and delivered marks still refer to old numbers).
            self._seq_reserved = seq + SEQ_BLOCK
            self.store.put_record(META_KIND, "seq", self._seq_reserved.to_bytes(8, "big"))
        return seq

    def connect(self, client_id: str | None = None, protocol: str = "", remote: str = "", user: str | None = None) -> "Connection":
        """A new connection; UserLimit when ``user`` already has ``max_connections_per_user`` open."""
        from core.connection import Connection

        if user is not None:
            limit = self.policy.max_connections_per_user
            if limit and self._by_user.get(user, 0) >= limit:
                raise UserLimit(f"user {user!r} already has {limit} connections (max_connections_per_user)")
        conn_id = f"{self.name}-{next(self._conn_ids)}"
        connection = Connection(self, conn_id, client_id, protocol=protocol, remote=remote)
        connection.user = user
        self.connections[conn_id] = connection
        if client_id is not None:
            same = self._by_client.get(client_id)
            if same is None:
                self._by_client[client_id] = connection
            elif isinstance(same, set):
                same.add(connection)
            else:
                self._by_client[client_id] = {same, connection}
        if user is not None:
            self._by_user[user] = self._by_user.get(user, 0) + 1
        return connection

    def forget_connection(self, connection: Connection) -> None:
        """A connection has closed: it is no longer counted or found by its client id."""
        if self.connections.pop(connection.id, None) is None:
            return  # forgotten already
        if connection.messages_in or connection.messages_out:
            # Its traffic stays in the per-protocol totals (metrics, $SYS) once it is gone.
            done = self.closed_traffic.setdefault(connection.protocol, [0, 0])
            done[0] += connection.messages_in
            done[1] += connection.messages_out
        self.closed_denied += connection.messages_denied
        if connection.user is not None:
            left = self._by_user.get(connection.user, 0) - 1
            if left > 0:
                self._by_user[connection.user] = left
            else:
                self._by_user.pop(connection.user, None)
        client_id = connection.client_id
        if client_id is not None:
            same = self._by_client.get(client_id)
            if same is connection:
                del self._by_client[client_id]
            elif isinstance(same, set):
                same.discard(connection)
                if len(same) == 1:
                    self._by_client[client_id] = next(iter(same))
                elif not same:
                    del self._by_client[client_id]

    def client_connected(self, client_id: str) -> bool:
        """Whether a connection with this client id is open (STOMP refuses a second one)."""
        same = self._by_client.get(client_id)
        if same is None:
            return False
        if isinstance(same, set):
            return any(not c.closed for c in same)
        return not same.closed

    @property
    def messages_sent(self) -> int:
        """Deliveries to clients: each connection counts its own (Consumer.deliver), closed ones are kept
        in ``closed_traffic``; summed when asked ($SYS, every few seconds), not counted twice per delivery."""
        return sum(c.messages_out for c in self.connections.values()) + sum(t[1] for t in self.closed_traffic.values())

    def traffic_totals(self) -> tuple[int, int]:
        """(messages received from clients, messages sent to them) since start, open and closed
        connections together: the counters the overview answers and the history samples."""
        received = sent = 0
        for conn in self.connections.values():
            received += conn.messages_in
            sent += conn.messages_out
        for done_in, done_out in self.closed_traffic.values():
            received += done_in
            sent += done_out
        return received, sent

    @property
    def deliveries_denied(self) -> int:
        """Deliveries skipped because the subscriber's rules deny the topic (a wildcard subscription
        that a deny rule overlaps), open and closed connections together; summed when asked."""
        return sum(c.messages_denied for c in self.connections.values()) + self.closed_denied

    def connection_count(self) -> int:
        return len(self.connections)

    def when_durable(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once everything written so far is on disk (the store's group commit)."""
        self.store.when_durable(callback)

    # -- destinations ---------------------------------------------------

    @overload
    def queue(self, name: str, create: Literal[True] = True) -> MessageQueue: ...

    @overload
    def queue(self, name: str, create: bool) -> MessageQueue | None: ...

    def queue(self, name: str, create: bool = True) -> MessageQueue | None:
        queue = self.queues.get(name)
        if queue is None and create:
            queue = self._create_queue(name)
        return queue

    def _create_queue(self, name: str, recorded: bool = False) -> MessageQueue:
        if name.startswith("temp-queue://"):
            queue = MessageQueue(name, self)
        else:
            queue = MessageQueue(name, self, QueueStorage(self.store, name, self.store_usage))
            if not self.is_dead_letter_queue(name) and self.virtual.add(queue) and not recorded:
                # A consumer queue receives from its virtual topic from now on, across
                # restarts too, even while it is empty and its consumers are away.
                self.store.put_record(CONSUMER_QUEUE_KIND, name, b"")
        self.queues[name] = queue
        return queue

    def declare_queue(self, name: str) -> tuple[MessageQueue, bool]:
        """An operator creates a queue (ActiveMQ's console "Create"): recorded, so it is there
        after a restart while still empty; whether it was new."""
        queue = self.queues.get(name)
        if queue is not None:
            return queue, False
        self.check_destination(name)  # the names a producer may send to, and no other
        queue = self._create_queue(name)
        self.store.put_record(DECLARED_QUEUE_KIND, name, b"")
        return queue, True

    def delete_queue(self, name: str) -> int:
        """Remove a queue and what it holds (a virtual topic stops copying to it); how many messages went.

        Refused while it has consumers.  Temporary queues go with their connection instead.
        """
        queue = self.queues.get(name)
        if queue is None or name.startswith("temp-queue://"):
            raise UnknownDestination(f"no queue {name}")
        if queue.consumers:
            raise BrokerError(f"queue {name} has consumers; it cannot be deleted now")
        purged = queue.purge()
        del self.queues[name]
        if self.virtual.remove(queue):
            self.store.delete_record(CONSUMER_QUEUE_KIND, name)
        self.store.delete_record(DECLARED_QUEUE_KIND, name)
        self._marks.discard(queue)
        self.store.delete_record(DELIVERED_KIND, name)
        self.store.forget_destination(name)  # not found again, empty, at the next start
        return purged

    def create_temp_queue(self, owner: "Connection", name: str) -> str:
        canonical = f"temp-queue://{owner.id}:{name}"
        if canonical not in self.queues:
            self.queue(canonical)
            self.temp_owners[canonical] = owner.id
        return canonical

    def delete_temp_queue(self, canonical: str) -> None:
        queue = self.queues.pop(canonical, None)
        self.temp_owners.pop(canonical, None)
        if queue is not None:
            queue.purge()

    def temp_queue_owner(self, canonical: str) -> str | None:
        """The id of the connection that created a temporary queue; None once it is gone."""
        return self.temp_owners.get(canonical)

    def stream(self, name: str) -> Stream:
        """A configured stream; UnknownStream otherwise."""
        return self.streams.get(name)

    # -- routing --------------------------------------------------------

    def check_name(self, destination: str, allow_wildcards: bool) -> None:
        """A canonical name a client gave: well formed, and within the configured length and depth."""
        policy = self.policy
        dest.check_limits(destination, policy.max_destination_levels, policy.max_destination_length)
        dest.validate(destination, allow_wildcards=allow_wildcards)

    def check_destination(self, destination: str) -> None:
        """Refuse a name no message may be sent to; names seen before are not parsed again.

        The one rule for every producer -- STOMP (each part of a composite), MQTT,
        the admin API's sends, moves and replays -- and for a queue made by name
        (an operator's create, a subscription to a queue that does not exist): no
        wildcard level, in a topic (wildcards are for subscribing) or a queue (a
        queue ``a.*`` would be a queue of that literal name that no other name
        reaches).  The one queue whose name holds a wildcard is a virtual topic's
        consumer queue (``Consumer.A.VirtualTopic.>``), where it is the filter of
        the topics it takes copies of.
        """
        checked = self._checked
        if destination not in checked:
            self.check_name(destination, allow_wildcards=False)
            if destination.startswith("queue://"):
                level = dest.wildcard_level(destination)
                if level and self.virtual.topic_filter(destination) is None:
                    raise dest.wildcard_send(destination, level)
            if destination.startswith("stream://"):
                raise BrokerError(
                    f"{destination} is a stream: it is fed by its destinations; send to one of them"
                )
            if len(checked) >= 10_000:
                checked.clear()
            checked.add(destination)

    def check_new_queue(self, name: str) -> None:
        """A queue a subscription would make (``name`` is ``queue://...``): named as a producer
        must name it (``check_destination``), so no ``queue://a.*`` that no producer could
        reach; a queue that exists passes, so one made before this rule can still be drained."""
        if name not in self.queues:
            self.check_destination(name)

    def send(self, message: Message, delay_ms: int = 0) -> None:
        """Route now, or after ``delay_ms`` (scheduled delivery)."""
        if delay_ms > 0:
            self._schedule(message, self.now_ms() + delay_ms, self.next_seq(), store=True)
            return
        self.route(message)

    def route(self, message: Message, count: bool = True) -> None:
        if count:
            self.messages_received += 1
        destination = message.destination
        queue = None
        if destination.startswith("temp-queue://"):
            queue = self.queues.get(destination)
            if queue is None:
                raise UnknownDestination(f"temporary queue {destination} does not exist (its owner has gone)")
        headers = message.headers
        dup_id = headers.get(DUPLICATE_ID_HEADER)
        if dup_id is not None:
            if self.duplicates.seen(destination, dup_id):
                log.debug("duplicate {dup} on {d} dropped", dup=dup_id, d=destination)
                return
            path = headers.get(BROKER_PATH_HEADER)
            if path is not None and self.node_name in path.split(","):
                # Forwarded here before: a loop of bridges brought it back.
                self.loops_dropped += 1
                return
        if self.streams.active:
            self.streams.append(message)
        if destination.startswith("topic://"):
            self._publish(message)
            if destination.startswith(self._virtual_prefix):
                self._copy_to_consumer_queues(message)
            return
        if queue is None:
            queue = self.queue(destination)
        queue.enqueue(Entry(message, self.next_seq()))

    def reroute(self, message: Message, append: bool = False) -> None:
        """Route a message again, as an operator moves or replays it: no duplicate check
        (its ``_AMQ_DUPL_ID`` was seen when it first came), not counted as received.

        ``append``: the streams fed by its new destination record it (a move
        brings it there for the first time; a replay returns it where it was recorded).
        """
        destination = message.destination
        if append and self.streams.active:
            self.streams.append(message)
        if destination.startswith("topic://"):
            self._publish(message)
            if destination.startswith(self._virtual_prefix):
                self._copy_to_consumer_queues(message)
            return
        queue = self.queues.get(destination) if destination.startswith("temp-queue://") else self.queue(destination)
        if queue is None:
            raise UnknownDestination(f"temporary queue {destination} does not exist (its owner has gone)")
        queue.enqueue(Entry(message, self.next_seq()))

    def _publish(self, message: Message) -> None:
        seq = self.next_seq()
        levels, subs = self.topics.route(message.destination)
        self.topics.remember(levels, seq, message)
        if len(subs) == 1:
            sub = subs[0]
            if sub.wants(message):
                sub.queue.enqueue(Entry(message, seq, via=sub))
            return
        # Several filters may feed one queue (an MQTT session): one entry per
        # queue, remembering every subscription that matched.
        entries: dict[int, Entry] = {}
        order: list[tuple[MessageQueue, Entry]] = []
        for sub in subs:
            if not sub.wants(message):
                continue
            entry = entries.get(id(sub.queue))
            if entry is None:
                entry = entries[id(sub.queue)] = Entry(message, seq, via=sub)
                order.append((sub.queue, entry))
            elif isinstance(entry.via, tuple):
                entry.via = entry.via + (sub,)
            elif isinstance(entry.via, Subscription):  # always: the entry was made with via=sub
                entry.via = (entry.via, sub)
        for queue, entry in order:
            queue.enqueue(entry)

    def _copy_to_consumer_queues(self, message: Message) -> None:
        """A virtual topic's message, copied into each of its consumer queues (ActiveMQ's VirtualTopicInterceptor).

        Each copy is a queue message of its own: addressed to the queue, with
        the topic in ``originalDestination`` (ActiveMQ's ``setOriginalDestination``),
        its own sequence number and, when persistent, its own record in the
        turn's batch, so acks, redelivery, dead letters (to the queue's DLQ),
        groups and selectors are the queue's.  No consumer queue: nothing is
        kept, as for any topic message nobody durably follows.
        """
        for queue in self.virtual.route(message.destination):
            queue.enqueue(Entry(_consumer_copy(message, queue.name), self.next_seq()))

    # -- retained messages ----------------------------------------------

    def retain(self, message: Message, bounded: bool = True) -> None:
        """Keep the message as its topic's retained one; an empty body clears it (MQTT).

        Raises RetainedLimit for a new topic past the configured bounds
        (``bounded`` False: the broker's own $SYS figures, never refused).
        """
        self.retained.retain(message, bounded)

    def replay(self, filter_levels: tuple[str, ...]) -> list[tuple[int, Message]]:
        """Recent messages of every topic a filter matches, oldest first (retroactive consumers)."""
        return self.topics.replay(filter_levels)

    def retained_for(self, destination: str) -> list[Message]:
        """Retained messages of every topic a filter matches (read from the store)."""
        return self.retained.matching(destination)

    # -- scheduled delivery ---------------------------------------------

    def _schedule(self, message: Message, due_ms: int, seq: int, store: bool) -> None:
        key = f"{due_ms:015d}:{seq_key(seq)}"
        if store and message.persistent:
            self.store.put_record(SCHEDULED_KIND, key, encode_message(message))
        delay = max(0.0, (due_ms - self.now_ms()) / 1000.0)
        self._scheduled[key] = self.clock.callLater(delay, self._fire, key, message)

    def _fire(self, key: str, message: Message) -> None:
        self._scheduled.pop(key, None)
        if message.persistent:
            self.store.delete_record(SCHEDULED_KIND, key)
        try:
            self.route(message)
        except UnknownDestination as exc:
            log.warn("scheduled message {id} dropped: {why}", id=message.id, why=str(exc))

    @property
    def scheduled_count(self) -> int:
        return len(self._scheduled)

    # -- delivery marks and protocol state --------------------------------

    def delivered(self, queue: MessageQueue, seq: int) -> None:
        """Note a queue's delivered mark: written once per batch, into the batch itself.

        Sessions send deliveries through when_durable, so a delivery reaches the
        client only once its mark is on disk: after a crash, whatever may have
        been seen comes back flagged redelivered (MQTT: DUP), exactly.
        """
        first = not self._marks
        self._marks.add(queue)
        if first:
            self.store.before_flush(self._save_marks)

    def _save_marks(self) -> None:
        marks, self._marks = self._marks, set()
        for queue in marks:
            if queue.storage is not None:
                self.store.put_record(DELIVERED_KIND, queue.storage.key, queue.delivered_mark.to_bytes(8, "big"))

    def save_state(self, name: str, data: bytes) -> None:
        """Protocol state that must survive a restart (protocols never touch the store)."""
        self.store.put_record(STATE_KIND, name, data)

    def delete_state(self, name: str) -> None:
        self.store.delete_record(STATE_KIND, name)

    def states(self, prefix: str) -> list[tuple[str, bytes]]:
        return list(self.store.iter_records(STATE_KIND, prefix))

    # -- redelivery, expiry, dead letters -------------------------------

    def redeliver(self, queue: MessageQueue, entries: list[Entry], reason: str) -> None:
        """Offer failed deliveries again, or dead-letter the ones that failed too often."""
        policy = self.policy
        limit = policy.max_redeliveries if queue.max_redeliveries is None else queue.max_redeliveries
        retry: list[Entry] = []
        for entry in entries:
            entry.redeliveries += 1
            if 0 <= limit < entry.redeliveries:
                self.dead_letter(
                    queue, entry, f"delivery failed {entry.redeliveries} times (max_redeliveries={limit}); last: {reason}",
                )
            else:
                retry.append(entry)
        if not retry:
            return
        if policy.redelivery_delay_ms > 0:
            attempts = max(e.redeliveries for e in retry)
            delay = policy.redelivery_delay_ms * (policy.redelivery_backoff ** (attempts - 1)) / 1000.0
            self.clock.callLater(delay, queue.push_front, retry)
        else:
            queue.push_front(retry)

    def expired(self, queue: MessageQueue, entry: Entry) -> None:
        queue.expired += 1
        if self.policy.expired_to_dlq and (queue.storage is not None or queue.name.startswith("queue://")):
            self.dead_letter(queue, entry, "message expired")
        else:
            queue.settle(entry)

    def dead_letter_queue_for(self, origin: str) -> str:
        if self.policy.individual_dlq and origin.startswith("queue://"):
            return "queue://DLQ." + dest.name_of(origin)
        return self.policy.dead_letter_queue

    def is_dead_letter_queue(self, name: str) -> bool:
        return self.policy.is_dead_letter_queue(name)

    def dead_letter(self, queue: MessageQueue, entry: Entry, reason: str) -> None:
        queue.settle(entry)
        queue.dead_lettered += 1
        message = entry.message
        if self.is_dead_letter_queue(queue.name):
            log.warn("dropping {id} from dead-letter queue {q}: {why}", id=message.id, q=queue.name, why=reason)
            return
        headers = dict(message.headers)
        headers[ORIGINAL_DESTINATION] = message.destination
        headers[DEAD_LETTER_CAUSE] = reason
        copy = message.copy(destination=self.dead_letter_queue_for(message.destination), headers=headers, expiration=0)
        self.queue(copy.destination).enqueue(Entry(copy, self.next_seq()))

    # -- topic subscriptions feeding existing queues ---------------------

    def add_subscription(
        self, queue: MessageQueue, destination: str, *, selector: MessageFilter | None = None, no_local: bool = False,
        owner_id: str | None = None, options: Options | None = None,
    ) -> Subscription:
        """A non-durable filter feeding ``queue`` (an MQTT clean session's queue)."""
        self.check_name(destination, allow_wildcards=True)
        sub = Subscription(queue, destination, selector=selector, no_local=no_local, owner_id=owner_id, options=options)
        self.topics.add(sub)
        return sub

    def remove_subscription(self, sub: Subscription) -> None:
        if sub.durable_key is not None:
            self.remove_durable(sub.durable_key)
        else:
            self.topics.remove(sub)

    def shared_subscription(self, group: str, destination: str) -> Subscription:
        """The queue a shared subscription's members consume from, one message to one member."""
        key = f"{group}\x1f{destination}"
        found = self.shared.get(key)
        if found is None:
            self.check_name(destination, allow_wildcards=True)
            queue = MessageQueue(f"shared://{group}/{dest.name_of(destination)}", self, max_redeliveries=-1)
            sub = Subscription(queue, destination)
            self.topics.add(sub)
            found = (sub, 0)
        self.shared[key] = (found[0], found[1] + 1)
        return found[0]

    def leave_shared(self, group: str, destination: str) -> None:
        key = f"{group}\x1f{destination}"
        found = self.shared.get(key)
        if found is None:
            return
        sub, members = found
        if members > 1:
            self.shared[key] = (sub, members - 1)
            return
        del self.shared[key]
        self.topics.remove(sub)
        sub.queue.purge()

    # -- durable subscriptions ------------------------------------------

    def durable_queue(self, queue_key: str) -> MessageQueue:
        queue = self.durable_queues.get(queue_key)
        if queue is None:
            storage = DurableStorage(self.store, queue_key, self.topic_messages)
            queue = self.durable_queues[queue_key] = MessageQueue(f"durable://{queue_key}", self, storage)
        return queue

    def durable_subscription(
        self, key: str, destination: str, selector_text: str | None, selector: MessageFilter | None, no_local: bool,
        *, queue_key: str | None = None, options: Options | None = None, user: str | None = None,
    ) -> Subscription:
        """Find or create a durable subscription; a changed definition starts afresh (as JMS).

        STOMP's durable subscriptions each have their own queue (queue_key is
        the key); an MQTT persistent session's filters all feed the session's
        one queue.
        """
        queue_key = queue_key or key
        existing = self.durables.get(key)
        if existing is not None:
            same = (
                existing.destination == destination and _selector_text(existing) == (selector_text or None)
                and existing.queue is self.durable_queues.get(queue_key)
            )
            if same and existing.options == options and existing.no_local == no_local:
                return existing
            if same:
                # Same messages, other delivery options (MQTT QoS, no local, retain
                # handling): update in place, keeping what the subscription holds.
                existing.redefine(options, no_local)
                self._save_durable(key, existing, queue_key, selector_text)
                return existing
            if existing.queue.consumers:
                # Replacing it would cut off its consumer and drop what it holds.
                raise SubscriptionError(f"durable subscription {key!r} is active; it cannot be redefined now")
            self.remove_durable(key)
        queue = self.durable_queue(queue_key)
        sub = Subscription(queue, destination, selector=selector, no_local=no_local, durable_key=key, options=options, user=user)
        self.durables[key] = sub
        self.topics.add(sub)
        self._save_durable(key, sub, queue_key, selector_text)
        return sub

    def _save_durable(self, key: str, sub: Subscription, queue_key: str, selector_text: str | None) -> None:
        record = {
            "destination": sub.destination, "selector": selector_text or None, "no_local": sub.no_local,
            "queue": queue_key, "options": _options_record(sub.options), "user": sub.user,
        }
        self.store.put_record(DURABLE_KIND, key, json.dumps(record).encode())

    def remove_durable(self, key: str) -> bool:
        """Remove one durable subscription; its queue goes with its last subscription."""
        sub = self.durables.pop(key, None)
        if sub is None:
            return False
        self.topics.remove(sub)
        self.store.delete_record(DURABLE_KIND, key)
        queue = sub.queue
        if not any(other.queue is queue for other in self.durables.values()):
            self._drop_durable_queue(queue)
        return True

    def remove_durable_queue(self, queue_key: str) -> None:
        """Remove a queue and every durable subscription feeding it (an MQTT session ends)."""
        queue = self.durable_queues.get(queue_key)
        if queue is None:
            return
        for key, sub in list(self.durables.items()):
            if sub.queue is queue:
                del self.durables[key]
                self.topics.remove(sub)
                self.store.delete_record(DURABLE_KIND, key)
        self._drop_durable_queue(queue)

    def _drop_durable_queue(self, queue: MessageQueue) -> None:
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
        queue.purge()
        for queue_key, q in list(self.durable_queues.items()):
            if q is queue:
                del self.durable_queues[queue_key]

    def durable(self, key: str) -> Subscription | None:
        """The durable subscription of that key, if there is one."""
        return self.durables.get(key)

    def subscription_count(self) -> int:
        """Topic subscriptions the broker feeds (durable or not, shared ones once)."""
        return len(self.topics)

    def subscriptions_of(self, queue: MessageQueue) -> list[Subscription]:
        return [sub for sub in self.durables.values() if sub.queue is queue]

    # -- recovery -------------------------------------------------------

    def recover(self) -> None:
        """Rebuild queues, durable subscriptions and scheduled messages from the store."""
        from core.selector import compile_selector

        store = self.store
        max_seq = 0
        marks = {key: int.from_bytes(raw, "big") for key, raw in store.iter_records(DELIVERED_KIND)}
        for key, raw in store.iter_records(META_KIND, "seq"):
            if key == "seq":
                max_seq = max(max_seq, int.from_bytes(raw, "big"))
        max_seq = max([max_seq, *marks.values()])
        self.duplicates.recover()
        self.streams.recover()
        for key, raw in store.iter_records(DURABLE_KIND):
            record = json.loads(raw)
            text = record.get("selector")
            selector = compile_selector(text) if text else None
            queue = self.durable_queue(record.get("queue") or key)
            sub = Subscription(
                queue, record["destination"], selector=selector, no_local=record.get("no_local", False),
                durable_key=key, options=record.get("options"), user=record.get("user"),
            )
            self.durables[key] = sub
            self.topics.add(sub)
        self.retained.recover()
        for name, _ in store.iter_records(CONSUMER_QUEUE_KIND):
            if self.virtual.topic_filter(name) is None or self.is_dead_letter_queue(name):
                store.delete_record(CONSUMER_QUEUE_KIND, name)  # not a consumer queue under this policy
            elif name not in self.queues:
                self._create_queue(name, recorded=True)
        for name, _ in store.iter_records(DECLARED_QUEUE_KIND):
            if name not in self.queues:
                self._create_queue(name, recorded=True)
        # Stored topic messages are only listed here; a durable subscriber's entry reads
        # its message below, unless it stays paged in the store.
        topic_stored: set[tuple[str, int]] = set()
        for destination in store.destinations():
            if destination.startswith("topic://"):
                for seq, _ in store.iter_messages(destination):
                    topic_stored.add((destination, seq))
                    max_seq = max(max_seq, seq)
                continue
            queue = self.queue(destination)
            mark = marks.get(destination, 0)
            queue.restore_mark(mark)
            storage = queue.storage
            count = storage.restored if isinstance(storage, QueueStorage) else self.store_usage.add
            for seq, data in store.iter_messages(destination):
                max_seq = max(max_seq, seq)
                if queue.over_memory():
                    queue.restore_paged(seq)  # stays in the store, not decoded
                    count(len(data))
                    continue
                # Handed out before the restart and never acked: flag it redelivered.
                entry = Entry(decode_message(data), seq, redeliveries=1 if seq <= mark else 0)
                queue.restore(entry)
                count(stored_size(entry))
        referenced: set[tuple[str, int]] = set()
        for key, raw in store.iter_records(DURABLE_REF_KIND):
            queue_key, seq_text = key.rsplit("\0", 1)
            seq = int(seq_text)
            topic = raw.decode()
            held = self.durable_queues.get(queue_key)
            if (topic, seq) not in topic_stored or held is None:
                store.delete_record(DURABLE_REF_KIND, key)  # a reference left by a crash
                continue
            mark = marks.get(queue_key, 0)
            held.restore_mark(mark)
            first_ref = self.topic_messages.restore_ref(seq)
            if held.over_memory():
                held.restore_paged(seq)
                size = RECORD_OVERHEAD
            else:
                stored = store.get_message(topic, seq)
                # (topic, seq) is in topic_stored, read from this store above: the message is there.
                assert stored is not None
                message = decode_message(stored)
                held.restore(Entry(message, seq, redeliveries=1 if seq <= mark else 0))
                size = len(message.body) + RECORD_OVERHEAD
            if first_ref:
                self.store_usage.add(size)
            referenced.add((topic, seq))
        for (topic, seq) in topic_stored - referenced:
            store.delete_message(topic, seq)  # nobody holds it any more
        for key, data in store.iter_records(SCHEDULED_KIND):
            due_text, seq_text = key.split(":", 1)
            message = decode_message(data)
            seq = int(seq_text)
            max_seq = max(max_seq, seq)
            delay = max(0.0, (int(due_text) - self.now_ms()) / 1000.0)
            self._scheduled[key] = self.clock.callLater(delay, self._fire, key, message)
        self._seq = max(self._seq, max_seq + 1)
        if max_seq:
            log.info(
                "recovered {q} queues, {d} durable subscriptions, {s} scheduled messages",
                q=len(self.queues), d=len(self.durables), s=len(self._scheduled),
            )


def _consumer_copy(message: Message, queue: str) -> Message:
    """A virtual topic's message as its consumer queue's: every field kept but the destination.

    Spelled out rather than ``Message.copy`` (a third of the cost, 1.1 us against
    2.8 us); tests/unit/test_broker.py checks that no field of Message is left out.
    """
    headers = dict(message.headers)
    headers[ORIGINAL_DESTINATION] = message.destination
    return Message(
        message.id, queue, message.body, headers, persistent=message.persistent, priority=message.priority,
        expiration=message.expiration, timestamp=message.timestamp, group_id=message.group_id,
        group_seq=message.group_seq, correlation_id=message.correlation_id, reply_to=message.reply_to,
        content_type=message.content_type, origin=message.origin,
    )


def _selector_text(sub: Subscription) -> str | None:
    selector = sub.selector
    if selector is None:
        return None
    return getattr(selector, "text", None) or None


def _options_record(options: Options | None) -> dict[str, Any] | None:
    """What a durable subscription's options are stored as (JSON)."""
    if options is None or isinstance(options, dict):
        return options
    return options.record()
