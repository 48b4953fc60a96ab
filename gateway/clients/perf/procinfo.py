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
