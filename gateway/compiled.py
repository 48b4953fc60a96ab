"""Which of the broker's modules run compiled (mypyc) in this installation.

``pip install .`` compiles the hot path where a C compiler is present and installs the
pure-Python package where not (setup.py).  Both run the same source, so the only way
to tell which one a process got is to look at where each module would load from; an
operator comparing figures with the README's table needs to know.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import pkgutil

PACKAGES = ("core", "protocols")


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


def describe() -> str:
    """One line for the start-up log and ``gateway perf``'s report."""
    modules = compiled_modules()
    if not modules:
        return "pure Python (no compiled modules: installed without a C compiler, editable, or GATEWAY_PURE_PYTHON=1)"
    return f"compiled with mypyc ({len(modules)} hot-path modules)"
