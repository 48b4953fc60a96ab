"""The users file (gateway/auth/users.py) and the password authenticator (gateway/auth/authenticator.py)."""
from __future__ import annotations

import os
import threading
import time

import pytest
from twisted.internet import defer

from core.access import ANONYMOUS
from gateway.auth.authenticator import BUSY, REFUSED, PasswordAuthenticator
from gateway.auth.users import DEFAULT_COST, Cost, PasswordHash, Users, UsersFileError, read_lines, set_user, write_lines
from protocols.auth import Credentials
from tests.support import call, reactor

CHEAP = Cost(ln=10)  # about 1 ms: the format and the logic, not the cost


def test_production_cost_is_the_real_one():
    assert (DEFAULT_COST.ln, DEFAULT_COST.r, DEFAULT_COST.p) == (15, 8, 1)
    assert DEFAULT_COST.maxmem > 32 * 1024 * 1024  # hashlib's default maxmem would refuse it
    started = time.perf_counter()
    made = PasswordHash.make(b"secret")
    assert time.perf_counter() - started < 2.0  # tens of milliseconds here; never seconds
    assert str(made).startswith("$scrypt$ln=15,r=8,p=1$")
    assert made.verify(b"secret") and not made.verify(b"Secret")


def test_hash_text_round_trip():
    made = PasswordHash.make("pässword".encode(), CHEAP)
    again = PasswordHash.parse(str(made))
    assert again == made and again.verify("pässword".encode())
    assert PasswordHash.make(b"x", CHEAP).salt != made.salt  # salted


@pytest.mark.parametrize("text, error", [
    ("$pbkdf2$ln=10,r=8,p=1$AAAAAAAAAAA$" + "A" * 43, "a hash is"),
    ("$scrypt$ln=10,r=8$AAAAAAAAAAA$" + "A" * 43, "a hash is"),
    ("$scrypt$ln=40,r=8,p=1$AAAAAAAAAAA$" + "A" * 43, "out of range"),
    ("$scrypt$ln=10,r=8,p=1$!!$" + "A" * 43, "a hash is"),
    ("$scrypt$ln=10,r=8,p=1$AAAA$" + "A" * 43, "salt"),
])
def test_bad_hashes_are_refused(text, error):
    with pytest.raises(UsersFileError, match=error):
        PasswordHash.parse(text)


def test_file_round_trip_keeps_comments_and_mode(tmp_path):
    path = str(tmp_path / "users")
    alice = str(PasswordHash.make(b"a", CHEAP))
    lines, found = set_user(["# gateway users", ""], "alice", alice)
    assert not found
    lines, _ = set_user(lines, "bob", str(PasswordHash.make(b"b", CHEAP)))
    write_lines(path, lines)
    assert os.stat(path).st_mode & 0o777 == 0o600
    users = Users.load(path)
    assert len(users) == 2 and "alice" in users and users.hash_for("alice").verify(b"a")
    changed, found = set_user(read_lines(path), "alice", str(PasswordHash.make(b"new", CHEAP)))
    assert found and changed[0] == "# gateway users"
    write_lines(path, changed)
    assert Users.load(path).hash_for("alice").verify(b"new")
    deleted, found = set_user(read_lines(path), "alice", None)
    write_lines(path, deleted)
    assert found and "alice" not in Users.load(path)
    assert not [f for f in os.listdir(tmp_path) if f != "users"]  # no temporary file left behind


@pytest.mark.parametrize("text, error", [
    ("alice\n", "line 1: expected NAME:HASH"),
    ("alice:x\n", "line 1: a hash is"),
    (f"a:{PasswordHash.make(b'x', Cost(ln=4))}\na:{PasswordHash.make(b'x', Cost(ln=4))}\n", "line 2: user 'a' appears twice"),
    (" :x\n", "user names"),
])
def test_bad_files_name_the_line(text, error):
    with pytest.raises(UsersFileError, match=error):
        Users.parse(text)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(UsersFileError, match="cannot read users file .*missing"):
        Users.load(str(tmp_path / "missing"))


def test_unknown_users_cost_what_known_ones_do():
    """The dummy hash has the file's cost: checking an unknown name takes as long as a wrong password."""
    cost = Cost(ln=12)  # a few ms, enough to dominate the noise of the call
    users = Users({"alice": PasswordHash.make(b"right", cost)})
    assert users.dummy.cost == cost and not users.hash_for("nobody").verify(b"right")

    def fastest(name: str) -> float:
        # The fastest of several: other work on the machine only ever adds time
        # (a median failed once while a compiler ran beside the suite).
        times = []
        for _ in range(7):
            started = time.perf_counter()
            users.hash_for(name).verify(b"wrong")
            times.append(time.perf_counter() - started)
        return min(times)

    known, unknown = fastest("alice"), fastest("nobody")
    assert 0.5 < unknown / known < 2.0, (known, unknown)


# The authenticator, on the test session's reactor thread.

def authenticator(allow_anonymous=False, **kwargs):
    users = Users({"alice": PasswordHash.make(b"right", CHEAP), "dev1": PasswordHash.make(b"d", CHEAP)})
    return PasswordAuthenticator(users, {"dev1": frozenset({"devices"})}, allow_anonymous, reactor(), **kwargs)


def login(auth, login=None, secret=None, certificate=None):
    def attempt():
        d = defer.Deferred()
        on_reactor = []

        def answer(principal, reason):
            on_reactor.append(threading.current_thread().name == "reactor")
            d.callback((principal, reason, on_reactor[0]))

        auth.authenticate(Credentials(login, secret, certificate, "127.0.0.1:1", "test"), answer)
        return d
    principal, reason, on_reactor = call(attempt)
    assert on_reactor
    return principal, reason


@pytest.fixture
def auth():
    a = authenticator()
    a.start()
    yield a
    a.stop()


def test_passwords(auth):
    principal, _ = login(auth, "alice", b"right")
    assert principal.name == "alice" and principal.groups == frozenset()
    assert login(auth, "dev1", b"d")[0].groups == frozenset({"devices"})
    assert login(auth, "alice", b"wrong") == (None, REFUSED)
    assert login(auth, "nobody", b"right") == (None, REFUSED)  # the same answer as a wrong password


def test_anonymous_only_when_allowed(auth):
    assert login(auth) == (None, REFUSED)
    open_ = authenticator(allow_anonymous=True)
    open_.start()
    try:
        assert login(open_) == (ANONYMOUS, "")
        assert login(open_, "alice", b"wrong") == (None, REFUSED)  # a bad login is not let in as anonymous
    finally:
        open_.stop()


def test_certificates_name_known_users(auth):
    assert login(auth, certificate="alice")[0].name == "alice"
    assert login(auth, "alice", None, certificate="alice")[0].name == "alice"
    assert login(auth, certificate="mallory") == (None, REFUSED)
    assert login(auth, "dev1", b"wrong", certificate="alice") == (None, REFUSED)  # another name: its password counts


def test_remembered_passwords_skip_the_hash_and_only_the_right_one(auth):
    login(auth, "alice", b"right")
    original = auth.users.hashes["alice"]
    checks = []

    class Counting:
        def verify(self, secret):
            checks.append(secret)
            return original.verify(secret)

    auth.users.hashes["alice"] = Counting()
    try:
        assert login(auth, "alice", b"right")[0].name == "alice"
        assert checks == []
        assert login(auth, "alice", b"wrong") == (None, REFUSED)
        assert checks == [b"wrong"]
    finally:
        auth.users.hashes["alice"] = original


def test_a_flood_of_logins_is_refused_past_the_bound():
    a = authenticator(max_pending=1, cache_seconds=0)
    a.start()
    try:
        def two():
            answers = []
            d = defer.Deferred()

            def answer(principal, reason):
                answers.append(reason)
                if len(answers) == 2:
                    d.callback(answers)

            a.authenticate(Credentials("alice", b"right", None, "r", "t"), answer)
            a.authenticate(Credentials("alice", b"right", None, "r", "t"), answer)
            return d
        assert call(two) == [BUSY, ""]
    finally:
        a.stop()
