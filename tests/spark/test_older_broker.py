"""The Spark source against a broker from before the long poll: it falls back to asking, once told.

No test can start an older gateway, so a stand-in answers on a real socket
what one answered: the stream's description, the reader registration, and
``404 not_found`` (the router's answer to a path it has no route for) for
``GET .../latest``.  The reader must take that 404 as "no long poll here",
not as an error, keep planning batches, and not ask for the long poll again.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest
from pyspark.sql.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

from spark.options import parse_read_options
from spark.reader import GatewayStreamReader


class OlderBroker(BaseHTTPRequestHandler):
    """The stream API of a broker without ``/latest``; ``server.latest`` is the partitions' ends."""

    server: Any

    def _answer(self, status: int, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.path == "/api/v1/streams/s":
            self._answer(200, {"name": "s", "reader_lease_seconds": 600, "partitions": [
                {"partition": p, "earliest": 0, "latest": latest} for p, latest in enumerate(self.server.latest)
            ]})
        else:
            self._answer(404, {"error": f"no route for GET {self.path.split('?')[0]}", "code": "not_found"})

    def do_PUT(self) -> None:
        self.server.paths.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(200, {"registered": True})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def older() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OlderBroker)
    server.paths = []  # type: ignore[attr-defined]
    server.latest = [3, 0]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_404_for_the_long_poll_falls_back_to_asking_and_is_not_asked_again(older: Any) -> None:
    url = f"http://127.0.0.1:{older.server_address[1]}"
    reader = GatewayStreamReader(parse_read_options({"url": url, "stream": "s"}, True), StructType())
    start = reader.initialOffset()
    assert start == {"0": 3, "1": 0}  # streams start at latest, as Kafka's

    # Everything known is read: the reader would long-poll, the broker has no such route.
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first == {"0": 3, "1": 0}
    older.latest = [5, 2]
    second = reader.latestOffset(first, ReadAllAvailable())
    assert second == {"0": 5, "1": 2}
    third = reader.latestOffset(second, ReadAllAvailable())
    assert third == {"0": 5, "1": 2}

    asked = [p.split("?")[0] for p in older.paths if not p.startswith("/api/v1/streams/s/readers/")]
    assert asked.count("/api/v1/streams/s/latest") == 1, older.paths  # tried once, then never again
    assert asked[-1] == "/api/v1/streams/s"
