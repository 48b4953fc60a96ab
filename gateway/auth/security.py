"""What a running gateway uses for security, built from ``[auth]``: the authenticator, the access rules, the startup check."""
from __future__ import annotations

import os

from twisted.logger import Logger

from core.access import Access, AllowAll, CreationAccess, DeadLetterAccess, Rules
from gateway.auth.audit import AuditedAccess, AuditLog, LoginBackoff
from gateway.auth.authenticator import PasswordAuthenticator
from gateway.auth.settings import exposure_refusal
from gateway.auth.tokens import Tokens
from gateway.auth.users import Users
from gateway.config import Config
from gateway.twisted_types import Reactor
from protocols.auth import Anonymous, Authenticator

log = Logger(namespace="gateway.auth")

LISTENERS = ("stomp", "mqtt", "ws", "admin")


class Exposed(Exception):
    """The configuration would let anonymous clients in from the network without saying so."""


def check_exposure(config: Config) -> None:
    """Raise ``Exposed`` when an enabled listener (plain or TLS) binds beyond loopback and no users are configured."""
    enabled = [
        (name, getattr(config, name).host or config.host) for name in LISTENERS
        if getattr(config, name).port or config.tls_port(name)
    ]
    refusal = exposure_refusal(config.auth, enabled)
    if refusal is not None:
        raise Exposed(refusal)


class Security:
    """``authenticator`` for every protocol and the admin listener, ``access`` for what principals may do.

    Without a users file and rules this is the loopback default: everyone is
    the anonymous principal and everything is allowed (``Anonymous``,
    ``AllowAll``), and the admin listener asks for no credentials.
    """

    def __init__(self, config: Config, reactor: Reactor) -> None:
        settings = self.settings = config.auth
        self.audit = AuditLog(settings.audit_log)
        self.passwords: PasswordAuthenticator | None = None
        self.authenticator: Authenticator = Anonymous()
        if settings.users_file or not settings.anonymous:
            users = Users.load(settings.users_file) if settings.users_file else Users({})
            self.passwords = PasswordAuthenticator(
                users, settings.memberships(), settings.anonymous, reactor,
                threads=settings.hash_threads, max_pending=settings.max_pending_logins,
                cache_seconds=settings.login_cache_seconds, audit=self.audit,
                backoff=LoginBackoff(
                    settings.max_failed_logins, settings.failed_login_window, settings.failed_login_ban_seconds,
                ) if settings.max_failed_logins else None,
            )
            self.authenticator = self.passwords
            if settings.tokens_file:
                self.passwords.replace_tokens(Tokens.load(settings.tokens_file))
            log.info("{n} users from {path}; anonymous clients {anonymous}, {rules} rules",
                     n=len(users), path=settings.users_file or "(no users_file)",
                     anonymous="allowed" if settings.anonymous else "refused", rules=len(settings.rules))
            if settings.users_file and os.stat(settings.users_file).st_mode & 0o077:
                log.warn("{path} can be read by other users of this machine: chmod 600 it", path=settings.users_file)
        restricted = bool(settings.users_file or settings.rules or settings.allow_anonymous is False)
        self.access: Access = Rules(settings.rules) if restricted else AllowAll()
        # Set by the gateway once the broker exists: whether a queue does (creating one needs admin).
        self.creation: CreationAccess | None = None
        if restricted:
            self.access = self.creation = CreationAccess(self.access)
            self.access = DeadLetterAccess(self.access, config.policy.is_dead_letter_queue)
        if restricted and settings.audit_log:
            self.access = AuditedAccess(self.access, self.audit)
        if restricted and not settings.rules:
            log.warn("[auth] has no rules: every destination is denied to every client ([[auth.rules]] allow what is meant)")
        # The admin listener asks for HTTP Basic credentials once there are users to give them.
        self.credentials_required = self.passwords is not None

    def reload(self, config: Config) -> bool:
        """SIGHUP with a re-read configuration: users, groups and rules in place, clients stay connected.

        Turning users or rules on or off changes what every session checks at
        CONNECT; that needs a restart, and is refused here with a message.
        """
        settings = config.auth
        rules = self._rules()
        restricted = bool(settings.users_file or settings.rules or settings.allow_anonymous is False)
        if (rules is not None) != restricted or (self.passwords is None) != (not settings.users_file and settings.anonymous):
            log.error("[auth] reload refused: turning users or rules on or off needs a restart; the previous settings stay")
            return False
        if settings.users_file != self.settings.users_file:
            log.error("[auth] reload refused: users_file changed; restart to use {path}", path=settings.users_file)
            return False
        if settings.tokens_file != self.settings.tokens_file:
            log.error("[auth] reload refused: tokens_file changed; restart to use {path}", path=settings.tokens_file)
            return False
        self.settings = settings
        if rules is not None:
            rules.replace(settings.rules)
        if self.passwords is not None:
            self.passwords.replace_groups(settings.memberships())
        self.reload_users()
        log.info("[auth] reloaded: {n} rules, {g} groups", n=len(settings.rules), g=len(settings.groups))
        return True

    def _rules(self) -> Rules | None:
        access = self.access
        while isinstance(access, (AuditedAccess, DeadLetterAccess, CreationAccess)):
            access = access.access
        return access if isinstance(access, Rules) else None

    def reload_users(self) -> bool:
        """Read the users file again (SIGHUP); a file that cannot be read leaves the old users in place."""
        path = self.settings.users_file
        if self.passwords is None or not path:
            return False
        try:
            users = Users.load(path)
        except (OSError, ValueError) as exc:
            log.error("users file {path} not reloaded, the previous users stay: {error}", path=path, error=str(exc))
            return False
        tokens_path = self.settings.tokens_file
        try:
            tokens = Tokens.load(tokens_path) if tokens_path else None
        except (OSError, ValueError) as exc:
            log.error("tokens file {path} not reloaded, the previous users and tokens stay: {error}", path=tokens_path, error=str(exc))
            return False
        self.passwords.replace_users(users)
        if tokens is not None:
            self.passwords.replace_tokens(tokens)
        log.info("{n} users reloaded from {path}{tokens}", n=len(users), path=path,
                 tokens=f", {len(tokens)} tokens from {tokens_path}" if tokens is not None else "")
        return True

    def start(self) -> None:
        if self.passwords is not None:
            self.passwords.start()

    def stop(self) -> None:
        if self.passwords is not None:
            self.passwords.stop()
        self.audit.close()
