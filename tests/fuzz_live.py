"""The live-broker fuzz harness of ``tests/integration/test_fuzz_live.py``: a support module, not collected.

What the fuzz tests need around one broker served over real loopback sockets:

* ``FailureLog``, a Twisted log observer keeping every failure event, and
  ``KNOWN_BUGS``, the reported, not yet fixed failures it sets aside (each with
  its strict xfail test in ``tests/integration/test_fuzz_regressions.py``);
* ``Watcher`` threads: STOMP 1.0/1.1/1.2 and MQTT 3.1.1/5.0 clients subscribed
  to the fuzzed topics for the whole module, which must parse all they are sent;
* ``Live`` and ``live_broker``: the broker with small limits, its watchers and
  messages stored before the fuzzing, and the checks run after each input and
  each batch (no logged failure, watchers served, stored messages in place,
  fresh clients round-trip);
* ``exchange``/``ws_exchange``: one fuzz connection, and when the broker must close it;
* the Hypothesis strategies for STOMP sessions, MQTT sessions and WebSocket
  framing around them, and the checks of what the broker answered.

Budgets and mutations are shared with the codec fuzz tests in ``tests/fuzzing.py``.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import os
import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from twisted.logger import formatEvent, globalLogPublisher

from protocols.mqtt import codec as mq
from protocols.stomp.codec import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    StompDecoder,
    StompLimits,
    StompProtocolError,
    encode_frame,
)
from tests.fuzzing import LONG_RUN, mutate, split
from tests.support import BrokerHandle, RawMqtt, RawStomp, make_config
from tests.unit.test_mqtt_codec_fuzz import client_packet, connect_packet

LIVE_COST = 10  # one live example is worth ten codec examples in a long run

MAX_FRAME = 2048
MAX_HEADERS = 24
MAX_HEADER_LENGTH = 512
MAX_PACKET = 2048

KEEP_QUEUE = "/queue/fz.keep"
KEEPER_ID = "fz-keeper-6b1e"
KEEP_TOPIC = "fz-keep/t"

IDLE = 0.01  # seconds of silence after which the client ends its side (the broker may still answer)
CLOSE_TIMEOUT = 5.0  # the longest the broker may take to close a connection it should close

_ids = itertools.count(1)


# --------------------------------------------------------------------------- failures in the log


@dataclass
class KnownBug:
    """A failure the fuzzing found that is reported, reproduced by a strict xfail test, and not fixed yet.

    Ignoring it here keeps the fuzzing looking for other bugs meanwhile; its
    xfail test starts passing once it is fixed, which fails the run (strict)
    and says to delete the entry.
    """

    name: str
    matches: Callable[[str], bool]


KNOWN_BUGS: tuple[KnownBug, ...] = (
    # Empty: what the fuzzing found (binary MQTT 5 correlation data, also with
    # NUL bytes; an expiry beyond u32 seconds; writes to a WebSocket autobahn
    # had closed; user properties without a name) is fixed, and its tests are in
    # tests/integration/test_fuzz_regressions.py.  A new finding goes here, with
    # its strict xfail test there, until fixed.
)


def known_bug(text: str) -> str | None:
    """The name of the known bug ``text`` (a logged failure, a watcher's problem) shows, if any."""
    for bug in KNOWN_BUGS:
        if bug.matches(text):
            return bug.name
    return None


class FailureLog:
    """A twisted.logger observer that keeps every failure event (``log_failure`` or ``isError``)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.known: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, log_event: dict[str, Any]) -> None:
        failure = log_event.get("log_failure")
        if failure is None and not log_event.get("isError"):
            return
        text = formatEvent(log_event)
        if failure is not None:
            text += "\n" + failure.getTraceback()
        bug = known_bug(text)
        with self._lock:
            if bug is not None:
                self.known[bug] = self.known.get(bug, 0) + 1
            else:
                self.events.append(text)

    def take(self) -> list[str]:
        with self._lock:
            events, self.events = self.events, []
        return events


# --------------------------------------------------------------------------- watchers


class Watcher(threading.Thread):
    """A client subscribed to the fuzzed topics for the whole module, reading on its own thread.

    Everything the broker fans out to it must parse; ``markers`` collects the
    bodies of messages under ``fz.mark`` so that a check can tell it is still
    being served.  If the broker sends something unparseable the watcher
    records it and reconnects, so one bad frame does not blind it.
    """

    def __init__(self, name: str, connect: Callable[[], tuple[socket.socket, Callable[[bytes], list[Any]]]]) -> None:
        super().__init__(name=f"watcher-{name}", daemon=True)
        self.label = name
        self._connect = connect
        self.markers: set[bytes] = set()
        self.problems: list[str] = []
        self.received = 0
        self.connections = 1
        self._halt = threading.Event()
        self._cond = threading.Condition()
        self.sock, self._feed = connect()
        self.start()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if self._halt.is_set():
                return
            if not data:
                self._problem("the broker closed the connection")
                continue
            try:
                items = self._feed(data)
            except (StompProtocolError, mq.MqttProtocolError) as exc:
                self._problem(f"unparseable output: {exc!r} {getattr(exc, 'detail', '')} in {data[:300]!r}")
                continue
            with self._cond:
                for item in items:
                    self.received += 1
                    marker = _marker_of(item)
                    if marker is not None:
                        self.markers.add(marker)
                self._cond.notify_all()

    def _problem(self, what: str) -> None:
        with self._cond:
            if known_bug(what) is None:
                self.problems.append(what)
        self.sock.close()
        if not self._halt.is_set():
            self.sock, self._feed = self._connect()
            with self._cond:
                self.connections += 1
                self._cond.notify_all()

    def wait_for_marker(self, marker: bytes, connections: int, timeout: float = 5.0) -> bool:
        """True once ``marker`` arrived; False after ``timeout`` or once the watcher had to
        reconnect (``connections`` changed), which may have lost it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while marker not in self.markers and self.connections == connections:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return marker in self.markers

    def take_problems(self) -> list[str]:
        with self._cond:
            problems, self.problems = self.problems, []
        return problems

    def stop(self) -> None:
        self._halt.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.join(5)


def _marker_of(item: Any) -> bytes | None:
    if isinstance(item, Frame) and item.command == "MESSAGE" and item.headers.get("destination") == "/topic/fz.mark":
        return item.body
    if isinstance(item, mq.Publish) and item.topic == "fz/mark":
        return item.payload
    return None


def stomp_watcher(handle: BrokerHandle, version: str) -> Watcher:
    def connect() -> tuple[socket.socket, Callable[[bytes], list[Any]]]:
        c = RawStomp(handle, version)
        c.frame("CONNECT", {"accept-version": version, "host": "fuzz", "heart-beat": "0,0"})
        connected = c.read()
        assert connected.command == "CONNECTED", connected
        c.frame("SUBSCRIBE", {"destination": "/topic/fz.>", "id": "watch", "receipt": "w"})
        assert c.read().command == "RECEIPT"
        c.sock.settimeout(None)
        return c.sock, c.decoder.feed

    return Watcher(f"stomp-{version}", connect)


def mqtt_watcher(handle: BrokerHandle, level: int) -> Watcher:
    def connect() -> tuple[socket.socket, Callable[[bytes], list[Any]]]:
        c = RawMqtt(handle, level)
        connack = c.connect(f"fz-watch-{level}-{os.getpid()}-{next(_ids)}", keep_alive=0)
        assert isinstance(connack, mq.Connack) and connack.reason_code == 0, connack
        c.packet(mq.Subscribe(1, [mq.SubscriptionRequest("fz/#", 0)]))
        suback = c.read()
        assert isinstance(suback, mq.Suback) and suback.reason_codes == [0], suback
        c.sock.settimeout(None)
        return c.sock, c.decoder.feed

    return Watcher(f"mqtt-{level}", connect)


def start_watchers(handle: BrokerHandle) -> list[Watcher]:
    return [stomp_watcher(handle, v) for v in ("1.0", "1.1", "1.2")] + [mqtt_watcher(handle, level) for level in (4, 5)]


# --------------------------------------------------------------------------- the broker under fuzz


@dataclass
class Live:
    handle: BrokerHandle
    failures: FailureLog
    watchers: list[Watcher] = field(default_factory=list)
    kept_body: bytes = b""
    kept_payload: bytes = b""

    def store_kept(self) -> None:
        """A persistent STOMP message and a QoS 1 message for the offline MQTT session, both on disk."""
        self.kept_body = f"kept-{next(_ids)}".encode()
        c = RawStomp(self.handle)
        c.connect("1.2")
        c.frame("SEND", {"destination": KEEP_QUEUE, "persistent": "true", "receipt": "k"}, self.kept_body)
        assert c.read().headers.get("receipt-id") == "k"
        c.close()
        self.kept_payload = f"kept-{next(_ids)}".encode()
        p = RawMqtt(self.handle, 4)
        assert p.connect(f"fz-keep-pub-{next(_ids)}").reason_code == 0
        p.packet(mq.Publish(KEEP_TOPIC, self.kept_payload, 1, False, False, 1))
        assert p.read() == mq.Puback(1)
        p.close()
        assert self.kept_present()

    def keeper_queue(self) -> Any:
        return self.handle.gateway.mqtt_hub.clients[KEEPER_ID].queue

    def kept_present(self) -> bool:
        def bodies() -> list[bytes]:
            return [e.message.body for e in self.keeper_queue().messages()]

        return (
            self.handle.queue_bodies("queue://fz.keep") == [self.kept_body]
            and self.handle.inspect(bodies) == [self.kept_payload]
        )

    def begin_batch(self) -> None:
        """Forget what an earlier, failed batch left behind: each batch answers for itself."""
        self.failures.take()
        for watcher in self.watchers:
            watcher.take_problems()

    def check(self) -> None:
        """After one input: no failure logged, everything the watchers were sent parses, stored
        messages in place, fresh clients served."""
        problems = self.failures.take()
        assert not problems, "failures in the broker's log:\n" + "\n\n".join(problems)
        self.check_watchers(stomp_marker)
        assert self.kept_present(), "a message stored before the fuzzing is gone"
        probe_stomp(self.handle)
        probe_mqtt(self.handle)
        problems = self.failures.take()
        assert not problems, "failures in the broker's log:\n" + "\n\n".join(problems)

    def check_watchers(self, send_marker: Callable[[BrokerHandle], bytes], what: str = "STOMP") -> None:
        """Every watcher gets a marker, so it has read all that was fanned out to it before, and
        none of that was unparseable.  A watcher that had to reconnect (after output a known bug
        garbled) may have lost the marker with it: it gets another one."""
        waiting = list(self.watchers)
        for attempt in range(3):
            connections = {watcher: watcher.connections for watcher in waiting}
            marker = send_marker(self.handle)
            waiting = [w for w in waiting if not w.wait_for_marker(marker, connections[w])]
            for watcher in waiting:
                assert watcher.connections != connections[watcher], f"{watcher.label} no longer receives {what} messages"
            if not waiting:
                break
        assert not waiting, f"{[w.label for w in waiting]} keep losing their connection"
        for watcher in self.watchers:
            problems = watcher.take_problems()
            assert not problems, f"{watcher.label}: " + "\n".join(problems)

    def restart(self) -> None:
        """Stop the broker and start it again on the same data directory; the watchers reconnect."""
        for watcher in self.watchers:
            watcher.stop()
        self.handle.stop()
        self.handle = BrokerHandle(self.handle.config)
        self.watchers = start_watchers(self.handle)

    def check_batch(self) -> None:
        """After a whole fuzz test: the watchers were served throughout, and the stored
        messages are consumed (then stored again for the next test)."""
        self.check()
        self.check_watchers(mqtt_marker, "MQTT")
        consume_kept(self)
        self.store_kept()


def stomp_marker(handle: BrokerHandle) -> bytes:
    """Send a marker to the watched topics; its body."""
    marker = f"mark-{next(_ids)}".encode()
    c = nodelay(RawStomp(handle))
    try:
        c.connect("1.2")
        c.frame("SEND", {"destination": "/topic/fz.mark", "receipt": "m"}, marker)
        assert c.read().headers.get("receipt-id") == "m"
    finally:
        c.close()
    return marker


def mqtt_marker(handle: BrokerHandle) -> bytes:
    """Publish a marker to the watched topics; its payload."""
    marker = f"mark-{next(_ids)}".encode()
    m = nodelay(RawMqtt(handle, 5))
    try:
        assert m.connect(f"fz-marker-{next(_ids)}").reason_code == 0
        m.packet(mq.Publish("fz/mark", marker, 1, False, False, 1))
        assert isinstance(m.read(), mq.Puback)
    finally:
        m.close()
    return marker


def nodelay(client: Any) -> Any:
    """No Nagle: a probe's small frames would otherwise wait out delayed ACKs (40 ms each)."""
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def probe_stomp(handle: BrokerHandle) -> None:
    """A fresh STOMP client sends itself a message through a queue."""
    c = nodelay(RawStomp(handle))
    try:
        c.connect("1.2")
        body = f"probe-{next(_ids)}".encode()
        c.frame("SUBSCRIBE", {"destination": "/queue/fz-probe", "id": "p"})
        c.frame("SEND", {"destination": "/queue/fz-probe", "receipt": "s"}, body)
        got = {c.read().command: None for _ in range(2)}
        assert set(got) == {"MESSAGE", "RECEIPT"}, got
        c.frame("DISCONNECT", {"receipt": "bye"})
        assert c.read().command == "RECEIPT"
    finally:
        c.close()


def probe_mqtt(handle: BrokerHandle) -> None:
    """A fresh MQTT client sends itself a message through a topic."""
    c = nodelay(RawMqtt(handle, 4))
    try:
        assert c.connect(f"fz-probe-{next(_ids)}").reason_code == 0
        c.packet(mq.Subscribe(1, [mq.SubscriptionRequest("fz-probe/t", 1)]))
        assert c.read() == mq.Suback(1, [1])
        payload = f"probe-{next(_ids)}".encode()
        c.packet(mq.Publish("fz-probe/t", payload, 1, False, False, 2))
        got = [c.read(), c.read()]
        publish = next(p for p in got if isinstance(p, mq.Publish))
        assert publish.payload == payload
        assert mq.Puback(2) in got
        c.packet(mq.Puback(publish.packet_id))  # type: ignore[arg-type]
        c.packet(mq.Disconnect())
        assert c.closed_by_peer()
    finally:
        c.close()


def consume_kept(live: Live) -> None:
    """Take the stored messages out as their consumers would, and acknowledge them."""
    c = RawStomp(live.handle)
    try:
        c.connect("1.2")
        c.frame("SUBSCRIBE", {"destination": KEEP_QUEUE, "id": "k", "ack": "client-individual"})
        message = c.read()
        assert (message.command, message.body) == ("MESSAGE", live.kept_body), message
        assert message.headers.get("persistent") == "true"
        c.frame("ACK", {"id": message.headers["ack"], "receipt": "a"})
        assert c.read().headers.get("receipt-id") == "a"
        c.frame("DISCONNECT", {"receipt": "bye"})
        assert c.read().command == "RECEIPT"
    finally:
        c.close()
    k = RawMqtt(live.handle, 4)
    try:
        connack = k.connect(KEEPER_ID, clean=False)
        assert connack.session_present, connack
        publish = k.read()
        assert isinstance(publish, mq.Publish) and (publish.payload, publish.qos) == (live.kept_payload, 1), publish
        k.packet(mq.Puback(publish.packet_id))  # type: ignore[arg-type]
        k.packet(mq.Disconnect())
        assert k.closed_by_peer()
    finally:
        k.close()


@contextlib.contextmanager
def live_broker(tmp_path_factory: Any) -> Iterator[Live]:
    """One broker with small limits (for a module: see the ``live`` fixture), failure observer
    installed, watchers subscribed."""
    config = make_config(tmp_path_factory.mktemp("fuzz-live"))
    limits = config.stomp_settings.limits
    limits.max_frame_size = MAX_FRAME
    limits.max_headers = MAX_HEADERS
    limits.max_header_length = MAX_HEADER_LENGTH
    config.mqtt_settings.max_packet_size = MAX_PACKET
    handle = BrokerHandle(config)
    failures = FailureLog()
    globalLogPublisher.addObserver(failures)
    state = Live(handle, failures)
    try:
        keeper = RawMqtt(handle, 4)
        assert keeper.connect(KEEPER_ID, clean=False).reason_code == 0
        keeper.packet(mq.Subscribe(1, [mq.SubscriptionRequest(KEEP_TOPIC, 1)]))
        assert keeper.read() == mq.Suback(1, [1])
        keeper.packet(mq.Disconnect())
        assert keeper.closed_by_peer()
        keeper.close()
        state.watchers = start_watchers(handle)
        state.store_kept()
        yield state
    finally:
        for watcher in state.watchers:
            watcher.stop()
        globalLogPublisher.removeObserver(failures)
        state.handle.stop()
    if failures.known and LONG_RUN:
        # Not a failure (each has its strict xfail test), but a long run should say how often.
        warnings.warn(f"known bugs hit while fuzzing: {failures.known}", stacklevel=1)


# --------------------------------------------------------------------------- one fuzz connection


@dataclass
class Exchange:
    """What the broker answered to one input, and whether it closed before the client's end."""

    replies: bytes
    closed_by_broker: bool


def exchange(port: int, chunks: list[bytes], terminal: Callable[[bytes], bool], must_close: bool) -> Exchange:
    """Send ``chunks`` on a new connection and collect the answer until the broker closes.

    ``must_close`` says the input itself ends the connection (a protocol
    error, a DISCONNECT): the broker must then close on its own within
    CLOSE_TIMEOUT.  Otherwise it is read until it closes or goes quiet for
    IDLE; once ``terminal(replies)`` says the answer is final (an ERROR, a
    refusing CONNACK, a DISCONNECT) the broker must close on its own too.
    Else the client ends its side, and the broker must then close within
    CLOSE_TIMEOUT: a connection is never left hanging.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSE_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    replies = bytearray()
    try:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker closed on an earlier byte
        if must_close:
            closed = read_until_close(sock, replies, CLOSE_TIMEOUT, None)
            assert closed, f"the broker did not close after input that ends the connection; it sent {bytes(replies[-200:])!r}"
            return Exchange(bytes(replies), True)
        if read_until_close(sock, replies, IDLE, lambda: terminal(bytes(replies))):
            return Exchange(bytes(replies), True)
        assert not terminal(bytes(replies)), f"the broker did not close after {bytes(replies[-200:])!r}"
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        closed = read_until_close(sock, replies, CLOSE_TIMEOUT, None)
        assert closed, "the broker kept the connection open after the client's end of it"
        return Exchange(bytes(replies), False)
    finally:
        sock.close()


def read_until_close(sock: socket.socket, into: bytearray, quiet: float, terminal: Callable[[], bool] | None) -> bool:
    """Read into ``into`` until the peer closes (True) or ``quiet`` seconds pass without data
    (False).  Once ``terminal()`` holds, the wait for the close is CLOSE_TIMEOUT instead."""
    deadline = time.monotonic() + quiet
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        if not data:
            return True
        into += data
        if terminal is not None and terminal():
            terminal = None
            deadline = time.monotonic() + CLOSE_TIMEOUT
        elif terminal is not None:
            deadline = time.monotonic() + quiet


# --------------------------------------------------------------------------- STOMP replies


def stomp_replies(data: bytes) -> tuple[list[Frame], int]:
    """The broker's frames in ``data`` and the bytes of an unfinished last one.

    The first frame (CONNECTED or ERROR) is unescaped; the rest use the
    version CONNECTED names, as a client would read them.
    """
    first_end = data.find(b"\0") + 1
    head = StompDecoder(StompLimits(max_frame_size=1 << 24), version="1.0")
    frames = head.feed(data[:first_end]) if first_end else []
    version = frames[0].headers.get("version", "1.0") if frames and frames[0].command == "CONNECTED" else "1.0"
    rest = StompDecoder(StompLimits(max_frame_size=1 << 24), version=version)
    frames += rest.feed(data[first_end:])
    return frames, head.buffered + rest.buffered


def stomp_terminal(data: bytes) -> bool:
    """True once the answer holds an ERROR, after which the broker must close."""
    try:
        frames, _ = stomp_replies(data)
    except StompProtocolError:
        return False  # reported by check_stomp_exchange
    return any(f.command == "ERROR" for f in frames)


def stomp_ends_connection(data: bytes) -> bool:
    """Whether ``data`` must make the broker close by itself, as far as the codec can tell.

    Read as the session reads it (unescaping by the version CONNECT
    negotiates): a StompProtocolError under the broker's limits, a frame
    before CONNECT, a CONNECT without a common version, a second CONNECT, an
    unknown command or a DISCONNECT.  The broker may close for more reasons
    (other session errors), never for fewer.
    """
    dec = StompDecoder(StompLimits(MAX_FRAME, MAX_HEADERS, MAX_HEADER_LENGTH), version="1.0")
    version: str | None = None
    chunk = data
    try:
        while True:
            frames = dec.feed(chunk)
            chunk = b""
            for frame in frames:
                command = frame.command
                if command not in CLIENT_COMMANDS or command == "NACK" and version == "1.0":
                    return True
                if version is not None:
                    if command in ("CONNECT", "STOMP", "DISCONNECT"):
                        return True
                    continue
                if command not in ("CONNECT", "STOMP"):
                    return True
                offered = frame.headers.get("accept-version")
                names = {"1.0"} if offered is None else {v.strip() for v in offered.split(",")}
                common = [v for v in ("1.0", "1.1", "1.2") if v in names]
                if not common:
                    return True
                version = dec.version = common[-1]
            # The decoder pauses after CONNECT; the session resumes it with the version set.
            if not frames or frames[-1].command not in ("CONNECT", "STOMP") or not dec.buffered:
                return False
    except StompProtocolError:
        return True


def check_stomp_exchange(ex: Exchange) -> None:
    """The answer is server frames, CONNECTED only first, and nothing after an ERROR."""
    frames, partial = stomp_replies(ex.replies)
    commands = [f.command for f in frames]
    assert set(commands) <= SERVER_COMMANDS, commands
    assert "CONNECTED" not in commands[1:], commands
    event(f"STOMP: ERROR {frames[-1].headers.get('message')}" if "ERROR" in commands else f"STOMP: {len(frames)} frames")
    if "ERROR" in commands:
        assert commands.index("ERROR") == len(commands) - 1, f"frames after an ERROR: {commands}"
        assert frames[-1].headers.get("message"), frames[-1]
        assert partial == 0, "an ERROR followed by more bytes"


# --------------------------------------------------------------------------- STOMP inputs
#
# A session is either strict (every value valid, so it goes deep: subscriptions,
# acks, transactions, fan-out) or loose (each value is sometimes invalid, so the
# session-level checks get their turn; the first failing frame ends it).

WATCHED = "fz"  # the topic root the watchers subscribe to

_char = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from(":\\\n\r"),
    st.characters(codec="utf-8", exclude_characters="\x00"),
)
_text = st.text(_char, max_size=12)


def pick(strict: bool, valid: list[str], invalid: list[str]) -> st.SearchStrategy[str]:
    """A valid value; when not ``strict``, an invalid one one time in four."""
    return st.sampled_from(valid if strict or not invalid else valid * 3 + invalid)


def _send_headers(strict: bool) -> dict[str, st.SearchStrategy[str]]:
    return {
        "persistent": pick(strict, ["true", "false"], ["TRUE", "x"]),
        "priority": pick(strict, ["0", "9", "4"], ["10", "-1", "x"]),
        "expires": pick(strict, ["0", "1", "4102444800000"], ["99999999999999", "-5", "x"]),
        "AMQ_SCHEDULED_DELAY": pick(strict, ["0", "10"], ["-1", "x"]),
        "JMSXGroupID": st.sampled_from(["g1", "g2"]),
        "JMSXGroupSeq": pick(strict, ["1", "0"], ["-1", "x"]),
        # Never subscribed to: replies are not part of the fuzzing.
        "reply-to": st.sampled_from(["/temp-queue/r", "/topic/fz-reply.r", "/queue/fz-reply.r", "nowhere", "/topic/fz-reply.+"]),
        "correlation-id": _text,
        "content-type": st.sampled_from(["text/plain", "application/octet-stream", ""]) | _text,
        "x-custom": _text,
        **({} if strict else {"transaction": st.sampled_from(["tx1", "tx2"])}),
    }


def _sanitize(headers: list[tuple[str, str]], version: str, command: str) -> list[tuple[str, str]]:
    """What the version can carry: no LF (or ':' in names) without escaping."""
    out = []
    for name, value in headers:
        if version == "1.0" or command in ("CONNECT", "STOMP"):
            name = name.replace("\n", "_").replace(":", "_")
            value = value.replace("\n", "_")
        out.append((name, value))
    return out


# Strict sessions leave out what needs state the generator does not track (ack ids,
# open transactions); loose ones have it all.
_STRICT_COMMANDS = ["SEND"] * 10 + ["SUBSCRIBE"] * 6 + ["UNSUBSCRIBE", "BEGIN"]
_LOOSE_COMMANDS = _STRICT_COMMANDS + ["ACK", "NACK", "COMMIT", "ABORT", "DISCONNECT", "CONNECT", "FROB"]


@st.composite
def stomp_frame(draw: Callable[..., Any], version: str, root: str, strict: bool) -> bytes:
    command = draw(st.sampled_from(_STRICT_COMMANDS if strict else _LOOSE_COMMANDS))
    headers: list[tuple[str, str]] = []
    body = b""
    if command == "SEND":
        destinations = [f"/queue/{root}.q1", f"/queue/{root}.q2", f"/topic/{root}.t1", f"/topic/{root}.t2.x", f"/topic/{root}.a b/c", f"/temp-queue/{root}"]
        destination = pick(strict, destinations, ["/queue/", "/bogus/x", "", "/remote-temp-queue/nope", f"/topic/{root}.*"])
        headers.append(("destination", draw(destination if strict else destination | _text)))
        headers += list(draw(st.fixed_dictionaries({}, optional=_send_headers(strict))).items())  # type: ignore[arg-type]
        body = b"x" * (MAX_FRAME + 1) if not strict and not draw(st.integers(0, 7)) else draw(st.binary(max_size=64))
        if draw(st.booleans()):
            headers.append(("content-length", str(len(body))))
        else:
            body = body.replace(b"\0", b"")
    elif command == "SUBSCRIBE":
        destinations = [f"/queue/{root}.q1", f"/queue/{root}.q2", f"/topic/{root}.t1", f"/topic/{root}.>", f"/topic/{root}.*"]
        headers.append(("destination", draw(pick(strict, destinations, [f"/topic/{root}.>.b", ""]))))
        if strict or draw(st.integers(0, 9)):
            headers.append(("id", draw(st.sampled_from(["s1", "s2", "s3"]))))
        headers.append(("ack", draw(pick(strict, ["auto", "client", "client-individual"], ["sometimes"]))))
        optional = {
            "selector": pick(strict, ["a = 1", "priority > 3 AND x LIKE 'a%'", "JMSPriority > 4", "x IN ('a', 'b')", "x IS NULL"], ["a = = b", "NOT ("]),
            "activemq.prefetchSize": pick(strict, ["1", "5"], ["0", "x"]),
            "activemq.subscriptionName": st.sampled_from(["d1", "d2"]),
            "activemq.exclusive": st.just("true"),
            "activemq.retroactive": st.just("true"),
        }
        headers += list(draw(st.fixed_dictionaries({}, optional=optional)).items())  # type: ignore[arg-type]
    elif command == "UNSUBSCRIBE":
        headers.append(("id", draw(pick(strict, ["s1", "s2", "s3"], ["zz"]))))
    elif command in ("ACK", "NACK"):
        ack_id = st.sampled_from(["1:1", "1:2", "2:1", "x", "ID:gateway-1-1"])
        headers += [("id", draw(ack_id)), ("message-id", draw(ack_id)), ("subscription", draw(st.sampled_from(["s1", "s2"])))]
        if draw(st.booleans()):
            headers.append(("transaction", draw(st.sampled_from(["tx1", "tx2"]))))
    elif command in ("BEGIN", "COMMIT", "ABORT"):
        headers.append(("transaction", draw(pick(strict, ["tx1", "tx2"], [""]))))
    if draw(st.booleans()):
        headers.append(("receipt", draw(st.sampled_from(["r1", "r2"]) | _text.filter(bool))))
    if draw(st.integers(0, 4)) == 0:
        headers.append((draw(_text.filter(bool)), draw(_text)))
    return encode_frame(command, _sanitize(headers, version, command), body, version=version)


@st.composite
def stomp_session(draw: Callable[..., Any], root: str = WATCHED) -> bytes:
    """CONNECT (or not), then up to six frames on destinations under ``root``, with heart-beat
    EOLs between them."""
    strict = draw(st.booleans())
    versions = draw(st.sampled_from(["1.0", "1.1", "1.2", "1.0,1.1,1.2", "1.1,1.2"] + ([] if strict else ["2.0", None])))
    version = "1.0" if versions in (None, "2.0") else versions.split(",")[-1]
    parts = []
    if strict or draw(st.integers(0, 9)):
        connect = [("host", "fuzz")]
        if versions is not None:
            connect.append(("accept-version", versions))
        optional = {
            "heart-beat": pick(strict, ["0,0", "0,100"], ["", "x"]),
            "client-id": st.sampled_from(["fz-c1", "fz-c2"]),
            "login": _text,
            "passcode": _text,
        }
        connect += list(draw(st.fixed_dictionaries({}, optional=optional)).items())  # type: ignore[arg-type]
        command = draw(st.sampled_from(["CONNECT", "STOMP"]))
        parts.append(encode_frame(command, _sanitize(connect, version, command), version=version))
    for frame in draw(st.lists(stomp_frame(version, root, strict), max_size=6)):
        parts.append(draw(st.sampled_from([b"", b"", b"\n", b"\r\n"])))
        parts.append(frame)
    return b"".join(parts)


def live_input(session: st.SearchStrategy[bytes]) -> st.SearchStrategy[list[bytes]]:
    """A session as generated, after random edits, or random bytes; cut into up to three sends."""

    @st.composite
    def build(draw: Callable[..., Any]) -> list[bytes]:
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "mutated", "random"]))
        if kind == "random":
            data = draw(st.binary(min_size=1, max_size=200))
        else:
            data = draw(session)
            if kind == "mutated":
                data = draw(mutate(data))
        return split(draw, data, max_cuts=2)

    return build()


# --------------------------------------------------------------------------- MQTT replies


def mqtt_replies(data: bytes) -> tuple[list[Any], int]:
    """The broker's packets in ``data`` and the bytes of an unfinished last one.

    The level is read off the CONNACK: 3.x CONNACKs have a remaining length of
    2, 5.0 ones carry properties.
    """
    if not data:
        return [], 0
    assert data[0] == 0x20, f"the first packet is not a CONNACK: {data[:20]!r}"
    level = 4 if data[1:2] == b"\x02" else 5
    dec = mq.MqttDecoder(level=level, server=False)
    return dec.feed(data), dec.buffered


def mqtt_terminal(data: bytes) -> bool:
    """True once the answer holds a refusing CONNACK or a DISCONNECT, after which the broker must close."""
    try:
        packets, _ = mqtt_replies(data)
    except (AssertionError, mq.MqttProtocolError):
        return False  # reported by check_mqtt_exchange
    return any(isinstance(p, mq.Disconnect) or isinstance(p, mq.Connack) and p.reason_code for p in packets)


def mqtt_ends_connection(data: bytes) -> bool:
    """Whether ``data`` must make the broker close by itself, as far as the codec can tell:
    an MqttProtocolError under the broker's limit (including anything before CONNECT), a
    DISCONNECT, a second CONNECT or an AUTH (enhanced authentication is not configured).
    The broker may close for more reasons (other session errors), never for fewer."""
    try:
        packets = mq.MqttDecoder(MAX_PACKET).feed(data)
    except mq.MqttProtocolError:
        return True
    return any(isinstance(p, (mq.Disconnect, mq.Auth, mq.Connect)) for p in packets[1:])


def check_mqtt_exchange(ex: Exchange) -> None:
    """A CONNACK first, and nothing after a refusing CONNACK or a DISCONNECT."""
    packets, partial = mqtt_replies(ex.replies)
    event("MQTT: " + (", ".join(sorted({type(p).__name__ for p in packets})) or "nothing"))
    if not packets:
        return  # a bare close: 3.x errors, or nothing to answer
    assert isinstance(packets[0], mq.Connack), packets
    assert not any(isinstance(p, mq.Connack) for p in packets[1:]), packets
    if packets[0].reason_code:
        assert packets == [packets[0]] and partial == 0, f"packets after a refusing CONNACK: {packets}"
    disconnects = [i for i, p in enumerate(packets) if isinstance(p, mq.Disconnect)]
    if disconnects:
        assert disconnects == [len(packets) - 1] and partial == 0, f"packets after a DISCONNECT: {packets}"
        assert packets[-1].reason_code >= 0x80, packets[-1]


# --------------------------------------------------------------------------- MQTT inputs

_CLIENT_IDS = st.sampled_from(["fz-m1", "fz-m2", "fz-m3", ""])


def _filters(root: str) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [f"{root}/#", f"{root}/+", f"{root}/t1", f"$share/g/{root}/#", "$share//x", "+/+", f"{root}/#/x", "a+b", f"{root}/will"]
    )


def _under(root: str, topic: str) -> str:
    return f"{root}/{topic}" if topic else topic  # an empty topic (5.0, with an alias) stays empty


def _live_packet(packet: Any, draw: Callable[..., Any], root: str) -> Any:
    """Point generated packets at topics under ``root`` and at the pooled client ids."""
    if isinstance(packet, mq.Publish):
        return dataclasses.replace(packet, topic=_under(root, packet.topic))
    if isinstance(packet, mq.Subscribe):
        subs = [
            dataclasses.replace(s, topic_filter=draw(_filters(root)) if draw(st.booleans()) else s.topic_filter)
            for s in packet.subscriptions
        ]
        return dataclasses.replace(packet, subscriptions=subs)
    if isinstance(packet, mq.Connect):
        props = dict(packet.properties)
        if draw(st.integers(0, 9)):
            # Enhanced authentication is refused outright; keep most sessions past CONNECT.
            props.pop("authentication_method", None)
            props.pop("authentication_data", None)
        will = packet.will and dataclasses.replace(packet.will, topic=_under(root, packet.will.topic))
        return dataclasses.replace(packet, client_id=draw(_CLIENT_IDS), will=will, properties=props)
    return packet


@st.composite
def mqtt_session(draw: Callable[..., Any], root: str = WATCHED) -> bytes:
    """CONNECT of some level (or not), then up to six client packets on topics under ``root``."""
    level = draw(st.sampled_from([3, 4, 5]))
    parts = []
    if draw(st.integers(0, 9)):
        parts.append(mq.encode(_live_packet(draw(connect_packet(level)), draw, root), level))
    for packet in draw(st.lists(client_packet(level), max_size=6)):
        parts.append(mq.encode(_live_packet(packet, draw, root), level))
    return b"".join(parts)


# --------------------------------------------------------------------------- WebSocket


def ws_handshake(port: int, subprotocol: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSE_TIMEOUT)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {subprotocol}\r\n\r\n"
        ).encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        data = sock.recv(4096)
        assert data, f"closed during the handshake: {response!r}"
        response += data
    assert response.startswith(b"HTTP/1.1 101"), response
    assert response.endswith(b"\r\n\r\n"), "the server spoke before the client"
    return sock


def ws_frame(payload: bytes, opcode: int = 2, fin: bool = True, rsv: int = 0, mask: bytes | None = b"\x01\x02\x03\x04") -> bytes:
    """One WebSocket frame as a client sends it (masked unless ``mask`` is None)."""
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    n = len(payload)
    bit = 0x80 if mask is not None else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_payloads(data: bytes) -> tuple[bytes, bool]:
    """The concatenated payloads of the server's data frames, and whether a close frame came."""
    out = bytearray()
    i = 0
    while i + 2 <= len(data):
        opcode = data[i] & 0x0F
        n = data[i + 1] & 0x7F
        assert not data[i + 1] & 0x80, "a server frame is masked"
        j = i + 2
        if n == 126:
            n, j = struct.unpack("!H", data[j : j + 2])[0], j + 2
        elif n == 127:
            n, j = struct.unpack("!Q", data[j : j + 8])[0], j + 8
        if j + n > len(data):
            break  # cut off by the close
        if opcode in (0, 1, 2):
            out += data[j : j + n]
        elif opcode == 8:
            return bytes(out), True
        i = j + n
    return bytes(out), False


@st.composite
def ws_input(draw: Callable[..., Any]) -> tuple[str, bytes]:
    """A subprotocol and WebSocket frames carrying a fuzzed STOMP or MQTT session.

    The session bytes are cut into messages (text or binary, maybe fragmented);
    the frame bytes themselves may then be edited too (bad opcodes, reserved
    bits, lengths, missing masks).
    """
    subprotocol = draw(st.sampled_from(["v10.stomp", "v11.stomp", "v12.stomp", "mqtt", "mqttv3.1"]))
    chunks = draw(live_input(stomp_session() if subprotocol.endswith("stomp") else mqtt_session()))
    frames = []
    for chunk in chunks:
        opcode = 1 if draw(st.booleans()) and _is_utf8(chunk) else 2
        if len(chunk) > 1 and draw(st.booleans()):
            cut = draw(st.integers(1, len(chunk) - 1))
            frames.append(ws_frame(chunk[:cut], opcode, fin=False))
            frames.append(ws_frame(chunk[cut:], 0))
        else:
            frames.append(ws_frame(chunk, opcode))
    if draw(st.integers(0, 3)) == 0:
        frames.append(ws_frame(draw(st.binary(max_size=20)), draw(st.integers(0, 15)), draw(st.booleans()), draw(st.integers(0, 7)), draw(st.none() | st.just(b"\x00\xff\x10\x20"))))
    data = b"".join(frames)
    if draw(st.integers(0, 3)) == 0:
        data = draw(mutate(data))
    return subprotocol, data


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def ws_exchange(port: int, subprotocol: str, data: bytes) -> bytes:
    """Send ``data`` after the handshake; what the broker answered once the connection is closed.

    If the broker does not close by itself within IDLE, the client closes (a
    close frame, which broken framing before it may swallow, then its TCP
    side), and the broker must close within CLOSE_TIMEOUT.
    """
    sock = ws_handshake(port, subprotocol)
    replies = bytearray()
    try:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if not read_until_close(sock, replies, IDLE, None):
            try:
                sock.sendall(ws_frame(b"\x03\xe8", 8))
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            closed = read_until_close(sock, replies, CLOSE_TIMEOUT, None)
            assert closed, "the broker kept the WebSocket connection open after the client's end of it"
    finally:
        sock.close()
    return bytes(replies)
