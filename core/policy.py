"""The core's part of the configuration: one typed object, passed down.

The gateway builds it from TOML and flags; the core never reads files or
the environment.  Defaults follow ActiveMQ where it has one.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Policy:
    # Redelivery: a message whose delivery failed more than this many times
    # goes to the dead-letter queue (ActiveMQ's maximumRedeliveries = 6).
    # -1 means redeliver forever.
    max_redeliveries: int = 6
    # Delay before a failed message is offered again, grown by the multiplier
    # for each further failure (ActiveMQ's redeliveryDelay/backOffMultiplier).
    redelivery_delay_ms: int = 0
    redelivery_backoff: float = 1.0
    # Dead letters go to this queue, or with individual_dlq to DLQ.<name>.
    dead_letter_queue: str = "queue://DLQ"
    individual_dlq: bool = False

    def is_dead_letter_queue(self, name: str) -> bool:
        """The shared DLQ, or any ``DLQ.<queue>`` (individual DLQs made while that policy was on stay DLQs)."""
        return name == self.dead_letter_queue or name.startswith("queue://DLQ.")
    # Whether expired messages are kept as dead letters (True) or dropped.
    expired_to_dlq: bool = True
    # Unacknowledged deliveries a consumer may hold when it names no prefetch.
    default_prefetch: int = 1000
    # How many recent messages a topic keeps for retroactive consumers (0: none).
    retroactive_count: int = 100
    # Bytes the recent-message windows of all topics may hold together; topics
    # published to least recently give theirs up first.
    retroactive_memory: int = 8 * 1024 * 1024
    # How many pending messages one dispatch pass looks at to find a match for
    # selectors and groups (ActiveMQ's maxPageSize): bounds the work per pass.
    max_page_size: int = 400
    # Seconds between sweeps that move expired messages out of idle queues.
    expiry_check_interval: float = 1.0
    # Bytes of pending messages one queue keeps in memory (0: no limit).  Beyond it a
    # queue's persistent messages stay only in the store and are paged back in as
    # consumers drain it (ActiveMQ's store cursor), so a deep backlog does not grow
    # the process.  Priority order holds within what is in memory.
    queue_memory_limit: int = 32 * 1024 * 1024
    # Bytes of pending messages all queues together keep in memory (0: no limit;
    # ActiveMQ's memoryUsage).  Beyond it every queue pages new arrivals.
    memory_limit: int = 256 * 1024 * 1024
    # Bytes of persistent messages the store may hold (0: no limit; ActiveMQ's storeUsage).
    # When reached, producers of persistent messages are held back ("block": their
    # socket is not read until consumers make room) or refused ("fail").
    store_limit: int = 10 * 1024 * 1024 * 1024
    store_full_policy: str = "block"
    # Default for messages whose producer did not say (STOMP `persistent`).
    default_persistent: bool = False
    # Duplicate-detection ids (``_AMQ_DUPL_ID``) remembered, broker-wide, in
    # arrival order (Artemis's id cache; 0 turns detection off).  A resend is
    # caught while its id is among the last this many: it must cover the
    # largest batch a producer may retry (a Spark micro-batch written by the sink).
    duplicate_cache_size: int = 100_000
    # Seconds between retention sweeps of the streams (age limits, reader leases).
    stream_retention_interval: float = 10.0
    # Seconds between the samples of the message totals kept for the last five
    # minutes (core/history.py), which the console's chart shows as soon as it
    # loads (/api/v1/overview/history); 0 keeps none.
    traffic_history_interval: float = 5.0
    # Bounds on a destination name a client may send to or subscribe to: levels
    # (EMQX's max_topic_levels is 128) and characters.  A device generating
    # topics in a loop must not make the broker walk or keep unbounded names.
    max_destination_levels: int = 128
    max_destination_length: int = 1024
    # Retained messages kept (topics) and their bytes in the store (0: no limit);
    # a new topic past either is not retained (EMQX's max_retained_messages).
    # Connections one authenticated user may have open at once (0: no limit); a
    # fleet sharing one account needs a high one, or accounts of their own.
    max_connections_per_user: int = 0
    max_retained_messages: int = 1_000_000
    max_retained_bytes: int = 1024 * 1024 * 1024
    # ActiveMQ's virtual topics.  A message published to a topic whose name starts
    # with virtual_topic_prefix ("" turns the feature off) is also copied into every
    # consumer queue of it that exists: a queue named virtual_topic_consumer_prefix +
    # the topic's name, where each ``*`` level of the prefix is a consumer group
    # (``queue://Consumer.A.VirtualTopic.orders``).  The topic part may be a filter
    # (``Consumer.A.VirtualTopic.>``).  The consumer prefix is levels, each ending
    # in ``.``; it may be empty (the queue has the topic's name).
    virtual_topic_prefix: str = "VirtualTopic."
    virtual_topic_consumer_prefix: str = "Consumer.*."
