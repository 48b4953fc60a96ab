"""Naming the process that holds a store's lock (gateway/lockholder.py), from /proc/locks."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from gateway.lockholder import holders, lock_holder

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="/proc/locks is Linux's")


def test_a_real_fcntl_lock_held_by_another_process_is_named_with_its_command_line(tmp_path):
    """RocksDB's LOCK is an fcntl (POSIX) lock: a child takes one the same way and waits to be told to go."""
    lock = tmp_path / "LOCK"
    lock.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB);"
         " print('locked', flush=True); sys.stdin.read()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"  # the barrier: it holds it now
        assert holders(str(lock)) == [holder.pid]
        named = lock_holder(str(lock))
        assert named is not None and named.startswith(f"pid {holder.pid} (python")
        assert "-c import fcntl" in named
    finally:
        holder.communicate("", timeout=10)
    assert holders(str(lock)) == [] and lock_holder(str(lock)) is None  # released with the process


def test_this_process_is_named_as_such(tmp_path):
    lock = tmp_path / "LOCK"
    with open(lock, "w") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert lock_holder(str(lock)) == f"pid {os.getpid()} (this process)"


def test_waiters_and_ofd_locks_are_not_holders_and_the_device_breaks_a_tie(tmp_path):
    lock = tmp_path / "LOCK"
    lock.touch()
    st = os.stat(lock)
    here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    elsewhere = f"ff:ff:{st.st_ino}"  # the same inode number on another filesystem
    table = tmp_path / "locks"
    table.write_text(
        f"1: POSIX  ADVISORY  WRITE 101 {here} 0 EOF\n"
        f"1: -> POSIX  ADVISORY  WRITE 102 {here} 0 EOF\n"  # waiting for 101's lock
        f"2: OFDLCK ADVISORY  WRITE -1 {here} 0 EOF\n"
        f"3: POSIX  ADVISORY  WRITE 103 {elsewhere} 0 EOF\n"
        "4: POSIX  ADVISORY  WRITE 104 00:00:1 0 EOF\n"
    )
    assert holders(str(lock), str(table)) == [101]
    # Where the device /proc/locks names differs from stat()'s (overlay, btrfs), the inode alone decides.
    table.write_text(f"3: POSIX  ADVISORY  WRITE 103 {elsewhere} 0 EOF\n")
    assert holders(str(lock), str(table)) == [103]


def test_nothing_to_name_without_the_file_or_a_lock(tmp_path):
    assert holders(str(tmp_path / "missing")) == [] and lock_holder(str(tmp_path / "missing")) is None
