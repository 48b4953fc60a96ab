"""The admin HTTP API's stream and publish endpoints, over real HTTP (docs/streams.rst)."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pyarrow as pa
import pytest

from core.stream import StreamSpec
from tests.support import BrokerHandle, connect, disconnect, make_config, mqtt_close, mqtt_connect, sync

ARROW = "application/vnd.apache.arrow.stream"


@pytest.fixture
def api(tmp_path):
    config = make_config(tmp_path)
    config.streams = [StreamSpec("sensors", ["topic://sensors.>"], partitions=2), StreamSpec("orders", ["queue://orders"])]
    config.admin_settings.max_request_size = 256 * 1024
    handle = BrokerHandle(config)
    yield Api(handle)
    handle.stop()


class Api:
    def __init__(self, handle: BrokerHandle) -> None:
        self.handle = handle
        self.base = f"http://127.0.0.1:{handle.admin_port}"

    def call(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None, headers: dict | None = None):
        request = urllib.request.Request(self.base + path, data=body, method=method, headers=headers or {})
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def json(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None):
        status, headers, data = self.call(method, path, body, content_type)
        assert headers.get("Content-Type") == "application/json", (status, data)
        return status, json.loads(data)

    def records(self, stream: str, partition: int, query: str) -> tuple[pa.Table, dict]:
        status, headers, data = self.call("GET", f"/api/v1/streams/{stream}/partitions/{partition}/records?{query}")
        assert status == 200, data
        assert headers["Content-Type"] == ARROW
        return pa.ipc.open_stream(data).read_all(), headers


def publish_arrow(api: Api, rows: dict) -> tuple[int, dict]:
    table = pa.table(rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return api.json("POST", "/api/v1/messages", sink.getvalue().to_pybytes(), ARROW)


def test_offsets_and_records_of_what_stomp_and_mqtt_sent(api):
    conn, got = connect(api.handle)
    for i in range(3):
        conn.send("/topic/sensors.a", f"s{i}", headers={"persistent": "true", "k": "v"})
    sync(conn, got)
    mqtt, _ = mqtt_connect(api.handle, "d1", version=5)
    mqtt.publish("sensors/a", bytes([0, 255, 1]), qos=1).wait_for_publish()
    status, listing = api.json("GET", "/api/v1/streams")
    assert status == 200 and [(s["name"], s["partitions"], s["records"], s["readers"]) for s in listing["streams"]] == [
        ("sensors", 2, 4, 0), ("orders", 1, 0, 0)]
    assert listing["streams"][0]["bytes"] > 0 and listing["streams"][1]["bytes"] == 0
    status, info = api.json("GET", "/api/v1/streams/sensors")
    index = next(p["partition"] for p in info["partitions"] if p["latest"])
    assert info["partitions"][index]["earliest"] == 0 and info["partitions"][index]["latest"] == 4
    assert info["destinations"] == ["topic://sensors.>"]
    table, headers = api.records("sensors", index, "from=0")
    assert table.column("body").to_pylist() == [b"s0", b"s1", b"s2", bytes([0, 255, 1])]
    assert table.column("offset").to_pylist() == [0, 1, 2, 3]
    assert dict(table.column("headers").to_pylist()[0]) == {"k": "v", "persistent": "true"}
    assert (headers["X-Stream-Next-Offset"], headers["X-Stream-Earliest"], headers["X-Stream-Latest"]) == ("4", "0", "4")
    # The same range is the same records every time, and bounded reads continue where they stop.
    again, _ = api.records("sensors", index, "from=0")
    assert again.equals(table)
    part, headers = api.records("sensors", index, "from=1&max_records=2")
    assert part.column("offset").to_pylist() == [1, 2] and headers["X-Stream-Next-Offset"] == "3"
    part, headers = api.records("sensors", index, "from=1&to=2")
    assert part.column("offset").to_pylist() == [1]
    empty, headers = api.records("sensors", index, "from=4")
    assert empty.num_rows == 0 and headers["X-Stream-Next-Offset"] == "4"
    status, _, text = api.call("GET", f"/api/v1/streams/sensors/partitions/{index}/records?from=2&format=jsonl")
    lines = [json.loads(line) for line in text.decode().splitlines()]
    assert [line["offset"] for line in lines] == [2, 3]
    assert lines[0]["body"] == "s2" and lines[1]["body_base64"] == "AP8B"
    assert lines[0]["destination"] == "topic://sensors.a" and lines[0]["message_id"].startswith("ID:")
    mqtt_close(mqtt)
    disconnect(conn)


def test_offsets_for_a_timestamp(api):
    conn, got = connect(api.handle)
    conn.send("/queue/orders", "o1", headers={"persistent": "true"})
    sync(conn, got)
    status, found = api.json("GET", "/api/v1/streams/orders/offsets?timestamp=0")
    assert found == {"partitions": [{"partition": 0, "offset": 0}]}
    status, found = api.json("GET", "/api/v1/streams/orders/offsets?timestamp=99999999999999")
    assert found == {"partitions": [{"partition": 0, "offset": 1}]}
    disconnect(conn)


@pytest.mark.parametrize("path, status, code, text", [
    ("/api/v1/streams/nope", 404, "unknown_stream", "unknown stream 'nope'"),
    ("/api/v1/streams/sensors/partitions/9/records?from=0", 404, "unknown_partition", "partitions 0-1, not 9"),
    ("/api/v1/streams/sensors/partitions/x/records?from=0", 404, "unknown_partition", "no partition 'x'"),
    ("/api/v1/streams/sensors/partitions/0/records", 400, "bad_request", "parameter from"),
    ("/api/v1/streams/sensors/partitions/0/records?from=abc", 400, "bad_request", "from must be an integer"),
    ("/api/v1/streams/sensors/partitions/0/records?from=0&max_records=0", 400, "bad_request", "max_records must be"),
    ("/api/v1/streams/sensors/partitions/0/records?from=0&format=xml", 400, "bad_request", "format must be arrow or jsonl"),
    ("/api/v1/streams/sensors/partitions/0/records?from=7", 416, "offset_out_of_range", "out of range [0, 0]"),
    ("/api/v1/streams/sensors/offsets", 400, "bad_request", "timestamp"),
    ("/api/v1/nothing-here", 404, "not_found", "no such resource"),
])
def test_bad_requests_get_a_json_error(api, path, status, code, text):
    got_status, body = api.json("GET", path)
    assert got_status == status and body["code"] == code and text in body["error"], body
    if code == "offset_out_of_range":
        assert (body["earliest"], body["latest"]) == (0, 0)


def test_methods_are_checked(api):
    status, body = api.json("DELETE", "/api/v1/streams")
    assert status == 405 and body["code"] == "method_not_allowed"


def test_readers_register_and_leave(api):
    status, _, _ = api.call("PUT", "/api/v1/streams/sensors/readers/query-1", json.dumps({"offsets": {"0": 0, "1": 0}}).encode(), "application/json")
    assert status == 204
    _, info = api.json("GET", "/api/v1/streams/sensors")
    assert [r["name"] for r in info["readers"]] == ["query-1"] and info["readers"][0]["offsets"] == {"0": 0, "1": 0}
    conn, got = connect(api.handle)
    for i in range(2):
        conn.send("/topic/sensors.a", f"s{i}", headers={"persistent": "true"})
    sync(conn, got)
    disconnect(conn)
    _, info = api.json("GET", "/api/v1/streams/sensors")
    # Lag: what the reader has yet to read, up to each partition's latest offset.
    assert sum(info["readers"][0]["lag"].values()) == 2
    assert info["readers"][0]["lag"] == {str(p["partition"]): p["latest"] for p in info["partitions"]}
    status, body = api.json("PUT", "/api/v1/streams/sensors/readers/query-1", b"[]", "application/json")
    assert status == 400 and "offsets" in body["error"]
    status, body = api.json("PUT", "/api/v1/streams/sensors/readers/q", json.dumps({"offsets": {"5": 0}}).encode(), "application/json")
    assert status == 404
    status, _, _ = api.call("DELETE", "/api/v1/streams/sensors/readers/query-1")
    assert status == 204
    _, info = api.json("GET", "/api/v1/streams/sensors")
    assert info["readers"] == []


def test_publish_arrow_rows_once_with_duplicate_ids(api):
    conn, got = connect(api.handle)
    conn.subscribe("/queue/orders", id="1", ack="auto")
    rows = {
        "destination": ["queue://orders", "/queue/orders", "queue://orders"],
        "body": [b"a", b"b", b"c"],
        "headers": pa.array([[("k", "1")], [], [("content-type", "text/plain")]], type=pa.map_(pa.string(), pa.string())),
        "id": ["id-a", "id-b", "id-c"],
    }
    status, answer = publish_arrow(api, rows)
    assert status == 200 and answer == {"accepted": 3, "duplicates": 0}
    status, answer = publish_arrow(api, rows)  # a retried batch
    assert status == 200 and answer == {"accepted": 0, "duplicates": 3}
    frames = got.wait_for(3)
    assert [f.body for f in got.settle()] == ["a", "b", "c"]
    assert frames[0].headers["k"] == "1" and frames[2].headers["content-type"] == "text/plain"
    assert frames[0].headers["_AMQ_DUPL_ID"] == "id-a"
    # The stream captured each once, persisted before the answer came.
    table, _ = api.records("orders", 0, "from=0")
    assert table.column("body").to_pylist() == [b"a", b"b", b"c"]
    disconnect(conn)


def test_publish_json_lines(api):
    conn, got = connect(api.handle)
    conn.subscribe("/topic/sensors.x", id="1", ack="auto")
    sync(conn, got)
    lines = b'{"destination": "/topic/sensors.x", "body": "hello", "headers": {"h": "1"}}\n{"destination": "topic://sensors.x", "body_base64": "AAE="}\n'
    status, answer = api.json("POST", "/api/v1/messages", lines, "application/x-ndjson")
    assert status == 200 and answer == {"accepted": 2, "duplicates": 0}
    frames = got.wait_for(2)
    assert frames[0].body == "hello" and frames[0].headers["h"] == "1"
    disconnect(conn)


@pytest.mark.parametrize("body, content_type, status, text", [
    (b'{"destination": "/queue/x"}\n', "application/x-ndjson", 400, "line 1: body must be a string"),
    (b'{"destination": "/nowhere/x", "body": "1"}\n', "application/x-ndjson", 400, "line 1: unknown destination"),
    (b'{"destination": "topic://a.*", "body": "1"}\n', "application/x-ndjson", 400, "wildcard"),
    (b'{"destination": "/stream/sensors", "body": "1"}\n', "application/x-ndjson", 400, "is a stream"),
    (b'{"destination": "/queue/x", "body": "1", "headers": {"priority": "high"}}\n', "application/x-ndjson", 400, "priority must be an integer"),
    (b'not json\n', "application/x-ndjson", 400, "line 1: not JSON"),
    (b'garbage', ARROW, 400, "not an Arrow IPC stream"),
    (b'{}', "text/plain", 415, "Content-Type must be"),
])
def test_bad_publishes_send_nothing(api, body, content_type, status, text):
    got_status, answer = api.json("POST", "/api/v1/messages", body, content_type)
    assert got_status == status and text in answer["error"], answer
    assert api.handle.queue_depth("queue://x") == 0


def test_one_bad_row_refuses_the_whole_request(api):
    status, answer = publish_arrow(api, {"destination": ["queue://orders", "queue://orders.*x", "/bad"], "body": [b"1", b"2", b"3"]})
    assert status == 400 and "row 2" in answer["error"]
    assert api.handle.queue_depth("queue://orders") == 0


def test_a_body_over_the_limit_is_refused_before_it_is_read(api):
    with socket.create_connection(("127.0.0.1", api.handle.admin_port), timeout=5) as sock:
        sock.sendall(b"POST /api/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: 999999999\r\n\r\n")
        answer = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 413") and b"max_request_size" in answer
    status, _ = api.json("GET", "/api/v1/streams")
    assert status == 200


def test_a_broker_without_streams_answers_too(broker):
    api = Api(broker)
    status, listing = api.json("GET", "/api/v1/streams")
    assert status == 200 and listing == {"streams": []}
    status, body = api.json("GET", "/api/v1/streams/sensors/partitions/0/records?from=0")
    assert status == 404 and body["code"] == "unknown_stream"
    status, answer = api.json("POST", "/api/v1/messages", b'{"destination": "/queue/plain", "body": "x"}\n', "application/x-ndjson")
    assert status == 200 and answer == {"accepted": 1, "duplicates": 0}
    assert broker.queue_bodies("queue://plain") == [b"x"]


def test_the_index_counts_dropped_duplicates(api):
    rows = b'{"destination": "/queue/orders", "body": "1", "id": "same"}\n'
    for _ in range(3):
        api.json("POST", "/api/v1/messages", rows, "application/x-ndjson")
    status, index = api.json("GET", "/api/v1")
    assert status == 200 and index["duplicates"] == {"dropped": 2, "remembered": 1}
    assert "/api/v1/streams" in index["api"]


def test_deeply_nested_json_is_a_bad_request(api):
    nested = b"[" * 100_000 + b"]" * 100_000
    status, body = api.json("POST", "/api/v1/messages", nested + b"\n", "application/x-ndjson")
    assert status == 400 and "nested too deeply" in body["error"]
    status, body = api.json("PUT", "/api/v1/streams/sensors/readers/r", b'{"offsets": ' + nested + b"}", "application/json")
    assert status == 400 and "offsets" in body["error"]
