"""Build: the metadata is in setup.cfg; this file only adds the optional compiled hot path.

Where a C compiler and Python's headers are present, ``pip install .`` compiles the
modules listed under ``[gateway:compiled]`` in setup.cfg with mypyc (the same typed
source the pure-Python package runs), as msgpack and PyYAML build their C parts.
Where they are not, or with ``GATEWAY_PURE_PYTHON=1``, or for an editable install
(where an extension would shadow the .py being edited), it installs the pure-Python
package and says so.  ``GATEWAY_REQUIRE_COMPILED=1`` turns a failed build into an error
instead of a fallback.

mypyc runs inside build_ext, not at import of this file: pip runs setup.py three times
per install (requirements, metadata, wheel) and translating the modules takes tens of
seconds.
"""

from __future__ import annotations

import configparser
import os
import sys
import tempfile
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("GATEWAY_REQUIRE_COMPILED") == "1"
GROUP = "gateway_hotpath"  # the name of mypyc's shared library of the compiled modules
BUILDING = bool({"bdist_wheel", "build", "build_ext", "install", "editable_wheel", "develop"} & set(sys.argv[1:]))


def compiled_modules() -> list[str]:
    config = configparser.ConfigParser()
    config.read(HERE / "setup.cfg")
    return config.get("gateway:compiled", "modules").split()


def _say(text: str) -> None:
    # pip shows a build's output only with -v, or when it fails; stderr reaches the log either way.
    print(f"gateway-broker: {text}", file=sys.stderr, flush=True)


def _why_pure() -> str | None:
    """The reason to install the pure-Python package, or None to compile."""
    if os.environ.get("GATEWAY_PURE_PYTHON") == "1":
        return "GATEWAY_PURE_PYTHON=1"
    if any(arg in ("editable_wheel", "develop") for arg in sys.argv):
        return "an editable install runs the .py files being edited"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc (part of mypy) is not installed"
    return None


def _compiler_works() -> str | None:
    """Compile a file that includes Python.h: finds a missing gcc and missing headers alike."""
    import sysconfig

    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "probe.c")
        source.write_text("#include <Python.h>\nint probe(void) { return 0; }\n")
        try:
            compiler.compile([str(source)], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]])
        except Exception as exc:  # noqa: BLE001 - CompileError, a missing executable: no compiler either way
            return f"no working C compiler with Python's headers ({exc.__class__.__name__}: {exc})"
    return None


class OptionalMypycBuild(build_ext):
    """Translates the hot path with mypyc when this command is first finalized, or falls back."""

    def finalize_options(self) -> None:
        # egg_info and dist_info finalize this command too (to list sources); only a build compiles.
        if not self.distribution.ext_modules and BUILDING:
            self.distribution.ext_modules = self._translate()
        super().finalize_options()

    def _translate(self) -> list:  # type: ignore[type-arg]
        reason = _why_pure() or _compiler_works()
        if reason is not None:
            if REQUIRED:
                raise SystemExit(f"gateway-broker: GATEWAY_REQUIRE_COMPILED=1 but {reason}")
            _say(f"installing the pure-Python package: {reason}")
            return []
        from mypyc.build import mypycify

        modules = compiled_modules()
        _say(f"compiling {len(modules)} hot-path modules with mypyc")
        cwd = os.getcwd()
        os.chdir(HERE)  # mypyc reads its settings from setup.cfg's [mypy] and names modules by path
        try:
            extensions = mypycify(modules, opt_level="3", debug_level="0", group_name=GROUP)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - mypyc exits on a type error; any failure means pure
            if REQUIRED:
                raise
            _say(f"installing the pure-Python package: mypyc could not translate the modules ({exc})")
            return []
        finally:
            os.chdir(cwd)
        for ext in extensions:
            ext.sources = [str(HERE / s) for s in ext.sources]
            ext.include_dirs = [d if os.path.isabs(d) else str(HERE / d) for d in ext.include_dirs]
        return extensions

    def run(self) -> None:
        self._remove_stale(keep_group=bool(self.extensions))
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:
            if REQUIRED:
                raise
            _say(f"installing the pure-Python package: the compiled build failed ({exc})")
            for built in self.get_outputs():  # a partial set would import half compiled
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []
            return
        _say(f"compiled {len(self.extensions)} extension(s): " + ", ".join(e.name for e in self.extensions))


    def _remove_stale(self, keep_group: bool) -> None:
        """A build in a tree built before (build/ is reused): extensions it does not make must not ship."""
        stale = [p for p in Path(self.build_lib).glob("*__mypyc.*") if not (keep_group and p.name.startswith(GROUP + "__"))]
        if not keep_group:
            for module in compiled_modules():
                stale += Path(self.build_lib, module).parent.glob(Path(module).stem + ".*.so")
        for path in stale:
            path.unlink()


class PlatformDistribution(Distribution):
    """Always a platform wheel: build_ext decides at build time whether it compiles anything."""

    def has_ext_modules(self) -> bool:
        return True


setup(distclass=PlatformDistribution, cmdclass={"build_ext": OptionalMypycBuild})
