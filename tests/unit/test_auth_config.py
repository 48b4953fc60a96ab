"""``[auth]`` in the configuration (gateway/auth/settings.py) and the check that keeps a broker without users on loopback."""
from __future__ import annotations

import pytest

from core.access import Permission, Principal, Rules
from gateway.auth.security import Exposed, check_exposure
from gateway.auth.settings import is_loopback
from gateway.config import Config, ConfigError, load

EXAMPLE = '''
[auth]
users_file = "users"
allow_anonymous = false
[auth.groups]
devices = ["dev1", "dev2"]
[[auth.rules]]
who = "group:devices"
access = "allow"
permissions = ["write"]
destinations = ["topic://sensors.{username}.>"]
[[auth.rules]]
who = "user:dev2"
access = "deny"
permissions = ["write"]
destinations = ["topic://sensors.dev2.locked"]
'''


def test_the_documented_shape(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text(EXAMPLE)
    auth = load(str(path)).auth
    assert auth.users_file == str(tmp_path / "users")  # beside the configuration file
    assert auth.allow_anonymous is False and not auth.anonymous
    assert auth.memberships() == {"dev1": frozenset({"devices"}), "dev2": frozenset({"devices"})}
    rules = Rules(auth.rules)
    dev2 = Principal("dev2", frozenset({"devices"}))
    assert rules.allowed(dev2, Permission.WRITE, "topic://sensors.dev2.t")
    assert not rules.allowed(dev2, Permission.WRITE, "topic://sensors.dev2.locked")
    assert not rules.allowed(dev2, Permission.WRITE, "topic://sensors.dev1.t")


def test_defaults_keep_everyone_anonymous():
    auth = load().auth
    assert auth.users_file == "" and auth.allow_anonymous is None and auth.anonymous and auth.rules == []


def test_an_absolute_users_file_stays(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text('[auth]\nusers_file = "/etc/gateway/users"\n')
    assert load(str(path)).auth.users_file == "/etc/gateway/users"


@pytest.mark.parametrize("text, error", [
    ("[auth]\nusers = 'x'\n", r"unknown setting \[auth\] users"),
    ("[auth]\nallow_anonymous = 'yes'\n", "allow_anonymous must be true or false"),
    ("[auth]\nusers_file = 3\n", "users_file must be a path"),
    ("[auth]\ntokens_file = 'tokens'\n", "tokens_file needs a users_file"),
    ("[auth]\nusers_file = 'u'\ntokens_file = []\n", "tokens_file must be a path"),
    ("[auth.groups]\nd = 'dev1'\n", r"\[auth.groups\] d must be a list"),
    ("[[auth.rules]]\nwho = '*'\npermissions = ['execute']\ndestinations = ['queue://a']\n", r"#1: unknown permission 'execute'"),
    ("[[auth.rules]]\nwho = 'bob'\npermissions = ['read']\ndestinations = ['queue://a']\n", "who must be"),
    ("[[auth.rules]]\nwho = 'group:nope'\npermissions = ['read']\ndestinations = ['queue://a']\n", "no group 'nope'"),
    ("[[auth.rules]]\nwho = '*'\npermissions = ['read']\ndestinations = ['topic://a.>.b']\n", "last level"),
    ("[[auth.rules]]\nwho = '*'\npermissions = ['read']\ndestinations = ['topic://a.u{username}']\n", "whole level"),
    ("[[auth.rules]]\nwho = '*'\npermissions = ['read']\n", "destinations is missing"),
    ("[[auth.rules]]\nwho = '*'\npermissions = ['read']\ndestinations = ['queue://a']\nwhat = 1\n", "unknown key 'what'"),
    ("[auth]\nrules = 'x'\n", "array of tables"),
    ("[auth]\nhash_threads = 0\n", "hash_threads"),
])
def test_bad_auth_says_why(tmp_path, text, error):
    path = tmp_path / "gw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load(str(path))


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("127.0.1.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("::") and not is_loopback("example.com")


def test_no_users_beyond_loopback_is_refused():
    check_exposure(Config())  # the default: loopback
    public = Config(host="0.0.0.0")
    with pytest.raises(Exposed, match=r"stomp on 0.0.0.0, mqtt on 0.0.0.0, ws on 0.0.0.0, admin on 0.0.0.0 .*allow_anonymous = true"):
        check_exposure(public)
    one = Config()
    one.mqtt.host = "10.0.0.1"
    with pytest.raises(Exposed, match="^mqtt on 10.0.0.1 would let anyone in"):
        check_exposure(one)
    one.mqtt.port = 0  # a disabled listener binds nothing
    one.mqtt.tls_port = 0
    check_exposure(one)
    public.auth.allow_anonymous = True
    check_exposure(public)
    public.auth.allow_anonymous = False
    with pytest.raises(Exposed):
        check_exposure(public)
    public.auth.users_file = "users"
    check_exposure(public)


def test_what_a_gateway_builds(tmp_path):
    from core.access import AllowAll, CreationAccess, DeadLetterAccess
    from gateway.auth.authenticator import PasswordAuthenticator
    from gateway.auth.security import Security
    from gateway.auth.users import UsersFileError
    from protocols.auth import Anonymous
    from tests.support import reactor

    default = Security(Config(), reactor())
    assert isinstance(default.authenticator, Anonymous) and isinstance(default.access, AllowAll)
    config = Config()
    config.auth.users_file = str(tmp_path / "missing")
    with pytest.raises(UsersFileError, match="cannot read users file .*missing: No such file"):
        Security(config, reactor())
    (tmp_path / "users").write_text("")
    config.auth.users_file = str(tmp_path / "users")
    built = Security(config, reactor())
    assert isinstance(built.authenticator, PasswordAuthenticator) and isinstance(built.access, DeadLetterAccess)
    # The rules, behind the DLQ's and queue creation's admin checks.
    assert isinstance(built.access.access, CreationAccess) and isinstance(built.access.access.access, Rules)
    assert not built.authenticator.allow_anonymous
