"""A client connection as the core sees it, whatever its protocol.

Sessions call these methods; the connection owns what dies with the client
(consumers, open transactions, temporary queues) and puts back what the
client held but did not acknowledge.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from core import destination as dest
from core.access import Reader
from core.network import PathFilter
from core.consumer import AckMode, Consumer, Sink
from core.entry import Entry
from core.errors import (
    BrokerError,
    SubscriptionError,
    UnknownDelivery,
    UnknownDestination,
    UnknownTransaction,
)
from core.message import Message
from core.queue import Host as QueueHost
from core.queue import MessageQueue
from core.selector import Selector, SelectorError, compile_selector
from core.topic import MessageFilter, Subscription

if TYPE_CHECKING:
    from core.stream import Stream
    from core.stream_feed import StreamFeed


class Closer(Protocol):
    """The session of a connection, which can end it telling the client why (the core imports no protocol)."""

    def close_by_admin(self, reason: str) -> None: ...


class Host(QueueHost, Protocol):
    """What a connection needs from its broker (beyond what the queues it makes need).

    The broker keeps its own tables (connections, durable subscriptions,
    temporary queues, streams); a connection asks and tells through these.
    """

    # -- destinations and routing
    def check_name(self, destination: str, allow_wildcards: bool) -> None: ...

    def check_destination(self, destination: str) -> None: ...

    def check_new_queue(self, name: str) -> None: ...

    def send(self, message: Message, delay_ms: int = 0) -> None: ...

    def retain(self, message: Message, bounded: bool = True) -> None: ...

    def queue(self, name: str) -> MessageQueue: ...

    def create_temp_queue(self, owner: Connection, name: str) -> str: ...

    def delete_temp_queue(self, canonical: str) -> None: ...

    def temp_queue_owner(self, canonical: str) -> str | None: ...

    def stream(self, name: str) -> Stream: ...

    # -- topic subscriptions
    def add_subscription(
        self, queue: MessageQueue, destination: str, *, selector: MessageFilter | None = None, no_local: bool = False,
        owner_id: str | None = None,
    ) -> Subscription: ...

    def remove_subscription(self, sub: Subscription) -> None: ...

    def durable(self, key: str) -> Subscription | None: ...

    def durable_subscription(
        self, key: str, destination: str, selector_text: str | None, selector: Selector | None, no_local: bool,
        *, user: str | None = None,
    ) -> Subscription: ...

    def remove_durable(self, key: str) -> bool: ...

    def replay(self, filter_levels: tuple[str, ...]) -> list[tuple[int, Message]]: ...

    # -- acknowledgements, durability, life
    def redeliver(self, queue: MessageQueue, entries: list[Entry], reason: str) -> None: ...

    def when_durable(self, callback: Callable[[], None]) -> None: ...

    def forget_connection(self, connection: Connection) -> None: ...


class Transaction:
    """Work held back until COMMIT: sends to route, entries to settle or to fail."""

    __slots__ = ("id", "sends", "settles", "failures")

    def __init__(self, id: str) -> None:
        self.id = id
        self.sends: list[tuple[Message, int]] = []
        self.settles: list[tuple[MessageQueue, Entry]] = []
        self.failures: list[tuple[MessageQueue, Entry]] = []


class Connection:
    # One per client connection: slots, for the memory of many idle ones.
    __slots__ = (
        "broker", "id", "client_id", "protocol", "remote", "user", "writable", "output_held", "consumers", "_subscriptions",
        "_transactions", "_temp_queues", "_feeds", "closed", "_consumers_made", "since_ms", "messages_in",
        "messages_out", "messages_denied", "closer",
    )

    def __init__(self, broker: Host, id: str, client_id: str | None, protocol: str = "", remote: str = "") -> None:
        self.broker = broker
        self.id = id
        self.client_id = client_id
        self.protocol = protocol
        self.remote = remote
        self.user: str | None = None  # the authenticated user, counted for max_connections_per_user
        # False while the client's socket cannot take more: consumers then have no credit.
        self.writable = True
        # True while its session holds as much output as it may until the disk syncs
        # (protocols.outbox.HOLD_BYTES): its consumers have no credit either.
        self.output_held = False
        self.consumers: dict[str, Consumer] = {}
        # The rest is made on first use: an empty dict is 64 bytes, and an idle
        # connection (most of 10,000 devices) has no topic subscription, stream
        # feed, transaction or temporary queue.
        self._subscriptions: dict[Consumer, Subscription] | None = None
        self._transactions: dict[str, Transaction] | None = None
        self._temp_queues: dict[str, None] | None = None  # keys only: a dict is 64 bytes empty, a set 216
        self._feeds: dict[Consumer, "StreamFeed"] | None = None
        self.closed = False
        self._consumers_made = 0
        # For operators (admin API, metrics): when it connected, and messages it sent and was given,
        # counted with one int increment where the core already handles each one.
        self.since_ms = broker.now_ms()
        self.messages_in = 0
        self.messages_out = 0  # counted by its consumers (core.consumer.Consumer.deliver)
        self.messages_denied = 0  # deliveries skipped because its rules deny the topic (Consumer.check)
        # The session that ends it when an operator asks, telling the client the reason
        # (STOMP ERROR, MQTT 5 DISCONNECT 0x98); set by the session, which the core cannot import.
        # The object, not its bound method: that was 64 bytes of every idle connection.
        self.closer: Closer | None = None

    def subscription_of(self, consumer: Consumer) -> Subscription | None:
        """The topic subscription a consumer of this connection reads, if it reads one."""
        subs = self._subscriptions
        return None if subs is None else subs.get(consumer)

    def feed_of(self, consumer: Consumer) -> "StreamFeed | None":
        """The stream feed a consumer of this connection reads, if it reads a stream."""
        feeds = self._feeds
        return None if feeds is None else feeds.get(consumer)

    @property
    def open_transactions(self) -> int:
        return 0 if self._transactions is None else len(self._transactions)

    def _next_consumer_id(self) -> str:
        self._consumers_made += 1
        return f"{self.id}/{self._consumers_made}"

    @property
    def identity(self) -> str:
        """Who published, for no-local: the client id when there is one, so it holds across reconnects."""
        return self.client_id or self.id

    # -- producing ------------------------------------------------------

    def send(self, message: Message, transaction: str | None = None, delay_ms: int = 0, retain: bool = False) -> None:
        self.broker.check_destination(message.destination)
        if retain:
            if not message.destination.startswith("topic://"):
                raise BrokerError("only topic messages can be retained")
            self.broker.retain(message)
        if message.destination.startswith("temp-queue://") and self.broker.temp_queue_owner(message.destination) is None:
            raise UnknownDestination(f"temporary queue {message.destination} does not exist (its owner has gone)")
        message.origin = self.identity
        self.messages_in += 1
        if transaction is not None:
            self._transaction(transaction).sends.append((message, delay_ms))
        else:
            self.broker.send(message, delay_ms)

    def temp_queue(self, name: str) -> str:
        """This connection's temporary queue of that name, created on first use."""
        canonical = self.broker.create_temp_queue(self, name)
        if self._temp_queues is None:
            self._temp_queues = {}
        self._temp_queues[canonical] = None
        return canonical

    # -- consuming ------------------------------------------------------

    def subscribe(
        self,
        destination: str,
        sink: Sink,
        *,
        ack_mode: AckMode = AckMode.AUTO,
        prefetch: int | None = None,
        selector: str | None = None,
        exclusive: bool = False,
        durable_name: str | None = None,
        retroactive: bool = False,
        no_local: bool = False,
        handle: object = None,
        stream_offset: str | None = None,
        stream_partition: int | None = None,
        check: Reader | None = None,
        network: PathFilter | None = None,
    ) -> Consumer:
        """``check``: given for a topic subscription a deny rule overlaps; set before the
        consumer is added, so that not even a durable subscription's backlog passes unchecked.
        ``network``: the subscriber is another broker of the network, consuming for its own
        consumers; it filters as a selector would, and a queue serves it after local consumers."""
        broker = self.broker
        broker.check_name(destination, allow_wildcards=True)
        if destination.startswith("queue://"):
            broker.check_new_queue(destination)
        if destination.startswith("stream://"):
            return self._subscribe_stream(
                destination, sink, ack_mode, prefetch, stream_offset or "next", stream_partition, handle,
            )
        compiled = None
        if selector is not None and selector.strip():
            try:
                compiled = compile_selector(selector)
            except SelectorError as exc:
                raise SubscriptionError(f"invalid selector: {exc}") from None
        consumer_id = self._next_consumer_id()
        if prefetch is None:
            prefetch = broker.policy.default_prefetch

        if destination.startswith("topic://"):
            if durable_name:
                if not self.client_id:
                    raise SubscriptionError("a durable subscription needs a client id on the connection")
                key = f"{self.client_id}:{durable_name}"
                prior = broker.durable(key)
                if prior is not None and prior.user != self.user:
                    raise SubscriptionError(f"durable subscription {durable_name!r} of client {self.client_id!r} is another user's")
                sub = broker.durable_subscription(key, destination, selector, compiled, no_local, user=self.user)
                # A returning subscriber kept receiving while away: replaying would duplicate.
                retroactive = retroactive and sub is not prior
                if sub.queue.consumers:
                    raise SubscriptionError(f"durable subscription {durable_name!r} of client {self.client_id!r} is already active")
                sub.owner_id = self.identity
            else:
                queue = MessageQueue(f"subscription://{consumer_id}", broker)
                sub = broker.add_subscription(
                    queue, destination, selector=network or compiled, no_local=no_local, owner_id=self.identity,
                )
            if retroactive:
                for seq, message in broker.replay(sub.levels):
                    if sub.wants(message):
                        sub.queue.enqueue(Entry(message, seq))
            consumer = Consumer(
                consumer_id, self, sub.queue, sink, ack_mode=ack_mode, prefetch=prefetch, handle=handle, check=check,
            )
            if self._subscriptions is None:
                self._subscriptions = {}
            self._subscriptions[consumer] = sub
        else:
            if destination.startswith("temp-queue://"):
                owner = broker.temp_queue_owner(destination)
                if owner is None:
                    raise UnknownDestination(f"temporary queue {destination} does not exist")
                if owner != self.id:
                    raise SubscriptionError("only the connection that created a temporary queue can consume from it")
            queue = broker.queue(destination)
            consumer = Consumer(
                consumer_id, self, queue, sink, ack_mode=ack_mode, prefetch=prefetch,
                selector=network or compiled, exclusive=exclusive, handle=handle, remote=network is not None,
            )
        self.consumers[consumer_id] = consumer
        consumer.queue.add_consumer(consumer)
        return consumer

    def _subscribe_stream(
        self, destination: str, sink: Sink, ack_mode: AckMode, prefetch: int | None, offset: str,
        partition: int | None, handle: object,
    ) -> Consumer:
        """A consumer of a stream from ``offset`` on (RabbitMQ's ``x-stream-offset``), then live."""
        from core.stream_feed import StreamFeed, resolve_offsets  # pyarrow: loaded with the first stream

        broker = self.broker
        stream = broker.stream(dest.name_of(destination))
        if partition is not None:
            stream.partition(partition)  # an unknown partition is refused here
        try:
            positions = resolve_offsets(stream, offset, partition, broker.now_ms())
        except ValueError as exc:
            raise SubscriptionError(str(exc)) from None
        consumer_id = self._next_consumer_id()
        # A stream record is never dead-lettered (max_redeliveries -1): it stays in the log.
        queue = MessageQueue(f"stream-feed://{stream.name}/{consumer_id}", broker, max_redeliveries=-1)
        feed = StreamFeed(stream, queue, positions)
        queue.refill_from(feed.fill)
        prefetch = broker.policy.default_prefetch if prefetch is None else prefetch
        consumer = Consumer(consumer_id, self, queue, sink, ack_mode=ack_mode, prefetch=prefetch, handle=handle)
        self.consumers[consumer_id] = consumer
        if self._feeds is None:
            self._feeds = {}
        self._feeds[consumer] = feed
        queue.add_consumer(consumer)
        feed.fill()
        return consumer

    def consume(
        self, queue: MessageQueue, sink: Sink, *, ack_mode: AckMode = AckMode.CLIENT_INDIVIDUAL,
        prefetch: int | None = None, handle: object = None, check: Reader | None = None,
    ) -> Consumer:
        """Attach a consumer to a queue the protocol manages itself (an MQTT session or shared queue)."""
        consumer_id = self._next_consumer_id()
        prefetch = self.broker.policy.default_prefetch if prefetch is None else prefetch
        consumer = Consumer(consumer_id, self, queue, sink, ack_mode=ack_mode, prefetch=prefetch, handle=handle, check=check)
        self.consumers[consumer_id] = consumer
        queue.add_consumer(consumer)
        return consumer

    def unsubscribe(self, consumer: Consumer, *, remove_durable: bool = False) -> None:
        if self.consumers.pop(consumer.id, None) is None:
            return
        queue = consumer.queue
        unacked = queue.remove_consumer(consumer)
        feed = None if self._feeds is None else self._feeds.pop(consumer, None)
        if feed is not None:
            feed.close()  # what it held unacknowledged is still in the stream
            queue.purge()  # and so is what it had read ahead (the queue is unstored: nothing to delete)
            return
        sub = None if self._subscriptions is None else self._subscriptions.pop(consumer, None)
        if sub is not None and sub.durable_key is None:
            # A plain topic subscription ends with its consumer; what it held is gone.
            self.broker.remove_subscription(sub)
            return
        if unacked:
            self.broker.redeliver(queue, unacked, "consumer closed")
        if sub is not None and remove_durable:
            self.broker.remove_subscription(sub)  # durable here: removes it and, with its last one, its queue

    def remove_durable(self, name: str) -> bool:
        """Drop an inactive durable subscription of this client (UNSUBSCRIBE by name)."""
        if not self.client_id:
            raise SubscriptionError("removing a durable subscription needs a client id on the connection")
        key = f"{self.client_id}:{name}"
        sub = self.broker.durable(key)
        if sub is None:
            return False
        if sub.user != self.user:
            raise SubscriptionError(f"durable subscription {name!r} of client {self.client_id!r} is another user's")
        if sub.queue.consumers:
            raise SubscriptionError(f"durable subscription {name!r} is active")
        return self.broker.remove_durable(key)

    # -- acknowledging --------------------------------------------------

    def _take(self, consumer: Consumer, tag: int, transaction: str | None) -> tuple[Transaction | None, list[Entry]]:
        # Look the transaction up before taking anything: a refused ack must leave the delivery held.
        tx = self._transaction(transaction) if transaction is not None else None
        entries = consumer.take(tag)
        if not entries:
            raise UnknownDelivery("no unacknowledged message with that id on this subscription")
        return tx, entries

    def ack(self, consumer: Consumer, tag: int, transaction: str | None = None) -> None:
        tx, entries = self._take(consumer, tag, transaction)
        queue = consumer.queue
        if tx is not None:
            tx.settles.extend((queue, e) for e in entries)
        else:
            for entry in entries:
                queue.settle(entry)
        queue.dispatch()

    def nack(self, consumer: Consumer, tag: int, transaction: str | None = None) -> None:
        tx, entries = self._take(consumer, tag, transaction)
        queue = consumer.queue
        if tx is not None:
            tx.failures.extend((queue, e) for e in entries)
            queue.dispatch()
        else:
            self.broker.redeliver(queue, entries, "rejected by the consumer (NACK)")

    # -- transactions ---------------------------------------------------

    def _transaction(self, tx_id: str) -> Transaction:
        tx = None if self._transactions is None else self._transactions.get(tx_id)
        if tx is None:
            raise UnknownTransaction(f"transaction {tx_id!r} has not been started")
        return tx

    def _end_transaction(self, tx_id: str) -> Transaction:
        tx = None if self._transactions is None else self._transactions.pop(tx_id, None)
        if tx is None:
            raise UnknownTransaction(f"transaction {tx_id!r} has not been started")
        return tx

    def begin(self, tx_id: str) -> None:
        if self._transactions is None:
            self._transactions = {}
        if tx_id in self._transactions:
            raise BrokerError(f"transaction {tx_id!r} is already started")
        self._transactions[tx_id] = Transaction(tx_id)

    def commit(self, tx_id: str) -> None:
        tx = self._end_transaction(tx_id)
        broker = self.broker
        for message, delay in tx.sends:
            try:
                broker.send(message, delay)
            except UnknownDestination:
                pass  # a temporary queue that died since the send: as if sent before it died
        for queue, entry in tx.settles:
            queue.settle(entry)
        for queue, entries in _by_queue(tx.failures):
            broker.redeliver(queue, entries, "rejected by the consumer (NACK)")

    def abort(self, tx_id: str) -> None:
        tx = self._end_transaction(tx_id)
        for queue, entries in _by_queue(tx.settles + tx.failures):
            self.broker.redeliver(queue, entries, "transaction aborted")

    # -- flow and life --------------------------------------------------

    def when_durable(self, callback: Callable[[], None]) -> None:
        self.broker.when_durable(callback)

    def pause(self) -> None:
        self.writable = False

    def resume(self) -> None:
        self.writable = True
        for consumer in list(self.consumers.values()):
            consumer.queue.dispatch()

    def hold_output(self) -> None:
        """Its session holds as many bytes for the store's sync as it may: no more deliveries.

        Apart from ``pause`` (the socket is full): a release of those bytes can
        come while the socket is full, and must not give back what Twisted took.
        """
        self.output_held = True

    def release_output(self) -> None:
        if not self.output_held:
            return
        self.output_held = False
        if self.writable:
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()

    def close_for(self, reason: str) -> bool:
        """An operator closes this connection: its session tells the client ``reason`` and closes.

        False when no session can (it is closing already, or it registered no closer).
        """
        closer = self.closer
        if closer is None or self.closed:
            return False
        closer.close_by_admin(reason)
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.writable = False
        if self._transactions is not None:
            for tx_id in list(self._transactions):
                self.abort(tx_id)
        for consumer in list(self.consumers.values()):
            self.unsubscribe(consumer)
        if self._temp_queues is not None:
            for name in self._temp_queues:
                self.broker.delete_temp_queue(name)
            self._temp_queues = None
        self.broker.forget_connection(self)


def _by_queue(pairs: list[tuple[MessageQueue, Entry]]) -> list[tuple[MessageQueue, list[Entry]]]:
    grouped: dict[int, tuple[MessageQueue, list[Entry]]] = {}
    for queue, entry in pairs:
        grouped.setdefault(id(queue), (queue, []))[1].append(entry)
    for _, entries in grouped.values():
        entries.sort(key=lambda e: e.seq)
    return list(grouped.values())
