"""A bridge's configuration: ``[[bridges]]`` with its ``[[bridges.topics]]`` (Mosquitto's names where they exist)."""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

# URL scheme -> (protocol, TLS, default port).
SCHEMES = {
    "mqtt": ("mqtt", False, 1883),
    "mqtts": ("mqtt", True, 8883),
    "stomp": ("stomp", False, 61613),
    "stomp+ssl": ("stomp", True, 61612),
}
DIRECTIONS = ("out", "in", "both")


@dataclass
class BridgeTopic:
    # An MQTT filter for an mqtt:// bridge.  Mosquitto's semantics: the local name is
    # local_prefix + what the pattern matches, the remote name remote_prefix + the same.
    pattern: str
    direction: str = "out"
    qos: int = 1
    local_prefix: str = ""
    remote_prefix: str = ""

    @property
    def outward(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def inward(self) -> bool:
        return self.direction in ("in", "both")


@dataclass(kw_only=True)
class LinkSettings:
    """How a link logs in and reconnects: a bridge's, and the network's for every peer."""

    user: str | None = None
    password: str | None = None
    password_file: str = ""
    # PEM files for mqtts:// and stomp+ssl://: the CA that signs the remote's certificate
    # (empty: the system's), and this broker's own certificate and key where the remote asks.
    ca: str = ""
    cert: str = ""
    key: str = ""
    # Seconds before reconnecting: the first wait and the longest (doubling between), as Mosquitto's.
    restart_timeout: list[float] = field(default_factory=lambda: [1.0, 60.0])
    keepalive: int = 60
    # Messages sent to the remote and not yet confirmed, at most.
    max_inflight: int = 1000


@dataclass
class BridgeSettings(LinkSettings):
    name: str
    url: str
    # MQTT protocol version at the remote: 4 (3.1.1) or 5.
    version: int = 4
    client_id: str = ""  # "": the broker's name + "-" + the bridge's name
    # False: the remote keeps the bridge's subscriptions and what is in flight while it is away.
    clean_session: bool = False
    # MQTT 3.1.1: mark the connection as a bridge (Mosquitto's try_private, protocol level
    # 0x84) so the remote does not send back what the bridge published there.
    try_private: bool = True
    topics: list[BridgeTopic] = field(default_factory=list)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def protocol(self) -> str:
        return SCHEMES[self.scheme][0]

    @property
    def tls(self) -> bool:
        return SCHEMES[self.scheme][1]

    @property
    def virtual_host(self) -> str:
        """STOMP's ``host`` header: the URL's path (``stomp://h:61613/prod`` is ``prod``), else ``/``,
        RabbitMQ's default virtual host, which ActiveMQ, Artemis and the gateway ignore."""
        path = unquote(urlsplit(self.url).path)
        return path[1:] if len(path) > 1 else "/"

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or SCHEMES[parts.scheme][2]


def validate_bridge(bridge: BridgeSettings) -> None:
    """Raise ValueError naming what is wrong with one bridge's settings."""
    where = f"[[bridges]] {bridge.name!r}" if bridge.name else "[[bridges]]"
    if not bridge.name or not all(c.isalnum() or c in "-_." for c in bridge.name):
        raise ValueError(f"{where}: name must be letters, digits, '-', '_' or '.', got {bridge.name!r}")
    try:
        parts = urlsplit(bridge.url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"{where}: url {bridge.url!r}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{where}: url must start with one of {', '.join(s + '://' for s in SCHEMES)}, got {bridge.url!r}")
    if not parts.hostname:
        raise ValueError(f"{where}: url {bridge.url!r} names no host")
    if bridge.version not in (4, 5):
        raise ValueError(f"{where}: version must be 4 (MQTT 3.1.1) or 5, got {bridge.version!r}")
    if bridge.password is not None and bridge.password_file:
        raise ValueError(f"{where}: give password or password_file, not both")
    if (bridge.password is not None or bridge.password_file) and bridge.user is None:
        raise ValueError(f"{where}: a password needs a user")
    if len(bridge.restart_timeout) != 2 or not 0 < bridge.restart_timeout[0] <= bridge.restart_timeout[1]:
        raise ValueError(f"{where}: restart_timeout must be [first, longest] seconds with 0 < first <= longest")
    if not 0 <= bridge.keepalive <= 65535:
        raise ValueError(f"{where}: keepalive must be 0-65535 seconds")
    if not 1 <= bridge.max_inflight <= 65535:
        raise ValueError(f"{where}: max_inflight must be 1-65535")
    if not bridge.topics:
        raise ValueError(f"{where}: no [[bridges.topics]]: a bridge needs at least one pattern")
    from protocols.mqtt.names import InvalidTopic, filter_to_canonical

    stomp = SCHEMES[parts.scheme][0] == "stomp"
    for topic in bridge.topics:
        if topic.direction not in DIRECTIONS:
            raise ValueError(f"{where}: direction must be out, in or both, got {topic.direction!r}")
        if topic.qos not in (0, 1, 2):
            raise ValueError(f"{where}: qos must be 0, 1 or 2, got {topic.qos!r}")
        for prefix in (topic.local_prefix, topic.remote_prefix):
            if any(c in prefix for c in "+#*>"):
                raise ValueError(f"{where}: a prefix cannot hold a wildcard: {prefix!r}")
        if stomp:
            _check_stomp_pattern(where, topic)
            continue
        for side, prefix in (("local", topic.local_prefix), ("remote", topic.remote_prefix)):
            try:
                filter_to_canonical(prefix + topic.pattern)
            except InvalidTopic as exc:
                raise ValueError(f"{where}: pattern {side} filter {prefix + topic.pattern!r}: {exc}") from None


def _check_stomp_pattern(where: str, topic: BridgeTopic) -> None:
    """A STOMP bridge names ``/topic/NAME`` (wildcards ``*`` and ``>`` as in a subscription) or ``/queue/NAME``."""
    from core.destination import InvalidDestination, validate

    for prefix, kind in (("/topic/", "topic://"), ("/queue/", "queue://")):
        if topic.pattern.startswith(prefix):
            name = topic.pattern[len(prefix):]
            break
    else:
        raise ValueError(f"{where}: a STOMP bridge's pattern starts with /topic/ or /queue/, got {topic.pattern!r}")
    if not name:
        raise ValueError(f"{where}: pattern {topic.pattern!r} names nothing after {prefix}")
    if kind == "queue://" and any(level in ("*", ">") for level in name.split(".")):
        raise ValueError(f"{where}: a queue pattern names one queue, without wildcards: {topic.pattern!r}")
    try:
        validate(kind + topic.local_prefix + name, allow_wildcards=True)
    except InvalidDestination as exc:
        raise ValueError(f"{where}: pattern {topic.pattern!r}: {exc}") from None
