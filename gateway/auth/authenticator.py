"""Passwords from the users file, checked off the reactor thread; certificates; anonymous clients if allowed.

Every refusal of a login says the same thing, ``bad user name or password``,
after the same work: an unknown user is checked against a dummy hash of the
same cost as the file's, so neither the answer nor its timing tells whether
the user exists.  The hashing runs in a small thread pool of its own
(hashlib releases the GIL while it works), so a flood of logins delays other
logins, never message flow; past ``max_pending`` checks waiting, a login is
refused at once.

A successful check is remembered for ``cache_seconds`` as an HMAC of the
password under a key drawn at start, so a reconnect storm of known clients
and the admin listener's per-request Basic credentials do not pay the slow
hash every time; a wrong password always pays it.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import cast

from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from core.access import ANONYMOUS, Principal
from gateway.auth.audit import AuditLog, LoginBackoff, host_of
from gateway.auth.tokens import Tokens
from gateway.auth.users import Users
from gateway.twisted_types import Reactor
from protocols.auth import Answer, Credentials

log = Logger(namespace="gateway.auth")

REFUSED = "bad user name or password"
BUSY = "too many logins in progress; retry later"
BANNED = "too many failed logins from this address; retry in {seconds:.0f} s"


class PasswordAuthenticator:
    """``protocols.auth.Authenticator`` over a users file and the groups of ``[auth.groups]``."""

    def __init__(
        self, users: Users, groups: Mapping[str, frozenset[str]], allow_anonymous: bool, reactor: Reactor, *,
        threads: int = 2, max_pending: int = 1000, cache_seconds: float = 300.0, cache_size: int = 100_000,
        audit: AuditLog | None = None, backoff: LoginBackoff | None = None,
    ) -> None:
        self.audit = audit or AuditLog("")
        self.backoff = backoff
        self.users = users
        self.groups = groups  # user -> the groups it is in
        self.allow_anonymous = allow_anonymous
        self.reactor = reactor
        self.pool = ThreadPool(minthreads=0, maxthreads=threads, name="gateway-auth")
        self.max_pending = max_pending
        self.pending = 0
        self.cache_seconds = cache_seconds
        self.cache_size = cache_size
        self._cache_key = secrets.token_bytes(32)
        self._verified: dict[str, tuple[bytes, float]] = {}  # name -> (HMAC of the password, expiry)
        self._principals: dict[str, Principal] = {}
        self.tokens = Tokens({})
        # Refusals since start, for /metrics: bad credentials, and logins refused while their address is banned.
        self.failed_logins = 0
        self.refused_logins = 0

    def start(self) -> None:
        self.pool.start()

    def stop(self) -> None:
        """Waits for the checks under way (tens of milliseconds each); queued ones are dropped."""
        self.pool.stop()

    def replace_groups(self, groups: Mapping[str, frozenset[str]]) -> None:
        """Re-read groups: principals made from now on carry them (connected ones keep theirs)."""
        self.groups = groups
        self._principals.clear()

    def replace_users(self, users: Users) -> None:
        """A re-read users file: remembered passwords are forgotten."""
        self.users = users
        self._verified.clear()
        self._principals.clear()

    def replace_tokens(self, tokens: Tokens) -> None:
        self.tokens = tokens

    def authenticate_token(self, token: str, remote: str, protocol: str = "http") -> tuple[Principal | None, str]:
        """The principal a bearer token acts as, at once (a SHA-256, no thread); refusals audited and counted as failed logins."""
        host = host_of(remote)
        now = self.reactor.seconds()
        backoff = self.backoff
        if backoff is not None:
            wait = backoff.banned(host, now)
            if wait:
                self.audit.write("login_refused", reason="address banned", address=remote, protocol=protocol)
                self.refused_logins += 1
                return None, BANNED.format(seconds=max(wait, 1))
        user = self.tokens.user_of(token)
        if user is not None and user in self.users:
            return self.principal(user), ""
        self.audit.write("login_failed", reason="bad token", address=remote, protocol=protocol)
        self.failed_logins += 1
        if backoff is not None and backoff.failed(host, now):
            self.audit.write("address_banned", address=host)
        return None, REFUSED

    def principal(self, name: str) -> Principal:
        found = self._principals.get(name)
        if found is None:
            found = self._principals[name] = Principal(name, self.groups.get(name, frozenset()))
        return found

    def authenticate(self, credentials: Credentials, answer: Answer) -> None:
        """Refused at once while the address is banned; failures counted, and written to the audit log."""
        backoff = self.backoff
        host = host_of(credentials.remote)
        fields = {
            "user": credentials.login, "client_id": credentials.client_id, "address": credentials.remote,
            "protocol": credentials.protocol,
        }
        if backoff is not None:
            wait = backoff.banned(host, self.reactor.seconds())
            if wait:
                self.audit.write("login_refused", reason="address banned", **fields)
                self.refused_logins += 1
                answer(None, BANNED.format(seconds=max(wait, 1)))
                return

        # Nothing given at all (a browser's first request, before its Basic prompt) guesses no
        # password: refused, but neither a failed login nor a step towards a ban.
        guessed = bool(credentials.login or credentials.secret)

        def answered(principal: Principal | None, why: str) -> None:
            if principal is None and why == REFUSED and guessed:
                self.audit.write("login_failed", **fields)
                self.failed_logins += 1
                if backoff is not None and backoff.failed(host, self.reactor.seconds()):
                    log.warn("{host}: {n} failed logins in {w:.0f} s: refused for a while", host=host, n=backoff.limit, w=backoff.window)
                    self.audit.write("address_banned", address=host)
            answer(principal, why)

        self._authenticate(credentials, answered)

    def _authenticate(self, credentials: Credentials, answer: Answer) -> None:
        login, secret, certified = credentials.login, credentials.secret, credentials.certificate_user
        if certified and (not login or login == certified) and certified in self.users:
            answer(self.principal(certified), "")
            return
        if not login:
            if secret or not self.allow_anonymous:
                answer(None, REFUSED)
            else:
                answer(ANONYMOUS, "")
            return
        secret = secret or b""
        digest = hmac.digest(self._cache_key, login.encode("utf-8", "surrogatepass") + b"\0" + secret, hashlib.sha256)
        remembered = self._verified.get(login)
        if remembered is not None and hmac.compare_digest(remembered[0], digest):
            if remembered[1] > self.reactor.seconds():
                answer(self.principal(login), "")
                return
            del self._verified[login]
        if self.pending >= self.max_pending:
            answer(None, BUSY)
            return
        self.pending += 1
        users = self.users
        # Twisted declares the reactor by zope interface; ours is typed by the Protocol it satisfies.
        checked = deferToThreadPool(cast(IReactorFromThreads, self.reactor), self.pool, users.hash_for(login).verify, secret)

        def done(ok: bool) -> None:
            self.pending -= 1
            # A login not in the file was checked against the dummy: ``ok`` is false, but ask the file too.
            if ok and login in users:
                self._remember(login, digest)
                answer(self.principal(login), "")
            else:
                answer(None, REFUSED)

        def failed(failure: Failure) -> None:
            self.pending -= 1
            log.failure("checking the password of {login!r} failed", failure, login=login)
            answer(None, REFUSED)

        checked.addCallbacks(done, failed)

    def _remember(self, login: str, digest: bytes) -> None:
        if self.cache_seconds <= 0:
            return
        if len(self._verified) >= self.cache_size:
            del self._verified[next(iter(self._verified))]
        self._verified[login] = (digest, self.reactor.seconds() + self.cache_seconds)
