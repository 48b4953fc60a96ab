"""``/metrics``: the broker's figures in the Prometheus text format (prometheus-client).

One custom collector builds every metric family from live state when
Prometheus scrapes: nothing is counted per message for it beyond the integers
the core keeps anyway, and a scrape costs O(queues + connections + consumers),
with per-queue series capped by ``[admin] metrics_max_destinations`` (the
deepest queues first, among those ``metrics_destinations`` names when it is
set).  Totals over every queue are always exported, so a capped scrape still
adds up.  Each broker has a registry of its own: no process-global state.

Requires ``admin`` on ``broker://metrics`` once users are configured
(Prometheus sends HTTP Basic credentials with ``basic_auth`` in its scrape config).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from twisted.logger import Logger
from twisted.web import server

from core.access import Permission
from core.broker import Broker
from core.queue import MessageQueue
from core.trie import filter_matches
from gateway.admin.bridges import BridgeStatus
from gateway.admin.descriptions import oldest_timestamp
from gateway.admin.http import Router, require
from gateway.admin.names import QUEUE_PREFIX
from persistence.rocks import RocksStore
from persistence.stats import Buckets
from persistence.store import StoreError

log = Logger(namespace="gateway.admin")

RESOURCE = "broker://metrics"


class LoginCounts(Protocol):
    """What the authenticator counts (gateway/auth/authenticator.py)."""

    failed_logins: int
    refused_logins: int


def protocol_family(protocol: str) -> str:
    """``stomp/1.2`` -> ``stomp``: series by protocol, not by version."""
    return protocol.split("/", 1)[0] or "unknown"


def _histogram(name: str, documentation: str, buckets: Buckets) -> HistogramMetricFamily:
    cumulative = [(("+Inf" if bound == float("inf") else repr(bound)), float(n)) for bound, n in buckets.cumulative()]
    return HistogramMetricFamily(name, documentation, buckets=cumulative, sum_value=buckets.sum)


class BrokerCollector(Collector):
    def __init__(
        self, broker: Broker, version: str, max_destinations: int = 1000, patterns: list[str] | None = None,
        logins: LoginCounts | None = None, bridges: BridgeStatus | None = None,
    ) -> None:
        self.broker = broker
        self.version = version
        self.max_destinations = max_destinations
        self.patterns = [tuple(p[len(QUEUE_PREFIX):].split(".")) for p in (patterns or [])]
        self.logins = logins
        self.bridges = bridges
        # Which queues the patterns admit, by name: queues come and go, patterns do not.
        self._admitted: dict[str, bool] = {}

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry must not scrape the broker when the collector is registered."""
        return []

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        info = GaugeMetricFamily("gateway_info", "The broker's name and version", labels=["name", "version"])
        info.add_metric([broker.name, self.version], 1)
        yield info
        yield GaugeMetricFamily("gateway_uptime_seconds", "Seconds since the broker started",
                                value=max(0.0, broker.clock.seconds() - broker.started_at))
        yield from self._connections()
        yield from self._queues()
        yield from self._topics()
        yield from self._store()
        yield from self._streams()
        yield from self._auth()
        yield from self._denied_deliveries()
        yield from self._bridges()

    # -- connections and traffic ----------------------------------------------

    def _connections(self) -> Iterator[Metric]:
        broker = self.broker
        open_by: dict[str, int] = {}
        received: dict[str, int] = {}
        sent: dict[str, int] = {}
        for conn in broker.connections.values():
            family = protocol_family(conn.protocol)
            open_by[family] = open_by.get(family, 0) + 1
            received[family] = received.get(family, 0) + conn.messages_in
            sent[family] = sent.get(family, 0) + conn.messages_out
        for protocol, (done_in, done_out) in broker.closed_traffic.items():
            family = protocol_family(protocol)
            received[family] = received.get(family, 0) + done_in
            sent[family] = sent.get(family, 0) + done_out
        for family in ("stomp", "mqtt"):  # always present, so a graph starts at 0 rather than nowhere
            open_by.setdefault(family, 0)
            received.setdefault(family, 0)
            sent.setdefault(family, 0)
        connections = GaugeMetricFamily("gateway_connections", "Open client connections", labels=["protocol"])
        for family, n in sorted(open_by.items()):
            connections.add_metric([family], n)
        yield connections
        ins = CounterMetricFamily("gateway_messages_received", "Messages clients sent to the broker", labels=["protocol"])
        for family, n in sorted(received.items()):
            ins.add_metric([family], n)
        yield ins
        outs = CounterMetricFamily("gateway_messages_sent", "Messages the broker delivered to clients", labels=["protocol"])
        for family, n in sorted(sent.items()):
            outs.add_metric([family], n)
        yield outs
        yield CounterMetricFamily("gateway_messages_routed", "Messages routed to destinations from every source "
                                  "(clients, HTTP, scheduled deliveries, wills)", value=broker.messages_received)
        dropped = CounterMetricFamily("gateway_messages_dropped", "Messages the broker dropped, by reason", labels=["reason"])
        dropped.add_metric(["duplicate"], broker.duplicates.dropped)
        yield dropped

    # -- queues -----------------------------------------------------------------

    def _admits(self, name: str) -> bool:
        if not self.patterns:
            return True
        known = self._admitted.get(name)
        if known is None:
            if len(self._admitted) >= 100_000:
                self._admitted.clear()
            levels = tuple(name[len(QUEUE_PREFIX):].split("."))
            known = self._admitted[name] = any(filter_matches(p, levels) for p in self.patterns)
        return known

    def _queues(self) -> Iterator[Metric]:
        broker = self.broker
        now = broker.now_ms()
        queues = [q for name, q in broker.queues.items() if name.startswith(QUEUE_PREFIX)]
        totals = {"messages": 0, "consumers": 0, "enqueued": 0, "dequeued": 0, "expired": 0, "dead_lettered": 0}
        depth: dict[int, int] = {}
        for q in queues:
            n = len(q) + q.inflight
            depth[id(q)] = n
            totals["messages"] += n
            totals["consumers"] += len(q.consumers)
            totals["enqueued"] += q.enqueued
            totals["dequeued"] += q.dequeued
            totals["expired"] += q.expired
            totals["dead_lettered"] += q.dead_lettered
        candidates = [q for q in queues if self._admits(q.name)]
        cap = self.max_destinations
        if len(candidates) > cap:
            shown = heapq.nlargest(cap, candidates, key=lambda q: depth[id(q)])
        else:
            shown = candidates
        shown.sort(key=lambda q: q.name)

        yield GaugeMetricFamily("gateway_queues", "Queues (temporary ones excluded)", value=len(queues))
        yield GaugeMetricFamily("gateway_queue_series_omitted",
                                "Queues without series of their own (metrics_max_destinations, metrics_destinations)",
                                value=len(queues) - len(shown))
        yield GaugeMetricFamily("gateway_queues_messages", "Messages in all queues, ready and unacknowledged", value=totals["messages"])
        yield GaugeMetricFamily("gateway_queues_consumers", "Consumers of all queues", value=totals["consumers"])
        for key, what in (("enqueued", "enqueued to"), ("dequeued", "dequeued from"),
                          ("expired", "expired in"), ("dead_lettered", "dead-lettered from")):
            yield CounterMetricFamily(f"gateway_queues_{key}", f"Messages {what} all existing queues", value=totals[key])

        families: dict[str, Any] = {
            "messages": GaugeMetricFamily("gateway_queue_messages", "Messages in the queue, ready and unacknowledged", labels=["queue"]),
            "ready": GaugeMetricFamily("gateway_queue_messages_ready", "Messages waiting for a consumer", labels=["queue"]),
            "unacked": GaugeMetricFamily("gateway_queue_messages_unacknowledged", "Messages delivered and not yet acknowledged", labels=["queue"]),
            "consumers": GaugeMetricFamily("gateway_queue_consumers", "Consumers of the queue", labels=["queue"]),
            "enqueued": CounterMetricFamily("gateway_queue_enqueued", "Messages enqueued to the queue", labels=["queue"]),
            "dequeued": CounterMetricFamily("gateway_queue_dequeued", "Messages that left the queue (acknowledged, expired, dead-lettered)", labels=["queue"]),
            "expired": CounterMetricFamily("gateway_queue_expired", "Messages that expired in the queue", labels=["queue"]),
            "dead_lettered": CounterMetricFamily("gateway_queue_dead_lettered", "Messages moved from the queue to a dead-letter queue", labels=["queue"]),
            "memory": GaugeMetricFamily("gateway_queue_memory_bytes", "Bytes the queue's waiting messages take in memory (estimate)", labels=["queue"]),
            "age": GaugeMetricFamily("gateway_queue_oldest_message_age_seconds", "Age of the oldest waiting message", labels=["queue"]),
        }
        for q in shown:
            self._queue_series(families, q, depth[id(q)], now)
        yield from families.values()

    @staticmethod
    def _queue_series(families: dict[str, Any], q: MessageQueue, messages: int, now: int) -> None:
        label = [q.name[len(QUEUE_PREFIX):]]
        ready = len(q)
        families["messages"].add_metric(label, messages)
        families["ready"].add_metric(label, ready)
        families["unacked"].add_metric(label, messages - ready)
        families["consumers"].add_metric(label, len(q.consumers))
        families["enqueued"].add_metric(label, q.enqueued)
        families["dequeued"].add_metric(label, q.dequeued)
        families["expired"].add_metric(label, q.expired)
        families["dead_lettered"].add_metric(label, q.dead_lettered)
        families["memory"].add_metric(label, q.pending.bytes)
        if q.pending.size:  # the paged-only case would read the store: not on every scrape
            oldest = oldest_timestamp(q)
            if oldest is not None:
                families["age"].add_metric(label, max(0, now - oldest) / 1000)

    # -- topics, memory, store ----------------------------------------------------

    def _topics(self) -> Iterator[Metric]:
        broker = self.broker
        yield GaugeMetricFamily("gateway_topic_subscriptions", "Topic subscriptions (durable or not, MQTT ones included)",
                                value=broker.subscription_count())
        yield GaugeMetricFamily("gateway_durable_subscriptions", "Durable topic subscriptions", value=len(broker.durables))
        yield GaugeMetricFamily("gateway_retained_messages", "Retained messages", value=len(broker.retained))
        yield GaugeMetricFamily("gateway_scheduled_messages", "Messages waiting for their scheduled delivery", value=broker.scheduled_count)

    def _store(self) -> Iterator[Metric]:
        broker = self.broker
        yield GaugeMetricFamily("gateway_memory_pending_bytes", "Bytes of waiting messages all queues hold in memory (estimate)",
                                value=broker.memory.bytes)
        yield GaugeMetricFamily("gateway_memory_limit_bytes", "The limit on them (memory_limit; 0: none)", value=broker.memory.limit)
        usage = broker.store_usage
        yield GaugeMetricFamily("gateway_store_usage_bytes", "Bytes of persistent messages in the store, as the store limit counts them",
                                value=usage.bytes)
        yield GaugeMetricFamily("gateway_store_limit_bytes", "The store limit (store_limit; 0: none)", value=usage.limit)
        yield GaugeMetricFamily("gateway_store_full", "1 while producers of stored messages are held or refused (store limit or alarm)",
                                value=1 if usage.full else 0)
        if usage.disk_free >= 0:
            yield GaugeMetricFamily("gateway_disk_free_bytes", "Free bytes on the store's filesystem, as last checked",
                                    value=usage.disk_free)
            yield GaugeMetricFamily("gateway_disk_free_limit_bytes", "The free-space floor (disk_free_limit; 0: none)",
                                    value=usage.disk_free_limit)
        yield GaugeMetricFamily("gateway_store_alarm", "1 while the disk is below its floor or the store cannot write",
                                value=1 if usage.alarm is not None else 0)
        yield GaugeMetricFamily("gateway_store_fault", "1 while the store cannot write (nothing is confirmed)",
                                value=1 if usage.faulted else 0)
        yield CounterMetricFamily("gateway_store_faults", "Runs of failed store writes since start", value=usage.faults)
        store = broker.store
        if not isinstance(store, RocksStore):
            return
        try:
            sizes = store.family_sizes()
        except StoreError:  # the store closing under a scrape
            sizes = {}
        sst = GaugeMetricFamily("gateway_store_sst_bytes", "Bytes in SST files, per RocksDB column family", labels=["family"])
        mem = GaugeMetricFamily("gateway_store_memtable_bytes", "Bytes in memtables, per RocksDB column family", labels=["family"])
        for family, (on_disk, in_memory) in sorted(sizes.items()):
            sst.add_metric([family], on_disk)
            mem.add_metric([family], in_memory)
        yield sst
        yield mem
        yield _histogram("gateway_store_batch_operations", "Operations per group-commit batch written", store.batch_ops)
        yield _histogram("gateway_store_write_seconds", "Seconds per group-commit batch write (with fsync when sync = true)",
                         store.write_seconds)
        syncs = CounterMetricFamily("gateway_store_syncs", "Write-ahead log syncs, by the thread that ran them "
                                    "(reactor: inline, while the disk is fast; worker)", labels=["thread"])
        syncs.add_metric(["reactor"], store.inline_syncs)
        syncs.add_metric(["worker"], store.worker_syncs)
        yield syncs
        yield GaugeMetricFamily("gateway_store_inline_sync_seconds", "Moving average of the inline syncs' seconds "
                                "(past [persistence] inline_sync_below_ms, syncs go to the worker thread)",
                                value=store.sync_seconds)

    # -- streams and logins ---------------------------------------------------------

    def _streams(self) -> Iterator[Metric]:
        streams = self.broker.streams.streams
        if not streams:
            return
        now = self.broker.now_ms()
        records = CounterMetricFamily("gateway_stream_records", "Records appended to the stream partition (its next offset)",
                                      labels=["stream", "partition"])
        first = GaugeMetricFamily("gateway_stream_first_offset", "The earliest offset retention keeps", labels=["stream", "partition"])
        size = GaugeMetricFamily("gateway_stream_bytes", "Bytes the partition's chunks take in the store", labels=["stream", "partition"])
        lag = GaugeMetricFamily("gateway_stream_reader_lag", "Records a registered reader has yet to read, per partition",
                                labels=["stream", "reader", "partition"])
        for stream in streams.values():
            for p in stream.partitions:
                labels = [stream.name, str(p.index)]
                records.add_metric(labels, p.end)
                first.add_metric(labels, p.first)
                size.add_metric(labels, p.bytes)
            for reader in stream.readers.values():
                if reader.expires_ms <= now:
                    continue
                for p in stream.partitions:
                    position = max(reader.offsets.get(p.index, p.first), p.first)
                    lag.add_metric([stream.name, reader.name, str(p.index)], max(0, p.end - position))
        yield records
        yield first
        yield size
        yield lag

    def _auth(self) -> Iterator[Metric]:
        logins = self.logins
        if logins is None:
            return
        failures = CounterMetricFamily("gateway_auth_failures", "Refused logins, every protocol and the admin listener", labels=["reason"])
        failures.add_metric(["bad_credentials"], logins.failed_logins)
        failures.add_metric(["address_banned"], logins.refused_logins)
        yield failures

    def _denied_deliveries(self) -> Iterator[Metric]:
        """A wildcard subscription a deny rule overlaps is granted and filtered at delivery: what it skipped."""
        yield CounterMetricFamily(
            "gateway_deliveries_denied", "Deliveries skipped because the subscriber's rules deny the topic "
            "(wildcard subscriptions that a deny rule overlaps)", value=self.broker.deliveries_denied,
        )

    # -- bridges --------------------------------------------------------------------------

    def _bridges(self) -> Iterator[Metric]:
        """Per bridge, label ``bridge`` (its configured name); nothing at all where none is configured."""
        statuses = self.bridges() if self.bridges is not None else []
        if not statuses:
            return
        labels = ["bridge"]
        connected = GaugeMetricFamily("gateway_bridge_connected", "1 while the bridge's link to its remote is up", labels=labels)
        queued = GaugeMetricFamily("gateway_bridge_queued_messages", "Messages waiting in the bridge's outbound queue",
                                   labels=labels)
        inflight = GaugeMetricFamily("gateway_bridge_inflight_messages", "Messages sent to the remote and not yet confirmed",
                                     labels=labels)
        messages = CounterMetricFamily("gateway_bridge_messages", "Messages the bridge moved: out, confirmed by the remote "
                                       "(QoS 0: sent); in, stored here and acknowledged to the remote", labels=["bridge", "direction"])
        refused = CounterMetricFamily("gateway_bridge_refused", "Outbound messages the remote refused (an error code, or over its maximum packet size)",
                                      labels=labels)
        connects = CounterMetricFamily("gateway_bridge_connects", "Times the bridge's link came up", labels=labels)
        loops = CounterMetricFamily("gateway_bridge_loops_dropped", "Messages not forwarded either way because their path "
                                    "names the broker they would go to", labels=labels)
        for status in sorted(statuses, key=lambda s: s["name"]):
            name = [status["name"]]
            connected.add_metric(name, 1 if status["state"] == "connected" else 0)
            queued.add_metric(name, status["out"]["queued"])
            inflight.add_metric(name, status["out"]["inflight"])
            messages.add_metric([status["name"], "out"], status["out"]["forwarded"])
            messages.add_metric([status["name"], "in"], status["in"]["received"])
            refused.add_metric(name, status["out"]["refused"])
            connects.add_metric(name, status["connects"])
            loops.add_metric(name, status["loops_dropped"])
        yield from (connected, queued, inflight, messages, refused, connects, loops)


class HttpCollector(Collector):
    """The admin listener's answers, as its Router counts them (``Router.answered``)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        answered = CounterMetricFamily(
            "gateway_http_requests", "Admin HTTP requests answered, by route pattern (unmatched: no route), method "
            "and status", labels=["route", "method", "status"])
        for (route, method, status), n in sorted(self.router.answered.items()):
            answered.add_metric([route, method, str(status)], n)
        yield answered


class MetricsAPI:
    def __init__(self, collector: BrokerCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)

    def install(self, router: Router) -> None:
        router.add("/metrics", get=self.metrics)
        self.registry.register(HttpCollector(router))

    def metrics(self, request: server.Request) -> Any:
        require(request, Permission.ADMIN, RESOURCE)
        return 200, {"Content-Type": CONTENT_TYPE_LATEST}, generate_latest(self.registry)
