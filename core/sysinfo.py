"""Live broker figures on ``$SYS`` topics, as Mosquitto publishes them.

Retained, so a new subscriber sees the latest figures at once; under ``$``
so that a plain ``#``/``>`` subscription does not receive them.  Every
protocol sees them (STOMP as ``/topic/$SYS.broker.uptime``).

Bridges are the gateway's (core cannot import it), so their figures come from
a provider the gateway hands over: the same status dicts the admin API answers.
"""
from __future__ import annotations

from typing import Any, Callable

from core.broker import Broker
from core.message import Message

# The bridges' status dicts (gateway/bridges.py ``Bridges.status``): name, client_id, state, out, in, ...
BridgeStatus = Callable[[], list[dict[str, Any]]]

# Where a bridge's figures go, canonical (MQTT ``$SYS/broker/connection/CLIENT_ID/state``, Mosquitto's
# notification topic, and ``$SYS/broker/bridges/NAME/...``): a topic under them that no bridge
# answers for any more is cleared, so a bridge removed, even before a restart, leaves no stale "1".
CONNECTION_PREFIX = "$SYS.broker.connection."
BRIDGES_PREFIX = "$SYS.broker.bridges."
_TO_CANONICAL = str.maketrans({"/": ".", ".": "/"})  # an MQTT level's "." is "/" in a canonical one (protocols/mqtt/names.py)


def _level(mqtt_name: str) -> str | None:
    """A client id or bridge name as canonical topic levels, as MQTT would split it; None if it cannot be a topic."""
    if not mqtt_name or any(c in mqtt_name for c in "+#*>\0"):
        return None
    return mqtt_name.translate(_TO_CANONICAL)


class SysPublisher:
    def __init__(self, broker: Broker, interval: float, version: str, bridges: BridgeStatus | None = None) -> None:
        self.broker = broker
        self.interval = interval
        self.version = version
        self.bridges = bridges
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
            **self.bridge_figures(),
        }

    def bridge_figures(self) -> dict[str, str]:
        """Per bridge: ``1``/``0`` on Mosquitto's connection state topic, and its queue and traffic."""
        figures: dict[str, str] = {}
        for status in self.bridges() if self.bridges is not None else ():
            client = _level(status["client_id"])
            if client is not None:
                figures[f"{CONNECTION_PREFIX}{client}.state"] = "1" if status["state"] == "connected" else "0"
            name = _level(status["name"])
            if name is not None:
                figures[f"{BRIDGES_PREFIX}{name}.queued"] = str(status["out"]["queued"])
                figures[f"{BRIDGES_PREFIX}{name}.forwarded"] = str(status["out"]["forwarded"])
                figures[f"{BRIDGES_PREFIX}{name}.received"] = str(status["in"]["received"])
        return figures

    def _clear_gone(self, figures: dict[str, str]) -> None:
        """Clear retained bridge figures no configured bridge gives any more (a handful of names to look at)."""
        kept = self.broker.retained.index.get("$SYS")
        if not kept:
            return
        gone = [name for name in kept if name.startswith((CONNECTION_PREFIX, BRIDGES_PREFIX)) and name not in figures]
        for name in gone:
            self.broker.retain(Message(self.broker.new_message_id(), "topic://" + name, b"", {}), bounded=False)

    def publish(self) -> None:
        broker = self.broker
        figures = self.figures()
        self._clear_gone(figures)
        for topic, value in figures.items():
            message = Message(
                broker.new_message_id(), "topic://" + topic, value.encode(), {}, timestamp=broker.now_ms(),
            )
            broker.retain(message, bounded=False)  # the broker's own: not against the clients' bounds
            broker.route(message, count=False)
        self._call = broker.clock.callLater(self.interval, self.publish)
