"""``gateway hotpath``: the cost of one message through the broker's own code, without sockets.

``gateway perf`` measures what a user sees, through the kernel and a load
generator sharing the cores; on a busy machine the same build's figure moves
by half from one run to the next, which hides a 5% change.  This drives the
sessions exactly as their Twisted adapters do (bytes in, a reactor turn,
bytes out) over memory transports, on a RocksDB store whose syncs run inline,
and reports what the broker's code costs per message: CPU microseconds, or
with ``--callgrind`` the instructions counted by valgrind, which do not
depend on the machine's load (two runs of different lengths, subtracted, so
start-up and imports cancel out).  Use it to compare two builds of one
change; use ``gateway perf`` for throughput.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, cast

from twisted.internet.task import Clock

from core.broker import Broker
from core.stream_config import StreamSpec
from persistence.rocks import RocksStore
from protocols.mqtt import codec as mq
from protocols.mqtt.hub import MqttHub
from protocols.mqtt.session import MqttSession
from protocols.mqtt.state import MqttSettings
from protocols.stomp.codec import StompDecoder, encode_frame
from protocols.stomp.session import StompSession, StompSettings

SCENARIOS = ("mqtt-qos0", "mqtt-qos1", "stomp-queue", "stomp-persistent")


class MemoryTransport:
    """What a session writes to, kept to count the deliveries once the timing is over."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self, reason: str = "") -> None:
        pass

    def resume_reading(self, reason: str = "") -> None:
        pass

    def certificate_user(self) -> str | None:
        return None

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks = []
        return data


class Bench:
    """One broker on a virtual clock, its store's syncs inline: a reactor turn is ``turn()``."""

    def __init__(self, data_dir: str, stream: bool) -> None:
        # Twisted's Clock is what the broker's Clock protocol describes; its zope
        # interface types do not say so to mypy.
        self.clock: Any = cast(Any, Clock())
        self.store = RocksStore(data_dir, schedule=self._soon, background=self._inline)
        specs = [StreamSpec("perf", ["queue://perf.>", "topic://perf.>"], 4)] if stream else None
        self.broker = Broker(self.store, self.clock, defer=self._soon, streams=specs)
        self.broker.start()
        self.hub = MqttHub(self.broker, MqttSettings())
        self.hub.recover()

    def _soon(self, work: Callable[[], None]) -> None:
        self.clock.callLater(0, work)

    def _inline(self, work: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        error: BaseException | None = None
        try:
            work()
        except BaseException as exc:  # handed to ``done``, as the gateway's thread runner does
            error = exc
        self.clock.callLater(0, done, error)

    def turn(self) -> None:
        """Run what the reactor would until nothing is due now (flushes, syncs, their callbacks)."""
        while any(call.getTime() <= self.clock.seconds() for call in self.clock.getDelayedCalls()):
            self.clock.advance(0)

    def close(self) -> None:
        self.store.close()


def _body(size: int) -> bytes:
    # No NUL: a STOMP SEND without content-length ends at the first one.
    return (b"0123456789abcdef" * (size // 16 + 1))[:size]


Run = Callable[[int], None]  # runs the first n of the prepared turns


def _mqtt(bench: Bench, qos: int, batch: int, rounds: int, size: int) -> tuple[Run, Callable[[], int]]:
    sub_t, pub_t = MemoryTransport(), MemoryTransport()
    sub, pub = MqttSession(bench.hub, sub_t, "sub"), MqttSession(bench.hub, pub_t, "pub")
    sub.data_received(mq.encode(mq.Connect("MQTT", 4, True, 0, "hotpath-sub"), 4))
    sub.data_received(mq.encode(mq.Subscribe(1, [mq.SubscriptionRequest("perf/hotpath", qos)]), 4))
    pub.data_received(mq.encode(mq.Connect("MQTT", 4, True, 0, "hotpath-pub"), 4))
    bench.turn()
    sub_t.take()
    body = _body(size)

    def ids(r: int) -> range:
        return range(r * batch % 65535, r * batch % 65535 + batch)

    data = [b"".join(mq.encode(mq.Publish("perf/hotpath", body, qos, False, packet_id=(i % 65535) + 1 if qos else None), 4)
                     for i in ids(r)) for r in range(rounds)]
    # The subscriber's PUBACKs, as a client answers each delivered batch (the broker numbers them from 1).
    acks = [b"".join(mq.encode(mq.Puback((i % 65535) + 1), 4) for i in ids(r)) for r in range(rounds)] if qos else []
    delivered: list[bytes] = []

    def run(n: int) -> None:
        for r in range(n):
            pub.data_received(data[r])
            bench.turn()
            if qos:
                sub.data_received(acks[r])
                bench.turn()
            delivered.append(sub_t.take())

    def count() -> int:
        packets = mq.MqttDecoder(level=4, server=False).feed(b"".join(delivered))
        return sum(1 for p in packets if isinstance(p, mq.Publish) and p.payload == body)

    return run, count


def _stomp(bench: Bench, persistent: bool, batch: int, rounds: int, size: int) -> tuple[Run, Callable[[], int]]:
    sub_t, pub_t = MemoryTransport(), MemoryTransport()
    settings = StompSettings()
    sub, pub = StompSession(bench.broker, sub_t, settings, "sub"), StompSession(bench.broker, pub_t, settings, "pub")
    for session in (sub, pub):
        session.data_received(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "/")]))
    sub.data_received(encode_frame("SUBSCRIBE", [("destination", "/queue/perf.hotpath"), ("id", "1"), ("ack", "auto")]))
    bench.turn()
    sub_t.take()
    body = _body(size)
    headers = [("destination", "/queue/perf.hotpath")] + ([("persistent", "true")] if persistent else [])
    data = [b"".join(encode_frame("SEND", headers + ([("receipt", str(i))] if persistent else []), body)
                     for i in range(r * batch, (r + 1) * batch)) for r in range(rounds)]
    delivered: list[bytes] = []

    def run(n: int) -> None:
        for r in range(n):
            pub.data_received(data[r])
            bench.turn()
            delivered.append(sub_t.take())

    def count() -> int:
        frames = StompDecoder(version="1.2").feed(b"".join(delivered))
        return sum(1 for f in frames if f.command == "MESSAGE" and f.body == body)

    return run, count


def measure(
    scenario: str, stream: bool, batch: int, rounds: int, size: int, timed: int | None = None, close: bool = True,
) -> dict[str, Any]:
    """Prepare ``rounds`` turns and run ``timed`` of them (all by default): CPU seconds, and what arrived.

    Only a run of every prepared turn is checked (``verified``): counting
    the deliveries is not part of what callgrind should count; nor is closing the store (``close``).
    """
    data_dir = tempfile.mkdtemp(prefix="gateway-hotpath-")
    bench = Bench(os.path.join(data_dir, "data"), stream)
    try:
        if scenario.startswith("mqtt"):
            run, count = _mqtt(bench, 1 if scenario == "mqtt-qos1" else 0, batch, rounds, size)
        else:
            run, count = _stomp(bench, scenario == "stomp-persistent", batch, rounds, size)
        n = rounds if timed is None else timed
        gc.collect()
        started = time.process_time()
        run(n)
        cpu = time.process_time() - started
        messages = batch * n
        delivered = count() if timed is None else None
        return {"scenario": scenario, "stream": stream, "messages": messages, "cpu_s": cpu,
                "delivered": delivered, "verified": delivered == messages}
    finally:
        if close:
            bench.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def instructions(scenario: str, stream: bool, batch: int, rounds: int, size: int) -> float:
    """Instructions per message under callgrind: a run of ``rounds`` turns minus one of a fifth of them.

    Both prepare the same ``rounds`` turns, so start-up and preparation cancel out.
    """
    if shutil.which("valgrind") is None:
        raise RuntimeError("--callgrind needs valgrind (apt-get install valgrind)")
    counts = []
    short = max(1, rounds // 5)
    for n in (short, rounds):
        args = [sys.executable, "-m", "gateway.clients.perf.hotpath", "--once", str(n), scenario, "--batch", str(batch),
                "--rounds", str(rounds), "--size", str(size)] + (["--stream"] if stream else [])
        # One hash seed for both runs: dicts and sets then lay out, and cost, the same.
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *args],
                              capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"valgrind run failed ({done.returncode}): {done.stderr[-500:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / ((rounds - short) * batch)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "hotpath", help="cost per message of the broker's own code, in-process (no sockets); --callgrind: instructions",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
    )
    _arguments(parser)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS), metavar="SCENARIO",
                        help=f"one or more of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--stream", action="store_true", help="the broker keeps a stream of every perf destination")
    parser.add_argument("--callgrind", action="store_true",
                        help="count instructions under valgrind instead of CPU time (slow; steady on a busy machine)")
    parser.add_argument("--batch", type=int, default=200, help="messages per reactor turn (default 200)")
    parser.add_argument("--rounds", type=int, default=100, help="turns per run (default 100)")
    parser.add_argument("--size", type=int, default=64, help="payload bytes (default 64)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per scenario, CPU time mode; the median is shown")


def run(args: argparse.Namespace) -> int:
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        print(f"gateway hotpath: unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    if min(args.batch, args.rounds, args.size, args.repeat) < 1:
        print("gateway hotpath: --batch, --rounds, --size and --repeat must be at least 1", file=sys.stderr)
        return 2
    failed = False
    for scenario in args.scenarios:
        first = measure(scenario, args.stream, args.batch, min(args.rounds, 5), args.size)  # warm-up, and the check
        if not first["verified"]:
            print(f"gateway hotpath: {scenario}: {first['delivered']} of {first['messages']} messages delivered",
                  file=sys.stderr)
            failed = True
            continue
        line: dict[str, Any] = {"scenario": scenario, "stream": args.stream, "batch": args.batch, "size": args.size}
        if args.callgrind:
            try:
                line["instructions_per_msg"] = round(instructions(scenario, args.stream, args.batch, args.rounds, args.size))
            except RuntimeError as exc:
                print(f"gateway hotpath: {exc}", file=sys.stderr)
                return 1
        else:
            runs = [measure(scenario, args.stream, args.batch, args.rounds, args.size) for _ in range(args.repeat)]
            if not all(r["verified"] for r in runs):
                print(f"gateway hotpath: {scenario}: a run lost messages", file=sys.stderr)
                failed = True
                continue
            per = sorted(r["cpu_s"] / r["messages"] * 1e6 for r in runs)
            line["cpu_us_per_msg"] = round(statistics.median(per), 3)
            line["cpu_us_per_msg_range"] = [round(per[0], 3), round(per[-1], 3)]
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway.clients.perf.hotpath")
    _arguments(parser)
    # One run of the first N prepared turns, unchecked: what callgrind counts.
    parser.add_argument("--once", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.once is not None:
        (scenario,) = args.scenarios
        measure(scenario, args.stream, args.batch, args.rounds, args.size, timed=args.once, close=False)
        # Not closed: closing RocksDB flushes memtables (a cost of the bytes written, paid
        # whenever a memtable fills), which a run of 100 turns reaches only at its end, so
        # it would be counted per message in one build and not in another.
        sys.stdout.flush()
        os._exit(0)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
