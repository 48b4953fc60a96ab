"""What configures a stream, and what a stream request can fail with.

Kept apart from ``core.stream`` so that a broker with no streams configured
never imports pyarrow (about 45 MiB of resident memory): the broker holds a
``NoStreams`` then, and only ``[streams.NAME]`` sections load the real thing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from core.errors import BrokerError

if TYPE_CHECKING:
    from core.message import Message
    from core.stream import Stream


class StreamError(BrokerError):
    """A stream request that cannot be served; ``code`` is the token the HTTP API answers with."""

    code = "bad_request"


class UnknownStream(StreamError):
    code = "unknown_stream"


class UnknownPartition(StreamError):
    code = "unknown_partition"


class OffsetOutOfRange(StreamError):
    code = "offset_out_of_range"

    def __init__(self, message: str, earliest: int, latest: int) -> None:
        super().__init__(message)
        self.earliest = earliest
        self.latest = latest


@dataclass
class StreamSpec:
    """One ``[streams.NAME]`` section: the core's typed view of it."""

    name: str
    destinations: list[str] = field(default_factory=list)
    partitions: int = 1
    # Records older than this are removed (0: kept until max_bytes says otherwise).
    max_age_seconds: float = 7 * 24 * 3600.0
    # Bytes the whole stream may take on disk (0: no limit), shared evenly by its partitions.
    max_bytes: int = 0
    # How long a reader's registered offsets hold back age retention after its last word.
    reader_lease_seconds: float = 600.0


class NoStreams:
    """The broker's streams when none is configured: nothing routes to them, every name is unknown.

    It answers what ``core.stream.StreamSet`` answers, so callers need not tell them apart.
    """

    active = False
    appended = 0

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}

    def captures(self, destination: str) -> bool:
        return False

    def get(self, name: str) -> NoReturn:
        raise UnknownStream(f"unknown stream {name!r}")

    def append(self, message: Message) -> None:
        pass  # no stream names any destination (the broker does not even call this: not active)

    def register_reader(self, stream_name: str, reader: str, offsets: dict[int, int]) -> None:
        self.get(stream_name)

    def forget_reader(self, stream_name: str, reader: str) -> None:
        self.get(stream_name)

    def recover(self) -> None:
        pass

    def sweep(self) -> int:
        return 0
