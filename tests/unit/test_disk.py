"""The free-space floor: its setting, its hysteresis, and the numbers operators read."""
from __future__ import annotations

import pytest

from persistence.disk import MIB, FreeSpaceFloor, disk_space, human, parse_floor


@pytest.mark.parametrize("value, expected", [(0, 0), (1 << 30, 1 << 30), ("5%", 0.05), (" 12.5% ", 0.125), ("0%", 0.0)])
def test_a_floor_is_bytes_or_a_share_of_the_disk(value, expected):
    assert parse_floor(value) == expected


@pytest.mark.parametrize("value", [-1, True, "5", "100%", "-1%", "five%", 1.5, None])
def test_a_floor_that_is_neither_is_refused(value):
    with pytest.raises(ValueError):
        parse_floor(value)


def test_the_alarm_goes_on_below_the_floor_and_off_only_a_tenth_above_it():
    floor = FreeSpaceFloor(100 * MIB)
    total = 1000 * MIB
    assert floor.update(150 * MIB, total) is False and not floor.low
    assert floor.update(99 * MIB, total) is True and floor.low
    # Back at the floor, and just above it: still on, or producers would flap with every flush.
    assert floor.update(100 * MIB, total) is False and floor.low
    assert floor.update(109 * MIB, total) is False and floor.low
    assert floor.update(110 * MIB, total) is True and not floor.low
    assert (floor.free, floor.limit) == (110 * MIB, 100 * MIB)


def test_a_share_is_resolved_against_the_filesystem_size():
    floor = FreeSpaceFloor(0.05)
    assert floor.update(60 * MIB, 1000 * MIB) is False and floor.limit == 50 * MIB
    assert floor.update(49 * MIB, 1000 * MIB) is True and floor.low


def test_no_floor_never_alarms():
    floor = FreeSpaceFloor(0)
    assert floor.update(0, 1000 * MIB) is False and not floor.low


def test_disk_space_reads_the_filesystem(tmp_path):
    free, total = disk_space(str(tmp_path))
    assert 0 <= free <= total and total > 0


@pytest.mark.parametrize("n, text", [(512, "512 B"), (2048, "2.0 KiB"), (13 * MIB + MIB // 2, "13.5 MiB"), (3 << 30, "3.0 GiB")])
def test_human_sizes(n, text):
    assert human(n) == text
