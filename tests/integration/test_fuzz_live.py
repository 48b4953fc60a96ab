"""Fuzzing a live broker over real loopback sockets: STOMP, MQTT and WebSocket.

Generated client sessions (CONNECT, then frames or packets of every kind),
the same after random edits, and random bytes are sent to one broker.  For
every input:

* what the broker answers decodes as server frames/packets and ends the way
  the protocol says: normal replies, an ERROR (STOMP) / a refusing CONNACK or a
  DISCONNECT (MQTT 5) followed by the broker closing, or just a close; the
  broker closes a connection at the latest when the client's side ends, never
  leaving it hanging;
* nothing reaches Twisted's log as a failure (an exception that escaped a
  session, or one a session caught as an internal error);
* afterwards a fresh client still round-trips a message on each protocol,
  clients subscribed all along (STOMP 1.0/1.1/1.2 and MQTT 3.1.1/5.0 watching
  the fuzzed topics) still receive and can parse everything, and messages
  stored before the fuzzing (a persistent STOMP message, a QoS 1 message for
  an offline MQTT session) are still there and can be consumed.

One broker serves the whole module, so what one input leaves behind (queues,
retained messages, sessions, durable subscriptions) is part of the next
input's world.  The example budget scales with ``FUZZ_EXAMPLES`` (see
``tests/fuzzing.py``); the harness (watchers, checks, strategies) is
``tests/fuzz_live.py``, and what the fuzzing found is kept as regression tests
in ``tests/integration/test_fuzz_regressions.py``.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given

from protocols.stomp.codec import SERVER_COMMANDS
from tests.fuzz_live import (
    LIVE_COST,
    Live,
    check_mqtt_exchange,
    check_stomp_exchange,
    consume_kept,
    exchange,
    live_broker,
    live_input,
    mqtt_ends_connection,
    mqtt_replies,
    mqtt_session,
    mqtt_terminal,
    stomp_ends_connection,
    stomp_replies,
    stomp_session,
    stomp_terminal,
    ws_exchange,
    ws_input,
    ws_payloads,
)
from tests.fuzzing import fuzz_settings, timeout_mark

pytestmark = timeout_mark()


@pytest.fixture(scope="module")
def live(tmp_path_factory: Any) -> Iterator[Live]:
    """One broker for the module, shared by every test here: what one input leaves behind is the next one's world."""
    with live_broker(tmp_path_factory) as state:
        yield state


# --------------------------------------------------------------------------- STOMP


def test_stomp_input_over_tcp(live: Live) -> None:
    """STOMP sessions, edited sessions and random bytes on the STOMP port; the batch checks after."""

    @fuzz_settings(80, cost=LIVE_COST)
    @given(chunks=live_input(stomp_session()))
    def fuzz(chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        check_stomp_exchange(exchange(live.handle.port, chunks, stomp_terminal, stomp_ends_connection(data)))
        live.check()

    live.begin_batch()
    fuzz()
    live.check_batch()


# --------------------------------------------------------------------------- MQTT


def test_mqtt_input_over_tcp(live: Live) -> None:
    """MQTT 3.1/3.1.1/5.0 sessions, edited sessions and random bytes on the MQTT port; the batch
    checks after."""

    @fuzz_settings(80, cost=LIVE_COST)
    @given(chunks=live_input(mqtt_session()))
    def fuzz(chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        check_mqtt_exchange(exchange(live.handle.mqtt_port, chunks, mqtt_terminal, mqtt_ends_connection(data)))
        live.check()

    live.begin_batch()
    fuzz()
    live.check_batch()


# --------------------------------------------------------------------------- WebSocket


def test_input_over_websocket(live: Live) -> None:
    """The same sessions inside WebSocket messages, and broken WebSocket framing around them;
    the batch checks after."""

    @fuzz_settings(50, cost=LIVE_COST)
    @given(case=ws_input())
    def fuzz(case: tuple[str, bytes]) -> None:
        subprotocol, data = case
        replies = ws_exchange(live.handle.ws_port, subprotocol, data)
        payload, _ = ws_payloads(replies)
        if subprotocol.endswith("stomp"):
            frames, _ = stomp_replies(payload)
            assert {f.command for f in frames} <= SERVER_COMMANDS, frames
        else:
            mqtt_replies(payload)
        live.check()

    live.begin_batch()
    fuzz()
    live.check_batch()


# --------------------------------------------------------------------------- after all of it


def test_stored_messages_survive_a_restart_after_fuzzing(live: Live) -> None:
    """What was stored before the fuzzing is on disk: a restarted broker still delivers it."""
    live.restart()
    consume_kept(live)
    live.store_kept()
    live.check()
