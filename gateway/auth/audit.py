"""What an operator needs to see after an attack or a mistake: failed logins, denials, admin actions.

One JSON object per line (``[auth] audit_log``), appended and flushed as it
happens, with the user, client id, address and protocol where known.  The
audit log is written on the reactor thread; its lines are short and rare
(refusals, not traffic), so a plain buffered file is enough.
"""
from __future__ import annotations

import json
import time
from typing import IO, Any

from twisted.logger import Logger

from core.access import Access, Permission, Principal, Reader, Reading

log = Logger(namespace="gateway.auth")


class AuditLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - held open

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"ts": round(time.time(), 3), "event": event}
        record.update((k, v) for k, v in fields.items() if v is not None)
        try:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._file.flush()
        except OSError as exc:
            log.error("audit log {path} not written: {error}", path=self.path, error=str(exc))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class AuditedAccess:
    """The rules, with each denial written to the audit log."""

    def __init__(self, access: Access, audit: AuditLog) -> None:
        self.access = access
        self.audit = audit

    @property
    def version(self) -> int:
        return self.access.version

    def allowed(self, principal: Principal, permission: Permission, destination: str, client_id: str | None = None) -> bool:
        if self.access.allowed(principal, permission, destination, client_id):
            return True
        self.audit.write(
            "denied", user=principal.name, client_id=client_id, permission=permission.value, destination=destination,
        )
        return False

    def reading(self, principal: Principal, destination: str, client_id: str | None = None) -> Reading:
        found = self.access.reading(principal, destination, client_id)
        if found is Reading.REFUSED:
            self.audit.write(
                "denied", user=principal.name, client_id=client_id, permission=Permission.READ.value, destination=destination,
            )
        return found

    def reader(self, principal: Principal, client_id: str | None = None) -> Reader | None:
        """Not audited: what it skips is counted, and would be a line per message here."""
        return self.access.reader(principal, client_id)


class LoginBackoff:
    """Failed logins per source address: past ``limit`` within ``window`` seconds, that address is
    refused at once for ``ban_seconds`` (doubling for each further ban, up to an hour)."""

    def __init__(self, limit: int, window: float, ban_seconds: float) -> None:
        self.limit = limit
        self.window = window
        self.ban_seconds = ban_seconds
        self._failures: dict[str, list[float]] = {}
        self._banned: dict[str, tuple[float, float]] = {}  # host -> (until, last ban length)

    def banned(self, host: str, now: float) -> float:
        """Seconds the address is still refused (0: not banned)."""
        ban = self._banned.get(host)
        if ban is None:
            return 0.0
        if ban[0] <= now:
            return 0.0
        return ban[0] - now

    def failed(self, host: str, now: float) -> bool:
        """Count a failure; True when it starts a ban."""
        if self.limit <= 0:
            return False
        times = [t for t in self._failures.get(host, ()) if now - t < self.window]
        times.append(now)
        if len(times) < self.limit:
            self._failures[host] = times
            if len(self._failures) > 100_000:  # bounded: forget the oldest addresses
                del self._failures[next(iter(self._failures))]
            return False
        self._failures.pop(host, None)
        previous = self._banned.get(host)
        length = self.ban_seconds if previous is None or now - previous[0] > 3600 else min(previous[1] * 2, 3600.0)
        self._banned[host] = (now + length, length)
        if len(self._banned) > 100_000:
            del self._banned[next(iter(self._banned))]
        return True


def host_of(remote: str) -> str:
    """The address part of ``host:port`` (and of ``ws:host:port``, the WebSocket listener's form)."""
    if remote.startswith("ws:"):
        remote = remote[3:]
    host, _, _ = remote.rpartition(":")
    return host or remote
