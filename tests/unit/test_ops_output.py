"""The operator commands' tables and progress bar (gateway/clients/ops/output.py)."""
from __future__ import annotations

import io

from gateway.clients.ops.output import Progress, age, table


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_numbers_right_aligned_text_left_and_missing_as_dash():
    out = io.StringIO()
    table([("orders", 12, None), ("a", 3456, ["x", "y"])], ("Name", "Messages", "Subs"), out)
    assert out.getvalue().splitlines() == [
        "Name    Messages  Subs",
        "orders        12  -",
        "a           3456  x,y",
    ]


def test_progress_draws_on_a_terminal_only():
    term = Terminal()
    bar = Progress(4, "replaying DLQ", term)
    bar.update(2, final=True)
    assert term.getvalue() == "\rreplaying DLQ [###############               ] 2/4\n"
    quiet = io.StringIO()
    Progress(4, "replaying DLQ", quiet).update(4, final=True)
    assert quiet.getvalue() == ""


def test_age_is_one_unit_rounded_down():
    assert [age(ms) for ms in (None, 0, 999, 59_999, 60_000, 3_599_999, 3_600_000, 86_399_999, 86_400_000 * 3 + 5)] == [
        None, "0s", "0s", "59s", "1m", "59m", "1h", "23h", "3d",
    ]
