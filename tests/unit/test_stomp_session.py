"""The STOMP state machine without sockets: a list as transport, a virtual clock."""
from twisted.internet.task import Clock

from core.broker import Broker
from persistence.memory import MemoryStore
from protocols.stomp.codec import StompDecoder, encode_frame
from protocols.stomp.session import StompSession, StompSettings


class FakeTransport:
    """What a session needs of its transport (protocols/transport.py), recorded."""

    def __init__(self):
        self.data = b""
        self.closed = False
        self.paused = set()

    def write(self, data):
        self.data += data

    def close(self):
        self.closed = True

    def pause_reading(self, reason=""):
        self.paused.add(reason)

    def resume_reading(self, reason=""):
        self.paused.discard(reason)

    def certificate_user(self):
        return None


def session(**settings):
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    broker.start()
    transport = FakeTransport()
    return StompSession(broker, transport, StompSettings(**settings), "test"), transport, clock


def frames(transport, version="1.2"):
    return StompDecoder(version=version).feed(transport.data)


def test_connect_negotiates_highest_common_version_and_heartbeat():
    s, t, _ = session(heartbeat_send_ms=500, heartbeat_receive_ms=2000)
    s.data_received(encode_frame("STOMP", {"accept-version": "1.0,1.1,1.2", "heart-beat": "1000,100"}.items()))
    (connected,) = frames(t)
    assert connected.command == "CONNECTED"
    assert connected.headers["version"] == "1.2"
    # We send every max(our 500, their wish 100) ms and expect them every max(2000, their 1000).
    assert connected.headers["heart-beat"] == "500,2000"


def test_heartbeats_sent_when_idle_and_silent_client_dropped():
    s, t, clock = session(heartbeat_send_ms=1000, heartbeat_receive_ms=1000, heartbeat_grace=2.0)
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "heart-beat": "1000,1000"}.items()))
    t.data = b""
    for _ in range(4):
        clock.advance(0.5)
    assert t.data.count(b"\n") >= 1 and not t.closed
    s.data_received(b"\n")  # the client's heart-beat keeps it alive
    clock.advance(1.5)
    assert not t.closed
    clock.advance(1.0)
    assert t.closed
    assert b"ERROR" in t.data and b"Heart-beat timeout" in t.data


def test_no_heartbeats_when_client_asks_none():
    s, t, clock = session()
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    t.data = b""
    clock.advance(60)
    assert t.data == b"" and not t.closed


def test_error_then_close_and_nothing_after():
    s, t, _ = session()
    s.data_received(encode_frame("SEND", {"destination": "/queue/a"}.items(), b"x"))
    (error,) = frames(t)
    assert error.command == "ERROR" and error.headers["message"] == "Not connected"
    assert t.closed
    before = t.data
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    assert t.data == before


def test_message_tail_encoded_once_per_escaping_and_shared():
    s, t, _ = session()
    s.data_received(
        encode_frame("CONNECT", {"accept-version": "1.2"}.items())
        + encode_frame("SUBSCRIBE", {"destination": "/topic/t", "id": "a"}.items())
        + encode_frame("SUBSCRIBE", {"destination": "/topic/t", "id": "b"}.items())
        + encode_frame("SEND", {"destination": "/topic/t", "k": "v"}.items(), b"body")
    )
    msgs = [f for f in frames(t) if f.command == "MESSAGE"]
    assert [m.headers["subscription"] for m in msgs] == ["a", "b"]
    assert all(m.body == b"body" and m.headers["k"] == "v" for m in msgs)
    ((_, message),) = s.broker.topics.replay(("t",))
    assert len(message.cache) == 1  # one encoding served both subscribers


def test_frames_after_connect_in_one_read_use_the_negotiated_escaping():
    s, t, _ = session()
    s.data_received(
        encode_frame("CONNECT", {"accept-version": "1.2"}.items())
        + encode_frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s"}.items(), version="1.2")
        + encode_frame("SEND", {"destination": "/queue/q", "k": "a:b\nc"}.items(), b"x", version="1.2")
    )
    (message,) = [f for f in frames(t) if f.command == "MESSAGE"]
    assert message.headers["k"] == "a:b\nc"


def test_frames_before_bad_bytes_are_still_handled():
    s, t, _ = session()
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    s.data_received(encode_frame("SEND", {"destination": "/queue/q"}.items(), b"kept") + b"BAD FRAME\nno colon\n\n\0")
    assert t.closed
    assert [e.message.body for e in s.broker.queues["queue://q"].messages()] == [b"kept"]


def test_unrepresentable_headers_left_out_for_stomp_10():
    s, t, _ = session()
    s.data_received(encode_frame("CONNECT", {}.items()))  # no accept-version: 1.0
    s.data_received(encode_frame("SUBSCRIBE", {"destination": "/queue/q"}.items(), version="1.0"))
    producer = s.broker.connect()
    from core.message import Message
    producer.send(Message("ID:1", "queue://q", b"x", {"multi": "a\nb", "ok": "a:b"}))
    (message,) = [f for f in frames(t, "1.0") if f.command == "MESSAGE"]
    assert "multi" not in message.headers and message.headers["ok"] == "a:b"


def test_phases_from_connect_to_disconnect_receipt_and_close():
    """The connected phase exists only after CONNECT; DISCONNECT with a receipt ends reading before the close."""
    from protocols.stomp.session import Phase

    s, t, clock = session()
    assert (s.phase, s.live, s.conn) == (Phase.AWAITING_CONNECT, None, None)
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    assert s.phase is Phase.CONNECTED and s.live is not None and s.conn is s.live.conn
    s.data_received(encode_frame("DISCONNECT", {"receipt": "bye"}.items()))
    assert s.phase is Phase.DISCONNECTING and not t.closed
    s.data_received(encode_frame("SEND", {"destination": "/queue/late"}.items(), b"after DISCONNECT"))
    clock.advance(0)
    assert s.phase is Phase.CLOSED and t.closed and s.closed
    assert [f.command for f in frames(t)] == ["CONNECTED", "RECEIPT"]
    assert "queue://late" not in s.broker.queues


def test_a_refused_connect_never_reaches_the_connected_phase():
    from protocols.stomp.session import Phase

    s, t, _ = session()
    s.data_received(encode_frame("CONNECT", {"accept-version": "2.0"}.items()))
    assert s.phase is Phase.CLOSED and s.live is None and t.closed
    (error,) = frames(t)
    assert error.command == "ERROR" and error.headers["version"] == "1.0,1.1,1.2"


class LaterAuthenticator:
    """Answers when the test says, as a slow hash off the reactor thread would."""

    def __init__(self):
        self.pending = []

    def authenticate(self, credentials, answer):
        self.pending.append((credentials, answer))


class Paused(FakeTransport):
    """A transport a test watches being paused (FakeTransport records it)."""


def authenticated_session(authenticator, access=None):
    from core.access import AllowAll

    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    broker.start()
    transport = Paused()
    s = StompSession(broker, transport, StompSettings(), "test", authenticator=authenticator, access=access or AllowAll())
    return s, transport


def test_frames_after_connect_wait_for_the_credentials_with_reading_paused():
    from core.access import Principal
    from protocols.stomp.session import Phase

    auth = LaterAuthenticator()
    s, t = authenticated_session(auth)
    s.data_received(
        encode_frame("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "pw"}.items())
        + encode_frame("SEND", {"destination": "/queue/q", "receipt": "r1"}.items(), b"after connect")
    )
    ((credentials, answer),) = auth.pending
    assert (credentials.login, credentials.secret, credentials.protocol) == ("alice", b"pw", "stomp/1.2")
    assert s.phase is Phase.AUTHENTICATING and t.paused == {"authenticating"} and t.data == b""
    s.data_received(encode_frame("SEND", {"destination": "/queue/q"}.items(), b"read meanwhile"))
    answer(Principal("alice"), "")
    assert s.phase is Phase.CONNECTED and t.paused == set() and s.principal.name == "alice"
    assert [f.command for f in frames(t)] == ["CONNECTED", "RECEIPT"]
    assert [e.message.body for e in s.broker.queues["queue://q"].messages()] == [b"after connect", b"read meanwhile"]


def test_refused_credentials_get_an_error_and_nothing_after_is_handled():
    auth = LaterAuthenticator()
    s, t = authenticated_session(auth)
    s.data_received(
        encode_frame("CONNECT", {"accept-version": "1.2", "login": "mallory", "passcode": "guess"}.items())
        + encode_frame("SEND", {"destination": "/queue/q"}.items(), b"must not be stored")
    )
    auth.pending[0][1](None, "bad user name or password")
    (error,) = frames(t)
    assert (error.command, error.headers["message"]) == ("ERROR", "Access refused")
    assert error.body == b"bad user name or password" and t.closed
    assert "queue://q" not in s.broker.queues


class DenyQueue:
    def allowed(self, principal, permission, destination, client_id=None):
        return not destination.startswith("queue://secret")

    def reading(self, principal, destination, client_id=None):
        from core.access import Reading

        return Reading.WHOLE if self.allowed(principal, None, destination) else Reading.REFUSED

    def reader(self, principal, client_id=None):
        return None

    version = 0


def test_denied_send_and_subscribe_get_an_error_naming_the_destination_with_the_receipt():
    from protocols.auth import Anonymous

    for frame in (
        encode_frame("SEND", {"destination": "/queue/secret", "receipt": "r9"}.items(), b"x"),
        encode_frame("SUBSCRIBE", {"destination": "/queue/secret", "id": "1", "receipt": "r9"}.items()),
        encode_frame("SEND", {"destination": "/queue/open,/queue/secret", "receipt": "r9"}.items(), b"x"),
    ):
        s, t = authenticated_session(Anonymous(), DenyQueue())
        s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()) + frame)
        connected, error = frames(t)
        assert error.headers["message"] == "Access denied" and error.headers["receipt-id"] == "r9"
        assert b"/queue/secret is not allowed" in error.body and t.closed
        assert not s.broker.queues.get("queue://open") or len(s.broker.queues["queue://open"]) == 0


def test_a_wildcard_subscription_a_deny_overlaps_is_granted_and_filtered_at_delivery():
    """Mosquitto's behaviour on STOMP: /topic/> beside a denied topic gets everything else, and the denials are counted."""
    from core.access import Rule, Rules
    from protocols.auth import Anonymous

    rules = Rules([
        Rule.parse("*", "allow", ["read", "write"], ["topic://>"]),
        Rule.parse("*", "allow", ["read"], ["topic://$SYS.>"]),
        Rule.parse("*", "deny", ["read"], ["topic://test.nosubscribe"]),
    ])
    s, t = authenticated_session(Anonymous(), rules)
    s.data_received(
        encode_frame("CONNECT", {"accept-version": "1.2"}.items())
        + encode_frame("SUBSCRIBE", {"destination": "/topic/>", "id": "all", "receipt": "r1"}.items())
        + encode_frame("SUBSCRIBE", {"destination": "/topic/TopicA.*", "id": "a"}.items())
    )
    for topic in ("test.nosubscribe", "TopicA.B", "test.other", "test.nosubscribe"):
        s.data_received(encode_frame("SEND", {"destination": f"/topic/{topic}"}.items(), topic.encode()))
    got = [(f.headers["subscription"], f.body) for f in frames(t) if f.command == "MESSAGE"]
    assert got == [("all", b"TopicA.B"), ("a", b"TopicA.B"), ("all", b"test.other")]
    assert s.conn.messages_denied == 2 and s.conn.messages_out == 3
    consumers = {c.handle.id: c for c in s.conn.consumers.values()}
    assert consumers["all"].check is not None and consumers["a"].check is None  # only the overlapped one pays
    # A reload that denies TopicA.> instead: the next delivery of both subscriptions is checked by it.
    rules.replace([rules.rules[0], rules.rules[1], Rule.parse("*", "deny", ["read"], ["topic://TopicA.>"])])
    assert consumers["a"].check is not None
    t.data = b""
    for topic in ("TopicA.B", "test.nosubscribe"):
        s.data_received(encode_frame("SEND", {"destination": f"/topic/{topic}"}.items(), topic.encode()))
    assert [(f.headers["subscription"], f.body) for f in frames(t)] == [("all", b"test.nosubscribe")]
    assert s.conn.messages_denied == 4 and not t.closed


def test_a_subscription_to_the_denied_topic_itself_is_still_refused():
    from core.access import Rule, Rules
    from protocols.auth import Anonymous

    rules = Rules([Rule.parse("*", "allow", ["read"], ["topic://>"]), Rule.parse("*", "deny", ["read"], ["topic://test.>"])])
    for destination in ("/topic/test.nosubscribe", "/topic/test.*", "/topic/$SYS.>"):
        s, t = authenticated_session(Anonymous(), rules)
        s.data_received(
            encode_frame("CONNECT", {"accept-version": "1.2"}.items())
            + encode_frame("SUBSCRIBE", {"destination": destination, "id": "1", "receipt": "r"}.items())
        )
        connected, error = frames(t)
        assert error.headers["message"] == "Access denied" and f"read access to {destination}".encode() in error.body
        assert t.closed
    assert not rules._listening  # the readers of closed sessions are forgotten by the rules


# -- heart-beats on the shared heap of deadlines (protocols/deadlines.py) ---------------------------


def heartbeating(clock, broker, heart_beat, **settings):
    transport = FakeTransport()
    s = StompSession(broker, transport, StompSettings(**settings), "test")
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2", "heart-beat": heart_beat}.items()))
    (connected,) = frames(transport)
    transport.data = b""
    return s, transport, connected.headers["heart-beat"]


def test_a_client_that_stops_sending_is_dropped_after_the_negotiated_grace():
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    s, t, agreed = heartbeating(clock, broker, "2000,0", heartbeat_receive_ms=1000, heartbeat_grace=2.0)
    assert agreed == "0,2000"  # it sends every 2 s at most: silence is allowed for 2 x 2 s
    clock.advance(3.9)
    s.data_received(b"\n")  # its heart-beat: the 4 s start again
    clock.advance(4.0)
    assert not t.closed  # silent for exactly the grace: not more
    clock.advance(0.01)
    assert t.closed and s.closed
    (error,) = frames(t)
    assert error.headers["message"] == "Heart-beat timeout" and error.body == b"nothing received for 4.0 s"


def elapse(clock, seconds, step=0.125):
    """Let ``seconds`` pass in small steps, as a running reactor would (Clock.advance runs what is due at the
    end); steps a float holds exactly, so the sums land on the deadlines."""
    for _ in range(round(seconds / step)):
        clock.advance(step)


def test_a_server_heart_beat_is_sent_at_the_interval_and_only_when_nothing_else_was():
    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    s, t, agreed = heartbeating(clock, broker, "0,3000", heartbeat_send_ms=1000)
    assert agreed == "3000,0"
    elapse(clock, 2.875)
    assert t.data == b""
    elapse(clock, 0.125)
    assert t.data == b"\n"  # at the interval after CONNECTED
    elapse(clock, 1.0)
    s.data_received(encode_frame("SEND", {"destination": "/queue/q", "receipt": "r"}.items()))  # the RECEIPT is written at 4 s
    t.data = b""
    elapse(clock, 2.875)
    assert t.data == b""  # the RECEIPT was as good as a heart-beat: none at 6 s
    elapse(clock, 0.125)
    assert t.data == b"\n" and not t.closed  # at 7 s, the interval after the RECEIPT


def test_heart_beats_of_many_connections_share_one_timer_and_a_closed_one_keeps_none():
    from protocols import deadlines

    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    timers = len(clock.getDelayedCalls())  # the broker's own, and the connect timers of none yet
    sessions = [heartbeating(clock, broker, "10000,10000")[0] for _ in range(50)]
    assert len(clock.getDelayedCalls()) == timers + 1  # one for all of them, not one each
    heap = deadlines.shared(clock)
    assert len(heap) == 50
    clock.advance(10.0)  # each owes a heart-beat: one firing writes all fifty
    assert all(s.transport.data == b"\n" for s in sessions)
    assert len(clock.getDelayedCalls()) == timers + 1
    for s in sessions:
        s.connection_lost()
    assert len(clock.getDelayedCalls()) == timers and len(heap) == 0  # nothing watched: no timer, no entries
    assert deadlines.shared(clock) is not heap  # and the clock is not held by a heap any more


def test_no_heart_beat_deadline_when_none_was_agreed():
    from protocols import deadlines

    clock = Clock()
    broker = Broker(MemoryStore(), clock)
    timers = len(clock.getDelayedCalls())
    s, t, agreed = heartbeating(clock, broker, "0,0")
    assert agreed == "0,0" and len(clock.getDelayedCalls()) == timers and len(deadlines.shared(clock)) == 0


# -- the shared lifecycle: the connect timer, producer flow control, why a session ended -----------


def test_no_connect_in_time_is_an_error_and_a_connected_client_keeps_no_timer():
    from protocols.lifecycle import CloseReason

    s, t, clock = session(connect_timeout=5.0)
    clock.advance(5.0)
    (error,) = frames(t)
    assert error.headers["message"] == "Connect timeout" and t.closed and s.close_reason is CloseReason.ERROR
    s, t, clock = session(connect_timeout=5.0)
    timers = len(clock.getDelayedCalls())
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    assert len(clock.getDelayedCalls()) == timers - 1 and s.gate is None  # the opening is over
    clock.advance(60)
    assert not t.closed and s.close_reason is CloseReason.NORMAL


def test_a_persistent_send_while_the_store_is_full_holds_the_producer_until_there_is_room():
    s, t, _ = session()
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    usage = s.broker.store_usage
    usage.set_alarm("Disk space low", "free disk space is below the floor")
    s.data_received(encode_frame("SEND", {"destination": "/queue/q", "persistent": "true"}.items(), b"stored"))
    assert t.paused == {"store limit"} and s.hold is not None
    s.data_received(encode_frame("SEND", {"destination": "/queue/q"}.items(), b"read before the pause took"))
    usage.set_alarm("", None)
    assert t.paused == set() and s.hold is None and not t.closed


def test_under_the_fail_policy_a_persistent_send_is_refused_while_the_store_is_full():
    from core.policy import Policy

    clock = Clock()
    broker = Broker(MemoryStore(), clock, Policy(store_full_policy="fail"))
    t = FakeTransport()
    s = StompSession(broker, t, StompSettings(), "test")
    s.data_received(encode_frame("CONNECT", {"accept-version": "1.2"}.items()))
    broker.store_usage.set_alarm("Disk space low", "free disk space is below the floor")
    s.data_received(encode_frame("SEND", {"destination": "/queue/q"}.items(), b"not persistent: taken"))
    s.data_received(encode_frame("SEND", {"destination": "/queue/q", "persistent": "true"}.items(), b"refused"))
    connected, error = frames(t)
    assert (error.headers["message"], error.body) == ("Disk space low", b"free disk space is below the floor")
    assert t.closed and t.paused == set()
    assert [e.message.body for e in broker.queues["queue://q"].messages()] == [b"not persistent: taken"]
