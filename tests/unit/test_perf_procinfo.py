"""Reading a broker's CPU, RSS and pid from /proc, as gateway perf does for any broker."""
from __future__ import annotations

import os
import socket
import threading
import time

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


def test_cpu_by_thread_puts_a_busy_thread_apart_from_the_main_one():
    before = procinfo.thread_cpu_seconds(os.getpid())
    done, release = threading.Event(), threading.Event()

    def burn() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.2:  # the kernel counts in 10 ms ticks
            sum(i * i for i in range(10_000))
        done.set()
        release.wait(30)  # alive until read: an ended thread's CPU leaves /proc/PID/task

    worker = threading.Thread(target=burn)
    worker.start()
    done.wait(30)
    after = procinfo.thread_cpu_seconds(os.getpid())
    release.set()
    worker.join()
    assert before is not None and after is not None
    assert after[worker.native_id][0] == "other" and after[os.getpid()][0] == "main"
    split = procinfo.thread_cpu_split(before, after)
    assert set(split) == {"main", "rocksdb", "other"}
    assert split["other"] >= 0.1  # the worker, new since the first reading, counted from zero
    assert split["main"] < split["other"]  # the main thread only waited
    # A thread that ended between two readings is left out, not counted as negative.
    ended = procinfo.thread_cpu_seconds(os.getpid())
    assert ended is not None and worker.native_id not in ended
    assert procinfo.thread_cpu_split(after, ended)["other"] >= 0.0
    assert procinfo.thread_cpu_seconds(2**22 + 12345) is None
