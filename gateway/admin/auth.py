"""Who an admin request is: HTTP Basic credentials checked by the broker's one authenticator.

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
from protocols.auth import Authenticator, Credentials

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
    def __init__(self, authenticator: Authenticator, access: Access, audit: AuditLog | None = None) -> None:
        self.authenticator = authenticator
        self.access = access
        self.audit = audit or AuditLog("")

    def check(self, request: server.Request, done: Callable[[Grant | HttpError], None]) -> None:
        header = request.getHeader("authorization")
        if header is None:
            login, secret = None, None
        else:
            parsed = basic_credentials(header)
            if parsed is None:
                done(HttpError(401, REFUSED, "unauthorized"))
                return
            login, secret = parsed
        address = request.getClientAddress()
        remote = f"{getattr(address, 'host', '?')}:{getattr(address, 'port', '?')}"

        def answered(principal: Principal | None, reason: str) -> None:
            if principal is not None:
                method = request.method.decode("ascii", "replace")
                if method not in ("GET", "HEAD"):  # what changes something, by whom
                    self.audit.write(
                        "admin_request", user=principal.name, address=remote, protocol="http", method=method,
                        path=request.path.decode("utf-8", "replace")[:500],
                    )
                done(Grant(principal, self.access))
            elif reason == BUSY:
                done(HttpError(503, reason, "busy"))
            else:
                done(HttpError(401, MISSING if header is None else REFUSED, "unauthorized"))

        self.authenticator.authenticate(Credentials(login, secret, None, remote, "http"), answered)
