"""What the generator reads about the broker process from /proc: CPU, RSS, and its pid by port.

Reading /proc works the same for any broker (Mosquitto, a JVM), so the
report can put the broker's CPU next to the generator's without help from
the broker itself.
"""
from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of the whole process (all threads) so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


THREAD_KINDS = ("main", "rocksdb", "other")


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]] | None:
    """Each live thread's kind and CPU so far; see ``thread_cpu_split``."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = "main" if tid == str(pid) else "rocksdb" if name.startswith("rocksdb:") else "other"
        out[int(tid)] = (kind, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def thread_cpu_split(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU between two readings by kind of thread: ``main`` (a Twisted broker's reactor), ``rocksdb``, ``other``.

    A broker's total hides where a cost lands: a stream's records add work on
    the reactor (encoding, the log's write), in RocksDB's flush and compaction
    threads, and in the thread that syncs; the split tells them apart.
    RocksDB names its background threads ``rocksdb:high`` and ``rocksdb:low``;
    any other program's threads count as ``other``.  A thread that ended
    between the readings took its CPU with it, so the parts may sum to less
    than the process's.
    """
    out = dict.fromkeys(THREAD_KINDS, 0.0)
    for tid, (kind, seconds) in after.items():
        out[kind] += seconds - before.get(tid, (kind, 0.0))[1]
    return out


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pid_listening_on(port: int) -> int | None:
    """The process that holds a listening TCP socket on ``port``, if this user can see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{parts[9]}]")
        except OSError:
            continue
    if not inodes:
        return None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(f"{fd_dir}/{fd}") in inodes:
                        return int(entry)
                except OSError:
                    continue
        except OSError:
            continue
    return None


def listen_overflows() -> int | None:
    """The kernel's count of connections dropped because an accept queue was full (machine-wide)."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines, lines[1:]):
        if names.startswith("TcpExt:") and values.startswith("TcpExt:"):
            fields = dict(zip(names.split()[1:], values.split()[1:]))
            value = fields.get("ListenOverflows")
            return int(value) if value is not None else None
    return None
