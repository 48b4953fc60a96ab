"""The admin API as the operator commands call it: JSON over HTTP(S), the user's credentials, clear errors.

Only the standard library (urllib, ssl): the commands start in a blink and
run where the broker's dependencies are not installed.  Every failure is an
``OpsError`` whose text is what the operator reads: the broker's own error
message for a 4xx, or what to check when the broker cannot be reached.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8161"
# What an answer that is not the admin API's most likely means.
NOT_ADMIN = "is --url the broker's admin listener (admin_port, default 8161), not a STOMP, MQTT or other port?"


class OpsError(Exception):
    """The broker refused (``status`` is its HTTP status) or could not be reached (0): exit status 1."""

    exit_status = 1

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class UsageError(OpsError):
    """What the operator gave (or left out) cannot work, so the broker is never asked: exit status 2.

    Apart from OpsError so a script can tell "fix the command line" from
    "the broker said no" by the exit status alone.
    """

    exit_status = 2


class AdminClient:
    """``authorization`` is a whole header value (Basic or Bearer), or None for a broker without users."""

    def __init__(self, url: str = DEFAULT_URL, authorization: str | None = None, cafile: str | None = None,
                 timeout: float = 600.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(f"--url must be http://HOST:PORT or https://HOST:PORT, got {url!r}")
        self.url = url.rstrip("/")
        self.authorization = authorization
        self.context = ssl.create_default_context(cafile=cafile) if parsed.scheme == "https" else None
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        """The decoded JSON answer; OpsError with the broker's message otherwise."""
        query = {k: str(v) for k, v in params.items() if v is not None}
        target = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(target, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            raise OpsError(_error_text(exc), exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise OpsError(f"cannot reach the broker's admin listener at {self.url}: {reason} "
                           "(is it running? --url, GATEWAY_URL)") from None
        except http.client.HTTPException as exc:  # e.g. the STOMP port, whose ERROR frame is no status line
            said = " ".join(str(exc).split())[:60]  # the peer's first line, on one line
            raise OpsError(f"{self.url} does not speak HTTP ({type(exc).__name__}: {said}); {NOT_ADMIN}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:  # a web server, a proxy's page: not the admin API
            raise OpsError(f"{self.url} answered {path} with something that is not JSON; {NOT_ADMIN}") from None

    def pages(self, path: str, name: str, **params: Any) -> list[dict[str, Any]]:
        """Every item of a paged list (``{name: [...], "pages": N}``), page by page."""
        items: list[dict[str, Any]] = []
        page = 1
        while True:
            answer = self.call("GET", path, page=page, page_size=1000, **params)
            items.extend(answer[name])
            if page >= answer.get("pages", 1):
                return items
            page += 1


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        message = body.get("error") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    if exc.code == 401:
        return f"{message} (HTTP 401: give --user, or --token, or GATEWAY_USER/GATEWAY_PASSWORD/GATEWAY_TOKEN)"
    return f"{message} (HTTP {exc.code})"


def authorization(user: str | None, password: str | None, token: str | None) -> str | None:
    """The Authorization header from flags, then the environment; None when nothing is given."""
    token = token or os.environ.get("GATEWAY_TOKEN")
    user = user or os.environ.get("GATEWAY_USER")
    if token and user:
        raise UsageError("give a user (and password) or a token, not both")
    if token:
        return "Bearer " + token
    if not user:
        return None
    password = password if password is not None else os.environ.get("GATEWAY_PASSWORD")
    if password is None:
        password = ask_password(user)
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def ask_password(user: str) -> str:
    """The password typed on the controlling terminal; UsageError where there is none.

    Without a terminal (cron, CI, ``ssh host gateway ...``) getpass falls back
    to reading standard input, which either ends at once (an EOFError
    traceback) or, worse, is ``gateway send``'s message body, whose first
    line would be sent as the password.  So only a terminal is asked.
    """
    missing = (f"no password for user {user}: set GATEWAY_PASSWORD, or run on a terminal to be asked for it "
               "(or give --token)")
    if os.name == "posix":
        try:
            os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
        except OSError:
            raise UsageError(missing) from None
    import getpass

    try:
        return getpass.getpass(f"Password for {user}: ")
    except EOFError:  # Ctrl-D at the prompt
        raise UsageError(missing) from None
