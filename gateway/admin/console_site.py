"""The web console: a few hand-written files from the package, served at ``/console/``.

The files go through the admin Router like every API route, so with users
configured the console asks for the same login as the API: the browser's
Basic prompt appears when the page loads, and the credentials it caches then
go with every fetch the page makes.  No permission is checked here (the files
say nothing about the broker; each API call checks its own), only that the
guard let the request in, as for the ``/api/v1`` index.

Only the names in ``FILES`` are served, looked up by name and never joined
onto a directory, so no request can reach another file.  The files are read
once per process, when the first admin site is built, from the installed
package (``importlib.resources``: a wheel carries them as package data, see
setup.cfg), so a missing file stops the broker at start rather than a page.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources

from twisted.web import server

from gateway.admin.http import Answer, HttpError, Router

__all__ = ["FILES", "Asset", "ConsoleSite", "load_assets"]

# Every file the console has, with its Content-Type; tests/integration/test_console_files.py checks that the
# directory holds exactly these, so a file added there without an entry here fails a test instead of a page.
FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "lists.js": "text/javascript; charset=utf-8",
    "overview.js": "text/javascript; charset=utf-8",
    "queue.js": "text/javascript; charset=utf-8",
    "bridges.js": "text/javascript; charset=utf-8",
    "streams.js": "text/javascript; charset=utf-8",
}

# The console runs only its own files: no inline script, nothing from elsewhere, not framed by another site.
HEADERS = {
    "Cache-Control": "no-cache",  # revalidated on every load (ETag): an upgraded broker's console is never stale
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


@functools.cache
def load_assets() -> dict[str, Asset]:
    """The console's files, read from the package once per process (a missing one fails at start, not on a click)."""
    root = resources.files("gateway.admin").joinpath("console")
    assets: dict[str, Asset] = {}
    for name, content_type in FILES.items():
        body = root.joinpath(name).read_bytes()
        assets[name] = Asset(body, content_type, '"' + hashlib.sha256(body).hexdigest()[:24] + '"')
    return assets


def _matches(header: str | None, etag: str) -> bool:
    """Whether If-None-Match names this version (weak comparison, as RFC 9110 asks for GET)."""
    if not header:
        return False
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False


class ConsoleSite:
    def __init__(self, assets: dict[str, Asset] | None = None) -> None:
        self.assets = assets if assets is not None else load_assets()

    def install(self, router: Router) -> None:
        router.add("/console", get=self.redirect)
        router.add("/console/", get=self.index)
        router.add("/console/{name}", get=self.file)

    def redirect(self, request: server.Request) -> Answer:
        # Relative, so the console also works behind a proxy that mounts the listener under a prefix.
        return 301, {"Location": "console/", "Content-Type": "text/plain; charset=utf-8"}, b"see console/\n"

    def index(self, request: server.Request) -> Answer:
        return self.file(request, "index.html")

    def file(self, request: server.Request, name: str) -> Answer:
        asset = self.assets.get(name)
        if asset is None:
            raise HttpError(404, f"no console file {name[:100]!r}", "not_found")
        headers = {**HEADERS, "ETag": asset.etag}
        if _matches(request.getHeader("if-none-match"), asset.etag):
            return 304, headers, b""
        return 200, {**headers, "Content-Type": asset.content_type}, asset.body
