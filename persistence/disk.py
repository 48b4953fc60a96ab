"""The free space of the disk under a store, against a floor kept ahead of a full disk.

A full disk is a fault the store survives (persistence/rocks.py), but one it
should rarely meet: below the floor the broker holds its producers while the
disk still has room for what consumers, acks and compactions must write to
give space back.  The floor is absolute (bytes) or a share of the
filesystem ("5%"); the alarm it raises clears only with some room above it,
so producers are not switched on and off by every flush and compaction.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MIB = 1 << 20


def disk_space(path: str) -> tuple[int, int]:
    """(bytes free for an unprivileged writer, the filesystem's size) where ``path`` lives."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def parse_floor(value: object) -> int | float:
    """``disk_free_limit`` as configured: bytes (an int >= 0) or a share of the disk ("5%" -> 0.05)."""
    if isinstance(value, bool):
        raise ValueError("a number of bytes or a percentage such as \"5%\"")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("bytes must be 0 or more")
        return value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ValueError(f"{value!r} is not a percentage such as \"5%\"") from None
        if not 0 <= share < 1:
            raise ValueError(f"{value!r}: a share from 0% to under 100%")
        return share
    raise ValueError(f"{value!r}: a number of bytes or a percentage such as \"5%\"")


def human(n: int) -> str:
    """Bytes as an operator reads them in a log line or an error: 1.5 GiB, 812 MiB, 4096 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass
class FreeSpaceFloor:
    """The alarm state of one floor: on below it, off again once free space is a tenth above it."""

    floor: int | float  # bytes, or a share of the filesystem's size
    low: bool = False
    free: int = -1
    limit: int = 0

    def resolve(self, total: int) -> int:
        return int(self.floor * total) if isinstance(self.floor, float) else self.floor

    def update(self, free: int, total: int) -> bool:
        """Take a reading; True when the alarm went on or off."""
        self.free = free
        limit = self.limit = self.resolve(total)
        if not limit:
            changed, self.low = self.low, False
            return changed
        if not self.low and free < limit:
            self.low = True
            return True
        if self.low and free >= limit + max(limit // 10, MIB):
            self.low = False
            return True
        return False
