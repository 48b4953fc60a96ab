"""``gateway streams [NAME] [--json]`` against a real broker: the tables an operator reads, and the exit status.

The command runs in this process (``gateway.cli.main``, real HTTP to the
broker's admin port) for speed, and once as the installed command in a
subprocess, as ``gateway bridges`` is tested (tests/integration/test_admin_bridges.py).
Records are appended with STOMP sends behind a receipt; a reader registers at
a known offset, so its lag is known exactly.
"""
from __future__ import annotations

import json
import re

import pytest

from core.stream import StreamSpec
from gateway import cli
from tests.integration.test_admin_stream_status import append, destination_in, put_reader
from tests.integration.test_admin_streams import Api
from tests.system.test_ops_cli import columns, gateway
from tests.support import BrokerHandle, call, make_config, wait_until


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("streams-cli"), traffic_history_interval=0.1)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"], partitions=2, max_bytes=1 << 30),
                      StreamSpec("orders", ["queue://orders"], reader_lease_seconds=40)]
    handle = BrokerHandle(config)
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    api = Api(handle)
    append(api, destination_in("sensors", 2, 0), 6)
    append(api, destination_in("sensors", 2, 1), 3)
    put_reader(api, "sensors", "spark-1", {0: 2, 1: 3})  # 4 behind in partition 0, caught up in 1
    put_reader(api, "orders", "late", {0: 0})

    # "late" last refreshed its 40 s lease 35 s ago, as a stuck query's: less than a quarter left.
    def stale() -> None:
        handle.broker.streams.get("orders").readers["late"].expires_ms = handle.broker.now_ms() + 5_000

    call(stale)
    # The append rate is the difference of the broker's last two samples: wait for a second one
    # (every 0.1 s here, but a busy machine can make the first test come sooner).
    wait_until(lambda: api.json("GET", "/api/v1/streams/sensors")[1]["records_per_second"] is not None,
               10, "two samples of the streams' history")
    yield api
    handle.stop()


def run(api, capsys, monkeypatch, *args):
    """(exit status, stdout, stderr) of ``gateway ARGS --url ...`` in this process, without the developer's GATEWAY_*."""
    for name in ("GATEWAY_URL", "GATEWAY_USER", "GATEWAY_PASSWORD", "GATEWAY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    code = cli.main([*args, "--url", api.handle.url])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_of_streams(api, capsys, monkeypatch):
    code, out, err = run(api, capsys, monkeypatch, "streams")
    assert code == 0 and err == "", err
    assert out.splitlines()[0].split() == ["Name", "Partitions", "Records", "Bytes", "Appended/s", "Readers", "MaxLag", "Expiring"]
    table = {row["Name"]: row for row in columns(out)}
    assert set(table) == {"sensors", "orders"}
    assert (table["sensors"]["Partitions"], table["sensors"]["Records"], table["sensors"]["Readers"],
            table["sensors"]["MaxLag"], table["sensors"]["Expiring"]) == ("2", "9", "1", "4", "0")
    assert int(table["sensors"]["Bytes"]) > 0 and re.fullmatch(r"\d+\.\d", table["sensors"]["Appended/s"])
    assert (table["orders"]["Records"], table["orders"]["MaxLag"], table["orders"]["Expiring"]) == ("0", "0", "1")

    code, out, _ = run(api, capsys, monkeypatch, "streams", "--json")
    assert code == 0 and [(s["name"], s["max_lag"]) for s in json.loads(out)] == [("sensors", 4), ("orders", 0)]


def test_one_stream_its_partitions_and_each_readers_position_lag_and_lease(api, capsys, monkeypatch):
    code, out, err = run(api, capsys, monkeypatch, "streams", "sensors")
    assert code == 0 and err == "", err
    fields, partitions, readers = out.split("\n\n")
    values = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in fields.splitlines()[1:])
    assert values["name"] == "sensors" and values["destinations"] == "topic://sensors.>"
    assert values["max age"] == "7d" and values["max bytes"] == str(1 << 30)
    assert values["reader lease"] == "10m (expiring below 2.5m left)"
    assert [(p["Partition"], p["Earliest"], p["Latest"], p["Records"]) for p in columns(partitions)] == [
        ("0", "0", "6", "6"), ("1", "0", "3", "3")]
    assert [(r["Reader"], r["Partition"], r["Position"], r["Latest"], r["Lag"], r["Lease"]) for r in columns(readers)] == [
        ("spark-1", "0", "2", "6", "4", "ok"), ("spark-1", "1", "3", "3", "0", "ok")]
    assert 590 < float(columns(readers)[0]["ExpiresIn(s)"]) <= 600

    code, out, _ = run(api, capsys, monkeypatch, "streams", "orders")
    [late] = columns(out.split("\n\n")[2])
    assert (late["Reader"], late["Lag"], late["Lease"]) == ("late", "0", "EXPIRING")
    assert float(late["ExpiresIn(s)"]) <= 5

    code, out, _ = run(api, capsys, monkeypatch, "streams", "sensors", "--json")
    info = json.loads(out)
    assert code == 0 and info["readers"][0]["lag"] == {"0": 4, "1": 0} and "history" not in info


def test_the_installed_command_says_an_unknown_name_and_exits_1(api):
    code, out, err = gateway(api.handle, "streams", "nope")
    assert (code, out) == (1, "") and err.strip() == "gateway streams: unknown stream 'nope' (HTTP 404)"


def test_a_broker_without_streams(tmp_path, capsys, monkeypatch):
    handle = BrokerHandle(make_config(tmp_path))
    handle.url = f"http://127.0.0.1:{handle.admin_port}"
    try:
        code, out, err = run(Api(handle), capsys, monkeypatch, "streams")
        assert (code, out, err) == (0, "no streams (none configured, or none this user may read)\n", "")
    finally:
        handle.stop()
