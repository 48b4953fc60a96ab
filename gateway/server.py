"""Assembly: the store, the broker and the listeners, started and stopped as one."""
from __future__ import annotations

import os
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from core.broker import Broker
from core.sysinfo import SysPublisher
from gateway.config import Config
from persistence.memory import MemoryStore
from persistence.store import Store
from protocols.mqtt.adapter import mqtt_factory
from protocols.mqtt.hub import MqttHub
from protocols.mqtt.session import MqttSession
from protocols.stomp.adapter import stomp_factory
from protocols.stomp.session import StompSession
from protocols.websocket import GatewayWebSocketFactory

log = Logger(namespace="gateway")

VERSION = "gateway 0.1.0"


class Gateway:
    def __init__(self, config: Config, reactor: Any, store: Store | None = None) -> None:
        self.config = config
        self.reactor = reactor
        self.store = store if store is not None else MemoryStore()
        self.broker = Broker(self.store, reactor, config.policy, name=config.name)
        self.mqtt_hub = MqttHub(self.broker, config.mqtt_settings)
        self.factories = {
            "stomp": stomp_factory(self.broker, config.stomp_settings),
            "mqtt": mqtt_factory(self.mqtt_hub),
            "ws": GatewayWebSocketFactory(self._websocket_session, config.ws_settings),
        }
        self.sys = SysPublisher(self.broker, config.sys_interval, VERSION)
        self.ports: dict[str, Any] = {}

    def _websocket_session(self, kind: str, transport: Any, remote: str) -> Any:
        """The same session classes as on TCP: no protocol logic is written twice."""
        if kind == "stomp":
            return StompSession(self.broker, transport, self.config.stomp_settings, remote)
        return MqttSession(self.mqtt_hub, transport, remote)

    @property
    def ws_port(self) -> int:
        return self.port("ws")

    def port(self, name: str) -> int:
        return self.ports[name].getHost().port

    @property
    def stomp_port(self) -> int:
        return self.port("stomp")

    @property
    def mqtt_port(self) -> int:
        return self.port("mqtt")

    def start(self, ephemeral: bool = False) -> None:
        """Recover, then listen; on return the ports are bound and known.

        ``ephemeral`` binds every enabled listener to a port the kernel picks
        (tests run many brokers side by side).
        """
        os.makedirs(self.config.data_dir, exist_ok=True)
        self.broker.start()
        self.sys.start()
        for name, factory in self.factories.items():
            listener = getattr(self.config, name)
            self._listen(name, listener.host or self.config.host, listener.port, factory, ephemeral)

    def _listen(self, name: str, host: str, port: int, factory: Any, ephemeral: bool) -> None:
        if port == 0:
            log.info("{name} listener disabled (port 0)", name=name.upper())
            return
        self.ports[name] = self.reactor.listenTCP(0 if ephemeral else port, factory, interface=host)
        bound = self.ports[name].getHost()
        log.info("{name} listening on {host}:{port}", name=name.upper(), host=bound.host, port=bound.port)

    def sessions(self) -> list[Any]:
        return [s for factory in self.factories.values() for s in factory.sessions]

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Stop listening, tell every client, let their sockets drain, then close the store."""
        for port in self.ports.values():
            yield port.stopListening()
        self.ports.clear()
        for session in self.sessions():
            session.shutdown()
        deadline = self.reactor.seconds() + self.config.shutdown_timeout
        while self.sessions() and self.reactor.seconds() < deadline:
            d = defer.Deferred()
            self.reactor.callLater(0.05, d.callback, None)
            yield d
        self.sys.stop()
        self.broker.stop()
        self.store.close()
        log.info("broker stopped")
