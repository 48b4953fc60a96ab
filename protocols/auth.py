"""What a session needs to authenticate its client: credentials in, a principal (or a refusal) out, later.

Checking a password means a slow hash, so the answer comes back through a
callback on the reactor thread, possibly in a later turn; the session waits
in its AUTHENTICATING phase with reading paused.  An authenticator that
answers at once (anonymous access) keeps CONNECT as fast as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from core.access import ANONYMOUS, Principal


@dataclass(frozen=True)
class Credentials:
    login: str | None           # STOMP login, MQTT username
    secret: bytes | None        # STOMP passcode (UTF-8), MQTT password (binary)
    certificate_user: str | None  # the CN of a verified TLS client certificate
    remote: str                 # the peer address, for backoff and the audit log
    protocol: str               # "stomp/1.2", "mqtt/5", ...
    client_id: str | None = None


# Called with the principal, or None and why the client is refused.
Answer = Callable[[Principal | None, str], None]


class Authenticator(Protocol):
    def authenticate(self, credentials: Credentials, answer: Answer) -> None:
        """Call ``answer`` exactly once, on the reactor thread, now or later."""


class Anonymous:
    """No users configured (loopback only, or allow_anonymous): everyone is the anonymous principal, at once."""

    def authenticate(self, credentials: Credentials, answer: Answer) -> None:
        answer(ANONYMOUS, "")
