"""The users file: one user a line, ``NAME:HASH``, the hash a salted scrypt in PHC string format.

::

    # written by `gateway passwd users NAME`
    alice:$scrypt$ln=15,r=8,p=1$kT1mQ2Vx0r0yNnN0WVZ0bQ$3q0...

The hash is ``$scrypt$ln=LOG2_N,r=R,p=P$SALT$KEY`` (the PHC string format)
with the salt (16 random bytes) and the key (32 bytes) in standard base64
without padding.  The cost is in each line, so raising the default
later leaves older lines valid.  Blank lines and lines starting with ``#`` are
kept as they are.  A name is anything printable without ``:`` and without
spaces at either end.

Why scrypt, n=2**15, r=8, p=1: it is memory-hard (32 MiB per check, so a GPU
or ASIC guessing passwords pays for memory, not just arithmetic), it is in
the standard library, and one check costs about 85 ms on the broker's
machine, where PBKDF2-SHA512 at OWASP's 210,000 iterations costs about 120 ms
and at 600,000 about 350 ms without any memory hardness.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import tempfile
from collections import Counter
from dataclasses import dataclass

SCHEME = "scrypt"
SALT_BYTES = 16
KEY_BYTES = 32
# Bounds on what a line may ask for, so a damaged file cannot ask for gigabytes.
MAX_LN = 20
MAX_R = 32
MAX_P = 16
MAX_NAME = 1024


class UsersFileError(ValueError):
    pass


@dataclass(frozen=True)
class Cost:
    """scrypt's parameters: n = 2**ln (memory and time), r (block size), p (parallel lanes, run one after another here)."""

    ln: int = 15
    r: int = 8
    p: int = 1

    @property
    def maxmem(self) -> int:
        """What OpenSSL needs (128 * r * (n + p + 2) bytes) and a little room: hashlib's default of 32 MiB is too small."""
        return 128 * self.r * ((1 << self.ln) + self.p + 2) + (1 << 20)


DEFAULT_COST = Cost()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@dataclass(frozen=True)
class PasswordHash:
    cost: Cost
    salt: bytes
    key: bytes

    @classmethod
    def make(cls, secret: bytes, cost: Cost = DEFAULT_COST) -> PasswordHash:
        salt = secrets.token_bytes(SALT_BYTES)
        return cls(cost, salt, _derive(secret, salt, cost, KEY_BYTES))

    @classmethod
    def parse(cls, text: str) -> PasswordHash:
        parts = text.split("$")
        if len(parts) != 5 or parts[0] or parts[1] != SCHEME:
            raise UsersFileError(f"a hash is $scrypt$ln=N,r=N,p=N$SALT$KEY, got {text[:40]!r}")
        try:
            params = dict(item.split("=", 1) for item in parts[2].split(","))
            cost = Cost(int(params.pop("ln")), int(params.pop("r")), int(params.pop("p")))
            salt, key = _unb64(parts[3]), _unb64(parts[4])
        except (ValueError, KeyError, binascii.Error):
            raise UsersFileError(f"a hash is $scrypt$ln=N,r=N,p=N$SALT$KEY, got {text[:40]!r}") from None
        if params or not (1 <= cost.ln <= MAX_LN and 1 <= cost.r <= MAX_R and 1 <= cost.p <= MAX_P):
            raise UsersFileError(f"scrypt parameters out of range (ln 1-{MAX_LN}, r 1-{MAX_R}, p 1-{MAX_P}): {parts[2]!r}")
        if len(salt) < 8 or not 16 <= len(key) <= 64:
            raise UsersFileError("salt of 8 bytes or more and a key of 16-64 bytes expected")
        return cls(cost, salt, key)

    def __str__(self) -> str:
        return f"${SCHEME}$ln={self.cost.ln},r={self.cost.r},p={self.cost.p}${_b64(self.salt)}${_b64(self.key)}"

    def verify(self, secret: bytes) -> bool:
        """The slow part: call it off the reactor thread.  Constant-time compare."""
        return hmac.compare_digest(_derive(secret, self.salt, self.cost, len(self.key)), self.key)


def _derive(secret: bytes, salt: bytes, cost: Cost, length: int) -> bytes:
    return hashlib.scrypt(secret, salt=salt, n=1 << cost.ln, r=cost.r, p=cost.p, maxmem=cost.maxmem, dklen=length)


def dummy_hash(cost: Cost) -> PasswordHash:
    """What an unknown user is checked against: the same work as a real check, and never a match."""
    return PasswordHash(cost, b"\0" * SALT_BYTES, secrets.token_bytes(KEY_BYTES))


def check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME or ":" in name or not name.isprintable() or name != name.strip():
        raise UsersFileError(f"user names are 1-{MAX_NAME} printable characters without ':' or spaces at either end, got {name[:40]!r}")


class Users:
    """The users of a file, by name; ``dummy`` is checked for names that are not there."""

    def __init__(self, hashes: dict[str, PasswordHash]) -> None:
        self.hashes = hashes
        # The cost most lines use, so an unknown user costs what a known one does.
        costs = Counter(h.cost for h in hashes.values())
        self.dummy = dummy_hash(costs.most_common(1)[0][0] if costs else DEFAULT_COST)

    def __contains__(self, name: str) -> bool:
        return name in self.hashes

    def __len__(self) -> int:
        return len(self.hashes)

    def hash_for(self, name: str) -> PasswordHash:
        return self.hashes.get(name, self.dummy)

    @classmethod
    def parse(cls, text: str, where: str = "users file") -> Users:
        hashes: dict[str, PasswordHash] = {}
        for number, line in enumerate(text.splitlines(), 1):
            entry = _entry(line)
            if entry is None:
                continue
            name, _, record = entry
            try:
                check_name(name)
                if not _:
                    raise UsersFileError("expected NAME:HASH")
                if name in hashes:
                    raise UsersFileError(f"user {name!r} appears twice")
                hashes[name] = PasswordHash.parse(record)
            except UsersFileError as exc:
                raise UsersFileError(f"{where} line {number}: {exc}") from None
        return cls(hashes)

    @classmethod
    def load(cls, path: str) -> Users:
        return cls.parse(read_file(path, "users file"), path)


def read_file(path: str, what: str) -> str:
    """The whole of a users or tokens file; UsersFileError says why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsersFileError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsersFileError(f"{what} {path} is not UTF-8") from None


def _entry(line: str) -> tuple[str, str, str] | None:
    """(name, ':', hash) of a user's line; None for blank and comment lines."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    return stripped.partition(":")


def read_lines(path: str) -> list[str]:
    """The file's lines (without line ends), or none when it does not exist yet."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def set_user(lines: list[str], name: str, record: str | None) -> tuple[list[str], bool]:
    """``lines`` with ``name``'s line replaced (or appended), or removed when ``record`` is None; and whether it was there."""
    out: list[str] = []
    found = False
    for line in lines:
        entry = _entry(line)
        if entry is not None and entry[0] == name:
            if not found and record is not None:
                out.append(f"{name}:{record}")
            found = True
            continue
        out.append(line)
    if not found and record is not None:
        out.append(f"{name}:{record}")
    return out, found


def write_lines(path: str, lines: list[str]) -> None:
    """Atomically: a new file (mode 0600) beside the old one, synced, then renamed over it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".users-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
