"""Build: the metadata is in setup.cfg; this file only adds the optional compiled hot path.

Where a C compiler and Python's headers are present, ``pip install .`` compiles the
modules listed under ``[gateway:compiled]`` in setup.cfg with mypyc (the same typed
source the pure-Python package runs), as msgpack and PyYAML build their C parts.
Where they are not, or with ``GATEWAY_PURE_PYTHON=1``, or for an editable install
(where an extension would shadow the .py being edited), it installs the pure-Python
package and says so.  ``GATEWAY_REQUIRE_COMPILED=1`` turns a failed build into an error
instead of a fallback (for packagers: a wheel that must be compiled, or no wheel).

pip shows a build's output only under ``-v`` (or when the build fails), so a fallback
is also announced at the end of the build where the person or the CI log running pip
sees it (``_announce``), and recorded in the package (``gateway/_build.json``) for
``gateway run`` to warn about at every start (gateway/compiled.py).

mypyc runs inside build_ext, not at import of this file: pip runs setup.py three times
per install (requirements, metadata, wheel) and translating the modules takes tens of
seconds.
"""

from __future__ import annotations

import atexit
import configparser
import json
import os
import re
import stat
import sys
import tempfile
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("GATEWAY_REQUIRE_COMPILED") == "1"
GROUP = "gateway_hotpath"  # the name of mypyc's shared library of the compiled modules
BUILDING = bool({"bdist_wheel", "build", "build_ext", "install", "editable_wheel", "develop"} & set(sys.argv[1:]))
EDITABLE = any(arg in ("editable_wheel", "develop") for arg in sys.argv)
CHOSEN = os.environ.get("GATEWAY_PURE_PYTHON") == "1"
RECORD = "gateway/_build.json"  # read by gateway/compiled.py; BUILD_RECORD there
ANNOUNCED: list[bool] = []  # the fallback warning is registered once per build


def compiled_modules() -> list[str]:
    config = configparser.ConfigParser()
    config.read(HERE / "setup.cfg")
    return config.get("gateway:compiled", "modules").split()


def _say(text: str) -> None:
    # pip shows a build's output only with -v, or when it fails; stderr reaches the log either way.
    print(f"gateway-broker: {text}", file=sys.stderr, flush=True)


def _frontend_is_verbose(argv: list[str]) -> bool:
    """Whether pip was run with -v: then it shows the build's own output, and _say is enough."""
    return os.environ.get("PIP_VERBOSE", "0") not in ("", "0") or any(
        arg == "--verbose" or re.fullmatch(r"-[a-zA-Z]*v[a-zA-Z]*", arg) for arg in argv[1:]
    )


def _announce(text: str) -> None:
    """Show ``text`` to whoever runs the install, although the frontend hides the build's output.

    pip (and uv) capture a build's stdout and stderr and print them only under -v or
    when the build fails; there is no channel for a warning from a build that
    succeeds (pypa/pip#6634).  So: the controlling terminal, when there is one (a
    person at a shell); else the frontend's own stderr, when that is a pipe or a
    terminal (a CI log), never a regular file (writing there could overwrite it).
    Nothing when our stderr already reaches the same place (``python -m build``
    passes it through) or the frontend is verbose; stderr has the text either way.
    """
    message = f"\nWARNING: gateway-broker: {text}\n".encode()
    if os.isatty(2):
        return  # stderr is the terminal itself: nobody captures it
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    if _frontend_is_verbose(argv):
        return
    try:
        fd = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        fd = -1  # no controlling terminal: CI, a container build, a service
    if fd < 0:
        try:
            target = os.stat(f"/proc/{parent}/fd/2")
            ours = os.fstat(2)
        except OSError:
            return
        if not (stat.S_ISFIFO(target.st_mode) or stat.S_ISCHR(target.st_mode)):
            return
        if (target.st_dev, target.st_ino) == (ours.st_dev, ours.st_ino):
            return  # the frontend passes our stderr through as its own
        try:
            fd = os.open(f"/proc/{parent}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            return
    try:
        os.write(fd, message)
    except OSError:
        pass
    finally:
        os.close(fd)


def _why_pure() -> str | None:
    """The reason to install the pure-Python package, or None to compile."""
    if CHOSEN:
        return "GATEWAY_PURE_PYTHON=1"
    if EDITABLE:
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
            _say(f"the compiler probe failed: {exc.__class__.__name__}: {exc}")  # the whole command, for -v and logs
            cc = os.path.basename((getattr(compiler, "compiler_so", None) or ["cc"])[0])
            return f"no working C compiler with Python's headers ({cc} could not compile a file that includes Python.h)"
    return None


class OptionalMypycBuild(build_ext):
    """Translates the hot path with mypyc when this command is first finalized, or falls back."""

    # Why this build installs pure Python (None: it compiles), for the record and the warning.
    pure_reason: str | None = None

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
            self.pure_reason = reason
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
            self.pure_reason = f"mypyc could not translate the modules ({exc})"
            _say(f"installing the pure-Python package: {self.pure_reason}")
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
            self._finish()
            return
        try:
            super().run()
        except Exception as exc:
            if REQUIRED:
                raise
            self.pure_reason = f"the compiled build failed ({exc})"
            _say(f"installing the pure-Python package: {self.pure_reason}")
            for built in self.get_outputs():  # a partial set would import half compiled
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []
            self._finish()
            return
        _say(f"compiled {len(self.extensions)} extension(s): " + ", ".join(e.name for e in self.extensions))
        self._finish()

    def _finish(self) -> None:
        """Record the outcome in the built package, and warn at the end of the build about an unasked fallback."""
        if EDITABLE or self.inplace:
            return  # the source tree: gateway/compiled.py takes a missing record for a developer's tree
        compiled = bool(self.extensions)
        record = {"compiled": compiled, "reason": None if compiled else self.pure_reason, "chosen": CHOSEN}
        path = Path(self.build_lib, RECORD)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record) + "\n", encoding="utf-8")
        if not compiled and not CHOSEN and not ANNOUNCED:
            ANNOUNCED.append(True)
            # At exit: the last thing the build says, after setuptools' own lines.
            atexit.register(_announce, (
                f"built as pure Python, without the compiled hot path: {self.pure_reason}. It works; "
                "compiled, the broker runs 1.6-2.5x faster: install a C compiler and Python's headers "
                "(Debian: apt install gcc python3-dev) and install again. "
                "GATEWAY_PURE_PYTHON=1 builds pure Python without this warning; GATEWAY_REQUIRE_COMPILED=1 makes it an error."
            ))


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
