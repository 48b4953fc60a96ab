"""Composition root: configuration, broker assembly, listeners, CLI."""
from __future__ import annotations

import configparser
import importlib.metadata
import os

__all__ = ["DISTRIBUTION", "__version__"]

# The name setup.cfg gives the distribution (``pip install gateway-broker``).
DISTRIBUTION = "gateway-broker"


def _version() -> str:
    """The version setup.cfg declares: the one source, so the CLI, logs, API and metrics cannot disagree.

    An installed package (editable or not) has it in its metadata.  A source
    tree run without an install (``python -m gateway.cli`` in a checkout) has
    no metadata, so setup.cfg beside the package is read instead; anything
    else is a copy of the package without either, named as such rather than
    given a made-up number.
    """
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    setup_cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.cfg")
    parser = configparser.ConfigParser()
    try:
        parser.read(setup_cfg, encoding="utf-8")
    except configparser.Error:
        return "0+unknown"
    if parser.get("metadata", "name", fallback="") != DISTRIBUTION:
        return "0+unknown"
    return parser.get("metadata", "version", fallback="0+unknown")


__version__ = _version()
