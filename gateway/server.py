"""Assembly: the store, the broker and the listeners, started and stopped as one."""
from __future__ import annotations

import os
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from core.broker import Broker
from gateway.config import Config
from persistence.memory import MemoryStore
from persistence.store import Store
from protocols.stomp.adapter import StompFactory

log = Logger(namespace="gateway")


class Gateway:
    def __init__(self, config: Config, reactor: Any, store: Store | None = None) -> None:
        self.config = config
        self.reactor = reactor
        self.store = store if store is not None else MemoryStore()
        self.broker = Broker(self.store, reactor, config.policy, name=config.name)
        self.stomp_factory = StompFactory(self.broker, config.stomp_settings)
        self.ports: dict[str, Any] = {}

    @property
    def stomp_port(self) -> int:
        return self.ports["stomp"].getHost().port

    def start(self, ephemeral: bool = False) -> None:
        """Recover, then listen; on return the ports are bound and known.

        ``ephemeral`` binds every enabled listener to a port the kernel picks
        (tests run many brokers side by side).
        """
        os.makedirs(self.config.data_dir, exist_ok=True)
        self.broker.start()
        listener = self.config.stomp
        self._listen("stomp", listener.host or self.config.host, listener.port, self.stomp_factory, ephemeral)

    def _listen(self, name: str, host: str, port: int, factory: Any, ephemeral: bool) -> None:
        if port == 0:
            log.info("{name} listener disabled (port 0)", name=name)
            return
        self.ports[name] = self.reactor.listenTCP(0 if ephemeral else port, factory, interface=host)
        bound = self.ports[name].getHost()
        log.info("{name} listening on {host}:{port}", name=name.upper(), host=bound.host, port=bound.port)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Stop listening, tell every client, let their sockets drain, then close the store."""
        for port in self.ports.values():
            yield port.stopListening()
        self.ports.clear()
        for session in list(self.stomp_factory.sessions):
            session.shutdown()
        deadline = self.reactor.seconds() + self.config.shutdown_timeout
        while self.stomp_factory.sessions and self.reactor.seconds() < deadline:
            d = defer.Deferred()
            self.reactor.callLater(0.05, d.callback, None)
            yield d
        self.broker.stop()
        self.store.close()
        log.info("broker stopped")
