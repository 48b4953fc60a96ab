"""``gateway passwd FILE USER``: add a user, change a password, or delete a user (``-D``), as mosquitto_passwd does.

On a terminal the password is asked twice, without echo; otherwise one line
is read from standard input (``echo secret | gateway passwd users alice``),
its line end removed.  The file is created when missing and always rewritten
whole, atomically, with mode 0600; other lines and comments stay as they are.
A running broker reads the file when it starts.
"""
from __future__ import annotations

import argparse
import getpass
import sys
from typing import TextIO

from gateway.auth.users import PasswordHash, UsersFileError, check_name, read_lines, set_user, write_lines


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    passwd = commands.add_parser(
        "passwd", help="add a user or change a password in a users file ([auth] users_file); -D deletes",
        description="Add USER to FILE (created with mode 0600 when missing) or change its password: asked twice "
                    "on a terminal, else one line read from standard input.",
    )
    passwd.add_argument("file", metavar="FILE", help="the users file")
    passwd.add_argument("user", metavar="USER", help="the user name")
    passwd.add_argument("-D", dest="delete", action="store_true", help="delete USER from FILE")


def _read_password(stdin: TextIO) -> str:
    if stdin.isatty():
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Reenter password: "):
            raise UsersFileError("the passwords do not match")
    else:
        first = stdin.readline().rstrip("\r\n")
    if not first:
        raise UsersFileError("empty password")
    return first


def run(args: argparse.Namespace, stdin: TextIO | None = None) -> int:
    try:
        check_name(args.user)
        lines = read_lines(args.file)
        if args.delete:
            lines, found = set_user(lines, args.user, None)
            if not found:
                raise UsersFileError(f"no user {args.user!r} in {args.file}")
        else:
            password = _read_password(stdin or sys.stdin)
            lines, found = set_user(lines, args.user, str(PasswordHash.make(password.encode("utf-8"))))
        write_lines(args.file, lines)
    except UsersFileError as exc:
        print(f"gateway passwd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gateway passwd: {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    except (EOFError, KeyboardInterrupt):
        print("gateway passwd: no password given", file=sys.stderr)
        return 1
    return 0
