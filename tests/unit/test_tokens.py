"""Bearer tokens (gateway/auth/tokens.py): the file, the check, and what a damaged file says."""
from __future__ import annotations

import pytest

from gateway.auth.tokens import Tokens, new_token, split
from gateway.auth.users import UsersFileError


def test_a_new_token_checks_as_its_user_and_nothing_else_does():
    token, line = new_token("prometheus")
    other, other_line = new_token("alice")
    tokens = Tokens.parse(f"# comment\n\n{line}\n{other_line}\n")
    assert len(tokens) == 2
    assert tokens.user_of(token) == "prometheus" and tokens.user_of(other) == "alice"
    token_id, secret = split(token) or ("", "")
    assert tokens.user_of(f"gwt_{token_id}_{secret[:-1]}x") is None    # a wrong secret
    assert tokens.user_of(f"gwt_zzzzzzzz_{secret}") is None            # an unknown ID
    assert tokens.user_of(secret) is None and tokens.user_of("") is None
    assert token not in line and secret not in line                     # the file holds a digest only


@pytest.mark.parametrize(("text", "error"), [
    ("abc", "line 1: expected ID:USER:SHA256"),
    ("abcdefgh::" + "0" * 64, "line 1: expected ID:USER:SHA256"),
    ("abcdefgh:bob:xyz", "line 1: the digest is not 64 hex digits"),
    ("abcdefgh:bob:" + "0" * 62, "line 1: the digest is not 64 hex digits"),
    ("abcdefgh:bob:" + "0" * 64 + "\nabcdefgh:eve:" + "1" * 64, "line 2: token 'abcdefgh' appears twice"),
])
def test_a_damaged_file_names_the_line(text, error):
    with pytest.raises(UsersFileError, match=error):
        Tokens.parse(text, "tokens")


def test_the_command_refuses_to_add_to_a_damaged_file(tmp_path, capsys):
    from gateway.cli import main

    path = tmp_path / "tokens"
    path.write_text("garbage\n")
    assert main(["token", str(path), "alice"]) == 1
    assert "line 1: expected ID:USER:SHA256" in capsys.readouterr().err
    assert path.read_text() == "garbage\n"
    assert main(["token", str(tmp_path / "new")]) == 1
    assert "name the USER" in capsys.readouterr().err
