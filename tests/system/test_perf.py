"""``gateway perf`` as users run it: every scenario against a real broker process, counts verified.

Small counts keep this quick; the figures are not asserted (speed is measured
by the command itself, not by tests), only that every message arrived and
that the report names what it measured.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gateway import compiled
from gateway.clients.perf.scenarios import SCENARIOS
from tests.system.test_cli import free_port


def perf(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "perf", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_every_scenario_against_its_own_broker():
    run = perf("all", "--start-broker", "--count", "3000", "--subscribers", "5",
               "--duration", "1", "--rate", "500", "--connections", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["scenario"] for r in lines] == [name for name in SCENARIOS if name not in ("bridge-qos1", "network-queue")]
    by_name = {r["scenario"]: r for r in lines}
    for result in lines:
        assert result["verified"], result
        assert result["messages"] == result["expected"]
        assert result["broker_pid"] and result["broker_cpu_s"] is not None
        assert result["figure"] > 0
    assert by_name["mqtt-fanout"]["expected"] == 3000 * 5
    assert by_name["latency"]["expected"] == 500
    assert 0 < by_name["latency"]["p50_ms"] <= by_name["latency"]["p99_ms"] <= by_name["latency"]["max_ms"]
    assert by_name["stomp-persistent"]["confirmed"] == 3000
    assert by_name["connections"]["refused"] == 0 and by_name["connections"]["failed"] == 0
    assert by_name["connections"]["broker_rss_after"] > by_name["connections"]["broker_rss_before"]
    table = run.stdout[run.stdout.index("scenario "):]
    for name in by_name:
        assert name in table


def test_a_bridged_pair_forwards_every_message_and_reports_both_brokers():
    run = perf("--start-broker", "--bridge", "--count", "3000")
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert result["scenario"] == "bridge-qos1" and result["verified"] and result["messages"] == 3000, result
    assert result["confirmed"] == 3000 and result["remote_broker_cpu_s"] > 0 and result["bridging_broker_us_per_msg"] > 0
    assert "--bridge" in result["broker"]
    refused = perf("bridge-qos1", "--start-broker")
    assert refused.returncode == 2 and "add --start-broker --bridge" in refused.stderr


def test_a_network_of_two_moves_a_persistent_queue_and_reports_both_brokers():
    run = perf("--start-broker", "--network", "--count", "3000")
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert result["scenario"] == "network-queue" and result["verified"] and result["messages"] == 3000, result
    assert result["confirmed"] == 3000 and result["remote_broker_cpu_s"] > 0 and "--network" in result["broker"]
    both = perf("--start-broker", "--network", "--bridge")
    assert both.returncode == 2 and "choose one" in both.stderr


def test_nothing_listening_is_a_clear_failure():
    port = str(free_port())
    run = perf("mqtt-qos0", "stomp-queue", "--mqtt-port", port, "--stomp-port", port, "--count", "10", timeout=60)
    assert run.returncode == 1
    assert "mqtt-qos0 failed" in run.stderr and "stomp-queue failed" in run.stderr
    assert "Connection refused" in run.stderr


def test_unknown_scenario_is_a_usage_error():
    run = perf("mqtt-qos3", timeout=30)
    assert run.returncode == 2
    assert "unknown scenario 'mqtt-qos3'" in run.stderr


def test_scenarios_on_a_broker_that_streams_every_destination_with_users_and_rules():
    run = perf("stomp-persistent", "mqtt-qos1", "--start-broker", "--stream", "--auth", "--count", "2000")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["scenario"] for r in lines] == ["stomp-persistent", "mqtt-qos1"]
    # The label says how the broker ran: its flags, and compiled or pure Python.
    label = f"gateway (--start-broker --stream --auth; {compiled.describe().split(' (')[0]})"
    assert all(r["verified"] and r["broker"] == label for r in lines), lines
    # The broker's CPU split by thread: the reactor did the work; the syncs ran
    # on it or the worker, and a stream's flushes on RocksDB's own threads.
    for r in lines:
        threads = r["broker_threads_cpu_s"]
        assert set(threads) == {"main", "rocksdb", "other"}
        assert 0 < threads["main"] and sum(threads.values()) <= r["broker_cpu_s"] + 0.02, r
    assert "broker_threads=main " in run.stdout


def test_against_plain_alternates_fresh_brokers_and_summarises_the_streams_cost():
    run = perf("mqtt-qos0", "stomp-queue", "--start-broker", "--stream", "--against-plain", "--rounds", "2", "--count", "2000")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    runs = [r for r in lines if "mode" in r]
    # Round 1 plain first, round 2 streaming first: drift within a round falls on both sides.
    assert [(r["round"], r["scenario"], r["mode"]) for r in runs] == [
        (1, "mqtt-qos0", "plain"), (1, "mqtt-qos0", "stream"), (1, "stomp-queue", "plain"), (1, "stomp-queue", "stream"),
        (2, "mqtt-qos0", "stream"), (2, "mqtt-qos0", "plain"), (2, "stomp-queue", "stream"), (2, "stomp-queue", "plain"),
    ]
    # Each scenario on brokers of its own: none pays for what the one before it left to flush.
    assert len({r["broker_pid"] for r in runs}) == 8
    assert all(r["verified"] and r["messages"] == 2000 for r in runs), runs
    assert len({r["broker"] for r in runs}) == 2 and all(("--stream" in r["broker"]) == (r["mode"] == "stream") for r in runs)
    summary, queue_summary = [r for r in lines if r.get("compare") == "stream/plain"]
    assert summary["scenario"] == "mqtt-qos0" and summary["rounds"] == 2 and summary["verified"]
    assert queue_summary["scenario"] == "stomp-queue" and queue_summary["rounds"] == 2 and queue_summary["verified"]
    assert 0 < summary["ratio_range"][0] <= summary["ratio_median"] <= summary["ratio_range"][1]
    assert summary["ratio_target"] == 0.85 and set(summary["added_cpu_us_by_thread"]) == {"main", "rocksdb", "other"}
    assert "a stream's cost: medians of 2 alternated rounds" in run.stdout


@pytest.mark.parametrize("args, says", [
    (["mqtt-qos0", "--start-broker", "--against-plain"], "with --start-broker --stream only"),
    (["mqtt-qos0", "--start-broker", "--stream", "--auth", "--against-plain"], "with --start-broker --stream only"),
    (["latency", "--start-broker", "--stream", "--against-plain"], "latency cannot be"),
    (["mqtt-qos0", "--start-broker", "--stream", "--against-plain", "--rounds", "0"], "--rounds must be at least 1"),
])
def test_against_plain_refuses_what_it_cannot_compare(args, says):
    run = perf(*args, timeout=30)
    assert run.returncode == 2 and says in run.stderr, run.stderr


def test_auth_makes_the_broker_refuse_anonymous_clients():
    from gateway.clients.perf.command import OwnBroker
    from gateway.clients.perf.roles import Target
    from gateway.clients.perf.wire import PerfError, Wire, mqtt_handshake, stomp_handshake

    broker = OwnBroker(auth=True)
    try:
        with pytest.raises(PerfError, match="return code 5"):  # CONNACK 5: not authorised
            mqtt_handshake(Wire("127.0.0.1", broker.mqtt_port), "anonymous")
        mqtt_handshake(Wire("127.0.0.1", broker.mqtt_port), "perf-user", login=OwnBroker.USER, passcode=broker.password)
        target = Target("127.0.0.1", broker.stomp_port, broker.mqtt_port, OwnBroker.USER, broker.password)
        stomp_handshake(Wire(target.host, target.stomp_port), target.login, target.passcode, "perf-stomp")
    finally:
        broker.stop()


@pytest.mark.parametrize("flag", ["--stream", "--auth", "--bridge", "--network"])
def test_stream_and_auth_need_a_broker_of_its_own(flag):
    run = perf("mqtt-qos0", flag)
    assert run.returncode == 2 and f"gateway perf: {flag} configures the broker it starts; add --start-broker" in run.stderr


def test_a_reconnect_storm_is_accepted_without_overflowing_the_accept_queue():
    """2,000 clients at once: Twisted's default backlog of 50 dropped most of such a burst
    (clients retried after 1, 3, 7 s); every one must now be accepted straight away and still
    be connected afterwards, while an already connected client keeps its round trips."""
    run = perf("connections", "--start-broker", "--connections", "2000")
    assert run.returncode == 0, run.stdout + run.stderr
    (line,) = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert line["verified"] and line["messages"] == 2000 and line["still_connected"] == 2000, line
    assert line["refused"] == 0 and line["failed"] == 0, line
    assert line["listen_overflows"] == 0, f"the kernel dropped connections for a full accept queue: {line}"
    assert line["connected_client_rtt_ms"]["samples_during"] > 0, line
