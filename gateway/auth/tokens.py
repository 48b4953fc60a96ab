"""Bearer tokens for the admin listener: ``Authorization: Bearer gwt_ID_SECRET`` instead of a password.

Scripts, Prometheus and CI jobs should not hold a person's password, and a
token can be revoked alone.  ``gateway token FILE USER`` draws one and prints
it once; the tokens file keeps only its SHA-256, one line per token::

    # written by `gateway token tokens NAME`
    k3v9q2xw:prometheus:6f1c...e2    (ID:USER:SHA-256 of the secret, hex)

Why a plain SHA-256 where passwords get scrypt: a token's secret is 32
random bytes, so there is nothing to guess from a stolen file and no slow
hash is needed; the check is cheap enough for the reactor thread and for a
Prometheus scrape every few seconds.  The ID (public, in the token) finds the
line; the secret is compared in constant time.  A token acts as its user, who
must still be in the users file: deleting the user disables its tokens.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import secrets
import sys
import time
from dataclasses import dataclass

from gateway.auth.users import UsersFileError, check_name, read_file, read_lines, write_lines

PREFIX = "gwt_"
ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH = 8


@dataclass(frozen=True)
class Token:
    id: str
    user: str
    digest: bytes  # SHA-256 of the secret part


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("ascii")).digest()


def split(token: str) -> tuple[str, str] | None:
    """(ID, secret) of a token's text, or None when it is not shaped like one."""
    if not token.startswith(PREFIX):
        return None
    token_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or len(token_id) != ID_LENGTH or not secret or not secret.isascii():
        return None
    return token_id, secret


class Tokens:
    """The tokens of a file by ID."""

    def __init__(self, tokens: dict[str, Token]) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def user_of(self, token: str) -> str | None:
        """The user a token acts as; None for an unknown, revoked or malformed token."""
        parts = split(token)
        if parts is None:
            return None
        found = self.tokens.get(parts[0])
        # Compare even when the ID is unknown, so the time taken says nothing about which IDs exist.
        expected = found.digest if found is not None else b"\0" * 32
        ok = hmac.compare_digest(expected, _digest(parts[1]))
        return found.user if ok and found is not None else None

    @classmethod
    def parse(cls, text: str, where: str = "tokens file") -> Tokens:
        tokens: dict[str, Token] = {}
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            token_id, _, rest = stripped.partition(":")
            user, _, digest = rest.rpartition(":")
            try:
                if len(token_id) != ID_LENGTH or not user:
                    raise UsersFileError("expected ID:USER:SHA256")
                check_name(user)
                if token_id in tokens:
                    raise UsersFileError(f"token {token_id!r} appears twice")
                raw = bytes.fromhex(digest)
                if len(raw) != 32:
                    raise ValueError
            except ValueError as exc:
                reason = str(exc) if isinstance(exc, UsersFileError) else "the digest is not 64 hex digits"
                raise UsersFileError(f"{where} line {number}: {reason}") from None
            tokens[token_id] = Token(token_id, user, raw)
        return cls(tokens)

    @classmethod
    def load(cls, path: str) -> Tokens:
        return cls.parse(read_file(path, "tokens file"), path)


def new_token(user: str) -> tuple[str, str]:
    """(the token to hand out, the line to store)."""
    token_id = "".join(secrets.choice(ID_CHARS) for _ in range(ID_LENGTH))
    secret = secrets.token_urlsafe(32)
    return f"{PREFIX}{token_id}_{secret}", f"{token_id}:{user}:{_digest(secret).hex()}"


# ``gateway token``


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "token", help="make, list or revoke bearer tokens for the admin listener ([auth] tokens_file)",
        description="Make a token for USER in FILE (created with mode 0600 when missing) and print it once; "
                    "--list shows IDs and users, --revoke ID deletes one.  A running broker re-reads FILE on SIGHUP.",
    )
    command.add_argument("file", metavar="FILE", help="the tokens file")
    command.add_argument("user", metavar="USER", nargs="?", help="the user the token acts as")
    command.add_argument("--list", action="store_true", help="list the tokens' IDs and users")
    command.add_argument("--revoke", metavar="ID", help="delete the token with this ID")


def run(args: argparse.Namespace) -> int:
    try:
        lines = read_lines(args.file)
        if args.list:
            for entry in Tokens.parse("\n".join(lines), args.file).tokens.values():
                print(f"{entry.id}\t{entry.user}")
            return 0
        if args.revoke:
            kept = [line for line in lines if line.strip().partition(":")[0] != args.revoke]
            if len(kept) == len(lines):
                raise UsersFileError(f"no token {args.revoke!r} in {args.file}")
            write_lines(args.file, kept)
            return 0
        if not args.user:
            raise UsersFileError("name the USER the token acts as (or --list, --revoke ID)")
        check_name(args.user)
        Tokens.parse("\n".join(lines), args.file)  # refuse to add to a damaged file
        token, line = new_token(args.user)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        write_lines(args.file, [*lines, f"# {stamp} UTC", line])
    except UsersFileError as exc:
        print(f"gateway token: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gateway token: {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    print(token)
    return 0
