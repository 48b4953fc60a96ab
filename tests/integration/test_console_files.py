"""The web console's files on the admin listener (gateway/admin/console_site.py), over real HTTP.

What the browser tests (tests/browser/test_console.py) cannot see cheaply: content types, caching,
that nothing but the listed files can be reached, and that the files ask for a login once users exist.
"""
from __future__ import annotations

import base64
import http.client
import json
import re
from importlib import resources

import pytest

from gateway.admin.console_site import FILES
from tests.integration.test_admin_auth import PASSWORDS, auth_config
from tests.integration.test_admin_streams import Api
from tests.support import BrokerHandle, make_config

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CONSOLE = resources.files("gateway.admin").joinpath("console")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    handle = BrokerHandle(make_config(tmp_path_factory.mktemp("console-files")))
    yield Api(handle)
    handle.stop()


def raw_get(handle, path, method="GET", headers=None):
    """A request with the path exactly as written: urllib would tidy some of what an attacker sends."""
    conn = http.client.HTTPConnection("127.0.0.1", handle.admin_port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def test_the_package_holds_exactly_the_listed_files():
    on_disk = {entry.name for entry in CONSOLE.iterdir() if entry.is_file()}
    assert on_disk == set(FILES)


def test_each_file_with_its_type_and_cache_headers(api):
    for name, content_type in FILES.items():
        status, headers, body = api.call("GET", f"/console/{name}")
        assert status == 200, (name, body[:200])
        assert headers["Content-Type"] == content_type == TYPES[name[name.rindex("."):]]
        assert body == CONSOLE.joinpath(name).read_bytes()
        assert headers["Cache-Control"] == "no-cache" and re.fullmatch(r'"[0-9a-f]{24}"', headers["ETag"])
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'self'" in headers["Content-Security-Policy"]


def test_the_console_root_is_the_page_and_a_bare_path_redirects(api):
    status, headers, body = api.call("GET", "/console/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="app.js"></script>' in body
    status, headers, _ = raw_get(api.handle, "/console")
    assert status == 301 and headers["Location"] == "console/"
    # A client joins the relative Location onto the URL it asked for (urllib here): the page.
    status, _, followed = api.call("GET", "/console")
    assert status == 200 and followed == body


def test_a_matching_etag_gets_304_without_a_body(api):
    _, headers, _ = api.call("GET", "/console/app.js")
    etag = headers["ETag"]
    for sent in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        status, again, body = raw_get(api.handle, "/console/app.js", headers={"If-None-Match": sent})
        assert status == 304 and body == b"" and again["ETag"] == etag, sent
    assert raw_get(api.handle, "/console/app.js", headers={"If-None-Match": '"stale"'})[0] == 200


@pytest.mark.parametrize("path", [
    "/console/nope.js",
    "/console/../http.py",
    "/console/..%2fhttp.py",
    "/console/..%2F..%2Fsetup.cfg",
    "/console/%2e%2e/console_site.py",
    "/console/%2e%2e%2f__init__.py",
    "/console/..%5cconsole_site.py",
    "/console//etc/passwd",
    "/console/%2Fetc%2Fpasswd",
    "/console/index.html%00.js",
    "/console/app.js/",
    "/console/console/app.js",
    "/console/INDEX.HTML",
])
def test_anything_but_a_listed_file_is_404(api, path):
    status, headers, body = raw_get(api.handle, path)
    assert status == 404, (path, body[:200])
    assert headers["Content-Type"] == "application/json" and json.loads(body)["code"] == "not_found"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD"])
def test_only_get(api, method):
    status, headers, _ = raw_get(api.handle, "/console/app.js", method)
    assert status == 405 and headers["Allow"] == "GET"


def test_modules_import_only_listed_files_and_nothing_from_the_internet():
    for name in FILES:
        text = CONSOLE.joinpath(name).read_text("utf-8")
        for imported in re.findall(r'''\bfrom\s+["']([^"']+)["']''', text):
            assert imported.startswith("./") and imported[2:] in FILES, (name, imported)
        # The SVG namespace is a name, not a fetch; any other absolute URL would be.
        assert not re.findall(r"https?://(?!www\.w3\.org/2000/svg)", text), name
        assert "//cdn" not in text, name


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    handle = BrokerHandle(auth_config(tmp_path_factory.mktemp("console-secured")))
    yield handle
    handle.stop()


def basic(user):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()}


def test_with_users_the_console_asks_for_a_login_and_needs_no_permission(secured):
    for path in ("/console", "/console/", "/console/app.js", "/console/nope.js"):
        status, headers, body = raw_get(secured, path)
        assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="gateway"'), path
        assert json.loads(body)["code"] == "unauthorized"
    status, _, body = raw_get(secured, "/console/", headers=basic("alice"))
    assert status == 200 and body.startswith(b"<!doctype html>")
    # bob may administer nothing: the files are his (what the API shows him is up to the rules).
    assert raw_get(secured, "/console/app.js", headers=basic("bob"))[0] == 200
    assert raw_get(secured, "/console/nope.js", headers=basic("bob"))[0] == 404
    wrong = {"Authorization": "Basic " + base64.b64encode(b"alice:wrong").decode()}
    assert raw_get(secured, "/console/", headers=wrong)[0] == 401


def test_anonymous_gets_the_files_only_when_anonymous_clients_are_allowed(tmp_path):
    handle = BrokerHandle(auth_config(tmp_path, allow_anonymous=True))
    try:
        assert raw_get(handle, "/console/")[0] == 200
        # ... and the API still asks for what the rules do not give anonymous.
        assert raw_get(handle, "/api/v1/overview")[0] == 401
    finally:
        handle.stop()
