"""The STOMP state machine: frames in, calls on the core; deliveries out, frames.

No sockets here: the session writes bytes through a small transport interface
and reads time from the broker's clock, so the WebSocket listener can drive
the same class and tests can drive it with no network at all.

This module is the session itself: input, dispatch by phase, CONNECT and its
heart-beats, transactions, output and teardown.  The handlers of SEND
(``send``) and of SUBSCRIBE, ACK and the MESSAGEs they bring
(``subscriptions``) are functions of ``(session, live, frame)`` in modules of
their own; the types they share are in ``state``.  The opening phase (connect
timer, login, what arrives meanwhile) is the ``LoginGate`` both protocols
share, and heart-beats are deadlines on the heap MQTT's keep-alives use
(protocols/lifecycle.py, protocols/deadlines.py).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

from twisted.logger import Logger

from core.access import ANONYMOUS, Access, AllowAll, Principal, Reader
from core.broker import Broker
from core.connection import Connection
from core.errors import BrokerError, UserLimit
from protocols import deadlines
from protocols.admission import Refusal
from protocols.auth import Anonymous, Authenticator, Credentials
from protocols.lifecycle import CloseReason, LoginGate, ProducerHold
from protocols.outbox import Outbox
from protocols.stomp.codec import CLIENT_COMMANDS, Frame, StompDecoder, StompLimits, StompProtocolError, encode_frame
from protocols.stomp.send import on_send
from protocols.stomp.state import (
    BROKER_HEADER,
    SERVER_NAME,
    TTL_HEADER,
    VERSIONS,
    Connected,
    Phase,
    StompError,
    StompSettings,
)
from protocols.stomp.subscriptions import on_ack, on_nack, on_subscribe, on_unsubscribe
from protocols.transport import Transport

__all__ = [
    "BROKER_HEADER", "SERVER_NAME", "TTL_HEADER", "VERSIONS", "Connected", "Phase", "StompError", "StompSession",
    "StompSettings",
]

log = Logger(namespace="gateway.stomp")


class StompSession:
    def __init__(
        self, broker: Broker, transport: Transport, settings: StompSettings, remote: str = "",
        authenticator: Authenticator | None = None, access: Access | None = None,
    ) -> None:
        self.broker = broker
        self.authenticator: Authenticator = authenticator or Anonymous()
        self.access: Access = access or AllowAll()
        # With no rules everything is allowed: the checks are skipped, not made.
        self.checked = not isinstance(self.access, AllowAll)
        # Checks deliveries of the subscriptions a deny rule overlaps, and hears of reloads;
        # made with the first topic subscription when there are rules (a producer needs none).
        self.reader: Reader | None = None
        self.principal = ANONYMOUS
        self.transport = transport
        self.settings = settings
        self.remote = remote
        limits = settings.limits
        if not isinstance(self.authenticator, Anonymous):
            # Until it has logged in, a client may send only small frames (its CONNECT).
            small = settings.preauth_max_frame_size
            limits = StompLimits(
                min(limits.max_frame_size, small), min(limits.max_headers, 50),
                min(limits.max_header_length, small), limits.max_command_length,
            )
        self.decoder = StompDecoder(limits)
        self.version = "1.0"
        # A bridge from another gateway (its CONNECT names its broker): what it sends is not sent back to it.
        self.bridge = False
        self.peer = ""  # that broker's name
        self.phase = Phase.AWAITING_CONNECT
        # Phase.CLOSED as a plain attribute: read for every frame and write, where a property costs a call.
        self.closed = False
        self.live: Connected | None = None
        # Heart-beats (seconds; 0: none each way), due on the shared heap of deadlines.
        self._send_interval = 0.0
        self._receive_interval = 0.0
        self._last_read = 0.0
        self._last_write = 0.0
        self._now = broker.clock.seconds
        self._deadlines: deadlines.Deadlines | None = None
        self._deadline: int | None = None  # the heart-beats' handle in _deadlines
        self.label = remote
        # Why the session ended, for transports that can say (WebSocket close codes).
        self.close_reason = CloseReason.NORMAL
        self.hold: ProducerHold | None = None  # reading paused by producer flow control
        # The opening phase (connect timer, refusal, login); None once CONNECT is accepted.
        self.gate: LoginGate | None = LoginGate(self, broker.clock, settings.connect_timeout)

    def _authenticating(self) -> bool:
        """CONNECT's credentials are being checked (a method: handlers change the phase under mypy's narrowing)."""
        return self.phase is Phase.AUTHENTICATING

    @property
    def conn(self) -> Connection | None:
        """The core connection, once connected (for operators' views and tests)."""
        return None if self.live is None else self.live.conn

    # -- input ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.phase is Phase.AUTHENTICATING:
            gate = self.gate
            assert gate is not None  # dropped only once connected
            gate.hold(data)  # reading is paused; this was already on its way
            return
        phase = self.phase  # a local: mypy narrows it, not the attribute the handlers change
        if phase is Phase.CLOSED or phase is Phase.DISCONNECTING:  # nothing more is read
            return
        self._last_read = self._now()
        while True:
            try:
                frames = self.decoder.feed(data)
            except StompProtocolError as exc:
                # Frames completed before the bad bytes are the client's real work.
                for frame in exc.frames:
                    if self.closed:
                        return
                    self._handle(frame)
                self.fail(exc.message, exc.detail, exc.headers.get("receipt"))
                return
            for frame in frames:
                phase = self.phase
                if phase is Phase.CLOSED or phase is Phase.DISCONNECTING:
                    return
                self._handle(frame)
            # The decoder pauses after CONNECT so the rest is read with the negotiated
            # version -- and, while the credentials are checked, not read at all.
            if self._authenticating():
                return
            if self.closed or not frames or frames[-1].command not in ("CONNECT", "STOMP") or not self.decoder.buffered:
                return
            data = b""

    def _handle(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        try:
            command = frame.command
            if command not in CLIENT_COMMANDS or (command == "NACK" and self.version == "1.0"):
                raise StompError(f"Unknown command {command[:40]!r}")
            live = self.live
            if live is None:
                if command not in ("CONNECT", "STOMP"):
                    raise StompError("Not connected", f"{command} before CONNECT; send CONNECT (or STOMP) first")
                self._on_connect(frame)
                return
            if command in ("CONNECT", "STOMP"):
                raise StompError("Already connected", "a second CONNECT on one connection")
            _HANDLERS[command](self, live, frame)
        except StompError as exc:
            self.fail(exc.message, exc.detail, receipt)
            return
        except BrokerError as refused:  # not `exc`: compiled (mypyc), one name has one type per function
            self.fail(str(refused), f"{frame.command} refused: {refused}", receipt)
            return
        except Exception:
            # A bug must cost one client its connection, never the reactor its loop.
            log.failure("[{label}] internal error handling {command}", label=self.label, command=frame.command)
            self.fail("Internal error", f"the broker failed to handle {frame.command}; see its log", receipt)
            return
        if receipt is not None and self.live is not None and frame.command not in ("DISCONNECT", "CONNECT", "STOMP"):
            # Only once what the frame stored is on disk (group commit).
            self.live.outbox.add(encode_frame("RECEIPT", (("receipt-id", receipt),), version=self.version))

    def replay(self, waiting: list[Any]) -> None:
        """What arrived while CONNECT's credentials were checked, now that it is answered (LoginGate)."""
        if waiting or self.decoder.buffered:
            self.data_received(b"".join(waiting))

    # -- connection ---------------------------------------------------------

    def connect_timed_out(self) -> None:
        if self.phase is Phase.AWAITING_CONNECT:
            self.fail("Connect timeout", f"no CONNECT within {self.settings.connect_timeout:g} s")

    def refuse_connect(self, refusal: Refusal) -> None:
        """The connection limits refuse this client: its CONNECT gets an ERROR saying why."""
        if self.gate is not None:
            self.gate.refusal = refusal

    def fail_unfinished(self, seconds: float) -> None:
        """Held an unfinished frame too long (the broker-wide budget for them): an ERROR and a close."""
        if not self.closed:
            self.fail("Frame not completed", f"no frame completed in {seconds:.0f} s while one was unfinished (partial_frame_timeout)")

    def _on_connect(self, frame: Frame) -> None:
        gate = self.gate
        assert gate is not None  # dropped only once connected, and a second CONNECT is refused first
        if gate.refusal is not None:
            raise StompError("Connection refused", gate.refusal.why)
        headers = frame.headers
        accepted = headers.get("accept-version")
        if accepted is None:
            version = "1.0"
        else:
            offered = {v.strip() for v in accepted.split(",")}
            common = [v for v in VERSIONS if v in offered]
            if not common:
                self.write_out(encode_frame(
                    "ERROR",
                    (("version", ",".join(VERSIONS)), ("content-type", "text/plain"),
                     ("message", "Supported protocol versions are " + " ".join(VERSIONS))),
                    b"Supported protocol versions are " + " ".join(VERSIONS).encode(),
                    version="1.2",
                ))
                self.close()
                return
            version = common[-1]
        client_id = headers.get("client-id") or None
        if client_id is not None and self.broker.client_connected(client_id):
            raise StompError("Client id in use", f"client-id {client_id!r} is already connected")
        self.version = version
        self.decoder.version = version
        passcode = headers.get("passcode")
        credentials = Credentials(
            headers.get("login"), None if passcode is None else passcode.encode("utf-8", "surrogateescape"),
            self.transport.certificate_user(), self.remote, f"stomp/{version}", client_id,
        )
        self.phase = Phase.AUTHENTICATING
        # The answer may come later (a slow hash, off the reactor thread): the gate reads nothing meanwhile.
        gate.ask(self.authenticator, credentials, partial(self._authenticated, frame))

    def _authenticated(self, frame: Frame, principal: Principal | None, why: str) -> None:
        """The authenticator's answer to this connection's CONNECT (now, or in a later turn)."""
        try:
            if principal is None:
                log.info("[{label}] CONNECT refused: {why}", label=self.label, why=why)
                raise StompError("Access refused", why or "bad user name or password")
            self.principal = principal
            self._connected(frame)
        except StompError as exc:
            self.fail(exc.message, exc.detail, frame.headers.get("receipt"))
        except Exception:
            log.failure("[{label}] internal error handling CONNECT", label=self.label)
            self.fail("Internal error", "the broker failed to handle CONNECT; see its log")

    def _connected(self, frame: Frame) -> None:
        headers = frame.headers
        version = self.version
        client_id = headers.get("client-id") or None
        # Asked again after the password check: another connection may have taken the id
        # while the authenticator answered (a slow hash runs off the reactor thread).
        if client_id is not None and self.broker.client_connected(client_id):
            raise StompError("Client id in use", f"client-id {client_id!r} is already connected")
        gate = self.gate
        if gate is not None:
            gate.stop()
            self.gate = None  # the opening is over: an idle connection keeps no gate
        self.decoder.limits = self.settings.limits  # logged in: the usual limits from the next frame on
        try:
            conn = self.broker.connect(client_id, protocol=f"stomp/{version}", remote=self.remote, user=self.principal.name)
        except UserLimit as exc:
            raise StompError("Connection refused", str(exc)) from None
        conn.closer = self
        self.live = Connected(conn, Outbox(self.broker.turn_end, conn, self))
        self.phase = Phase.CONNECTED
        self.label = f"{conn.id} {client_id or '-'}"
        out = [("version", version), ("server", SERVER_NAME), ("session", conn.id)]
        if BROKER_HEADER in headers:
            self.bridge = True
            self.peer = headers[BROKER_HEADER]
            out.append((BROKER_HEADER, self.broker.node_name))
        if version != "1.0":
            out.append(("heart-beat", self._negotiate_heartbeat(headers.get("heart-beat", "0,0"))))
        self.write_out(encode_frame("CONNECTED", out, version=version))
        log.info("[{label}] connected from {remote} with STOMP {version}", label=self.label, remote=self.remote, version=version)

    # -- heart-beats: deadlines on the heap MQTT's keep-alives use -----------------

    def _negotiate_heartbeat(self, value: str) -> str:
        try:
            cx_text, cy_text = value.split(",")
            cx, cy = int(cx_text), int(cy_text)
            if cx < 0 or cy < 0:
                raise ValueError
        except ValueError:
            raise StompError("Invalid heart-beat header", f"heart-beat must be two non-negative integers, got {value!r}")
        settings = self.settings
        send = max(settings.heartbeat_send_ms, cy) if cy and settings.heartbeat_send_ms else 0
        receive = max(settings.heartbeat_receive_ms, cx) if cx and settings.heartbeat_receive_ms else 0
        self._send_interval = send / 1000.0
        self._receive_interval = receive / 1000.0
        if send or receive:
            now = self.broker.clock.seconds()
            self._last_read = self._last_write = now
            due = self._heartbeat_due()
            if due is not None and not self.closed:
                heap = self._deadlines = deadlines.shared(self.broker.clock)
                self._deadline = heap.watch(due, self)
        return f"{send},{receive}"

    def _heartbeat_due(self) -> float | None:
        """When the next heart-beat is owed, or the client's silence would exceed the grace, whichever is first.

        A client is dropped once silent for more than its interval times the grace
        (not at exactly that): due just past it, by the smallest step a float has, and
        ``deadline_reached`` compares with the same sum, so a due deadline always acts.
        """
        due: float | None = None
        receive = self._receive_interval
        if receive:
            due = math.nextafter(self._last_read + receive * self.settings.heartbeat_grace, math.inf)
        send = self._send_interval
        if send:
            beat = self._last_write + send
            if due is None or beat < due:
                due = beat
        return due

    def deadline_reached(self) -> float | None:
        """The heap's call at the deadline: drop a silent client, send a heart-beat owed; when to come again.

        The read and write paths only note the time (``_last_read``,
        ``_last_write``); the deadline moves on when it comes, so an active
        connection costs the heap one entry popped and pushed per interval.
        """
        if self.closed:
            return None
        now = self.broker.clock.seconds()
        receive = self._receive_interval
        if receive and now > self._last_read + receive * self.settings.heartbeat_grace:
            self._deadline = None
            log.info("[{label}] no heart-beat for {s:.1f}s: closing", label=self.label, s=now - self._last_read)
            self.fail("Heart-beat timeout", f"nothing received for {now - self._last_read:.1f} s")
            return None
        send = self._send_interval
        if send and now - self._last_write >= send * 0.8:
            self.write_out(b"\n")
        return self._heartbeat_due()

    # -- DISCONNECT and transactions -------------------------------------------

    def _on_disconnect(self, live: Connected, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            # The receipt once what came before is on disk, and only after the close
            # has given back what the client held (its unacked messages, its client-id):
            # a client that reconnects at once finds them.  The close on the next turn,
            # since closing redelivers and durable callbacks must not dispatch.
            self.phase = Phase.DISCONNECTING
            live.outbox.submit()
            last = encode_frame("RECEIPT", (("receipt-id", receipt),), version=self.version)
            live.conn.when_durable(lambda: self.broker.clock.callLater(0, self.close, last))
        else:
            self.close()

    def _tx(self, frame: Frame) -> str:
        tx = frame.headers.get("transaction")
        if not tx:
            raise StompError("Missing transaction header", f"{frame.command} requires a transaction header")
        return tx

    def _on_begin(self, live: Connected, frame: Frame) -> None:
        if live.conn.open_transactions >= self.settings.max_transactions:
            raise StompError("Too many transactions", f"at most {self.settings.max_transactions} open per connection")
        live.conn.begin(self._tx(frame))

    def _on_commit(self, live: Connected, frame: Frame) -> None:
        live.conn.commit(self._tx(frame))

    def _on_abort(self, live: Connected, frame: Frame) -> None:
        live.conn.abort(self._tx(frame))

    # -- output and teardown -----------------------------------------------

    def write_out(self, data: bytes) -> None:
        """Bytes to the client, now (the outbox decides when); nothing once closed."""
        if not self.closed:
            self._last_write = self._now()
            self.transport.write(data)

    def fail(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """The client did something wrong: logged as a protocol error, then ``_error_and_close``."""
        if self.close_reason is CloseReason.NORMAL:
            self.close_reason = CloseReason.ERROR
        log.info("[{label}] protocol error: {message}", label=self.label, message=message)
        self._error_and_close(message, detail, receipt)

    def internal_error(self, detail: str) -> None:
        """The broker failed this client outside its input (protocols.lifecycle.fail_soon)."""
        self.fail("Internal error", detail)

    def _error_and_close(self, message: str, detail: str = "", receipt: str | None = None) -> None:
        """An ERROR frame (the client's only way to learn why), then the close; the caller logs why."""
        message = message.replace("\r", " ").replace("\n", " ")
        headers = [("message", message), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        body = (detail or message).encode("utf-8")
        headers.append(("content-length", str(len(body))))
        if self.live is not None:
            self.live.outbox.submit()  # frames gathered before the error go out before it
        self.write_out(encode_frame("ERROR", headers, body, version=self.version))
        self.close()

    def close_by_admin(self, reason: str) -> None:
        """An operator closed this connection (admin API): an ERROR with the reason, then the close.

        Logged as what it is, an operator's decision, so that a search of the
        log for protocol errors finds clients that misbehaved, not maintenance.
        """
        if not self.closed:
            self.close_reason = CloseReason.ADMIN
            log.info("[{label}] closed by an operator: {reason}", label=self.label, reason=reason)
            self._error_and_close(reason, "the connection was closed by an administrator")

    def shutdown(self, reason: str = "Broker shutting down") -> None:
        """The broker is stopping: tell the client why, then close (not a protocol error either)."""
        if not self.closed:
            self.close_reason = CloseReason.SHUTDOWN
            log.info("[{label}] closing: {reason}", label=self.label, reason=reason)
            self._error_and_close(reason, "the broker is shutting down; reconnect later")

    def close(self, last: bytes = b"") -> None:
        """``last``: a frame written once the core has closed the connection (DISCONNECT's receipt)."""
        if self.closed:
            return
        if self.live is not None:
            self.live.outbox.submit()  # what this turn gathered goes out before the close
        self._release()
        if last:
            self.transport.write(last)
        self.transport.close()

    def _release(self) -> None:
        self.phase = Phase.CLOSED
        self.closed = True
        if self.reader is not None:
            self.reader.close()  # the rules forget it: nothing left to check
        if self.gate is not None:
            self.gate.close()
            self.gate = None
        if self._deadline is not None and self._deadlines is not None:
            self._deadlines.forget(self._deadline)
        self._deadline = None
        if self.live is not None:
            self.live.conn.close()

    def connection_lost(self) -> None:
        """The socket is gone: what this client held goes back to its queues."""
        if not self.closed:
            log.info("[{label}] connection lost", label=self.label)
        self._release()

    def pause_producing(self) -> None:
        if self.live is not None:
            self.live.conn.pause()

    def resume_producing(self) -> None:
        if self.live is not None and not self.closed:
            self.live.conn.resume()


# What each client command does once connected (CLIENT_COMMANDS is checked
# before the lookup; CONNECT and STOMP are handled before there is a ``live``).
_HANDLERS: dict[str, Callable[[StompSession, Connected, Frame], None]] = {
    "SEND": on_send,
    "SUBSCRIBE": on_subscribe,
    "UNSUBSCRIBE": on_unsubscribe,
    "ACK": on_ack,
    "NACK": on_nack,
    "BEGIN": StompSession._on_begin,
    "COMMIT": StompSession._on_commit,
    "ABORT": StompSession._on_abort,
    "DISCONNECT": StompSession._on_disconnect,
}
assert set(_HANDLERS) == set(CLIENT_COMMANDS) - {"CONNECT", "STOMP"}
