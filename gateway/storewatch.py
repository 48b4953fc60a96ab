"""The store's alarm: the disk's free space against its floor, and the store's faults.

Both end in one place, ``Broker.store_usage.alarm``, which every producer's
session already consults (held or refused by ``store_full_policy``, as at
``store_limit``), and which readiness, ``/metrics`` and ``$SYS`` report.
The floor is checked every ``disk_check_interval`` seconds and after every
quarter of the room left above it has been written, so a burst cannot run
from above the floor to a full disk between two timer checks.

A fault (a write that failed) is retried on the same timer; RocksDB takes
writes again a few seconds after space returns.  When it does not (a sync of
its log that failed too leaves its log writer broken for good), the store is
opened again once the disk has had room for ``REOPEN_AFTER`` seconds, which
recovers it from its log as a restart would.  A fault that is not a lack of
space, a store that cannot be opened again, or one that outlasts
``fault_exit_after`` seconds with room on the disk, is beyond what the
process can mend: ``on_fatal`` is told (the CLI exits non-zero; a restart
recovers from the write-ahead log).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from twisted.logger import Logger

from core.broker import Broker
from gateway.config import PersistenceConfig
from gateway.twisted_types import DelayedCall, Reactor
from persistence.disk import MIB, FreeSpaceFloor, disk_space, human
from persistence.rocks import RocksStore
from persistence.store import StoreFault

log = Logger(namespace="gateway.store")

# Seconds between compactions that give deleted space back while the disk is below its floor.
RECLAIM_EVERY = 5.0
# Seconds with room on the disk after which a store RocksDB has not resumed is opened again
# (its SstFileManager looks for space every 5 s), and between such attempts.
REOPEN_AFTER = 12.0

DISK_LOW = "Disk space low"
STORE_FAILED = "Store write failed"


class StoreWatch:
    def __init__(
        self, store: RocksStore, spill: RocksStore | None, broker: Broker, settings: PersistenceConfig,
        reactor: Reactor, on_fatal: Callable[[str], None],
    ) -> None:
        self.store = store
        self.stores = [store] if spill is None else [store, spill]
        self.broker = broker
        self.settings = settings
        self.reactor = reactor
        self.on_fatal = on_fatal
        self.floor = FreeSpaceFloor(settings.disk_free_limit)
        self._timer: DelayedCall | None = None
        self._fatal = False
        # Since when the disk has had room above the floor during a fault (monotonic; None: not yet).
        self._room_since: float | None = None
        self._reclaimed = 0.0  # monotonic time of the last compaction under the alarm
        self._reopened = 0.0  # and of the last reopen of a store that RocksDB would not resume
        for each in self.stores:
            each.on_fault = self._fault_changed
            each.on_large_write = self.check

    def start(self) -> None:
        self.check()

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for each in self.stores:
            each.on_fault = None
            each.on_large_write = None

    @property
    def fault(self) -> StoreFault | None:
        for each in self.stores:
            if each.fault is not None:
                return each.fault
        return None

    def _fault_changed(self, fault: StoreFault | None) -> None:
        if fault is not None:
            self.broker.store_usage.faults += 1
            if not fault.space:
                self._fail(f"the store failed with an error it cannot recover from: {fault.error}")
                return
        elif self.fault is None:
            self.broker.store_recovered()
        self._publish()

    def check(self) -> None:
        """Read the disk, try to end a fault, and set the alarm; then schedule the next check."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._fatal:
            return
        try:
            free, total = disk_space(self.store.path)
        except OSError as exc:
            log.error("cannot read the free space of {path}: {error}", path=self.store.path, error=str(exc))
            free, total = -1, 0
        changed = free >= 0 and self.floor.update(free, total)
        if changed and self.floor.low:
            log.warn(
                "disk alarm: {free} free at {path}, below disk_free_limit {limit}: producers of stored "
                "messages are held or refused until it is back above {back}",
                free=human(free), path=self.store.path, limit=human(self.floor.limit),
                back=human(self.floor.limit + max(self.floor.limit // 10, MIB)),
            )
        elif changed:
            log.info("disk alarm cleared: {free} free at {path}", free=human(free), path=self.store.path)
        self._try_recover(free)
        if self._fatal:
            return
        if self.floor.low:
            self._reclaim()
        self._publish()
        # The next check after a quarter of the room above the floor is written (at least 1 MiB on).
        room = max(MIB, (free - self.floor.limit) // 4) if free >= 0 else MIB
        for each in self.stores:
            each.check_after = each.bytes_written + room
        self._timer = self.reactor.callLater(self.settings.disk_check_interval, self.check)

    def _try_recover(self, free: int) -> None:
        for each in self.stores:
            fault = each.fault
            if fault is None:
                continue
            if not fault.space:
                self._fail(f"the store at {each.path} failed with an error it cannot recover from: {fault.error}")
                return
            if each.recover():
                continue
            if free >= 0 and not self.floor.low:
                now = time.monotonic()
                if self._room_since is None:
                    self._room_since = now
                    continue
                waited = now - self._room_since
                if waited >= REOPEN_AFTER and now - self._reopened >= REOPEN_AFTER:
                    # RocksDB has had room for two of its own recovery polls and still refuses:
                    # its log writer is broken for good.  Open it again, as a restart would.
                    self._reopened = now
                    if each.reopen():
                        continue
                    if each.closed:
                        self._fail(f"the store at {each.path} could not be opened again after a full disk")
                        return
                if waited >= self.settings.fault_exit_after:
                    self._fail(
                        f"the store at {each.path} still cannot write {waited:.0f}s after the disk "
                        f"had room again ({human(free)} free): {fault.last_error or fault.error}"
                    )
                    return
            else:
                self._room_since = None
        if self.fault is None:
            self._room_since = None

    def _reclaim(self) -> None:
        """Below the floor, give back what acks deleted at once rather than at the next compaction_interval.

        Deleted messages hold their space until a compaction drops them; without
        this a drained store could keep the alarm on (and its producers held) for
        a minute.  At most every RECLAIM_EVERY seconds: a compaction holds the reactor.
        """
        store = self.store
        now = time.monotonic()
        if store.fault is not None or not store.deletes_since_compaction or now - self._reclaimed < RECLAIM_EVERY:
            return
        self._reclaimed = now
        deletes = store.deletes_since_compaction
        try:
            store.compact()
        except Exception as exc:  # rocksdict raises a plain Exception; the next check tries again
            log.warn("compaction under the disk alarm failed: {error}", error=str(exc))
            return
        log.info("store compacted under the disk alarm after {n} deletes", n=deletes)

    def _fail(self, why: str) -> None:
        self._fatal = True
        log.critical("{why}; stopping: a restart recovers what was confirmed from the write-ahead log", why=why)
        self.on_fatal(why)

    def _publish(self) -> None:
        """Set the broker's alarm from the fault (first) or the floor, and the figures operators read."""
        usage = self.broker.store_usage
        usage.disk_free = self.floor.free
        usage.disk_free_limit = self.floor.limit
        fault = self.fault
        usage.faulted = fault is not None
        free = human(self.floor.free) if self.floor.free >= 0 else "unknown"
        if fault is not None:
            usage.set_alarm(STORE_FAILED, (
                f"the broker's store could not write ({fault.error}; {free} free at {self.store.path}): "
                "nothing more is confirmed until it writes again"
            ))
        elif self.floor.low:
            usage.set_alarm(DISK_LOW, (
                f"the disk has {free} free at {self.store.path}, below disk_free_limit {human(self.floor.limit)}: "
                "producers of stored messages are held or refused until space returns"
            ))
        elif usage.alarm is not None:
            usage.set_alarm("", None)
