"""``gateway hotpath``: every scenario delivers every message, or says how many it did not.

The figures themselves are not judged here (a timed unit test would be a
flaky one); what is checked is that each scenario really drives the broker
end to end, so a figure it prints is the cost of a delivered message.
"""
from __future__ import annotations

import os
import tempfile

import pytest

from gateway.cli import main
from gateway.clients.perf.hotpath import SCENARIOS, Bench, _mqtt, _stomp, measure


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_delivers_every_message(scenario, stream):
    result = measure(scenario, stream, batch=30, rounds=4, size=64)
    assert result["messages"] == 120 and result["delivered"] == 120 and result["verified"]
    assert result["cpu_s"] > 0


def test_with_a_stream_every_message_is_also_a_record():
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(os.path.join(tmp, "data"), stream=True)
        run, count = _mqtt(bench, 1, batch=25, rounds=3, size=16)
        run(3)
        stream = bench.broker.streams.get("perf")
        assert sum(p.end for p in stream.partitions) == 75 and count() == 75
        run2, count2 = _stomp(bench, True, batch=10, rounds=2, size=16)
        run2(2)
        assert sum(p.end for p in stream.partitions) == 95 and count2() == 20
        bench.close()


def test_a_partial_run_is_not_checked():
    # What callgrind counts: the first turns of those prepared, no counting of deliveries.
    result = measure("mqtt-qos0", False, batch=10, rounds=5, size=8, timed=2)
    assert result["messages"] == 20 and result["delivered"] is None and not result["verified"]


def test_bad_arguments_are_refused_with_the_reason(capsys):
    assert main(["hotpath", "mqtt-qos9"]) == 2
    assert "unknown scenario 'mqtt-qos9'; choose from mqtt-qos0, mqtt-qos1, stomp-queue, stomp-persistent" in capsys.readouterr().err
    assert main(["hotpath", "--batch", "0"]) == 2
    assert "--batch, --rounds, --size and --repeat must be at least 1" in capsys.readouterr().err


def test_the_command_prints_one_json_line_per_scenario(capsys):
    assert main(["hotpath", "mqtt-qos0", "stomp-queue", "--rounds", "3", "--batch", "20", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split('"scenario": ')[1].split(",")[0] for line in lines] == ['"mqtt-qos0"', '"stomp-queue"']
    assert all('"cpu_us_per_msg": ' in line for line in lines)
