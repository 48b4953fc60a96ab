"""Which process holds a file lock: for a standby's log, so an operator can tell HA from a mistake.

RocksDB locks ``<store>/LOCK`` with ``fcntl(F_SETLK)``.  The holder could be asked
with ``F_GETLK`` on a descriptor of that file, but closing any descriptor of a file
drops every POSIX lock this process holds on it: in a process that holds (or will
hold, after a takeover) the same store, a probe would silently release the master's
lock.  ``/proc/locks`` needs no descriptor, so it is read instead (Linux; elsewhere
the holder is simply not named).
"""
from __future__ import annotations

import os

__all__ = ["lock_holder", "holders"]

# A command line is named up to this many characters (an operator needs to recognise it, not read it whole).
MAX_COMMAND = 200


def holders(path: str, locks: str = "/proc/locks") -> list[int]:
    """The ids of the processes that hold a lock on ``path`` (blocked waiters excluded), as /proc/locks says.

    A lock is matched by inode, and by device where the device agrees (on overlay
    and btrfs the device /proc/locks names can differ from what stat() gives).
    OFD locks belong to no process (-1 there) and are left out.
    """
    try:
        st = os.stat(path)
        with open(locks, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    same_inode: list[tuple[int, bool]] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":  # "->": waiting for the lock, not holding it
            continue
        pid_field, where = fields[4], fields[5]
        dev, _, inode = where.rpartition(":")
        if inode != str(st.st_ino):
            continue
        try:
            pid = int(pid_field)
        except ValueError:
            continue
        if pid > 0:
            same_inode.append((pid, dev == device))
    exact = [pid for pid, on_device in same_inode if on_device]
    return sorted(set(exact or [pid for pid, _ in same_inode]))


def lock_holder(path: str) -> str | None:
    """``pid 1234 (gateway run --data-dir /srv/data)``: who holds ``path``; None when it cannot be told.

    None also covers a holder on another machine (a store on a shared filesystem),
    which no local table shows.
    """
    pids = holders(path)
    if not pids:
        return None
    named = []
    for pid in pids:
        if pid == os.getpid():
            named.append(f"pid {pid} (this process)")
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            argv = []
        command = " ".join(_short(argv))
        if len(command) > MAX_COMMAND:
            command = command[: MAX_COMMAND - 3] + "..."
        named.append(f"pid {pid} ({command})" if command else f"pid {pid}")
    return ", ".join(named)


def _short(argv: list[str]) -> list[str]:
    """``/venv/bin/python /venv/bin/gateway run ...`` reads as ``gateway run ...``: the interpreter says nothing."""
    if len(argv) >= 2 and os.path.basename(argv[0]).startswith("python") and not argv[1].startswith("-"):
        argv = argv[1:]
    if argv:
        argv = [os.path.basename(argv[0]), *argv[1:]]
    return argv
