"""The manual (docs/) builds, and says what the code does: every admin route, every setting, every module.

A manual drifts from the code one forgotten key at a time; these tests make
the drift a failure where it starts.  The build runs with warnings as errors,
so a broken cross-reference fails as CI runs it (``python -m sphinx -W -b html
docs <dir>``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ("gateway", "protocols", "core", "persistence", "spark")


# -- the build --------------------------------------------------------------------------


def test_manual_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    if importlib.util.find_spec("sphinx") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Sphinx is missing: it is in the test extra (pip install '.[test]')")
        pytest.skip("Sphinx is not installed (pip install '.[docs]')")
    built = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, f"the manual does not build cleanly:\n{built.stdout}\n{built.stderr}"
    assert (tmp_path / "html" / "index.html").is_file()


def test_every_chapter_is_in_the_table_of_contents() -> None:
    chapters = {path.stem for path in DOCS.glob("*.rst")} - {"index"}
    assert chapters <= set(toctree()), f"chapters missing from docs/index.rst's toctree: {sorted(chapters - set(toctree()))}"


def toctree() -> list[str]:
    lines = (DOCS / "index.rst").read_text().splitlines()
    start = lines.index(".. toctree::")
    entries = []
    for line in lines[start + 1:]:
        if line.strip() and not line.startswith("   "):
            break
        if line.strip() and not line.strip().startswith(":"):
            entries.append(line.strip())
    return entries


# -- admin routes -------------------------------------------------------------------------

ROUTE_LINE = re.compile(r"^\s+(GET|HEAD|POST|PUT|PATCH|DELETE)\s+(/[^\s?\[]*)")


def registered_routes() -> set[tuple[str, str]]:
    """(method, documented path) of every route the admin listener serves, master and standby.

    Read from the routes registered on the real ``admin_site``'s router, so a
    route added anywhere shows up here; a ``{param}`` or ``{param:path}`` is
    documented as ``PARAM``.
    """
    from twisted.internet.task import Clock

    from core.broker import Broker
    from gateway.admin import admin_site
    from gateway.admin.health import standby_router
    from persistence.memory import MemoryStore

    routers = [admin_site(Broker(MemoryStore(), Clock()), 1 << 20, "0").resource, standby_router()]
    routes = set()
    for router in routers:
        for pattern, methods in router.routes():
            path = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: m.group(1).upper(), pattern)
            routes.update((method, path) for method in methods)
    return routes


def documented_routes() -> set[tuple[str, str]]:
    text = (DOCS / "operations.rst").read_text()
    return {(m.group(1), m.group(2)) for line in text.splitlines() if (m := ROUTE_LINE.match(line))}


def test_every_admin_route_is_documented_in_operations() -> None:
    routes = registered_routes()
    assert ("POST", "/api/v1/queues/NAME/purge") in routes  # the form the chapter writes
    assert ("DELETE", "/api/v1/retained/TOPIC") in routes  # {topic:path} too
    missing = sorted(routes - documented_routes())
    assert not missing, (
        "admin routes not in docs/operations.rst ('Every route'; write each as 'METHOD /path/PARAM'): "
        + ", ".join(f"{method} {path}" for method, path in missing)
    )


def test_every_documented_route_exists() -> None:
    stale = sorted(documented_routes() - registered_routes())
    assert not stale, "docs/operations.rst lists routes the admin listener does not serve: " + ", ".join(
        f"{method} {path}" for method, path in stale
    )


# -- configuration --------------------------------------------------------------------------

DEFAULTS_MARK = re.compile(r"^\.\. defaults: \[([\w.]+)\]$")


def defaults_blocks() -> dict[str, str]:
    """Section -> the literal block under its ``.. defaults: [section]`` mark in configuration.rst."""
    lines = (DOCS / "configuration.rst").read_text().splitlines()
    blocks: dict[str, str] = {}
    for number, line in enumerate(lines):
        mark = DEFAULTS_MARK.match(line)
        if mark is None:
            continue
        at = number + 1
        while not lines[at].strip():
            at += 1
        assert lines[at].strip() == "::", f"configuration.rst: a literal block must follow {line!r}"
        at += 1
        block: list[str] = []
        while at < len(lines) and (not lines[at].strip() or lines[at].startswith("    ")):
            block.append(lines[at][4:])
            at += 1
        blocks[mark.group(1)] = "\n".join(block)
    return blocks


def expected_sections() -> dict[str, dict[str, Any]]:
    """Section -> key -> default, from the settings dataclasses the configuration is loaded into."""
    from core.stream_config import StreamSpec
    from gateway.config import Config
    from protocols.bridge.settings import BridgeSettings, BridgeTopic

    config = Config()

    def fields(obj: Any, leave: tuple[str, ...] = ()) -> dict[str, Any]:
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in leave}

    broker = {
        name: value for name, value in fields(config).items()
        if not dataclasses.is_dataclass(value) and name not in ("streams", "bridges", "network")
    }
    return {
        "broker": broker,
        "stomp": {**fields(config.stomp), **fields(config.stomp_settings, ("limits",)), **fields(config.stomp_settings.limits)},
        "mqtt": {**fields(config.mqtt), **fields(config.mqtt_settings)},
        "websocket": {**fields(config.ws), **fields(config.ws_settings)},
        "admin": {**fields(config.admin), **fields(config.admin_settings)},
        "tls": fields(config.tls),
        "auth": fields(config.auth),
        "persistence": fields(config.persistence),
        "policy": fields(config.policy),
        "streams.NAME": fields(StreamSpec("NAME"), ("name",)),
        # Arrays of tables, with required keys (no default): documented as comments.
        "bridges": fields(BridgeSettings("", ""), ("topics", "name", "url")),
        "bridges.topics": fields(BridgeTopic(""), ("pattern",)),
        "network": fields(config.network),
    }


def test_configuration_reference_has_every_key_at_its_default() -> None:
    blocks = defaults_blocks()
    expected = expected_sections()
    assert set(blocks) == set(expected), f"configuration.rst's defaults blocks: {sorted(blocks)}, expected {sorted(expected)}"
    problems = []
    for section, defaults in expected.items():
        text = blocks[section]
        written: dict[str, Any] = tomllib.loads(text)
        for part in section.split("."):
            written = written.get(part, {})
            if isinstance(written, list):  # [[bridges]]: the first table shows the defaults
                written = written[0] if written else {}
        for key, value in written.items():
            if key not in defaults:
                problems.append(f"[{section}] {key} is documented but is no setting")
        for key, default in defaults.items():
            if key in written:
                if written[key] != default or type(written[key]) is not type(default):
                    problems.append(f"[{section}] {key} = {written[key]!r} in the manual, {default!r} in the code")
            elif not re.search(rf"^#\s*(\[\[{re.escape(section)}\.)?{key}\b", text, re.MULTILINE):
                problems.append(f"[{section}] {key} (default {default!r}) is not in the manual")
    assert not problems, "docs/configuration.rst disagrees with the code:\n" + "\n".join(problems)


# -- design: every module --------------------------------------------------------------------


def modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_design_lists_every_module() -> None:
    design = (DOCS / "design.rst").read_text()
    listed = set(re.findall(r"^\s+- ``([\w/]+\.py)``:", design, re.MULTILINE))
    missing = sorted(modules() - listed)
    assert not missing, "modules missing from docs/design.rst's Layout (one line each): " + ", ".join(missing)
    gone = sorted(listed - modules())
    assert not gone, "docs/design.rst's Layout lists modules that do not exist: " + ", ".join(gone)


def test_manual_refers_to_nothing_outside_the_repository() -> None:
    for page in DOCS.glob("*.rst"):
        text = page.read_text()
        assert "shared/" not in text and "beside the repository" not in text, f"{page.name} points outside the repository"
