"""``[auth]``: the users file, anonymous access, groups and rules, checked when the configuration is read.

::

    [auth]
    users_file = "users"        # relative to the configuration file's directory
    allow_anonymous = false     # unset: anonymous only without users, and then only on loopback
    [auth.groups]
    devices = ["dev1", "dev2"]
    [[auth.rules]]
    who = "group:devices"       # "user:NAME", "group:NAME", "anonymous" or "*"
    access = "allow"            # or "deny"; deny wins
    permissions = ["write"]     # "read", "write", "admin"
    destinations = ["topic://sensors.{username}.>"]
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from core.access import Rule

_KEYS = (
    "users_file", "allow_anonymous", "groups", "rules", "login_cache_seconds", "hash_threads", "max_pending_logins",
    "max_failed_logins", "failed_login_window", "failed_login_ban_seconds", "audit_log", "tokens_file",
)
_RULE_KEYS = ("who", "access", "permissions", "destinations")


@dataclass
class AuthSettings:
    # The users file (`gateway passwd FILE USER` writes it); "" is none: everyone is anonymous.
    users_file: str = ""
    # Bearer tokens for the admin listener (`gateway token FILE USER` writes it); "" is none.
    tokens_file: str = ""
    # None: not said.  Then anonymous clients are let in only without a users file, and a
    # broker without one refuses to listen beyond loopback.
    allow_anonymous: bool | None = None
    # Group name -> its users.
    groups: dict[str, list[str]] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)
    # Seconds a checked password is remembered (as an HMAC under a per-process key), so
    # reconnects and admin requests skip the slow hash; 0: check every time.
    login_cache_seconds: float = 300.0
    # Threads that hash passwords, and checks that may wait for them before logins are refused.
    hash_threads: int = 2
    max_pending_logins: int = 1000
    # Failed logins from one address within the window before it is refused at once for
    # the ban (doubling for each further ban, up to an hour); 0: no limit.
    max_failed_logins: int = 10
    failed_login_window: float = 60.0
    failed_login_ban_seconds: float = 60.0
    # JSON lines of failed logins, denials and admin actions ("": none), beside the config file.
    audit_log: str = ""

    @property
    def anonymous(self) -> bool:
        """Whether clients without a login get in."""
        return self.allow_anonymous if self.allow_anonymous is not None else not self.users_file

    def memberships(self) -> dict[str, frozenset[str]]:
        """User -> the groups it is in."""
        found: dict[str, set[str]] = {}
        for group, members in self.groups.items():
            for user in members:
                found.setdefault(user, set()).add(group)
        return {user: frozenset(groups) for user, groups in found.items()}

    def resolve(self, base: str) -> None:
        """A relative users file is the configuration file's neighbour."""
        if self.users_file and not os.path.isabs(self.users_file):
            self.users_file = os.path.join(base, self.users_file)
        if self.tokens_file and not os.path.isabs(self.tokens_file):
            self.tokens_file = os.path.join(base, self.tokens_file)
        if self.audit_log and not os.path.isabs(self.audit_log):
            self.audit_log = os.path.join(base, self.audit_log)


def parse_auth(values: dict[str, Any]) -> AuthSettings:
    """The ``[auth]`` table; ValueError names the key and what is wrong."""
    settings = AuthSettings()
    for key in values:
        if key not in _KEYS:
            raise ValueError(f"unknown setting [auth] {key}")
    users_file = values.get("users_file", "")
    if not isinstance(users_file, str):
        raise ValueError("[auth] users_file must be a path (string)")
    settings.users_file = users_file
    tokens_file = values.get("tokens_file", "")
    if not isinstance(tokens_file, str):
        raise ValueError("[auth] tokens_file must be a path (string)")
    if tokens_file and not users_file:
        raise ValueError("[auth] tokens_file needs a users_file: a token acts as one of its users")
    settings.tokens_file = tokens_file
    anonymous = values.get("allow_anonymous")
    if anonymous is not None and not isinstance(anonymous, bool):
        raise ValueError("[auth] allow_anonymous must be true or false")
    settings.allow_anonymous = anonymous
    audit = values.get("audit_log", "")
    if not isinstance(audit, str):
        raise ValueError("[auth] audit_log must be a path (string)")
    settings.audit_log = audit
    for key in (
        "login_cache_seconds", "hash_threads", "max_pending_logins", "max_failed_logins",
        "failed_login_window", "failed_login_ban_seconds",
    ):
        if key in values:
            value = values[key]
            wanted = float if key in ("login_cache_seconds", "failed_login_window", "failed_login_ban_seconds") else int
            if isinstance(value, bool) or not isinstance(value, (int, float) if wanted is float else int):
                raise ValueError(f"[auth] {key} must be {wanted.__name__}, got {value!r}")
            setattr(settings, key, wanted(value))
    if settings.login_cache_seconds < 0:
        raise ValueError("[auth] login_cache_seconds must be 0 (off) or more")
    if settings.max_failed_logins < 0 or settings.failed_login_window <= 0 or settings.failed_login_ban_seconds <= 0:
        raise ValueError("[auth] max_failed_logins must be 0 (off) or more, failed_login_window and failed_login_ban_seconds positive")
    if not 1 <= settings.hash_threads <= 64 or settings.max_pending_logins < 1:
        raise ValueError("[auth] hash_threads must be 1-64 and max_pending_logins positive")
    groups = values.get("groups", {})
    if not isinstance(groups, dict):
        raise ValueError("[auth.groups] must be a table: NAME = [\"user1\", \"user2\"]")
    for name, members in groups.items():
        if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
            raise ValueError(f"[auth.groups] {name} must be a list of user names")
    settings.groups = {name: list(members) for name, members in groups.items()}
    rules = values.get("rules", [])
    if not isinstance(rules, list):
        raise ValueError("[[auth.rules]] must be an array of tables: write each rule under its own [[auth.rules]]")
    for number, table in enumerate(rules, 1):
        where = f"[[auth.rules]] #{number}"
        if not isinstance(table, dict):
            raise ValueError(f"{where} must be a table")
        unknown = sorted(set(table) - set(_RULE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(_RULE_KEYS)})")
        for key in ("who", "permissions", "destinations"):
            if key not in table:
                raise ValueError(f"{where}: {key} is missing")
        try:
            rule = Rule.parse(table["who"], table.get("access", "allow"), table["permissions"], table["destinations"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if rule.who.startswith("group:") and rule.who[6:] not in settings.groups:
            raise ValueError(f"{where}: who = {rule.who!r}, but [auth.groups] has no group {rule.who[6:]!r}")
        settings.rules.append(rule)
    return settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name (or "" for every address): it may resolve beyond this machine


def exposure_refusal(settings: AuthSettings, listeners: list[tuple[str, str]]) -> str | None:
    """Why the broker must not start: ``listeners`` are (name, host) of the enabled ones.

    Without users everyone is anonymous, so the broker keeps to loopback
    unless ``allow_anonymous = true`` says anonymous network clients are meant.
    """
    if settings.users_file or settings.allow_anonymous:
        return None
    exposed = [f"{name} on {host or '*'}" for name, host in listeners if not is_loopback(host)]
    if not exposed:
        return None
    return (
        f"{', '.join(exposed)} would let anyone in: no users are configured. "
        "Set [auth] users_file (add users with `gateway passwd FILE USER`), "
        "or [auth] allow_anonymous = true to serve anonymous clients beyond loopback"
    )
