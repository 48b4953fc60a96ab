"""What the admin API says of a stream's state, over real HTTP: append rates, reader lag and leases, lag over time.

One broker for the module, sampling every 0.1 s (``traffic_history_interval``,
which the stream history shares) so samples come within a test; each test
uses a stream or reader of its own.  Records are appended by STOMP sends with
a receipt barrier (``sync``): once it returns, the records are on disk and the
partitions' ``latest`` counts them.  Waits poll the API (``wait_until``) for
what the broker samples on its own clock.
"""
from __future__ import annotations

import json
import zlib

import pytest

from core.stream import StreamSpec
from tests.bridging import wait_until
from tests.integration.test_admin_auth import auth_config
from tests.integration.test_admin_auth import call as auth_call
from tests.integration.test_admin_streams import Api
from tests.support import BrokerHandle, connect, disconnect, make_config, sync

INTERVAL = 0.1
# The fields the stream's description had before this history existed (Spark's connector reads them): unchanged.
DESCRIBED = {"name", "destinations", "max_age_seconds", "max_bytes", "reader_lease_seconds", "partitions", "readers"}
PARTITION = {"partition", "earliest", "latest", "bytes"}
READER = {"name", "offsets", "lag", "expires_in_seconds"}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("stream-status"), traffic_history_interval=INTERVAL)
    config.streams = [
        StreamSpec("sensors", ["topic://sensors.>"], partitions=2),
        StreamSpec("leases", ["topic://leases.>"], reader_lease_seconds=2.0),
        StreamSpec("bounded", ["topic://bounded.>"], partitions=2, max_age_seconds=3600, max_bytes=1 << 20),
    ]
    handle = BrokerHandle(config)
    yield Api(handle)
    handle.stop()


def destination_in(stream: str, partitions: int, partition: int) -> str:
    """A topic the stream appends to ``partition`` (partitioning is a CRC-32 of the canonical name)."""
    for i in range(1000):
        name = f"{stream}.d{i}"
        if zlib.crc32(f"topic://{name}".encode()) % partitions == partition:
            return name
    raise AssertionError("no destination found")


def append(api: Api, topic: str, count: int) -> None:
    conn, got = connect(api.handle)
    for i in range(count):
        conn.send(f"/topic/{topic}", f"r{i}", headers={"persistent": "true"})
    sync(conn, got)  # the receipt: the records are on disk
    disconnect(conn)


def put_reader(api: Api, stream: str, reader: str, offsets: dict[int, int]) -> None:
    status, _, body = api.call("PUT", f"/api/v1/streams/{stream}/readers/{reader}",
                               json.dumps({"offsets": {str(k): v for k, v in offsets.items()}}).encode(), "application/json")
    assert status == 204, body


def describe(api: Api, stream: str, history: bool = False) -> dict:
    status, info = api.json("GET", f"/api/v1/streams/{stream}" + ("?history=1" if history else ""))
    assert status == 200, info
    return info


def listed(api: Api, stream: str) -> dict:
    status, answer = api.json("GET", "/api/v1/streams")
    assert status == 200
    return next(s for s in answer["streams"] if s["name"] == stream)


def reader(info: dict, name: str) -> dict:
    return next(r for r in info["readers"] if r["name"] == name)


def test_a_readers_lag_per_partition_from_a_known_offset_and_the_append_rates(api):
    p0, p1 = destination_in("sensors", 2, 0), destination_in("sensors", 2, 1)
    append(api, p0, 10)
    append(api, p1, 4)
    put_reader(api, "sensors", "query-1", {0: 3, 1: 4})  # 7 behind in partition 0, none in 1
    info = describe(api, "sensors")
    assert [(p["partition"], p["earliest"], p["latest"], p["records"]) for p in info["partitions"]] == [(0, 0, 10, 10), (1, 0, 4, 4)]
    q = reader(info, "query-1")
    assert q["offsets"] == {"0": 3, "1": 4} and q["lag"] == {"0": 7, "1": 0} and q["total_lag"] == 7
    assert q["lease_expiring"] is False and 599 <= q["expires_in_seconds"] <= 600
    assert info["lease_expiring_below_seconds"] == 150.0  # a quarter of the default 600 s lease
    assert info["history_interval_seconds"] == INTERVAL and info["history_window_seconds"] == 300

    append(api, p1, 5)
    info = describe(api, "sensors")
    assert reader(info, "query-1")["lag"] == {"0": 7, "1": 5} and reader(info, "query-1")["total_lag"] == 12
    summary = listed(api, "sensors")
    assert (summary["records"], summary["readers"], summary["max_lag"], summary["readers_expiring"]) == (19, 1, 12, 0)

    # The broker samples on its own: the lag over time ends at 12, and the appends show as a rate.
    info = wait_until(lambda: (i := describe(api, "sensors", history=True))
                      and (lags := reader(i, "query-1")["lag_history"]) and lags[-1]["lag"] == 12 and i,
                      5, "a sample with the reader 12 behind")
    samples = info["history"]
    # From the sample taken at start (nothing appended) to the last (all 19): the rates account for every record.
    assert samples[0]["appended"] == 0 and samples[0]["records_per_second"] is None and samples[-1]["appended"] == 19
    assert max(s["records_per_second"] for s in samples[1:]) > 0
    for before, after in zip(samples, samples[1:]):
        assert before["time_ms"] < after["time_ms"] <= before["time_ms"] + 1000 * INTERVAL * 20  # a late turn, at most
        expected = round((after["appended"] - before["appended"]) * 1000 / (after["time_ms"] - before["time_ms"]), 3)
        assert after["records_per_second"] == expected
    rates = [p["records_per_second"] for p in info["partitions"]]
    assert all(isinstance(r, float) and r >= 0 for r in rates)
    assert info["records_per_second"] == round(sum(rates), 3)
    lags = [s["lag"] for s in reader(info, "query-1")["lag_history"]]
    # 7 until the last append, 12 since; samples taken while the five sends arrive may show 8 to 11.
    assert lags[-1] == 12 and lags == sorted(lags) and set(lags) <= set(range(7, 13))
    assert reader(info, "query-1")["lag_history"][0]["time_ms"] >= samples[0]["time_ms"]


def test_a_reader_is_flagged_when_less_than_a_quarter_of_its_lease_is_left(api):
    put_reader(api, "leases", "stuck", {0: 0})
    info = describe(api, "leases")
    assert info["reader_lease_seconds"] == 2.0 and info["lease_expiring_below_seconds"] == 0.5
    assert reader(info, "stuck")["lease_expiring"] is False
    # Nobody refreshes it: 1.5 s later it has less than 0.5 s left.
    info = wait_until(lambda: (i := describe(api, "leases")) and i["readers"] and reader(i, "stuck")["lease_expiring"] and i,
                      5, "the lease flagged as expiring")
    assert reader(info, "stuck")["expires_in_seconds"] <= 0.5
    assert listed(api, "leases")["readers_expiring"] == 1
    put_reader(api, "leases", "stuck", {0: 0})  # a refresh: the whole lease again
    info = describe(api, "leases")
    assert reader(info, "stuck")["lease_expiring"] is False and reader(info, "stuck")["expires_in_seconds"] > 1.5
    api.call("DELETE", "/api/v1/streams/leases/readers/stuck")


def test_the_history_is_bounded_and_a_forgotten_reader_takes_its_own_with_it(api):
    put_reader(api, "bounded", "brief", {0: 0, 1: 0})
    wait_until(lambda: len(reader(describe(api, "bounded", history=True), "brief")["lag_history"]) >= 2, 5, "two lag samples")
    tracked = api.handle.inspect(api.handle.broker.stream_history.tracked)
    assert tracked["bounded"] == ["brief"]
    # One preallocated ring per stream and per reader, of window / interval + 1 rows, however long it runs.
    size = api.handle.inspect(lambda: api.handle.broker.stream_history.size)
    assert size == int(300 / INTERVAL) + 1
    assert len(describe(api, "bounded", history=True)["history"]) <= size

    status, _, _ = api.call("DELETE", "/api/v1/streams/bounded/readers/brief")
    assert status == 204
    wait_until(lambda: api.handle.inspect(api.handle.broker.stream_history.tracked)["bounded"] == [], 5,
               "the forgotten reader's ring dropped at the next sample")
    assert describe(api, "bounded", history=True)["readers"] == []


def test_existing_fields_are_unchanged_and_the_history_only_comes_when_asked(api):
    put_reader(api, "bounded", "plain", {0: 0})
    info = describe(api, "bounded")
    assert DESCRIBED <= set(info) and "history" not in info
    assert (info["max_age_seconds"], info["max_bytes"], info["reader_lease_seconds"]) == (3600, 1 << 20, 600.0)
    assert all(PARTITION <= set(p) for p in info["partitions"])
    assert READER <= set(reader(info, "plain")) and "lag_history" not in reader(info, "plain")
    status, body = api.json("GET", "/api/v1/streams/bounded?history=yes")
    assert status == 400 and "history" in body["error"]
    api.call("DELETE", "/api/v1/streams/bounded/readers/plain")


def test_only_the_streams_a_user_may_read(tmp_path):
    handle = BrokerHandle(auth_config(tmp_path))  # carol may read stream://sensors only; bob nothing
    try:
        status, _, body = auth_call(handle, "GET", "/api/v1/streams", "carol")
        streams = json.loads(body)["streams"]
        assert status == 200 and [s["name"] for s in streams] == ["sensors"]
        assert {"records_per_second", "max_lag", "readers_expiring"} <= set(streams[0])
        assert auth_call(handle, "GET", "/api/v1/streams/sensors?history=1", "carol")[0] == 200
        assert auth_call(handle, "GET", "/api/v1/streams/orders?history=1", "carol")[0] == 403
        assert json.loads(auth_call(handle, "GET", "/api/v1/streams", "bob")[2]) == {"streams": []}
        assert auth_call(handle, "GET", "/api/v1/streams/sensors?history=1", "bob")[0] == 403
    finally:
        handle.stop()
