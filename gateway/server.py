"""Assembly: the store, the broker and the listeners, started and stopped as one."""
from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.logger import Logger

from core.access import Access, AllowAll
from core.broker import Broker
from core.sysinfo import SysPublisher
from gateway import __version__, compiled
from gateway.admin import admin_site, standby_site
from gateway.admin.auth import BasicGuard
from gateway.admin.http import AdminSite
from gateway.auth.security import Security, check_exposure
from gateway.bridges import Bridges, node_name
from gateway.config import Config, ConfigError
from gateway.lockholder import lock_holder
from gateway.storewatch import StoreWatch
from gateway.tls import ServerTls, TlsError, TlsFiles, tls_factory
from gateway.twisted_types import DelayedCall, ListeningPort, Reactor
from persistence.memory import MemoryStore
from persistence.rocks import GroupConfig, RocksStore, StoreLocked
from persistence.store import Store
from protocols.adapter import ConnectionGuard
from protocols.admission import Admission, AdmissionSettings
from protocols.mqtt.adapter import mqtt_factory
from protocols.partial import PartialBudget
from protocols.mqtt.hub import MqttHub
from protocols.auth import Anonymous, Authenticator
from protocols.mqtt.session import MqttSession
from protocols.stomp.adapter import stomp_factory
from protocols.stomp.session import StompSession
from protocols.websocket import GatewayWebSocketFactory

log = Logger(namespace="gateway")


# Connections accepted per wake-up of a listener when a burst is queued (see _listen).
ACCEPTS_PER_WAKEUP = 500


def _url_host(host: str) -> str:
    """A bound address as a URL's host: every address (0.0.0.0, ::) is this machine's name; IPv6 in brackets."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


def listen_backlog(wanted: int) -> int:
    """The accept queue a listener asks for: as configured, but no more than the kernel allows.

    Twisted's default of 50 overflows in a reconnect storm (10,000 devices
    back after a network blip): the kernel drops handshakes past the queue,
    clients retry after 1, 3, 7... seconds, and the storm took minutes.
    """
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            ceiling = int(f.read().strip())
    except (OSError, ValueError):
        return wanted
    return max(1, min(wanted, ceiling))


class Gateway:
    def __init__(self, config: Config, reactor: Reactor, store: Store | None = None) -> None:
        """``store`` overrides the configured one (tests share a MemoryStore across restarts).

        The parts are built by ``start``, once the store is open: opening the
        RocksDB store may have to wait for another broker to release it.
        """
        self.config = config
        self.reactor = reactor
        self._given_store = store
        self.store: Store | None = None
        self.spill: Store | None = None
        self.broker: Broker | None = None
        self.mqtt_hub: MqttHub | None = None
        self.factories: dict[str, Any] = {}
        self.sys: SysPublisher | None = None
        self.admin: AdminSite | None = None
        # The admin listener of a standby waiting for the store lock (health and readiness only).
        self._standby: AdminSite | None = None
        self.guard = ConnectionGuard()
        self.ports: dict[str, ListeningPort] = {}
        self.tls: ServerTls | None = None
        # [auth]: one authenticator for every listener, the rules, built by start.
        self.security: Security | None = None
        self.authenticator: Authenticator = Anonymous()
        # How to read the configuration again on SIGHUP (the CLI sets it: file and flags).
        self.reload_config: Callable[[], Config] | None = None
        self.access: Access = AllowAll()
        self.storewatch: StoreWatch | None = None
        # Told when the store fails beyond repair (the CLI exits non-zero); by default the gateway stops.
        self.on_fatal: Callable[[str], None] = self._stop_on_fatal
        self.fatal_error: str | None = None
        self.bridges: Bridges | None = None

    def _open_store(self) -> Store:
        if self._given_store is not None:
            return self._given_store
        persistence = self.config.persistence
        if persistence.backend == "memory":
            return MemoryStore()
        groups = [GroupConfig(name, list(patterns)) for name, patterns in persistence.groups.items()]
        return RocksStore(
            self.store_path, groups, sync=persistence.sync, max_batch=persistence.max_batch,
            schedule=self._soon, background=self._in_thread,
            inline_sync_below=persistence.inline_sync_below_ms / 1000,
            later=self.reactor.callLater, unwaited_sync_gap=persistence.stream_sync_interval_ms / 1000,
        )

    def _open_spill(self) -> Store | None:
        """The temporary store for non-persistent messages beyond memory: wiped at every start."""
        if self._given_store is not None or self.config.persistence.backend == "memory":
            return None
        path = os.path.join(self.config.data_dir, "spill")
        shutil.rmtree(path, ignore_errors=True)
        return RocksStore(path, sync=False, schedule=self._soon)

    def _soon(self, work: Callable[[], None]) -> None:
        """Run ``work`` in the next reactor turn (the store's batch flush, the broker's deferred work)."""
        self.reactor.callLater(0, work)

    def _in_thread(self, work: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        """Run ``work`` on the reactor's thread pool, then ``done`` back on the reactor thread (the store's fsync)."""
        def run() -> None:
            error: BaseException | None = None
            try:
                work()
            except BaseException as exc:  # handed to ``done``: the store decides what a failed sync means
                error = exc
            self.reactor.callFromThread(done, error)

        self.reactor.callInThread(run)

    def _build(self, store: Store) -> None:
        config = self.config
        self.store = store
        self.spill = self._open_spill()
        self.broker = Broker(
            store, self.reactor, config.policy, name=config.name, spill=self.spill,
            defer=self._soon, streams=config.streams,
        )
        if self.security is not None and self.security.creation is not None:
            self.security.creation.exists = self.broker.queues.__contains__
        # One user store and one set of rules for every listener, plain and TLS.
        self.mqtt_hub = MqttHub(self.broker, config.mqtt_settings, self.authenticator, self.access)
        # One set of connection limits for every listener: the budgets are the process's.
        self.guard = ConnectionGuard(
            Admission(AdmissionSettings(
                config.max_connections, config.max_connections_per_address, config.max_connection_rate_per_address,
            ), self.reactor),
            PartialBudget(config.partial_frame_memory, config.partial_frame_timeout, self.reactor),
        )
        self.factories = {
            "stomp": stomp_factory(self.broker, config.stomp_settings, self.guard, self.authenticator, self.access),
            "mqtt": mqtt_factory(self.mqtt_hub, self.guard),
            "ws": GatewayWebSocketFactory(self._websocket_session, config.ws_settings, self.guard),
        }
        self.bridges = Bridges(self.broker, self.reactor, node_name(self.broker, config.network.name or config.name))
        self.admin = admin_site(
            self.broker, config.admin_settings.max_request_size, __version__, BasicGuard(
                self.authenticator, self.access, self.security.audit if self.security else None,
                self.security.passwords.authenticate_token if self.security and self.security.passwords else None,
            ),
            settings=config.admin_settings, logins=self.security.passwords if self.security else None,
            bridges=self.bridges.status,
        )
        self.sys = SysPublisher(self.broker, config.sys_interval, __version__, bridges=self.bridges.status)
        self._housekeeping: DelayedCall | None = None
        if isinstance(store, RocksStore):
            spill = self.spill if isinstance(self.spill, RocksStore) else None
            self.storewatch = StoreWatch(store, spill, self.broker, config.persistence, self.reactor, self._fatal)

    def _fatal(self, why: str) -> None:
        self.fatal_error = why
        self.on_fatal(why)

    def _stop_on_fatal(self, why: str) -> None:
        self.stop()

    def reclaim(self, force: bool = False) -> bool:
        """Compact the store when enough has been deleted since the last time (or when forced)."""
        store = self.store
        if not isinstance(store, RocksStore):  # the memory store keeps no deleted ranges
            return False
        if store.fault is not None:
            return False  # nothing is written until the store recovers; a compaction would fail too
        deletes = store.deletes_since_compaction
        if not deletes or not (force or deletes >= self.config.persistence.compaction_deletes):
            return False
        started = self.reactor.seconds()
        store.compact()
        log.info("store compacted after {n} deletes in {s:.2f}s", n=deletes, s=self.reactor.seconds() - started)
        return True

    def _housekeep(self) -> None:
        self.reclaim()
        self._housekeeping = self.reactor.callLater(self.config.persistence.compaction_interval, self._housekeep)

    def _websocket_session(self, kind: str, transport: Any, remote: str) -> Any:
        """The same session classes as on TCP: no protocol logic is written twice."""
        broker, hub = self.broker, self.mqtt_hub
        assert broker is not None and hub is not None  # built by start, before any listener
        if kind == "stomp":
            return StompSession(broker, transport, self.config.stomp_settings, remote, self.authenticator, self.access)
        return MqttSession(hub, transport, remote)

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

    @property
    def admin_port(self) -> int:
        return self.port("admin")

    def start(self, ephemeral: bool = False) -> None:
        """Recover, then listen; on return the ports are bound and known.

        ``ephemeral`` binds every enabled listener to a port the kernel picks
        (tests run many brokers side by side).
        """
        if self.security is None:  # first: no users and a public address, or an unreadable users file, stop the start
            check_exposure(self.config)
            self.security = Security(self.config, self.reactor)
            self.authenticator, self.access = self.security.authenticator, self.security.access
            self.security.start()
        if self.tls is None:  # first: a certificate that cannot be used stops the start, saying why
            self.tls = self._load_tls()
        os.makedirs(self.config.data_dir, exist_ok=True)
        # Nothing is logged before the store opens: a standby runs this every lock_retry_interval.
        store = self._open_store()
        if self._standby is not None:
            log.info("store lock acquired: taking over as master")
        self._build(store)
        broker, hub, publisher, site = self.broker, self.mqtt_hub, self.sys, self.admin
        assert broker is not None and hub is not None and publisher is not None and site is not None  # built by _build
        broker.start()
        hub.recover()
        publisher.start()
        if self.bridges is not None:
            self.bridges.start(self.config.bridges)
            if self.config.network.peers:
                self.bridges.start_network(self.config.network)
        if self.storewatch is not None:
            self.storewatch.start()
        if self.config.persistence.compaction_interval > 0:
            self._housekeeping = self.reactor.callLater(self.config.persistence.compaction_interval, self._housekeep)
        standby = self._standby
        if standby is not None:
            # A standby taking over: its admin listener answers with the master's routes from now on.
            standby.resource, standby.max_request_size = site.resource, site.max_request_size
            site = self.admin = standby
            self._standby = None
        for name, factory in [*self.factories.items(), ("admin", site)]:
            listener = getattr(self.config, name)
            host = listener.host or self.config.host
            if name not in self.ports:  # the admin listener of a standby that took over is up already
                self._listen(name, host, listener.port, factory, ephemeral)
            tls_port = self.config.tls_port(name)
            if tls_port and self.tls is not None and f"{name}_tls" not in self.ports:
                # What listenSSL does, through _listen: the same factory behind Twisted's TLS.
                creator = self.tls.creator(self.config.tls_client_certs(name))
                self._listen(f"{name}_tls", host, tls_port, tls_factory(creator, factory), ephemeral)
        unintended = compiled.unintended_pure_python()
        if unintended is not None:
            log.warn("{warning}", warning=unintended)
        # Last: the lines a person reads on starting it end with where everything is.
        log.info("{summary}", summary=self.summary())

    def summary(self) -> str:
        """The start-up summary: what runs, where its data is, and where each listener and the console are.

        One log event of several lines (Twisted indents the ones after the first),
        logged once the ports are bound, so every address in it is the real one.
        """
        config = self.config
        data = os.path.abspath(config.data_dir)
        if isinstance(self.store, MemoryStore):
            data += " (persistence: memory, nothing is kept across a restart)"
        lines = [f"gateway {__version__} ready", f"data directory: {data}", f"hot path: {compiled.describe()}"]
        for name, label in (("stomp", "STOMP"), ("mqtt", "MQTT"), ("ws", "WebSocket")):
            for key, suffix in ((name, ""), (f"{name}_tls", " over TLS")):
                port = self.ports.get(key)
                if port is None:
                    if not suffix:
                        lines.append(f"{label}: off")
                    continue
                address = port.getHost()
                where = f"{address.host}:{address.port}"
                if name == "ws":
                    scheme = "wss" if suffix else "ws"
                    base = f"{scheme}://{_url_host(address.host)}:{address.port}"
                    ws = config.ws_settings
                    stomp_urls, mqtt_urls = (", ".join(base + path for path in paths) for paths in (ws.stomp_paths, ws.mqtt_paths))
                    where = f"{stomp_urls} (STOMP); {mqtt_urls} (MQTT)"
                lines.append(f"{label}{suffix}: {where}")
        admin = [(key, scheme) for key, scheme in (("admin", "http"), ("admin_tls", "https")) if key in self.ports]
        if not admin:
            lines.append("admin HTTP: off (no console, no /metrics)")
        for key, scheme in admin:
            address = self.ports[key].getHost()
            base = f"{scheme}://{_url_host(address.host)}:{address.port}"
            lines += [f"console: {base}/console/", f"metrics: {base}/metrics", f"admin API: {base}/api/v1"]
        return "\n".join(lines)

    def _load_tls(self) -> ServerTls | None:
        """The [tls] certificate for the listeners that have a TLS port (None: no TLS listener)."""
        config = self.config
        names = [name for name in ("stomp", "mqtt", "ws", "admin") if config.tls_port(name)]
        if not names:
            return None
        tls = config.tls
        files = TlsFiles(tls.cert, tls.key, tls.ca, tls.min_version)
        return ServerTls(files, {config.tls_client_certs(name) for name in names})

    def reload(self) -> None:
        """SIGHUP: the configuration's [auth] (users, groups, rules) and the TLS certificates again;
        connected clients stay connected.  A file that cannot be used is logged and the old settings stay."""
        if self.security is not None:
            if self.reload_config is None:
                self.security.reload_users()
            else:
                try:
                    fresh = self.reload_config()
                except ConfigError as exc:
                    log.error("configuration not reloaded, the previous one stays: {error}", error=str(exc))
                else:
                    self.security.reload(fresh)
                    if self.bridges is not None:
                        self.bridges.reload(fresh.bridges)
        self.reload_tls()

    def reload_tls(self) -> bool:
        """Read the TLS certificate, key and CA again (SIGHUP): new connections use them.

        Open connections keep what they shook hands with.  When the new files
        cannot be used the old ones stay in use, the error is logged, and the
        answer is False; True once reloaded.
        """
        if self.tls is None:
            log.info("no TLS listener: nothing to reload")
            return False
        try:
            self.tls.reload()
        except TlsError as exc:
            log.error("TLS reload failed, the previous certificate stays in use: {error}", error=str(exc))
            return False
        return True

    @property
    def store_path(self) -> str:
        return os.path.join(self.config.data_dir, "store")

    def start_when_master(self, ephemeral: bool = False) -> defer.Deferred[Gateway]:
        """Start, or wait as a standby while another broker holds the store (shared-store HA).

        A standby serves health and readiness (503) on its admin listener meanwhile.
        """
        started: defer.Deferred[Gateway] = defer.Deferred()

        interval = self.config.persistence.lock_retry_interval

        def attempt(first: bool) -> None:
            try:
                self.start(ephemeral)
            except StoreLocked:
                if first:
                    # Once: a standby retries every interval, and a line per retry (86,000 a day)
                    # would bury the one that matters.  The next line is the takeover.
                    log.info("{message}", message=self.standby_message())
                    self._stand_by(ephemeral)
                else:
                    log.debug("store {path} still locked: next try in {interval}s", path=self.store_path, interval=interval)
                self.reactor.callLater(interval, attempt, False)
                return
            except Exception as exc:
                started.errback(exc)
                return
            started.callback(self)

        attempt(True)
        return started

    def standby_message(self) -> str:
        """What a broker that finds its store locked says, once: whose lock, and what to do if that is a mistake.

        Two brokers on one data directory are a shared-store pair only by intent;
        started twice by accident, the second one otherwise looks like it is running.
        """
        lock = os.path.join(self.store_path, "LOCK")
        holder = lock_holder(lock)
        by = f"held by {holder}" if holder else "held by a process not visible from here (another machine?)"
        return (
            f"gateway {__version__}: standing by: data directory {os.path.abspath(self.config.data_dir)} is in use, "
            f"its store lock {os.path.abspath(lock)} is {by}. This broker serves no clients, retries the lock every "
            f"{self.config.persistence.lock_retry_interval:g}s and takes over as master when that broker stops. "
            "Not intended? Stop this one, or give it a data directory of its own (--data-dir)."
        )

    def _stand_by(self, ephemeral: bool) -> None:
        """Listen on the admin port(s) with health and readiness only, so probes see a standby, not a dead port."""
        site = self._standby = standby_site(self.config.admin_settings.max_request_size)
        listener = self.config.admin
        host = listener.host or self.config.host
        try:
            self._listen("admin", host, listener.port, site, ephemeral)
            tls_port = self.config.tls_port("admin")
            if tls_port and self.tls is not None:
                creator = self.tls.creator(self.config.tls_client_certs("admin"))
                self._listen("admin_tls", host, tls_port, tls_factory(creator, site), ephemeral)
        except CannotListenError as exc:
            # The master may hold the port (both on one machine): stand by without probes then.
            log.warn("standby: admin listener not started: {error}", error=str(exc))

    def _listen(self, name: str, host: str, port: int, factory: Any, ephemeral: bool) -> None:
        if port == 0:
            log.info("{name} listener disabled (port 0)", name=name.upper())
            return
        backlog = listen_backlog(self.config.listen_backlog)
        self.ports[name] = port_ = self.reactor.listenTCP(0 if ephemeral else port, factory, backlog=backlog, interface=host)
        # Drain a burst of queued connections in one go: Twisted starts at 100 accepts a
        # wake-up and grows by 20, too slowly for a storm that fills the queue in milliseconds.
        if hasattr(port_, "numberAccepts"):
            port_.numberAccepts = max(port_.numberAccepts, ACCEPTS_PER_WAKEUP)
        bound = self.ports[name].getHost()
        log.info(
            "{name} listening on {host}:{port} (backlog {backlog})",
            name=name.upper().replace("_", " "), host=bound.host, port=bound.port, backlog=backlog,
        )

    def sessions(self) -> list[Any]:
        return [s for factory in self.factories.values() for s in factory.sessions]

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Stop listening, tell every client, let their sockets drain, then close the store."""
        for port in self.ports.values():
            yield port.stopListening()
        self.ports.clear()
        if self.bridges is not None:
            self.bridges.stop()  # first: their links close cleanly while the store still takes their acks
        for session in self.sessions():
            session.shutdown()
        deadline = self.reactor.seconds() + self.config.shutdown_timeout
        while self.sessions() and self.reactor.seconds() < deadline:
            d: defer.Deferred[None] = defer.Deferred()
            self.reactor.callLater(0.05, d.callback, None)
            yield d
        if self._housekeeping is not None and self._housekeeping.active():
            self._housekeeping.cancel()
        if self.storewatch is not None:
            self.storewatch.stop()
        if self.guard.budget is not None:
            self.guard.budget.stop()
        if self.broker is not None:
            assert self.sys is not None and self.store is not None  # _build sets them with the broker
            self.sys.stop()
            self.broker.stop()
            self.store.close()
            if self.spill is not None:
                self.spill.close()
        if self.security is not None:
            self.security.stop()
        log.info("broker stopped")
