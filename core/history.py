"""A short history of the broker's message totals: what a console loaded now shows of the last minutes.

A page that computes rates from its own polls starts with an empty chart on
every load, and shows nothing of a burst that ended before it was opened.  So
the broker samples its totals (messages in from clients, messages out to them:
the counters ``/api/v1/overview`` answers with) every ``interval`` seconds and
keeps the samples of the last ``window`` seconds in a ring, as RabbitMQ's
management plugin keeps its message-rate samples.  Sixty-one samples of three
integers: memory that does not grow, and a sum over the connections every few
seconds, as ``$SYS`` does.
"""
from __future__ import annotations

from collections import deque
from typing import Any

WINDOW_SECONDS = 300.0  # what the console's chart spans: five minutes


class TrafficHistory:
    """Samples (time ms, messages received, messages sent), oldest first, the last ``window`` seconds of them."""

    def __init__(self, interval: float, window: float = WINDOW_SECONDS) -> None:
        self.interval = interval if interval > 0 else 0.0
        self.window = window
        # One more than fit in the window: the first sample of it is the base of the first rate.
        size = int(window / self.interval) + 1 if self.interval else 1
        self.samples: deque[tuple[int, int, int]] = deque(maxlen=size)

    def add(self, now_ms: int, received: int, sent: int) -> None:
        self.samples.append((now_ms, received, sent))

    def describe(self) -> list[dict[str, Any]]:
        """The samples as the admin API answers them, each with the rates since the one before.

        A rate is per second over the real time between two samples (a turn of the
        reactor can be late); the first sample has none (null).  A total that went
        down cannot happen in one process, but would give null rather than a negative rate.
        """
        out: list[dict[str, Any]] = []
        before: tuple[int, int, int] | None = None
        for sample in self.samples:
            at, received, sent = sample
            in_rate: float | None = None
            out_rate: float | None = None
            if before is not None and at > before[0]:
                seconds = (at - before[0]) / 1000
                if received >= before[1]:
                    in_rate = round((received - before[1]) / seconds, 3)
                if sent >= before[2]:
                    out_rate = round((sent - before[2]) / seconds, 3)
            out.append({"time_ms": at, "received": received, "sent": sent,
                        "in_per_second": in_rate, "out_per_second": out_rate})
            before = sample
        return out
