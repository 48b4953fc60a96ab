"""``gateway perf --start-broker --stream --against-plain``: what a stream costs, in one command.

A stream's cost is a ratio (the figure with a stream over the figure
without) and the broker CPU it adds to each message.  Measured as two
separate runs, the machine's hour moves either figure by more than the
stream does, so each round here starts a fresh plain broker and a fresh
streaming one back to back, in alternating order, and a ratio is taken
within each round before the median is: drift between rounds cancels,
drift within one is spread over both sides.  The CPU added is split by
thread (the reactor, RocksDB's flush and compaction, the rest: the syncs),
so a change can be seen to move the part it meant to.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from gateway.clients.perf.roles import Target
from gateway.clients.perf.scenarios import SCENARIOS, Options, Result, Scenario

# Issue 27's targets: a stream costs at most 15% of the figure (at most 40% where each
# message waits for its record's sync before its PUBACK), and 0.4 us of broker CPU a record.
RATIO_TARGETS = {"mqtt-qos0": 0.85, "mqtt-qos1": 0.6, "stomp-queue": 0.85, "stomp-persistent": 0.85}
ADDED_CPU_TARGET_US = 0.4
# Throughput scenarios on one broker: a ratio of their figures means "how much is left".
COMPARABLE = ("mqtt-qos0", "mqtt-qos1", "mqtt-fanout", "stomp-queue", "stomp-persistent")
DEFAULT = ["mqtt-qos0", "mqtt-qos1", "stomp-queue", "stomp-persistent"]


class Broker(Protocol):
    stomp_port: int
    mqtt_port: int
    pid: int

    def stop(self) -> None: ...


@dataclass
class Pair:
    """One round of one scenario: the plain broker's result and the streaming one's."""

    plain: Result
    stream: Result


@dataclass
class Summary:
    scenario: str
    rounds: list[Pair] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        pairs = [p for p in self.rounds if p.plain.verified and p.stream.verified]
        out: dict[str, Any] = {"scenario": self.scenario, "compare": "stream/plain", "rounds": len(self.rounds),
                               "verified": len(pairs) == len(self.rounds) and bool(pairs)}
        if not pairs:
            return out
        ratios = [p.stream.figure / p.plain.figure for p in pairs]
        out.update({
            "plain_median": round(statistics.median(p.plain.figure for p in pairs), 1),
            "stream_median": round(statistics.median(p.stream.figure for p in pairs), 1),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "ratio_target": RATIO_TARGETS.get(self.scenario),
        })
        cpu = [(a, b) for a, b in ((per_message(p.plain), per_message(p.stream)) for p in pairs)
               if a is not None and b is not None]
        if len(cpu) == len(pairs):  # a broker whose CPU could not be read gives ratios only
            out["plain_cpu_us"] = round(statistics.median(a for a, _ in cpu), 2)
            out["stream_cpu_us"] = round(statistics.median(b for _, b in cpu), 2)
            out["added_cpu_us"] = round(statistics.median(b - a for a, b in cpu), 2)
            out["added_cpu_target_us"] = ADDED_CPU_TARGET_US
        split = [s for s in map(added_by_thread, pairs) if s is not None]
        if len(split) == len(pairs):
            out["added_cpu_us_by_thread"] = {k: round(statistics.median(s[k] for s in split), 2) for k in split[0]}
        return out


def per_message(result: Result) -> float | None:
    """Broker CPU a message, in microseconds."""
    if result.broker_cpu is None or not result.messages:
        return None
    return result.broker_cpu / result.messages * 1e6


def added_by_thread(pair: Pair) -> dict[str, float] | None:
    """What the stream added to each kind of thread's CPU a message, in microseconds."""
    plain = pair.plain.details.get("broker_threads_cpu_s")
    stream = pair.stream.details.get("broker_threads_cpu_s")
    if not plain or not stream or not pair.plain.messages or not pair.stream.messages:
        return None
    return {k: (stream[k] / pair.stream.messages - plain.get(k, 0.0) / pair.plain.messages) * 1e6 for k in stream}


def compare(names: list[str], options: Options, rounds: int, start: Callable[[bool], Broker],
            host: str, report: Callable[[str, int, Result, int], None]) -> list[Summary]:
    """Run each scenario of a round on a fresh plain broker and a fresh streaming one, alternating which goes first.

    A broker per scenario, not per round: RocksDB flushes what a stream holds
    some seconds after it was written, so on a broker shared by the round the
    records one scenario wrote were flushed during the next one, and counted
    as its cost (``stomp-queue`` after the MQTT scenarios: 0.73 us a message
    of RocksDB's threads in two rounds of three, 0.10 in the third).
    """
    summaries = {name: Summary(name) for name in names}
    for number in range(1, rounds + 1):
        order = (False, True) if number % 2 else (True, False)
        for name in names:
            results: dict[bool, Result] = {}
            for stream in order:
                broker = start(stream)
                try:
                    target = Target(host, broker.stomp_port, broker.mqtt_port, None, None)
                    results[stream] = SCENARIOS[name](Scenario(target, options, broker.pid))
                    report("stream" if stream else "plain", number, results[stream], broker.pid)
                finally:
                    broker.stop()
            summaries[name].rounds.append(Pair(results[False], results[True]))
    return list(summaries.values())


def table(summaries: list[Summary]) -> str:
    rows = [("scenario", "plain", "stream", "ratio", "target", "CPU us/msg plain -> stream", "added", "by thread")]
    for s in summaries:
        j = s.as_json()
        if "ratio_median" not in j:
            rows.append((s.scenario, "?", "?", "?", "", "", "", "a round lost messages"))
            continue
        target = j["ratio_target"]
        added = j.get("added_cpu_us")
        rows.append((
            s.scenario, f"{j['plain_median']:,.0f}", f"{j['stream_median']:,.0f}",
            f"{j['ratio_median']:.2f} ({j['ratio_range'][0]:.2f}-{j['ratio_range'][1]:.2f})",
            f">= {target:.2f}" if target else "",
            f"{j['plain_cpu_us']:.2f} -> {j['stream_cpu_us']:.2f}" if added is not None else "?",
            f"{added:+.2f} (<= {ADDED_CPU_TARGET_US})" if added is not None else "?",
            " ".join(f"{k} {v:+.2f}" for k, v in j.get("added_cpu_us_by_thread", {}).items()),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"a stream's cost: medians of {len(summaries[0].rounds) if summaries else 0} alternated rounds "
             "(ratio: of each round's pair; CPU: the broker's, a message)"]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)
