"""Which of the broker's modules run compiled (mypyc) in this installation, and why not.

``pip install .`` compiles the hot path where a C compiler is present and installs the
pure-Python package where not (setup.py).  Both run the same source, so the only way
to tell which one a process got is to look at where each module would load from; an
operator comparing figures with the README's table needs to know.

Why a build fell back is known only to the build, and pip shows a build's output only
under ``-v``: so setup.py leaves its outcome in the package (``BUILD_RECORD``), and
``gateway run`` reads it to warn, once at start, when the hot path is pure Python
although nobody asked for that.
"""

from __future__ import annotations

import importlib.machinery
import importlib.resources
import importlib.util
import json
import os
import pkgutil
from dataclasses import dataclass

PACKAGES = ("core", "protocols")

# Written by setup.py's build_ext into the built package (a wheel, ``pip install .``), never
# into the source tree: {"compiled": bool, "reason": str | null, "chosen": bool}.  An editable
# install or a checkout has none.
BUILD_RECORD = "_build.json"

# Where pure Python is intended: set at build time (setup.py), or in the broker's
# environment by a packager who ships the pure package on purpose.
PURE_PYTHON_ENV = "GATEWAY_PURE_PYTHON"


def compiled_modules() -> list[str]:
    """Names of the modules under core/ and protocols/ that load from an extension."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:
            continue
        for info in pkgutil.walk_packages(list(spec.submodule_search_locations), package + "."):
            module = importlib.util.find_spec(info.name)
            if module is not None and module.origin is not None and module.origin.endswith(suffixes):
                found.append(info.name)
    return sorted(found)


@dataclass(frozen=True)
class BuildRecord:
    """What the build that made this installation decided (setup.py writes it)."""

    compiled: bool
    reason: str | None  # why it installed pure Python; None when it compiled
    chosen: bool  # pure Python was asked for (GATEWAY_PURE_PYTHON=1 at build time)


def build_record() -> BuildRecord | None:
    """The build's record, or None: a source tree or an editable install, which never compile."""
    try:
        text = importlib.resources.files("gateway").joinpath(BUILD_RECORD).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    reason = data.get("reason")
    return BuildRecord(bool(data.get("compiled")), reason if isinstance(reason, str) else None, bool(data.get("chosen")))


def describe() -> str:
    """One line for the start-up log, ``gateway --version`` and ``gateway perf``'s report."""
    modules = compiled_modules()
    if modules:
        return f"compiled with mypyc ({len(modules)} hot-path modules)"
    return f"pure Python ({_why_pure(build_record())})"


def _why_pure(record: BuildRecord | None) -> str:
    if record is None:
        return "a source tree or an editable install, which run the .py files"
    if record.compiled:
        return "the install was compiled, but no compiled module loads: are its .py files shadowed by a source tree on the path?"
    if record.chosen:
        return f"installed with {PURE_PYTHON_ENV}=1"
    return f"the install did not compile it: {record.reason or 'no reason recorded'}"


def unintended_pure_python() -> str | None:
    """The warning ``gateway run`` logs when the hot path is pure Python and nobody asked for that; else None.

    Asked for: an editable install or a source tree (a developer's), a build with
    ``GATEWAY_PURE_PYTHON=1``, or that variable set where the broker runs.
    """
    if compiled_modules():
        return None
    record = build_record()
    if record is None or record.chosen or os.environ.get(PURE_PYTHON_ENV) == "1":
        return None
    return (
        f"hot path: pure Python ({_why_pure(record)}); the compiled build runs 1.6-2.5x faster. "
        "Install a C compiler and Python's headers (Debian: apt install gcc python3-dev) and reinstall, "
        f"or set {PURE_PYTHON_ENV}=1 where the broker runs if pure Python is intended"
    )
