"""The TCP adapter on real loopback sockets: writes straight to the socket, and Twisted's buffer when it is full."""
from __future__ import annotations

import socket
import threading

import pytest
from twisted.internet import reactor as installed

from protocols.adapter import SessionFactory, SessionProtocol
from tests.support import call


class Echoless:
    """A session that only records what it is told: the adapter is what is under test."""

    class _Decoder:
        buffered = 0

    def __init__(self, protocol: SessionProtocol) -> None:
        self.protocol = protocol
        self.decoder = self._Decoder()
        self.paused = 0
        self.label = "test"

    def data_received(self, data: bytes) -> None:
        pass

    def connection_lost(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def pause_producing(self) -> None:
        self.paused += 1

    def resume_producing(self) -> None:
        pass

    def refuse_connect(self, refusal) -> None:
        pass

    def fail_unfinished(self, seconds: float) -> None:
        pass


@pytest.fixture
def connected_pair():
    sessions: list[Echoless] = []
    made = threading.Event()

    def make(protocol: SessionProtocol, remote: str) -> Echoless:
        session = Echoless(protocol)
        sessions.append(session)
        made.set()
        return session

    port = call(lambda: installed.listenTCP(0, SessionFactory(make), interface="127.0.0.1"))
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    assert made.wait(5)
    yield sessions[0], client
    client.close()
    call(port.stopListening)


def test_a_write_goes_straight_to_the_socket(connected_pair):
    session, client = connected_pair

    def write_and_look() -> tuple[int, int]:
        session.protocol.write(b"hello")
        transport = session.protocol.transport
        return transport._tempDataLen, len(transport.dataBuffer)

    # Nothing left for Twisted's next poll: the bytes are in the kernel already.
    assert call(write_and_look) == (0, 0)
    client.settimeout(5)
    assert client.recv(100) == b"hello"


def test_what_the_socket_cannot_take_goes_through_twisted_in_order(connected_pair):
    session, client = connected_pair
    pieces = [bytes([i % 251]) * 65536 for i in range(128)]  # 8 MiB: far past the socket's buffers

    def write_all() -> int:
        for piece in pieces:
            session.protocol.write(piece)
        return session.protocol.transport._tempDataLen + len(session.protocol.transport.dataBuffer)

    assert call(write_all) > 0  # the kernel's buffers filled: the rest waits in Twisted's
    assert session.paused >= 1  # and its producer (the session) was told to pause
    client.settimeout(10)
    received = bytearray()
    while len(received) < 128 * 65536:
        chunk = client.recv(1 << 20)
        assert chunk
        received += chunk
    assert bytes(received) == b"".join(pieces)
