"""Live broker figures on ``$SYS`` topics, as Mosquitto publishes them.

Retained, so a new subscriber sees the latest figures at once; under ``$``
so that a plain ``#``/``>`` subscription does not receive them.  Every
protocol sees them (STOMP as ``/topic/$SYS.broker.uptime``).
"""
from __future__ import annotations

from typing import Any

from core.broker import Broker
from core.message import Message


class SysPublisher:
    def __init__(self, broker: Broker, interval: float, version: str) -> None:
        self.broker = broker
        self.interval = interval
        self.version = version
        self._call: Any = None

    def start(self) -> None:
        if self.interval > 0:
            self.publish()

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def figures(self) -> dict[str, str]:
        broker = self.broker
        uptime = int(broker.clock.seconds() - broker.started_at)
        queues = [q for name, q in broker.queues.items() if name.startswith("queue://")]
        return {
            "$SYS.broker.version": self.version,
            "$SYS.broker.uptime": f"{uptime} seconds",
            "$SYS.broker.clients.connected": str(broker.connection_count()),
            "$SYS.broker.messages.received": str(broker.messages_received),
            "$SYS.broker.messages.sent": str(broker.messages_sent),
            "$SYS.broker.subscriptions.count": str(broker.subscription_count()),
            # Beside Mosquitto's, what /metrics says of queues and the store (O(queues) every interval).
            "$SYS.broker.retained messages.count": str(len(broker.retained)),
            "$SYS.broker.queues.count": str(len(queues)),
            "$SYS.broker.queues.messages": str(sum(len(q) + q.inflight for q in queues)),
            "$SYS.broker.queues.consumers": str(sum(len(q.consumers) for q in queues)),
            "$SYS.broker.store.bytes": str(broker.store_usage.bytes),
            # The disk alarm or a failed write, in words ("ok" without one), and the free space last read.
            "$SYS.broker.store.alarm": broker.store_usage.alarm or "ok",
            "$SYS.broker.store.disk free": str(broker.store_usage.disk_free),
        }

    def publish(self) -> None:
        broker = self.broker
        for topic, value in self.figures().items():
            message = Message(
                broker.new_message_id(), "topic://" + topic, value.encode(), {}, timestamp=broker.now_ms(),
            )
            broker.retain(message, bounded=False)  # the broker's own: not against the clients' bounds
            broker.route(message, count=False)
        self._call = broker.clock.callLater(self.interval, self.publish)
