"""One typed configuration object, built from defaults, a TOML file and flags.

The embedded default is a working broker: every listener on loopback, data in
``./data``.  A TOML file overrides it section by section and command-line
flags override the file.  Unknown keys and wrong types are errors that name
the key: a typo must not silently fall back to a default.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from core.destination import validate as validate_destination
from core.policy import Policy
from core.stream_config import StreamSpec
from gateway.auth.settings import AuthSettings, parse_auth
from gateway.tls import CLIENT_CERT_MODES
from persistence.disk import parse_floor
from protocols.bridge.network import NetworkSettings, validate_network
from protocols.bridge.settings import BridgeSettings, BridgeTopic, validate_bridge
from protocols.mqtt.names import filter_to_canonical
from protocols.mqtt.state import MqttSettings
from protocols.stomp.codec import StompLimits
from protocols.stomp.session import StompSettings
from protocols.websocket import WebSocketSettings


class ConfigError(ValueError):
    pass


@dataclass
class ListenerConfig:
    port: int  # 0: this plain (non-TLS) listener is off
    host: str | None = None  # None: the broker's host
    # The TLS listener beside it: -1 (unset) is the standard port (DEFAULT_TLS_PORTS)
    # once [tls] has a certificate, off without one; 0 is off.
    tls_port: int = -1
    # Client certificates on that TLS port: "required", "optional" or "off"; "" as [tls] says.
    tls_client_certs: str = ""


# TLS ports when [tls] is configured: ActiveMQ's stomp+ssl and wss, MQTT's registered
# port, and ActiveMQ's HTTPS console.
DEFAULT_TLS_PORTS = {"stomp": 61612, "mqtt": 8883, "ws": 61615, "admin": 8162}


@dataclass
class TlsConfig:
    # PEM files: the server's certificate (intermediates after it), its private key
    # (without a passphrase) and the CA that signs accepted client certificates.
    # Relative paths are read from the configuration file's directory.
    cert: str = ""
    key: str = ""
    ca: str = ""
    # Client certificates, unless a listener says otherwise (tls_client_certs):
    # "required" (a client without one from ca fails the handshake), "optional" (asked
    # for; a client may connect without) or "off".  Without ca they are off.
    client_certs: str = "optional"
    # The oldest TLS version accepted: "1.2" or "1.3".
    min_version: str = "1.2"


@dataclass
class PersistenceConfig:
    # "rocksdb" (default, in <data_dir>/store) or "memory" (nothing survives a restart).
    backend: str = "rocksdb"
    # true: receipts, PUBACKs and commits wait for fsync of their batch.  false trades
    # that guarantee for speed: a crash of the machine (not of the process) can lose
    # acknowledged messages.
    sync: bool = True
    # Destination groups, each its own column family: name -> canonical patterns,
    # e.g. orders = ["queue://orders.>"].  Unmatched destinations go to "default".
    groups: dict[str, list[str]] = field(default_factory=dict)
    # Operations after which a batch is written at once instead of at the end of the turn.
    max_batch: int = 2000
    # Milliseconds: while the disk's fsyncs average less than this, a sync that a client
    # waits for (a receipt, a PUBACK) runs on the reactor thread, which it holds for that
    # long, instead of a worker thread, whose hand-over costs more than a fast fsync.
    # 0: always on the worker thread.
    inline_sync_below_ms: float = 2.0
    # Milliseconds: a sync that no client waits for (a stream's records, which readers see
    # once synced) starts no sooner than this after the last one ended, so that a flood
    # of turns shares its fsyncs; records reach readers up to this much later.  0: at once.
    stream_sync_interval_ms: float = 10.0
    # Seconds between retries of the store lock while another broker holds it (standby).
    lock_retry_interval: float = 1.0
    # Disk given back: every compaction_interval seconds, compact once this many
    # deletes (acks) have accumulated, so deleted ranges do not hold space.
    compaction_interval: float = 60.0
    compaction_deletes: int = 100_000
    # The disk's free space below which producers of anything stored are held or refused
    # (store_full_policy), so the store never meets a full disk: bytes, or in the TOML file
    # a share of the filesystem such as "5%" (kept here as 0.05); 0: no floor.
    disk_free_limit: int | float = 1 << 30
    # Seconds between checks of the free space (it is also checked after large writes).
    disk_check_interval: float = 1.0
    # After a failed write, seconds the broker waits for the store to write again once
    # the disk has room above the floor; then it exits non-zero, for a restart to recover.
    fault_exit_after: float = 120.0


@dataclass
class AdminSettings:
    # Bytes a request body may have (a publish of messages); larger requests get 413.
    max_request_size: int = 16 * 1024 * 1024
    # Queues with series of their own in /metrics, at most (0: none, only the totals).
    # Past the cap the deepest are shown; every queue is counted in the totals.
    metrics_max_destinations: int = 1000
    # The queues that may have series of their own: canonical patterns such as
    # "queue://orders.>" ([]: every queue).  Still capped, deepest first.
    metrics_destinations: list[str] = field(default_factory=list)


@dataclass
class Config:
    host: str = "127.0.0.1"
    # Set in a configuration file, a relative data_dir is the file's neighbour (every path
    # there is); the default and --data-dir are relative to the current directory.
    data_dir: str = "./data"
    log_level: str = "info"
    name: str = "gateway"
    stomp: ListenerConfig = field(default_factory=lambda: ListenerConfig(61613))
    stomp_settings: StompSettings = field(default_factory=StompSettings)
    mqtt: ListenerConfig = field(default_factory=lambda: ListenerConfig(1883))
    mqtt_settings: MqttSettings = field(default_factory=MqttSettings)
    ws: ListenerConfig = field(default_factory=lambda: ListenerConfig(61614))
    ws_settings: WebSocketSettings = field(default_factory=WebSocketSettings)
    # The admin HTTP listener: the JSON API, stream reads for Spark, publishing.
    admin: ListenerConfig = field(default_factory=lambda: ListenerConfig(8161))
    admin_settings: AdminSettings = field(default_factory=AdminSettings)
    # Certificate, key and CA of every TLS listener (each listener's tls_port).
    tls: TlsConfig = field(default_factory=TlsConfig)
    streams: list[StreamSpec] = field(default_factory=list)
    persistence: PersistenceConfig = field(default_factory=PersistenceConfig)
    # Seconds between $SYS figure updates (0: none), as Mosquitto's sys_interval.
    sys_interval: float = 10.0
    policy: Policy = field(default_factory=Policy)
    # [auth]: users, anonymous access, groups and rules (gateway/auth/settings.py).
    auth: AuthSettings = field(default_factory=AuthSettings)
    # Seconds a shutdown waits for clients to be told and their sockets to drain.
    shutdown_timeout: float = 5.0
    # Connections the kernel may queue before the broker accepts them, per listener
    # (capped by net.core.somaxconn): large, so a reconnect storm is not dropped.
    listen_backlog: int = 65535
    # Connections over STOMP, MQTT and WebSocket together; per source address; new
    # ones per second per address (0: no limit).  Refused with the protocol's answer.
    max_connections: int = 100_000
    max_connections_per_address: int = 0
    max_connection_rate_per_address: int = 0
    # Bytes all connections may hold in unfinished frames and packets; past it
    # reading pauses, largest holders first.  A connection that completes no frame
    # for partial_frame_timeout seconds while holding part of one is dropped.
    partial_frame_memory: int = 64 * 1024 * 1024
    partial_frame_timeout: float = 60.0
    # [[bridges]]: links to other brokers (protocols/bridge/settings.py).
    bridges: list[BridgeSettings] = field(default_factory=list)
    # [network]: this broker's peers in a network of gateways (protocols/bridge/network.py).
    network: NetworkSettings = field(default_factory=NetworkSettings)

    def tls_port(self, name: str) -> int:
        """The TLS port of listener ``name`` ("stomp", "mqtt", "ws", "admin"); 0 when it has none."""
        port: int = getattr(self, name).tls_port
        if port < 0:
            return DEFAULT_TLS_PORTS[name] if self.tls.cert else 0
        return port

    def tls_client_certs(self, name: str) -> str:
        """Whether listener ``name``'s TLS port asks for client certificates: required, optional or off."""
        mode: str = getattr(self, name).tls_client_certs or self.tls.client_certs
        return mode if self.tls.ca else "off"


LOG_LEVELS = ("debug", "info", "warn", "error", "critical")


def _apply(target: Any, values: dict[str, Any], section: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(target)}
    for key, value in values.items():
        f = fields.get(key)
        if f is None:
            raise ConfigError(f"unknown setting [{section}] {key}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"[{section}] {key} must be a table")
            _apply(current, value, f"{section}.{key}")
            continue
        expected = type(current) if current is not None else str
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"[{section}] {key} must be {expected.__name__}, got {value!r}")
        setattr(target, key, value)


def load(path: str | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file at ``path``, then ``overrides`` (from flags)."""
    config = Config()
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        _from_toml(config, data)
        _resolve_paths(config, data, os.path.dirname(os.path.abspath(path)))
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in ("stomp_port", "mqtt_port", "ws_port", "admin_port"):
            getattr(config, key[:-5]).port = value
        elif key in ("stomp_tls_port", "mqtt_tls_port", "ws_tls_port", "admin_tls_port"):
            getattr(config, key[:-9]).tls_port = value
        else:
            setattr(config, key, value)
    validate(config)
    return config


# TOML section -> Config attribute of a listener (with its ``<name>_settings``).
_LISTENER_SECTIONS = {"mqtt": "mqtt", "websocket": "ws", "admin": "admin"}
# The keys of a listener section that belong to the listener, not to its settings.
_LISTENER_KEYS = ("port", "host", "tls_port", "tls_client_certs")


def _bridges(values: Any) -> list[BridgeSettings]:
    if not isinstance(values, list):
        raise ConfigError("bridges must be an array of tables: [[bridges]]")
    bridges = []
    for table in values:
        table = dict(table)
        topics = table.pop("topics", [])
        if not isinstance(topics, list):
            raise ConfigError("[[bridges]] topics must be an array of tables: [[bridges.topics]]")
        for key in ("name", "url"):
            if not isinstance(table.get(key), str):
                raise ConfigError(f"[[bridges]] needs {key} = \"...\"")
        bridge = BridgeSettings(table.pop("name"), table.pop("url"))
        if "restart_timeout" in table:
            timeout = table.pop("restart_timeout")
            if isinstance(timeout, (int, float)):
                timeout = [timeout, timeout]
            if not (isinstance(timeout, list) and all(isinstance(t, (int, float)) for t in timeout)):
                raise ConfigError(f"[[bridges]] {bridge.name!r}: restart_timeout must be seconds or [first, longest]")
            bridge.restart_timeout = [float(t) for t in timeout]
        _apply(bridge, table, f"bridges {bridge.name!r}")
        for item in topics:
            item = dict(item)
            if not isinstance(item.get("pattern"), str):
                raise ConfigError(f"[[bridges.topics]] of {bridge.name!r} needs pattern = \"...\"")
            topic = BridgeTopic(item.pop("pattern"))
            _apply(topic, item, f"bridges.topics of {bridge.name!r}")
            bridge.topics.append(topic)
        bridges.append(bridge)
    return bridges


def _from_toml(config: Config, data: dict[str, Any]) -> None:
    for section, values in data.items():
        if section == "bridges":
            config.bridges = _bridges(values)
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"top-level key {section!r} must be a [section]")
        if section == "broker":
            _apply(config, {k: v for k, v in values.items()}, "broker")
        elif section == "stomp":
            listener = {k: values[k] for k in _LISTENER_KEYS if k in values}
            limits = {k: values[k] for k in ("max_frame_size", "max_headers", "max_header_length", "max_command_length") if k in values}
            rest = {k: v for k, v in values.items() if k not in listener and k not in limits}
            _apply(config.stomp, listener, "stomp")
            _apply(config.stomp_settings.limits, limits, "stomp")
            _apply(config.stomp_settings, rest, "stomp")
        elif section in _LISTENER_SECTIONS:
            # port and host go to the listener, the rest to its settings.
            name = _LISTENER_SECTIONS[section]
            listener = {k: values[k] for k in _LISTENER_KEYS if k in values}
            rest = {k: v for k, v in values.items() if k not in listener}
            _apply(getattr(config, name), listener, section)
            _apply(getattr(config, f"{name}_settings"), rest, section)
        elif section == "streams":
            for name, table in values.items():
                if not isinstance(table, dict):
                    raise ConfigError(f"[streams] {name} must be a table: [streams.{name}]")
                spec = StreamSpec(name)
                _apply(spec, {k: v for k, v in table.items() if k != "name"}, f"streams.{name}")
                if "name" in table:
                    raise ConfigError(f"[streams.{name}] name is the table's name; remove the key")
                config.streams.append(spec)
        elif section == "persistence":
            values = dict(values)
            if "disk_free_limit" in values:
                try:
                    config.persistence.disk_free_limit = parse_floor(values.pop("disk_free_limit"))
                except ValueError as exc:
                    raise ConfigError(f"[persistence] disk_free_limit: {exc}") from None
            _apply(config.persistence, values, "persistence")
        elif section == "policy":
            _apply(config.policy, values, "policy")
        elif section == "auth":
            try:
                config.auth = parse_auth(values)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        elif section == "tls":
            _apply(config.tls, values, "tls")
        elif section == "network":
            values = dict(values)
            if "restart_timeout" in values and isinstance(values["restart_timeout"], (int, float)):
                values["restart_timeout"] = [values["restart_timeout"]] * 2
            _apply(config.network, values, "network")
            config.network.restart_timeout = [float(t) for t in config.network.restart_timeout]
        else:
            raise ConfigError(f"unknown section [{section}]")


def validate(config: Config) -> None:
    if not config.data_dir:
        raise ConfigError("[broker] data_dir must name a directory (default ./data)")
    if config.log_level not in LOG_LEVELS:
        raise ConfigError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    for name in ("stomp", "mqtt", "ws", "admin"):
        listener: ListenerConfig = getattr(config, name)
        if not 0 <= listener.port <= 65535:
            raise ConfigError(f"{name} port must be 0-65535 (0 disables), got {listener.port}")
    _validate_tls(config)
    _validate_bridges(config.bridges)
    try:
        validate_network(config.network)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    limits: StompLimits = config.stomp_settings.limits
    for key in ("max_frame_size", "max_headers", "max_header_length", "max_command_length"):
        if getattr(limits, key) <= 0:
            raise ConfigError(f"[stomp] {key} must be positive")
    mqtt = config.mqtt_settings
    if not 0 < mqtt.receive_maximum <= 65535:
        raise ConfigError("[mqtt] receive_maximum must be 1-65535")
    if not 0 <= mqtt.topic_alias_maximum <= 65535:
        raise ConfigError("[mqtt] topic_alias_maximum must be 0-65535")
    if mqtt.max_packet_size <= 0 or mqtt.max_inflight <= 0:
        raise ConfigError("[mqtt] max_packet_size and max_inflight must be positive")
    for topic_filter in mqtt.queue_topics:
        if not isinstance(topic_filter, str):
            raise ConfigError("[mqtt] queue_topics must be a list of MQTT topic filters")
        try:
            filter_to_canonical(topic_filter)
        except ValueError as exc:
            raise ConfigError(f"[mqtt] queue_topics: {topic_filter!r}: {exc}") from None
    persistence = config.persistence
    if persistence.backend not in ("rocksdb", "memory"):
        raise ConfigError(f"[persistence] backend must be rocksdb or memory, got {persistence.backend!r}")
    if persistence.disk_check_interval <= 0 or persistence.fault_exit_after <= 0:
        raise ConfigError("[persistence] disk_check_interval and fault_exit_after must be positive")
    if persistence.inline_sync_below_ms < 0:
        raise ConfigError("[persistence] inline_sync_below_ms must be 0 (never) or more")
    if not 0 <= persistence.stream_sync_interval_ms <= 1000:
        raise ConfigError("[persistence] stream_sync_interval_ms must be from 0 (at once) to 1000")
    for name, patterns in persistence.groups.items():
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"[persistence.groups] {name!r}: group names are letters, digits, - and _")
        if not isinstance(patterns, list) or not all(
            isinstance(p, str) and p.split("://", 1)[0] in ("queue", "topic") and "://" in p for p in patterns
        ):
            raise ConfigError(f"[persistence.groups] {name}: a list of patterns like \"queue://orders.>\"")
    if config.listen_backlog <= 0:
        raise ConfigError("[broker] listen_backlog must be positive")
    for key in ("max_connections", "max_connections_per_address", "max_connection_rate_per_address"):
        if getattr(config, key) < 0:
            raise ConfigError(f"[broker] {key} must be 0 (no limit) or more")
    if config.partial_frame_memory <= 0 or config.partial_frame_timeout <= 0:
        raise ConfigError("[broker] partial_frame_memory and partial_frame_timeout must be positive")
    if config.admin_settings.max_request_size <= 0:
        raise ConfigError("[admin] max_request_size must be positive")
    _validate_metrics(config.admin_settings)
    _validate_streams(config.streams)
    if config.policy.duplicate_cache_size < 0:
        raise ConfigError("[policy] duplicate_cache_size must be 0 (off) or more")
    for key in ("max_destination_levels", "max_destination_length", "max_retained_messages", "max_retained_bytes"):
        if getattr(config.policy, key) < 0:
            raise ConfigError(f"[policy] {key} must be 0 (no limit) or more")
    if config.ws_settings.max_message_size <= 0:
        raise ConfigError("[websocket] max_message_size must be positive")
    _validate_websocket_paths(config.ws_settings)
    if config.policy.store_full_policy not in ("block", "fail"):
        raise ConfigError("[policy] store_full_policy must be block or fail")
    if not config.policy.dead_letter_queue.startswith("queue://"):
        raise ConfigError("[policy] dead_letter_queue must be a queue://NAME")


def _validate_bridges(bridges: list[BridgeSettings]) -> None:
    seen: set[str] = set()
    for bridge in bridges:
        try:
            validate_bridge(bridge)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if bridge.name in seen:
            raise ConfigError(f"[[bridges]] name {bridge.name!r} is used twice")
        seen.add(bridge.name)


def _validate_metrics(settings: AdminSettings) -> None:
    if settings.metrics_max_destinations < 0:
        raise ConfigError("[admin] metrics_max_destinations must be 0 (no per-queue series) or more")
    for pattern in settings.metrics_destinations:
        if not isinstance(pattern, str) or not pattern.startswith("queue://") or not pattern[len("queue://"):]:
            raise ConfigError(f"[admin] metrics_destinations: {pattern!r} is not a queue pattern like \"queue://orders.>\"")
        levels = pattern[len("queue://"):].split(".")
        if any(level == "" for level in levels) or ">" in levels[:-1]:
            raise ConfigError(f"[admin] metrics_destinations: {pattern!r}: empty level, or '>' before the last level")


_TLS_SECTIONS = {"stomp": "stomp", "mqtt": "mqtt", "ws": "websocket", "admin": "admin"}


def _validate_tls(config: Config) -> None:
    """The files themselves are read when the listeners start (gateway/tls.py), and again on reload."""
    tls = config.tls
    if bool(tls.cert) != bool(tls.key):
        raise ConfigError("[tls] cert and key go together: give both, or neither for no TLS")
    if tls.min_version not in ("1.2", "1.3"):
        raise ConfigError(f"[tls] min_version must be \"1.2\" or \"1.3\", got {tls.min_version!r}")
    if tls.client_certs not in CLIENT_CERT_MODES:
        raise ConfigError(f"[tls] client_certs must be required, optional or off, got {tls.client_certs!r}")
    for name, section in _TLS_SECTIONS.items():
        listener: ListenerConfig = getattr(config, name)
        if not -1 <= listener.tls_port <= 65535:
            raise ConfigError(f"[{section}] tls_port must be 0-65535 (0 disables), got {listener.tls_port}")
        if listener.tls_port > 0 and not tls.cert:
            raise ConfigError(f"[{section}] tls_port needs a certificate: set [tls] cert and key")
        if listener.tls_client_certs not in ("",) + CLIENT_CERT_MODES:
            raise ConfigError(f"[{section}] tls_client_certs must be required, optional or off, got {listener.tls_client_certs!r}")
        mode = listener.tls_client_certs or tls.client_certs
        if mode == "required" and config.tls_port(name) and not tls.ca:
            raise ConfigError(f"[{section}] client certificates required: set [tls] ca, the authority that signs them")


def _resolve_paths(config: Config, data: dict[str, Any], base: str) -> None:
    """Every relative path the file names is the file's neighbour, whatever the current directory.

    A configuration is written once and run from anywhere (a shell, a service
    manager starting in /), so its paths must mean the same from everywhere.
    Only what the file says moves: the embedded default (./data) and flags such as
    --data-dir stay relative to the current directory, as a command line's paths are.
    """
    if "data_dir" in data.get("broker", {}) and config.data_dir and not os.path.isabs(config.data_dir):
        config.data_dir = os.path.join(base, config.data_dir)
    _resolve_tls_paths(config.tls, base)
    config.auth.resolve(base)
    for bridge in [*config.bridges, config.network]:
        for key in ("password_file", "ca", "cert", "key"):
            value = getattr(bridge, key)
            if value and not os.path.isabs(value):
                setattr(bridge, key, os.path.join(base, value))


def _resolve_tls_paths(tls: TlsConfig, base: str) -> None:
    """Relative certificate, key and CA paths are the configuration file's neighbours."""
    for key in ("cert", "key", "ca"):
        value: str = getattr(tls, key)
        if value and not os.path.isabs(value):
            setattr(tls, key, os.path.join(base, value))


def _validate_websocket_paths(settings: WebSocketSettings) -> None:
    """Paths as a client's request line has them: the query string is not part of one."""
    seen: dict[str, str] = {}
    for key in ("stomp_paths", "mqtt_paths"):
        for path in getattr(settings, key):
            if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "?# ") or not path.isprintable():
                raise ConfigError(f"[websocket] {key}: {path!r} is not a path like \"/ws\" (it starts with /, no query string)")
            other = seen.setdefault(path, key)
            if other != key:
                raise ConfigError(f"[websocket] {path!r} is in both stomp_paths and mqtt_paths; a path picks one protocol")


_STREAM_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _validate_streams(streams: list[StreamSpec]) -> None:
    for spec in streams:
        where = f"[streams.{spec.name}]"
        if not spec.name or len(spec.name) > 200 or not set(spec.name) <= _STREAM_NAME_CHARS:
            raise ConfigError(f"{where}: stream names are 1-200 letters, digits, '_', '-' and '.'")
        if not spec.destinations:
            raise ConfigError(f"{where} destinations: name at least one, e.g. [\"topic://sensors.>\"]")
        for pattern in spec.destinations:
            if not isinstance(pattern, str) or not pattern.startswith(("topic://", "queue://")):
                raise ConfigError(f"{where} destinations: {pattern!r} is not a pattern like \"topic://sensors.>\" or \"queue://orders\"")
            try:
                validate_destination(pattern, allow_wildcards=True)
            except ValueError as exc:
                raise ConfigError(f"{where} destinations: {exc}") from None
        if not 1 <= spec.partitions <= 1024:
            raise ConfigError(f"{where} partitions must be 1-1024, got {spec.partitions}")
        if spec.max_age_seconds < 0 or spec.max_bytes < 0:
            raise ConfigError(f"{where} max_age_seconds and max_bytes must be 0 (no limit) or more")
        if spec.reader_lease_seconds <= 0:
            raise ConfigError(f"{where} reader_lease_seconds must be positive")
