"""HTTP client for the broker's stream API (docs/streams.rst), stdlib only.

Executors run on other machines and install nothing but PySpark, so this
uses ``http.client`` and keeps one connection alive per client: a task reads
its whole range over one socket.  Every failure becomes one of spark.errors,
worded for the person running the query: the URL when nothing answers, the
broker's own ``error`` text when it refuses.
"""
from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from spark.errors import BrokerError, BrokerUnreachable, OffsetOutOfRange, UnknownStream

ARROW_STREAM = "application/vnd.apache.arrow.stream"

# A reused keep-alive connection the broker has closed in the meantime fails on
# first use with one of these; the request is then sent again on a new one.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)


@dataclass(frozen=True)
class Records:
    """One range answer: the IPC stream as received, and where to continue."""

    data: bytes
    next_offset: int
    earliest: int
    latest: int


class BrokerClient:
    """A keep-alive connection to one broker's admin listener; not thread-safe, not picklable.

    ``retry`` seconds: how long to keep trying a broker that stopped answering
    (restarted, failing over to its standby) before giving up, so a running
    query rides out a broker restart instead of failing.  A broker that has
    never answered this client fails at once (a wrong URL should say so
    now), unless ``reached`` says someone else reached it already (an
    executor's task, after the driver planned it).
    """

    def __init__(
        self, url: str, timeout: float = 60.0, retry: float = 0.0, reached: bool = False, authorization: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        self._authorization = authorization
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._retry = retry
        self._reached = reached
        self._conn: http.client.HTTPConnection | None = None

    def __getstate__(self) -> Any:
        raise TypeError("BrokerClient holds a socket; create one where it is used (read() on the executor)")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "BrokerClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------

    def _new_connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self._timeout)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise BrokerUnreachable(
                f"gateway: cannot reach the broker at {self.url}: {_reason(exc)}. Is the broker running, "
                f"and is its admin listener enabled on that address (--admin-port)?"
            ) from None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPResponse, bytes]:
        """Send one request and read the whole answer; retried while the broker is away (see ``retry``).

        Every request may be sent twice: reads and reader registrations are
        idempotent, and publishes carry duplicate-detection ids.  A 503 (the
        broker's store is full) is retried the same way: the sink waits for room.
        """
        deadline: float | None = None
        delay = 0.1
        while True:
            try:
                status, resp, data = self._request_once(method, path, body, headers)
            except BrokerUnreachable as exc:
                if not (self._retry > 0 and self._reached):
                    raise
                failure: BrokerUnreachable | None = exc
            else:
                self._reached = True
                if status != 503 or self._retry <= 0:
                    return status, resp, data
                failure = None
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._retry
            if now >= deadline:
                if failure is not None:
                    raise BrokerUnreachable(f"{failure} (kept trying for {self._retry:g} s; option 'retryTimeoutMs')") from None
                return status, resp, data
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 2.0)

    def _request_once(self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None) -> tuple[int, http.client.HTTPResponse, bytes]:
        target = self._prefix + path
        for attempt in (0, 1):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = self._new_connection()
            try:
                try:
                    sent = dict(headers) if headers else {}
                    if self._authorization is not None:
                        sent["Authorization"] = self._authorization
                    self._conn.request(method, target, body=body, headers=sent)
                except (BrokenPipeError, ConnectionResetError):
                    # A server may answer early and close before reading a body it
                    # refuses (413): its answer is still there to read.
                    resp = self._conn.getresponse()
                    data = resp.read()
                    self.close()
                    return resp.status, resp, data
                resp = self._conn.getresponse()
                data = resp.read()
            except _STALE as exc:
                self.close()
                if reused and attempt == 0:
                    continue
                raise BrokerUnreachable(f"gateway: the broker at {self.url} closed the connection during {method} {path}: {_reason(exc)}") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise BrokerUnreachable(f"gateway: {method} {self.url}{path} failed: {_reason(exc)}") from None
            if resp.will_close:
                self.close()
            return resp.status, resp, data
        raise AssertionError("unreachable")

    def _fail(self, method: str, path: str, status: int, data: bytes) -> BrokerError:
        try:
            answer = json.loads(data)
            text, code = str(answer.get("error", "")), str(answer.get("code", ""))
        except (ValueError, AttributeError):
            answer, text, code = {}, data[:200].decode("utf-8", "replace"), ""
        if status in (401, 403):
            why = "set the options user and password (or token)" if status == 401 else "the user lacks the permission (read on the stream, write on the destination)"
            return BrokerError(f"gateway: the broker at {self.url} refused {method} {path}: {status} {text or code}; {why}", status, code)
        if status == 404 and not code:
            return BrokerError(
                f"gateway: {self.url} has no stream API at {path} (404); is this the broker's admin listener?", status, code)
        return BrokerError(f"gateway: the broker at {self.url} refused {method} {path}: {status} {text or code}", status, code)

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        status, _, data = self.request(method, path, payload, headers)
        if status >= 300:
            raise self._fail(method, path, status, data)
        return json.loads(data) if data else None

    # -- the API --------------------------------------------------------------------

    def streams(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/api/v1/streams")["streams"])

    def stream(self, name: str) -> dict[str, Any]:
        """The stream's description, or UnknownStream naming the streams that do exist."""
        path = f"/api/v1/streams/{quote(name, safe='')}"
        status, _, data = self.request("GET", path)
        if status == 200:
            info: dict[str, Any] = json.loads(data)
            return info
        error = self._fail("GET", path, status, data)
        if status == 404 and error.code in ("unknown_stream", ""):
            try:
                known = ", ".join(sorted(s["name"] for s in self.streams())) or "none"
            except BrokerError:
                known = "unknown"
            raise UnknownStream(
                f"gateway: option 'stream' names {name!r}, which the broker at {self.url} does not have "
                f"(its streams: {known}); streams are configured in the broker's [streams.NAME] sections",
                status, "unknown_stream") from None
        raise error

    def stream_bounds(self, name: str, after: list[int] | None = None, wait_ms: int = 0) -> dict[int, tuple[int, int]]:
        """Each partition's (earliest, latest), from ``GET .../latest``: the long poll for new records.

        With ``after`` (every partition's latest as the caller last saw it, in
        partition order) and ``wait_ms``, the broker answers once a latest
        differs from ``after``, or when ``wait_ms`` has passed with none moved.
        """
        query: dict[str, str | int] = {}
        if after is not None:
            query["after"] = ",".join(str(int(o)) for o in after)
        if wait_ms:
            query["wait_ms"] = int(wait_ms)
        path = f"/api/v1/streams/{quote(name, safe='')}/latest" + (f"?{urlencode(query, safe=',')}" if query else "")
        status, _, data = self.request("GET", path)
        if status == 200:
            try:
                return {int(p["partition"]): (int(p["earliest"]), int(p["latest"])) for p in json.loads(data)["partitions"]}
            except (ValueError, KeyError, TypeError):
                raise BrokerError(f"gateway: the broker at {self.url} answered GET {path} with no partitions") from None
        error = self._fail("GET", path, status, data)
        if status == 404 and error.code == "unknown_stream":
            self.stream(name)  # raises UnknownStream with the list of streams
        raise error

    def offsets_for_time(self, name: str, timestamp_ms: int) -> dict[int, int]:
        answer = self._json("GET", f"/api/v1/streams/{quote(name, safe='')}/offsets?timestamp={int(timestamp_ms)}")
        return {int(p["partition"]): int(p["offset"]) for p in answer["partitions"]}

    def records(self, name: str, partition: int, start: int, end: int | None = None,
                max_records: int | None = None, max_bytes: int | None = None) -> Records:
        """Records [start, min(end, latest)) as an Arrow IPC stream; 416 becomes OffsetOutOfRange."""
        query: dict[str, int] = {"from": start}
        if end is not None:
            query["to"] = end
        if max_records is not None:
            query["max_records"] = max_records
        if max_bytes is not None:
            query["max_bytes"] = max_bytes
        path = f"/api/v1/streams/{quote(name, safe='')}/partitions/{int(partition)}/records?{urlencode(query)}"
        status, resp, data = self.request("GET", path)
        if status == 200:
            try:
                return Records(data, int(resp.headers["X-Stream-Next-Offset"]),
                               int(resp.headers["X-Stream-Earliest"]), int(resp.headers["X-Stream-Latest"]))
            except (KeyError, TypeError, ValueError):
                raise BrokerError(f"gateway: the broker at {self.url} answered GET {path} without valid X-Stream-* headers") from None
        if status == 416:
            try:
                answer = json.loads(data)
                earliest, latest = int(answer["earliest"]), int(answer["latest"])
            except (ValueError, KeyError, TypeError):
                raise self._fail("GET", path, status, data) from None
            raise OffsetOutOfRange(
                f"gateway: offset {start} of stream {name!r} partition {partition} is out of range: "
                f"the partition holds offsets {earliest} to {latest}", earliest, latest)
        if status == 404:
            try:
                code = json.loads(data).get("code")
            except ValueError:
                code = None
            if code == "unknown_stream":
                self.stream(name)  # raises UnknownStream with the list of streams
        raise self._fail("GET", path, status, data)

    def put_reader(self, name: str, reader: str, offsets: dict[int, int]) -> None:
        self._json("PUT", f"/api/v1/streams/{quote(name, safe='')}/readers/{quote(reader, safe='')}",
                   {"offsets": {str(p): int(o) for p, o in offsets.items()}})

    def delete_reader(self, name: str, reader: str) -> None:
        self._json("DELETE", f"/api/v1/streams/{quote(name, safe='')}/readers/{quote(reader, safe='')}")

    def publish(self, ipc_stream: bytes) -> tuple[int, int]:
        """POST rows as an Arrow IPC stream; answers (accepted, duplicates) once they are on disk."""
        path = "/api/v1/messages"
        status, _, data = self.request("POST", path, ipc_stream, {"Content-Type": ARROW_STREAM})
        if status == 413:
            raise BrokerError(
                f"gateway: the broker at {self.url} refused a publish request of {len(ipc_stream)} bytes as too large (413); "
                f"lower the option 'maxBytesPerRequest' or raise the broker's max_request_size", status, "too_large")
        if status >= 300:
            raise self._fail("POST", path, status, data)
        answer = json.loads(data)
        return int(answer["accepted"]), int(answer.get("duplicates", 0))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    text = str(exc) or type(exc).__name__
    return text
