"""Parsing and checking the data source's options, once, on the driver.

Spark hands options over as a case-insensitive map of strings and passes
along options that are not ours, so unknown names are ignored; but a known
option with a bad value must fail at ``load()``/``save()`` time with a
message naming the option and the value, not as a stack trace from deep
inside a task.  Names follow Spark's Kafka source where they mean the same.
"""
from __future__ import annotations

import base64

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Union
from urllib.parse import urlsplit

from spark.errors import OptionError

EARLIEST = -2  # in offset JSON, as Kafka
LATEST = -1

# "earliest", "latest", or explicit per-partition offsets (which may hold EARLIEST/LATEST).
OffsetSpec = Union[str, dict[int, int]]

READER_NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")
DESTINATION_PREFIXES = ("topic://", "queue://", "/topic/", "/queue/")

DEFAULT_TIMEOUT_MS = 60_000
DEFAULT_RETRY_MS = 30_000
DEFAULT_MAX_ROWS_PER_REQUEST = 10_000
DEFAULT_MAX_BYTES_PER_REQUEST = 4 << 20
# How long latestOffset may wait for new records when a query has read all there was
# (the broker's long poll, as Kafka's fetch.max.wait.ms); the broker waits 30 s at most.
DEFAULT_LATEST_OFFSET_WAIT_MS = 1_000
MAX_LATEST_OFFSET_WAIT_MS = 30_000


@dataclass(frozen=True)
class ReadOptions:
    """What a reader needs; frozen and plain so it pickles into every partition cheaply."""

    url: str
    stream: str
    starting: OffsetSpec
    starting_timestamp: int | None
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int | None
    include_headers: bool
    reader_name: str | None
    max_records_per_fetch: int | None
    max_bytes_per_fetch: int | None
    timeout: float
    retry: float
    authorization: str | None = None  # the HTTP Basic header of user/password, for a broker with users
    latest_offset_wait_ms: int = DEFAULT_LATEST_OFFSET_WAIT_MS  # 0: latestOffset never waits


@dataclass(frozen=True)
class WriteOptions:
    url: str
    destination: str | None
    id_column: str | None
    max_rows_per_request: int
    max_bytes_per_request: int
    timeout: float
    retry: float
    authorization: str | None = None


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    # Spark's map is already case-insensitive; a plain dict from a test or a caller is not.
    return {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}


def _get(opts: dict[str, str], name: str) -> str | None:
    return opts.get(name.lower())


def parse_url(opts: dict[str, str]) -> str:
    """The broker's admin URL without a trailing slash.

    Required rather than defaulting to loopback: on a cluster, executors
    would each silently talk to their own machine.
    """
    raw = _get(opts, "url")
    if raw is None or not raw.strip():
        raise OptionError("url", raw, "is required: the broker's admin HTTP address, e.g. http://127.0.0.1:8161")
    url = raw.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise OptionError("url", raw, "must be http://HOST:PORT or https://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise OptionError("url", raw, "must be http://HOST:PORT or https://HOST:PORT")
    del port
    return url.rstrip("/")


def _int(opts: dict[str, str], name: str, minimum: int, what: str) -> int | None:
    raw = _get(opts, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(name, raw, f"must be {what}") from None
    if value < minimum:
        raise OptionError(name, raw, f"must be {what}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = _get(opts, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(name, raw, "must be true or false")
    return value == "true"


def _timeout(opts: dict[str, str]) -> float:
    ms = _int(opts, "requestTimeoutMs", 1, "a positive number of milliseconds")
    return (DEFAULT_TIMEOUT_MS if ms is None else ms) / 1000.0


def _authorization(opts: dict[str, str]) -> str | None:
    """``user`` and ``password`` as HTTP Basic, or ``token`` as a bearer token (Spark redacts both names in plans and logs)."""
    user, password, token = _get(opts, "user"), _get(opts, "password"), _get(opts, "token")
    if token is not None:
        if user is not None or password is not None:
            raise OptionError("token", "(redacted)", "replaces user and password: give one or the other")
        if not token.startswith("gwt_") or any(c.isspace() for c in token):
            raise OptionError("token", "(redacted)", "must be a token made by `gateway token FILE USER` (gwt_...)")
        return "Bearer " + token
    if user is None and password is None:
        return None
    if not user or password is None:
        raise OptionError("user", user, "and password go together: the broker's user name and password")
    if ":" in user:
        raise OptionError("user", user, "must not contain ':' (HTTP Basic)")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")


def _retry(opts: dict[str, str]) -> float:
    """How long a running query keeps trying a broker that went away (a restart, a failover)."""
    ms = _int(opts, "retryTimeoutMs", 0, "a number of milliseconds (0: fail at once)")
    return (DEFAULT_RETRY_MS if ms is None else ms) / 1000.0


def parse_offsets(name: str, raw: str, stream: str, *, allow_earliest: bool) -> OffsetSpec:
    """``earliest``/``latest`` or JSON per partition, flat or nested under the stream's name.

    Kafka nests per topic ({"sensors": {"0": 23}}); a single stream makes the
    flat form ({"0": 23}) the natural one, and both are accepted so options
    can be carried over from a Kafka query.
    """
    text = raw.strip()
    words = ("earliest", "latest") if allow_earliest else ("latest",)
    if text.lower() in words:
        return text.lower()
    expected = (
        f"must be {' or '.join(repr(w) for w in words)} or JSON offsets per partition such as "
        + ('{"0": 23, "1": -2} (-2 = earliest, -1 = latest)' if allow_earliest else '{"0": 23, "1": -1} (-1 = latest)')
    )
    try:
        data = json.loads(text)
    except ValueError:
        raise OptionError(name, raw, expected) from None
    if not isinstance(data, dict) or not data:
        raise OptionError(name, raw, expected)
    if all(isinstance(v, dict) for v in data.values()):
        others = sorted(k for k in data if k != stream)
        if others:
            raise OptionError(name, raw, f"names stream(s) {', '.join(others)} but option 'stream' is {stream!r}")
        data = data[stream]
    offsets: dict[int, int] = {}
    lowest = EARLIEST if allow_earliest else LATEST
    for key, value in data.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise OptionError(name, raw, f"has partition {key!r}; partitions are numbers 0, 1, ...: {expected}")
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise OptionError(name, raw, f"has offset {value!r} for partition {key}: {expected}")
        offsets[int(key)] = value
    return offsets


def parse_read_options(options: Mapping[str, Any], streaming: bool | None) -> ReadOptions:
    """Every read option, checked; defaults follow Kafka (streams start at latest, batches at earliest).

    ``streaming`` None: not known yet (``DataSource.schema``), so options that
    fit only one kind of query are not judged.
    """
    opts = _lower(options)
    url = parse_url(opts)
    stream = _get(opts, "stream")
    if stream is None or not stream.strip():
        raise OptionError("stream", stream, "is required: the name of the broker stream to read")
    stream = stream.strip()
    if "/" in stream or "?" in stream or "#" in stream:
        raise OptionError("stream", stream, "must be a stream name (no '/', '?' or '#')")

    raw_start = _get(opts, "startingOffsets")
    starting = parse_offsets("startingOffsets", raw_start, stream, allow_earliest=True) if raw_start is not None else (
        "latest" if streaming else "earliest")
    starting_timestamp = _int(opts, "startingTimestamp", 0, "a timestamp in epoch milliseconds (an integer >= 0)")

    raw_end = _get(opts, "endingOffsets")
    if raw_end is not None and streaming is True:
        raise OptionError("endingOffsets", raw_end, "is for batch queries only (spark.read); a stream has no end")
    ending = parse_offsets("endingOffsets", raw_end, stream, allow_earliest=False) if raw_end is not None else "latest"

    max_per_trigger = _int(opts, "maxOffsetsPerTrigger", 1, "a positive integer (records per micro-batch)")
    if max_per_trigger is not None and streaming is False:
        raise OptionError("maxOffsetsPerTrigger", _get(opts, "maxOffsetsPerTrigger"), "is for streaming queries only (spark.readStream)")

    reader_name = _get(opts, "readerName")
    if reader_name is not None and not READER_NAME.fullmatch(reader_name):
        raise OptionError("readerName", reader_name, "must be 1-200 characters of letters, digits and ._:-")

    timeout = _timeout(opts)
    wait_ms = _latest_offset_wait(opts, streaming, timeout)

    return ReadOptions(
        url=url,
        stream=stream,
        starting=starting,
        starting_timestamp=starting_timestamp,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        min_partitions=_int(opts, "minPartitions", 1, "a positive integer"),
        include_headers=_bool(opts, "includeHeaders", False),
        reader_name=reader_name,
        max_records_per_fetch=_int(opts, "maxRecordsPerFetch", 1, "a positive integer"),
        max_bytes_per_fetch=_int(opts, "maxBytesPerFetch", 1, "a positive number of bytes"),
        timeout=timeout,
        retry=_retry(opts),
        authorization=_authorization(opts),
        latest_offset_wait_ms=wait_ms,
    )


def _latest_offset_wait(opts: dict[str, str], streaming: bool | None, timeout: float) -> int:
    """latestOffsetWaitMs: 0 to 30,000, and shorter than an HTTP request may take."""
    raw = _get(opts, "latestOffsetWaitMs")
    if raw is not None and streaming is False:
        raise OptionError("latestOffsetWaitMs", raw, "is for streaming queries only (spark.readStream)")
    what = f"a number of milliseconds from 0 (never wait) to {MAX_LATEST_OFFSET_WAIT_MS:,}"
    ms = _int(opts, "latestOffsetWaitMs", 0, what)
    if ms is None:
        return min(DEFAULT_LATEST_OFFSET_WAIT_MS, int(timeout * 1000) // 2)
    if ms > MAX_LATEST_OFFSET_WAIT_MS:
        raise OptionError("latestOffsetWaitMs", raw, f"must be {what}")
    if ms and ms >= timeout * 1000:
        raise OptionError("latestOffsetWaitMs", raw, f"must be shorter than requestTimeoutMs ({int(timeout * 1000)}): "
                                                     f"the broker's answer may take that long")
    return ms


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    opts = _lower(options)
    destination = _get(opts, "destination")
    if destination is not None:
        destination = destination.strip()
        if not destination.startswith(DESTINATION_PREFIXES) or destination in DESTINATION_PREFIXES:
            raise OptionError("destination", destination, "must be topic://NAME, queue://NAME, /topic/NAME or /queue/NAME")
    id_column = _get(opts, "idColumn")
    if id_column is not None and not id_column.strip():
        raise OptionError("idColumn", id_column, "must name a string column")
    return WriteOptions(
        url=parse_url(opts),
        destination=destination,
        id_column=id_column.strip() if id_column is not None else None,
        max_rows_per_request=_int(opts, "maxRowsPerRequest", 1, "a positive integer") or DEFAULT_MAX_ROWS_PER_REQUEST,
        max_bytes_per_request=_int(opts, "maxBytesPerRequest", 1, "a positive number of bytes") or DEFAULT_MAX_BYTES_PER_REQUEST,
        timeout=_timeout(opts),
        retry=_retry(opts),
        authorization=_authorization(opts),
    )
