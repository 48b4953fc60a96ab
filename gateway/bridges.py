"""The configured bridges: one reconnecting client service each, started, reloaded and stopped with the broker.

Reconnection is Twisted's ``ClientService`` with Mosquitto's backoff
(``restart_timeout = [first, longest]``, doubling between, with jitter so that
many edges do not come back in step).  A SIGHUP applies ``[[bridges]]`` again:
a bridge whose settings changed is restarted, a new one started, a removed one
stopped and its outbound queue dropped (the number of messages lost that way
is logged).
"""
from __future__ import annotations

import random
import secrets
from typing import Any, cast

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import endpoints, ssl, task
from twisted.logger import Logger

from core.broker import Broker
from protocols.bridge.bridge import QUEUE_PREFIX, Bridge
from protocols.bridge.link import Link, LinkFactory
from protocols.bridge.mqtt import MqttLink
from protocols.bridge.network import NetworkLink, NetworkPeer, NetworkSettings
from protocols.bridge.stomp import StompLink
from protocols.bridge.settings import BridgeSettings

log = Logger(namespace="gateway.bridge")


def _password(settings: BridgeSettings) -> bytes | None:
    if settings.password_file:
        with open(settings.password_file, "rb") as f:
            return f.read().rstrip(b"\r\n")
    return settings.password.encode() if settings.password is not None else None


def _endpoint(reactor: Any, settings: BridgeSettings) -> Any:
    endpoint = endpoints.HostnameEndpoint(reactor, settings.host, settings.port, timeout=10)
    if not settings.tls:
        return endpoint
    trust = ssl.Certificate.loadPEM(open(settings.ca, "rb").read()) if settings.ca else ssl.platformTrust()
    client = None
    if settings.cert:
        with open(settings.cert, "rb") as f:
            cert = f.read()
        with open(settings.key or settings.cert, "rb") as f:
            key = f.read()
        client = ssl.PrivateCertificate.loadPEM(cert + b"\n" + key)
    options = ssl.optionsForClientTLS(settings.host, trustRoot=trust, clientCertificate=client)
    return endpoints.wrapClientTLS(options, cast(Any, endpoint))


class RunningBridge:
    """A bridge and the service that keeps its link up."""

    def __init__(self, bridge: Bridge, service: ClientService) -> None:
        self.bridge = bridge
        self.service = service


class Bridges:
    def __init__(self, broker: Broker, reactor: Any, broker_name: str) -> None:
        self.broker = broker
        self.reactor = reactor
        self.broker_name = broker_name
        self.running: dict[str, RunningBridge] = {}
        self.settings: dict[str, BridgeSettings] = {}
        self.network: NetworkSettings | None = None
        self._demand: task.LoopingCall | None = None

    def start(self, configured: list[BridgeSettings]) -> None:
        """At start-up, after recovery: the queue of a bridge configured no longer is dropped, saying so."""
        names = {s.name for s in configured}
        for name in [q for q in self.broker.queues if q.startswith(QUEUE_PREFIX)]:
            if name[len(QUEUE_PREFIX):] not in names:
                dropped = self.broker.delete_queue(name)
                log.warn("bridge {bridge} is configured no longer: its outbound queue is dropped ({n} messages)",
                         bridge=name[len(QUEUE_PREFIX):], n=dropped)
        for settings in configured:
            self._start(settings)

    def _start(self, settings: BridgeSettings, bridge: Bridge | None = None) -> None:
        bridge = bridge or Bridge(self.broker, settings, self.broker_name)
        try:
            password = _password(settings)
            endpoint = _endpoint(self.reactor, settings)
        except OSError as exc:
            bridge.set_state("stopped", f"cannot read a file the bridge needs: {exc}")
            log.error("bridge {bridge}: {why}", bridge=settings.name, why=bridge.last_error)
            self.running[settings.name] = RunningBridge(bridge, None)  # type: ignore[arg-type]
            self.settings[settings.name] = settings
            return
        first, longest = settings.restart_timeout
        policy = backoffPolicy(initialDelay=first, maxDelay=longest, factor=2.0, jitter=lambda: random.random() * first)
        link: type[Link] = NetworkLink if isinstance(bridge, NetworkPeer) else StompLink if settings.protocol == "stomp" else MqttLink
        factory = LinkFactory(link, bridge, self.reactor, password)
        service = ClientService(endpoint, cast(Any, factory), retryPolicy=policy, clock=self.reactor)
        service.startService()
        self.running[settings.name] = RunningBridge(bridge, service)
        self.settings[settings.name] = settings
        log.info("bridge {bridge}: to {url} ({out} out, {inn} in){queued}", bridge=settings.name, url=settings.url,
                 out=len(bridge.out_rules), inn=len(bridge.in_rules),
                 queued=f", {len(bridge.queue)} messages queued" if bridge.queue is not None and len(bridge.queue) else "")

    def _stop(self, name: str) -> Any:
        running = self.running.pop(name, None)
        self.settings.pop(name, None)
        if running is None:
            return None
        running.bridge.set_state("stopped")
        d = running.service.stopService() if running.service is not None else None
        running.bridge.close()
        return d

    def reload(self, configured: list[BridgeSettings]) -> None:
        """SIGHUP: start new bridges, restart changed ones, stop and drop removed ones."""
        wanted = {s.name: s for s in configured}
        for name in list(self.running):
            if isinstance(self.running[name].bridge, NetworkPeer):
                continue  # [network] is read at start only
            if name not in wanted:
                bridge = self.running[name].bridge
                self._stop(name)
                dropped = bridge.remove()
                log.warn("bridge {bridge} removed by a reload: its outbound queue is dropped ({n} messages)",
                         bridge=name, n=dropped)
            elif wanted[name] != self.settings[name]:
                self._stop(name)
                self._start(wanted[name])
                log.info("bridge {bridge} restarted with its new settings", bridge=name)
        for name, settings in wanted.items():
            if name not in self.running:
                self._start(settings)

    def stop(self) -> None:
        if self._demand is not None and self._demand.running:
            self._demand.stop()
        for name in list(self.running):
            self._stop(name)

    def start_network(self, network: NetworkSettings) -> None:
        """One link to each peer, and a look every ``demand_interval`` at what each should pull."""
        self.network = network
        for peer in network.peers:
            settings = network.link_settings(peer)
            self._start(settings, NetworkPeer(self.broker, settings, self.broker_name, network.ttl))
        if network.peers:
            self._demand = task.LoopingCall(self._pull)
            self._demand.clock = self.reactor
            self._demand.start(network.demand_interval, now=False)
        log.info("network: {node} with {n} peers, ttl {ttl}", node=self.broker_name, n=len(network.peers), ttl=network.ttl)

    def _pull(self) -> None:
        for running in self.running.values():
            peer = running.bridge
            if isinstance(peer, NetworkPeer) and peer.link is not None:
                peer.link.update(peer.demand())

    def status(self) -> list[dict[str, Any]]:
        return [r.bridge.status() for r in self.running.values()]

    def get(self, name: str) -> Bridge | None:
        running = self.running.get(name)
        return running.bridge if running is not None else None


def node_name(broker: Broker, configured: str) -> str:
    """This broker's name on the paths of forwarded messages: ``[broker] name`` when it is set,
    else one made up once and kept in the store (two brokers left at the default must differ)."""
    if configured != "gateway":
        name = configured
    else:
        kept = broker.states("node-name")
        if kept:
            name = kept[0][1].decode()
        else:
            name = f"gateway-{secrets.token_hex(4)}"
            broker.save_state("node-name", name.encode())
    broker.node_name = name
    return name
