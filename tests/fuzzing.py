"""Shared pieces of the fuzz tests: example budgets, byte mutations, chunking.

The fuzz tests (``tests/unit/test_stomp_codec_fuzz.py``,
``tests/unit/test_mqtt_codec_fuzz.py``, ``tests/integration/test_fuzz_live.py``)
run a small, fixed budget by default so that the whole suite stays fast in CI.
A longer run is the same tests with a bigger budget::

    FUZZ_EXAMPLES=20000 python -m pytest tests/unit/test_stomp_codec_fuzz.py \\
        tests/unit/test_mqtt_codec_fuzz.py tests/integration/test_fuzz_live.py

``FUZZ_EXAMPLES`` is the number of examples each codec property gets; a live
test gets a tenth of it (each of its examples is a real connection), and no
test ever gets fewer than its CI budget.  In a long run pytest's per-test
timeout is raised to match, and Hypothesis prints the reproduction blob of any
failure so it can be replayed with ``@reproduce_failure``.
"""
from __future__ import annotations

import os
from itertools import pairwise
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Examples per codec property in a long run; None in the default (CI) run.
LONG_RUN: int | None = int(os.environ["FUZZ_EXAMPLES"]) if os.environ.get("FUZZ_EXAMPLES") else None

_COMMON: dict[str, Any] = {
    # Fuzz examples vary a lot in size; a slow one is not a failure.
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}
settings.register_profile("fuzz-ci", **_COMMON)
settings.register_profile("fuzz-long", print_blob=True, **_COMMON)


def fuzz_settings(ci_examples: int, cost: int = 1) -> settings:
    """Hypothesis settings for one fuzz property.

    ``ci_examples`` is the default budget; ``cost`` is how many codec examples
    one example of this property is worth (10 for a live-broker example), so
    that a long run spends its time evenly.
    """
    if LONG_RUN is None:
        return settings(settings.get_profile("fuzz-ci"), max_examples=ci_examples)
    return settings(settings.get_profile("fuzz-long"), max_examples=max(ci_examples, LONG_RUN // cost))


def timeout_mark() -> Any:
    """pytest-timeout for a fuzz module: the configured 120 s, or enough for a long run."""
    if LONG_RUN is None:
        return pytest.mark.timeout(120)
    return pytest.mark.timeout(120 + LONG_RUN // 10)


# --------------------------------------------------------------------------- mutations

#: Bytes that mean something to STOMP or MQTT framing, spliced in by ``mutate``.
TOKENS = (
    b"\x00",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b":",
    b"\\",
    b"\\c",
    b"\\n",
    b"\\r",
    b"\\t",
    b"content-length:",
    b"content-length:0\n",
    b"content-length:99999999\n",
    b"receipt:r\n",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
    b"\x80",
    b"\x7f",
    b"\xff\xff\xff\x7f",  # the largest 4-byte Variable Byte Integer
    b"\xff\xff\xff\xff\x7f",  # a 5-byte one
    b"\x00\x00",
    b"\xff\xff",
    b"\x10",
    b"\x30",
    b"\x82",
    b"\xe0\x00",
    b"\xf0",
    b"+",
    b"#",
    b"/",
)

_OPS = ("flip", "set", "delete", "insert", "token", "duplicate", "truncate", "swap")


@st.composite
def mutate(draw: Callable[..., Any], data: bytes, max_ops: int = 4) -> bytes:
    """``data`` after 1..max_ops random edits of the kinds a broken or hostile peer makes.

    Bit flips, overwritten bytes, deleted and duplicated ranges, inserted
    random bytes or framing tokens, truncation and swapped ranges.
    """
    out = bytearray(data)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(_OPS))
        n = len(out)
        if op in ("flip", "set", "delete", "duplicate", "truncate", "swap") and not n:
            op = "insert"
        if op == "flip":
            i = draw(st.integers(0, n - 1))
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            out[draw(st.integers(0, n - 1))] = draw(st.integers(0, 255))
        elif op == "delete":
            i = draw(st.integers(0, n - 1))
            del out[i : i + draw(st.integers(1, 8))]
        elif op == "insert":
            i = draw(st.integers(0, n))
            out[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "token":
            i = draw(st.integers(0, n))
            out[i:i] = draw(st.sampled_from(TOKENS))
        elif op == "duplicate":
            i = draw(st.integers(0, n - 1))
            piece = out[i : i + draw(st.integers(1, 64))]
            j = draw(st.integers(0, n))
            out[j:j] = piece
        elif op == "truncate":
            del out[draw(st.integers(0, n - 1)) :]
        else:  # swap two adjacent ranges
            i = draw(st.integers(0, n - 1))
            j = draw(st.integers(i, n))
            k = draw(st.integers(j, n))
            out[i:k] = out[j:k] + out[i:j]
    return bytes(out)


def split(draw: Callable[..., Any], data: bytes, max_cuts: int = 8) -> list[bytes]:
    """``data`` cut at up to ``max_cuts`` random points (empty pieces included, as reads can be)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=max_cuts)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]
