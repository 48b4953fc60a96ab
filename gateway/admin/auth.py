"""Who an admin request is: HTTP Basic credentials, a bearer token or a client certificate.

Basic credentials go to the broker's one authenticator, as a STOMP or MQTT
login does; ``Authorization: Bearer gwt_...`` is a token from the tokens file
(gateway/auth/tokens.py), for scripts and Prometheus; a request with neither,
on a TLS port that asked for a client certificate, is the certificate's user
(its CN), as on the other TLS listeners.
Missing or bad credentials get 401 with ``WWW-Authenticate: Basic``; an
unknown user and a wrong password get the same body after the same work (the
authenticator's dummy hash).  A request without credentials is the anonymous
principal when ``[auth]`` lets anonymous clients in; what it may then do is
up to the rules, as for any principal (gateway/admin/http.py ``require``).
"""
from __future__ import annotations

import base64
import binascii
from typing import Callable

from twisted.web import server

from core.access import Access, Principal
from gateway.admin.http import Grant, HttpError
from gateway.auth.audit import AuditLog
from gateway.auth.authenticator import BUSY, REFUSED
from protocols.adapter import peer_certificate_user
from protocols.auth import Authenticator, Credentials

# A bearer token's check: (token, remote address) -> the principal, or None and why.
TokenCheck = Callable[[str, str], "tuple[Principal | None, str]"]

MISSING = "this listener needs a user name and password (HTTP Basic)"


def basic_credentials(header: str) -> tuple[str, bytes] | None:
    """(user, password) of an ``Authorization: Basic ...`` value, or None when it is not one."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).partition(b":")
        return (user.decode("utf-8"), password) if sep else None
    except (binascii.Error, ValueError):
        return None


class BasicGuard:
    def __init__(
        self, authenticator: Authenticator, access: Access, audit: AuditLog | None = None, tokens: TokenCheck | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.access = access
        self.audit = audit or AuditLog("")
        self.tokens = tokens

    def check(self, request: server.Request, done: Callable[[Grant | HttpError], None]) -> None:
        header = request.getHeader("authorization")
        address = request.getClientAddress()
        remote = f"{getattr(address, 'host', '?')}:{getattr(address, 'port', '?')}"
        certified = None
        if header is None:
            login, secret = None, None
            certified = peer_certificate_user(request.channel.transport)
        elif header.strip()[:7].lower() == "bearer ":
            principal, why = self.tokens(header.strip()[7:].strip(), remote) if self.tokens else (None, REFUSED)
            if principal is None:
                done(HttpError(401, why, "unauthorized"))
            else:
                self._granted(request, principal, remote, done)
            return
        else:
            parsed = basic_credentials(header)
            if parsed is None:
                done(HttpError(401, REFUSED, "unauthorized"))
                return
            login, secret = parsed

        def answered(principal: Principal | None, reason: str) -> None:
            if principal is not None:
                self._granted(request, principal, remote, done)
            elif reason == BUSY:
                done(HttpError(503, reason, "busy"))
            elif header is None and not certified:
                done(HttpError(401, MISSING, "unauthorized"))
            else:
                done(HttpError(401, reason or REFUSED, "unauthorized"))

        self.authenticator.authenticate(Credentials(login, secret, certified, remote, "http"), answered)

    def _granted(self, request: server.Request, principal: Principal, remote: str, done: Callable[[Grant | HttpError], None]) -> None:
        method = request.method.decode("ascii", "replace")
        if method not in ("GET", "HEAD"):  # what changes something, by whom
            self.audit.write(
                "admin_request", user=principal.name, address=remote, protocol="http", method=method,
                path=request.path.decode("utf-8", "replace")[:500],
            )
        done(Grant(principal, self.access))
