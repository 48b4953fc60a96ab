"""Tables for people, JSON for scripts, a progress bar where work is long."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO | None = None) -> None:
    """Columns sized to their widest cell; numbers right-aligned, as dstat prints them."""
    out = out or sys.stdout
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in rows) if rows else False
               for i in range(len(headers))]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    print(line(headers), file=out)
    for row in cells:
        print(line(row), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def age(ms: int | None) -> str | None:
    """12s, 5m, 3h, 2d (rounded down): how long a message has waited, read at a glance in a narrow column."""
    if ms is None:
        return None
    seconds = max(0, ms) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def dump(value: Any, out: TextIO | None = None) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), file=out or sys.stdout)


class Progress:
    """``done/total`` with a bar on a terminal (redrawn at most 10 times a second); nothing otherwise."""

    def __init__(self, total: int, what: str, out: TextIO | None = None) -> None:
        self.total = max(total, 0)
        self.what = what
        self.out = out or sys.stderr
        self.shown = self.out.isatty()
        self._last = 0.0

    def update(self, done: int, final: bool = False) -> None:
        if not self.shown:
            return
        now = time.monotonic()
        if not final and now - self._last < 0.1:
            return
        self._last = now
        total = max(self.total, done)
        fraction = done / total if total else 1.0
        bar = "#" * int(fraction * 30)
        self.out.write(f"\r{self.what} [{bar:<30}] {done}/{total}")
        if final:
            self.out.write("\n")
        self.out.flush()
