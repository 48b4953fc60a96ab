"""Reading a broker's CPU, RSS and pid from /proc, as gateway perf does for any broker."""
from __future__ import annotations

import os
import socket

from gateway.clients.perf import procinfo


def test_cpu_and_rss_of_this_process():
    before = procinfo.cpu_seconds(os.getpid())
    sum(i * i for i in range(300_000))  # burn a little CPU
    after = procinfo.cpu_seconds(os.getpid())
    assert before is not None and after is not None and after > before
    rss = procinfo.rss_bytes(os.getpid())
    assert rss is not None and 5 * 2**20 < rss < 8 * 2**30


def test_unknown_pid_gives_none():
    assert procinfo.cpu_seconds(2**22 + 12345) is None
    assert procinfo.rss_bytes(2**22 + 12345) is None


def test_pid_of_a_listening_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert procinfo.pid_listening_on(port) == os.getpid()
    assert procinfo.pid_listening_on(port) is None
