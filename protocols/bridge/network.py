"""A network of gateway brokers (ActiveMQ's network of brokers), built on STOMP bridge links.

Each broker keeps one link to each of its peers and *pulls*: it subscribes at
the peer to every topic filter and every queue that its side wants (its own
subscribers and consumers, and those of the other peers that pull from it),
and withdraws the subscription when the demand goes.  So a topic's messages
cross to a broker only while it has subscribers that match, and a queue's
messages only while it has consumers, and then only when the peer's own
consumers have no credit (the peer serves its local consumers first: see
``core/network.py`` and ``MessageQueue.active_consumers``).  A queue message
moves: the peer acknowledges it only once this broker has stored it.

Loops and fan-out: every message carries its path; the peer gives a link no
message whose path names the link's broker or is ``ttl`` long already, and a
copy that arrives twice (over two paths of a mesh) has the same
``_AMQ_DUPL_ID`` and is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from protocols.bridge.bridge import Bridge
from protocols.bridge.settings import SCHEMES, BridgeSettings, BridgeTopic, LinkSettings
from protocols.bridge.stomp import StompLink
from protocols.stomp import names
from protocols.stomp.codec import encode_frame
from protocols.stomp.session import TTL_HEADER

if TYPE_CHECKING:
    from core.broker import Broker

log = Logger(namespace="gateway.network")


@dataclass
class NetworkSettings(LinkSettings):
    # This broker's name in the network ("": [broker] name, or the one made up and kept in the store).
    name: str = ""
    # The STOMP listeners of the other brokers: "HOST:PORT", or stomp:// and stomp+ssl:// URLs.
    peers: list[str] = field(default_factory=list)
    # How many brokers a message may cross.
    ttl: int = 3
    # Seconds between looks at what this broker's side wants of each peer.
    demand_interval: float = 0.5

    def peer_url(self, peer: str) -> str:
        return peer if "://" in peer else f"stomp://{peer}"

    def link_settings(self, peer: str) -> BridgeSettings:
        url = self.peer_url(peer)
        settings = BridgeSettings(
            "network-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in url.split("://", 1)[1]), url,
            user=self.user, password=self.password, password_file=self.password_file, ca=self.ca, cert=self.cert,
            key=self.key, restart_timeout=list(self.restart_timeout), keepalive=self.keepalive,
            max_inflight=self.max_inflight, clean_session=True,
        )
        return settings


def validate_network(network: NetworkSettings) -> None:
    if not 1 <= network.ttl <= 255:
        raise ValueError(f"[network] ttl must be 1-255, got {network.ttl}")
    if network.name and not all(c.isalnum() or c in "-_." for c in network.name):
        raise ValueError(f"[network] name must be letters, digits, '-', '_' or '.', got {network.name!r}")
    for peer in network.peers:
        url = network.peer_url(peer)
        scheme = url.split("://", 1)[0]
        if scheme not in SCHEMES or SCHEMES[scheme][0] != "stomp":
            raise ValueError(f"[network] peers are STOMP listeners (HOST:PORT, stomp:// or stomp+ssl://), got {peer!r}")
        settings = network.link_settings(peer)
        try:
            settings.port  # noqa: B018 (raises on a bad port)
        except ValueError as exc:
            raise ValueError(f"[network] peer {peer!r}: {exc}") from None
        if not settings.host:
            raise ValueError(f"[network] peer {peer!r} names no host")
    if len(set(map(network.peer_url, network.peers))) != len(network.peers):
        raise ValueError("[network] a peer is listed twice")
    if (network.password is not None or network.password_file) and network.user is None:
        raise ValueError("[network] a password needs a user")


def client_id_of(node: str) -> str:
    """What a broker's network links call themselves at every peer (one link per pair of brokers)."""
    return f"{node}.network"


class NetworkPeer(Bridge):
    """The broker side of a link to one peer: no outbound queue, in-rules that follow the demand."""

    def __init__(self, broker: "Broker", settings: BridgeSettings, node: str, ttl: int) -> None:
        settings.client_id = client_id_of(node)
        super().__init__(broker, settings, node)
        self.ttl = ttl
        self.wanted: set[str] = set()  # canonical destinations this side wants from the peer
        self.link: NetworkLink | None = None  # while connected

    def remote_name_of(self, topic: BridgeTopic) -> str:
        return topic.pattern

    def local_destination(self, remote: str) -> str | None:
        """The same name here as there: the network shares one namespace."""
        if remote.startswith("/topic/"):
            return "topic://" + remote[len("/topic/"):]
        if remote.startswith("/queue/"):
            return "queue://" + remote[len("/queue/"):]
        return None

    def demand(self) -> set[str]:
        """What this broker's side wants from the peer: every topic filter subscribed here and every
        queue consumed here, but for what the peer itself pulls (its demand is its own side's)."""
        peer_client = client_id_of(self.remote_name) if self.remote_name else None
        broker = self.broker
        wanted = {sub.destination for sub in broker.topics.trie if sub.owner_id != peer_client}
        for name, queue in broker.queues.items():
            if name.startswith("queue://") and any(
                getattr(c.owner, "client_id", None) != peer_client for c in queue.consumers
            ):
                wanted.add(name)
        return {d for d in wanted if not d.startswith("topic://$")}  # $SYS is each broker's own

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["network"] = {"ttl": self.ttl, "pulling": sorted(self.wanted)}
        return status


class NetworkLink(StompLink):
    """A STOMP link that subscribes at the peer to what its side wants, as that changes."""

    bridge: NetworkPeer

    def _subscribe(self) -> None:
        self.subscribed: set[str] = set()
        self.bridge.link = self
        self.update(self.bridge.demand())

    def forget(self) -> None:
        super().forget()
        if self.bridge.link is self:
            self.bridge.link = None
            self.bridge.wanted = set()

    def update(self, wanted: set[str]) -> None:
        """SUBSCRIBE to what is newly wanted, UNSUBSCRIBE from what is no longer."""
        if not self.accepted or self.lost:
            return
        peer = self.bridge
        for destination in sorted(wanted - self.subscribed):
            headers = [("id", destination), ("destination", names.from_canonical(destination)),
                       ("ack", "client-individual"), ("activemq.prefetchSize", str(peer.settings.max_inflight)),
                       (TTL_HEADER, str(peer.ttl))]
            self.write(encode_frame("SUBSCRIBE", headers, version="1.2"))
        for destination in sorted(self.subscribed - wanted):
            self.write(encode_frame("UNSUBSCRIBE", [("id", destination)], version="1.2"))
        if wanted != self.subscribed:
            log.debug("network link {bridge}: pulling {n} destinations", bridge=peer.name, n=len(wanted))
        self.subscribed = set(wanted)
        peer.wanted = self.subscribed
