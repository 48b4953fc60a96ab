"""Sphinx configuration of the gateway manual: plain Sphinx, nothing fetched from the network.

Built in CI with warnings as errors (tests/unit/test_docs.py runs
``python -m sphinx -W -b html docs <dir>``), so a broken reference fails.
The version is read from setup.cfg, the one place it is declared, without
importing the broker: the manual builds from a checkout with only Sphinx.
"""
import configparser
import os

_setup = configparser.ConfigParser()
_setup.read(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "setup.cfg"), encoding="utf-8")

project = "gateway"
author = "the gateway authors"
copyright = "the gateway authors; Apache License 2.0"
version = release = _setup.get("metadata", "version", fallback="unknown")

root_doc = "index"
extensions: list[str] = []
exclude_patterns = ["_build"]
# Literal blocks are TOML, shell sessions, HTTP routes and JSON alike: no language guessed.
highlight_language = "none"
html_theme = "alabaster"
html_title = f"gateway {release}"
html_static_path: list[str] = []
# No search index download, no external fonts: the built manual works offline.
html_theme_options = {"description": "A STOMP / MQTT / WebSocket message broker", "font_family": "sans-serif", "head_font_family": "sans-serif"}
