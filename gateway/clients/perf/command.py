"""``gateway perf``: arguments, an optional broker of its own, the table and the JSON lines."""
from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from gateway import compiled
from gateway.auth.users import PasswordHash, set_user, write_lines
from gateway.clients.perf import compare, procinfo
from gateway.clients.perf.roles import Target
from gateway.clients.perf.scenarios import (
    GROUPS,
    SCENARIOS,
    TARGETS,
    Options,
    Result,
    Scenario,
    expand,
)
from gateway.clients.perf.wire import PerfError


def add_parser(commands: Any) -> None:
    perf = commands.add_parser(
        "perf",
        help="load-test a STOMP/MQTT broker (this one or any other) and report msgs/s",
        description="Scenarios: " + ", ".join(SCENARIOS) + "; groups: " + ", ".join(f"{k} ({' '.join(v)})" for k, v in GROUPS.items()),
    )
    perf.add_argument("scenarios", nargs="*", default=["all"], metavar="SCENARIO")
    perf.add_argument("--host", default="127.0.0.1")
    perf.add_argument("--stomp-port", type=int, default=61613)
    perf.add_argument("--mqtt-port", type=int, default=1883)
    perf.add_argument("--login")
    perf.add_argument("--passcode")
    perf.add_argument("--broker-pid", type=int, help="pid whose CPU and RSS to report (default: whoever listens on the port)")
    perf.add_argument("--start-broker", action="store_true",
                      help="start this broker on its default configuration (RocksDB in a fresh temporary data dir) for the run")
    perf.add_argument("--stream", action="store_true",
                      help="with --start-broker: the broker also keeps a stream of every perf destination, "
                           "so the figures include the cost of appending each message to it")
    perf.add_argument("--auth", action="store_true",
                      help="with --start-broker: the broker has users and rules (anonymous off, a user allowed "
                           "perf.> and denied one branch of it), and the generator logs in as that user")
    perf.add_argument("--bridge", action="store_true",
                      help="with --start-broker: start a second broker and bridge the first to it (MQTT 5, "
                           "perf/# out), for bridge-qos1: publishers on the first, subscribers on the second")
    perf.add_argument("--network", action="store_true",
                      help="with --start-broker: start a second broker, the two peered in a network of brokers, "
                           "for network-queue: producers on the first, consumers on the second")
    perf.add_argument("--against-plain", action="store_true",
                      help="with --start-broker --stream: each round runs the scenarios on a fresh plain broker and "
                           "a fresh streaming one, alternating, and the summary gives the stream's ratio and added CPU")
    perf.add_argument("--rounds", type=int, default=3, help="with --against-plain: rounds (default 3)")
    perf.add_argument("--count", type=int, help="messages (or connections) per scenario instead of its default")
    perf.add_argument("--size", type=int, default=64, help="payload bytes (default 64)")
    perf.add_argument("--subscribers", type=int, default=50, help="mqtt-fanout subscribers (default 50)")
    perf.add_argument("--inflight", type=int, default=100, help="unconfirmed QoS 1 publishes / receipts (default 100)")
    perf.add_argument("--rate", type=int, default=1000, help="latency: messages per second (default 1000)")
    perf.add_argument("--duration", type=float, default=10.0, help="latency: seconds (default 10)")
    perf.add_argument("--connections", type=int, default=10_000, help="connections: how many (default 10000)")
    perf.add_argument("--label", default=None, help="name of the broker in the output (default host:port)")


def run(args: argparse.Namespace) -> int:
    try:
        names = expand(args.scenarios)
    except ValueError as exc:
        print(f"gateway perf: {exc}", file=sys.stderr)
        return 2
    if args.size < 8 and "latency" in names:
        print("gateway perf: latency needs --size of at least 8 (the send time rides in the payload)", file=sys.stderr)
        return 2
    if args.bridge and args.network:
        print("gateway perf: --bridge and --network are two ways to pair brokers; choose one", file=sys.stderr)
        return 2
    if args.bridge and names == expand(["all"]):
        names = ["bridge-qos1"]
    if args.network and names == expand(["all"]):
        names = ["network-queue"]
    for scenario, flag in (("bridge-qos1", "bridge"), ("network-queue", "network")):
        if scenario in names and not getattr(args, flag):
            print(f"gateway perf: {scenario} measures a pair of brokers: add --start-broker --{flag}", file=sys.stderr)
            return 2
    for flag in ("stream", "auth", "bridge", "network"):
        if getattr(args, flag) and not args.start_broker:
            print(f"gateway perf: --{flag} configures the broker it starts; add --start-broker", file=sys.stderr)
            return 2
    options = Options(args.size, args.count, args.subscribers, args.inflight, args.rate, args.duration, args.connections)
    if args.against_plain:
        return _against_plain(args, names, options)
    remote = OwnBroker() if args.bridge else None
    broker = None
    try:
        if args.network:
            # Two brokers, each the other's peer: ports first, then each started with the other's.
            broker, remote = OwnBroker.network_pair()
        elif args.start_broker:
            broker = OwnBroker(stream=args.stream, auth=args.auth, bridge_to=remote.mqtt_port if remote else None)
        if broker is not None:
            login, passcode = (OwnBroker.USER, broker.password) if args.auth else (args.login, args.passcode)
            target = Target(args.host, broker.stomp_port, broker.mqtt_port, login, passcode)
            pid: int | None = broker.pid
        else:
            target = Target(args.host, args.stomp_port, args.mqtt_port, args.login, args.passcode)
            pid = args.broker_pid or procinfo.pid_listening_on(
                target.stomp_port if all(n.startswith("stomp") for n in names) else target.mqtt_port)
        label = args.label or (broker.label if broker else f"{args.host}")
        results: list[Result] = []
        failed = False
        remote_target = Target(args.host, remote.stomp_port, remote.mqtt_port, None, None) if remote else None
        for name in names:
            try:
                result = SCENARIOS[name](Scenario(target, options, pid, remote_target, remote.pid if remote else None))
            except (PerfError, OSError) as exc:
                print(f"gateway perf: {name} failed: {exc}", file=sys.stderr)
                failed = True
                continue
            results.append(result)
            line = {"broker": label, "broker_pid": pid, **result.as_json()}
            print(json.dumps(line), flush=True)
            failed = failed or not result.verified
        print(table(results, label, pid), flush=True)
        return 1 if failed else 0
    finally:
        for own in (broker, remote):
            if own is not None:
                own.stop()


def _against_plain(args: argparse.Namespace, names: list[str], options: Options) -> int:
    if not (args.start_broker and args.stream) or args.auth or args.bridge or args.network:
        print("gateway perf: --against-plain compares brokers it starts: use it with --start-broker --stream only",
              file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("gateway perf: --rounds must be at least 1", file=sys.stderr)
        return 2
    if names == expand(["all"]):
        names = list(compare.DEFAULT)
    other = [n for n in names if n not in compare.COMPARABLE]
    if other:
        print(f"gateway perf: --against-plain compares throughput on one broker: {', '.join(other)} cannot be "
              f"(choose from {', '.join(compare.COMPARABLE)})", file=sys.stderr)
        return 2
    build = compiled.describe().split(" (")[0]

    def report(mode: str, number: int, result: Result, pid: int) -> None:
        line = {"broker": f"gateway (--start-broker{' --stream' if mode == 'stream' else ''}; {build})",
                "broker_pid": pid, "mode": mode, "round": number, **result.as_json()}
        print(json.dumps(line), flush=True)

    try:
        summaries = compare.compare(names, options, args.rounds, lambda stream: OwnBroker(stream=stream),
                                    args.host, report)
    except (PerfError, OSError) as exc:
        print(f"gateway perf: {exc}", file=sys.stderr)
        return 1
    for summary in summaries:
        print(json.dumps(summary.as_json()), flush=True)
    print(compare.table(summaries), flush=True)
    return 0 if all(s.as_json()["verified"] for s in summaries) else 1


def table(results: list[Result], label: str, pid: int | None) -> str:
    rows = [("scenario", "figure", "unit", "target", "verified", "messages", "seconds", "gen CPU", "broker CPU")]
    for r in results:
        target = TARGETS.get(r.scenario)
        rows.append((
            r.scenario, _num(r.figure), r.unit,
            ("<= " if r.scenario in ("latency", "connections") else ">= ") + _num(target) if target else "",
            "yes" if r.verified else f"NO ({r.messages}/{r.expected})",
            str(r.messages), f"{r.seconds:.2f}", f"{r.generator_cpu:.2f}s",
            "?" if r.broker_cpu is None else f"{r.broker_cpu:.2f}s",
        ))
        extra = {k: v for k, v in r.details.items() if k not in ("broker_rss_before", "broker_rss_after", "connected_client_rtt_ms")}
        if r.scenario == "connections" and r.details.get("broker_rss_after") is not None:
            extra["broker_rss"] = f"{r.details['broker_rss_before'] / 2**20:.1f} -> {r.details['broker_rss_after'] / 2**20:.1f} MiB"
        threads = extra.pop("broker_threads_cpu_s", None)
        if threads:
            extra["broker_threads"] = " ".join(f"{kind} {seconds:.2f}s" for kind, seconds in threads.items())
        rtt = r.details.get("connected_client_rtt_ms")
        if rtt:
            extra["connected_client_rtt_ms"] = "before p50 {} / during p50 {} p99 {} max {}".format(
                rtt["before_p50"], rtt["during_p50"], rtt["during_p99"], rtt["during_max"])
        if extra:
            rows.append(("", "  " + ", ".join(f"{k}={v}" for k, v in extra.items()), "", "", "", "", "", "", ""))
    widths = [max(len(row[i]) for row in rows if not row[1].startswith("  ") or i != 1) for i in range(len(rows[0]))]
    lines = [f"broker: {label} (pid {pid if pid else 'unknown'}); generator CPU and broker CPU are seconds over the timed part"]
    for row in rows:
        if row[1].startswith("  "):
            lines.append(" " * (widths[0] + 2) + row[1].strip())
        else:
            lines.append("  ".join(cell.rjust(w) if i in (1, 5, 6, 7, 8) else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)


def _num(value: float) -> str:
    if value != value:  # NaN
        return "?"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# What --stream adds to the broker's configuration: every destination the scenarios use.
STREAM_CONFIG = """[streams.perf]
destinations = ["queue://perf.>", "topic://perf.>"]
partitions = 4
"""

# What --auth adds: users and rules as a deployment has them, so each CONNECT checks a
# password hash and each SEND, PUBLISH and SUBSCRIBE goes through the rules (a deny
# rule included, so they are not a single allow-all match).
AUTH_CONFIG = """[auth]
users_file = "users"
allow_anonymous = false
[[auth.rules]]
who = "user:perf"
permissions = ["read", "write", "admin"]
destinations = ["queue://perf.>", "topic://perf.>"]
[[auth.rules]]
who = "user:perf"
access = "deny"
permissions = ["write"]
destinations = ["topic://perf.denied.>"]
"""


# What --bridge adds to the first broker: a bridge to the second, as a site to its centre.
BRIDGE_CONFIG = """[[bridges]]
name = "perf"
url = "mqtt://127.0.0.1:{port}"
version = 5
[[bridges.topics]]
pattern = "perf/#"
direction = "out"
"""


# What --network gives each of the two brokers: the other as its peer.
NETWORK_CONFIG = """[network]
peers = ["127.0.0.1:{port}"]
demand_interval = 0.1
"""


class OwnBroker:
    """``gateway run`` on its defaults but free ports and a throw-away data directory."""

    USER = "perf"

    @classmethod
    def network_pair(cls) -> tuple["OwnBroker", "OwnBroker"]:
        ports = [(_free_port(), _free_port()) for _ in range(2)]
        first = cls(ports=ports[0], peer=ports[1][0])
        try:
            second = cls(ports=ports[1], peer=ports[0][0])
        except PerfError:
            first.stop()
            raise
        return first, second

    def __init__(self, stream: bool = False, auth: bool = False, bridge_to: int | None = None,
                 ports: tuple[int, int] | None = None, peer: int | None = None) -> None:
        self.data = tempfile.mkdtemp(prefix="gateway-perf-")
        self.stomp_port, self.mqtt_port = ports or (_free_port(), _free_port())
        self.password = secrets.token_urlsafe(12)
        flags = [f for f, on in (("--stream", stream), ("--auth", auth), ("--bridge", bridge_to), ("--network", peer)) if on]
        self.label = f"gateway (--start-broker{''.join(' ' + f for f in flags)}; {compiled.describe().split(' (')[0]})"
        extra = []
        if stream or auth or bridge_to or peer:
            path = f"{self.data}/perf.toml"
            with open(path, "w") as f:
                f.write((STREAM_CONFIG if stream else "") + (AUTH_CONFIG if auth else "")
                        + (BRIDGE_CONFIG.format(port=bridge_to) if bridge_to else "")
                        + (NETWORK_CONFIG.format(port=peer) if peer else ""))
            extra = ["--config", path]
        if auth:
            lines, _ = set_user([], self.USER, str(PasswordHash.make(self.password.encode())))
            write_lines(f"{self.data}/users", lines)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "run", "--data-dir", f"{self.data}/data",
             "--stomp-port", str(self.stomp_port), "--mqtt-port", str(self.mqtt_port), "--ws-port", "0",
             "--admin-port", "0", "--log-level", "warn", *extra],
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        for port in (self.stomp_port, self.mqtt_port):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise PerfError("the broker did not start") from None
                    time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.data, ignore_errors=True)

