"""The two ways the package installs: compiled with mypyc where a C compiler is, pure Python where not.

The rest of the suite runs the source tree (``python -m pytest`` puts it first on the
path), which is the pure-Python path.  These tests build or find the compiled one,
check that every module setup.cfg names loads from an extension, and run the tests of
those modules and the protocol round trips against it, from a copy of tests/ outside
the project so that the .py files cannot shadow the extensions.  Then they build once
with no usable compiler and check that the install falls back, says so, and runs.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The compiled modules' own tests, then the protocols end to end through real clients
# (stomp.py, paho-mqtt, WebSocket) and the store: what a wrong translation would break.
# About two minutes of tests, dealt over two processes that run at once (see SHARDS); the
# whole suite runs on the pure path.
SUBSET = [
    *(f"tests/unit/test_{name}.py" for name in (
        "broker", "connection", "deadlines", "destination", "duplicates", "lifecycle", "message", "mqtt_codec",
        "mqtt_codec_layers", "mqtt_session", "mqtt_state", "outbox", "queue", "stomp_codec", "stomp_session",
        "record_writer", "records", "stream", "topic", "trie", "turn",
    )),
    *(f"tests/integration/test_{name}.py" for name in (
        "stomp_acks", "stomp_topics", "stomp_transactions", "stomp_bad_input", "mqtt_v311", "mqtt_v5",
        "mqtt_bad_input", "websocket", "persistence_restart",
    )),
    "tests/system/test_bridges.py",  # the MQTT bridge's link (protocols/bridge/mqtt.py) is compiled too
]


# Processes the subset's tests are dealt over (every SHARDS-th test each, by the plugin below,
# written beside the copy of tests/).  These tests spend most of their time waiting on the
# network and the clock (about a third of one core busy), so two halves side by side take
# little more than half as long as one run.
SHARDS = 2
SHARD_PLUGIN = """
import os


def pytest_collection_modifyitems(session, config, items):
    index, count = map(int, os.environ["GATEWAY_TEST_SHARD"].split("/"))
    config.hook.pytest_deselected(items=[item for n, item in enumerate(items) if n % count != index])
    items[:] = items[index::count]
"""


def listed_modules() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config.get("gateway:compiled", "modules").split()


def dotted(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


def _python(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GATEWAY_PURE_PYTHON", "CC")}
    env.update(extra)
    return env


def _build_wheel(out: Path, env: dict[str, str], verbose: bool = True) -> tuple[Path, str]:
    done = _python(["-m", "pip", "wheel", str(ROOT), "--no-deps", *(["-v"] if verbose else []), "-w", str(out)], out, env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheels = list(out.glob("gateway_broker-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], done.stdout + done.stderr


@pytest.fixture(scope="module")
def compiled_site(tmp_path_factory: Any) -> Path | None:
    """Where the compiled package is: None if the installed one is compiled, else a built wheel unpacked."""
    scratch = tmp_path_factory.mktemp("compiled")
    probe = _python(["-c", "from gateway.compiled import compiled_modules; print(' '.join(compiled_modules()))"],
                    scratch, _clean_env())
    if probe.returncode == 0 and probe.stdout.split():
        return None  # `pip install .` (CI, README's second command) already compiled it
    wheel, _ = _build_wheel(scratch, _clean_env())
    site = scratch / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_every_listed_module_exists_and_is_typed_source() -> None:
    modules = listed_modules()
    assert len(modules) >= 15
    for path in modules:
        assert (ROOT / path).is_file(), path
        assert path.split("/")[0] in ("core", "protocols"), path  # what gateway.compiled looks under


@pytest.mark.timeout(900)  # a wheel to build (editable installs) and a few hundred tests to run
def test_compiled_install_loads_every_listed_module_and_passes_the_core_tests(compiled_site: Path | None, tmp_path: Path) -> None:
    env = _clean_env()
    if compiled_site is not None:
        env["PYTHONPATH"] = str(compiled_site)
    expected = sorted(dotted(m) for m in listed_modules())

    script = "from gateway.compiled import compiled_modules, describe; print(describe()); print(' '.join(compiled_modules()))"
    loaded = _python(["-c", script], tmp_path, env)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines()[0] == f"compiled with mypyc ({len(expected)} hot-path modules)"
    assert loaded.stdout.splitlines()[1].split() == expected

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests", run / "tests", ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
    shutil.copy(ROOT / "setup.cfg", run / "setup.cfg")  # pytest's settings: markers, timeout
    env.update(GATEWAY_EXPECT_COMPILED="1", GATEWAY_EXPECT_MODULES=" ".join(expected))
    (run / "shard_plugin.py").write_text(SHARD_PLUGIN)
    runs = []
    for shard in range(SHARDS):
        out = open(tmp_path / f"shard{shard}.log", "w+")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "shard_plugin", "-x", *SUBSET]
        shard_env = {**env, "GATEWAY_TEST_SHARD": f"{shard}/{SHARDS}"}
        runs.append((subprocess.Popen(command, cwd=run, env=shard_env, stdout=out, stderr=subprocess.STDOUT, text=True), out))
    passed = 0
    try:
        for proc, out in runs:
            proc.wait(900)
            out.seek(0)
            output = out.read()
            assert proc.returncode == 0, output[-6000:]
            summary = output.strip().splitlines()[-1]
            assert " passed" in summary and "failed" not in summary and "skipped" not in summary, summary
            passed += int(summary.split(" passed")[0].split()[-1])
    finally:
        for proc, out in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
    assert passed >= 900, passed


FALLBACK = "no working C compiler with Python's headers (false could not compile a file that includes Python.h)"


@pytest.mark.timeout(600)
def test_without_a_compiler_the_install_falls_back_to_pure_python_and_says_so(tmp_path: Path) -> None:
    """pip hides a build's output unless -v: the fallback must still reach the person (or CI log) running it."""
    # CC=false: the compiler probe in setup.py fails the way a machine without gcc does.  No -v.
    wheel, log = _build_wheel(tmp_path, _clean_env(CC="false"), verbose=False)
    warnings = [line for line in log.splitlines() if line.startswith("WARNING: gateway-broker:")]
    assert warnings == [
        f"WARNING: gateway-broker: built as pure Python, without the compiled hot path: {FALLBACK}. It works; compiled, "
        "the broker runs 1.6-2.5x faster: install a C compiler and Python's headers (Debian: apt install gcc python3-dev) "
        "and install again. GATEWAY_PURE_PYTHON=1 builds pure Python without this warning; "
        "GATEWAY_REQUIRE_COMPILED=1 makes it an error."
    ], log[-3000:]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = json.loads(zf.read("gateway/_build.json"))
    assert not [n for n in names if n.endswith(".so")], names
    assert "protocols/stomp/session.py" in names
    assert record == {"compiled": False, "reason": FALLBACK, "chosen": False}

    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    script = (
        "from gateway.compiled import describe; print(describe())\n"
        "from protocols.stomp.codec import StompDecoder\n"
        "print([f.command for f in StompDecoder().feed(b'SEND\\ndestination:/queue/a\\n\\nhi\\x00')])"
    )
    check = _python(["-c", script], tmp_path, _clean_env(PYTHONPATH=str(site)))
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines() == [f"pure Python (the install did not compile it: {FALLBACK})", "['SEND']"]

    # `gateway run` says so too, once, as a warning: a log is where an operator looks later.
    expected = (
        f"[gateway#warn] hot path: pure Python (the install did not compile it: {FALLBACK}); the compiled build "
        "runs 1.6-2.5x faster. Install a C compiler and Python's headers (Debian: apt install gcc python3-dev) and "
        "reinstall, or set GATEWAY_PURE_PYTHON=1 where the broker runs if pure Python is intended"
    )
    assert _warnings_at_run(tmp_path / "run1", _clean_env(PYTHONPATH=str(site))) == [expected]
    # A packager who ships pure Python on purpose says so where it runs: no warning then.
    assert _warnings_at_run(tmp_path / "run2", _clean_env(PYTHONPATH=str(site), GATEWAY_PURE_PYTHON="1")) == []


@pytest.mark.timeout(600)
def test_pure_python_asked_for_at_build_is_recorded_and_not_warned_about(tmp_path: Path) -> None:
    wheel, log = _build_wheel(tmp_path, _clean_env(GATEWAY_PURE_PYTHON="1"), verbose=False)
    assert "WARNING: gateway-broker" not in log, log[-3000:]
    with zipfile.ZipFile(wheel) as zf:
        assert json.loads(zf.read("gateway/_build.json")) == {
            "compiled": False, "reason": "GATEWAY_PURE_PYTHON=1", "chosen": True,
        }
        zf.extractall(tmp_path / "site")
    env = _clean_env(PYTHONPATH=str(tmp_path / "site"))
    describe = _python(["-c", "from gateway.compiled import describe; print(describe())"], tmp_path, env)
    assert describe.stdout.strip() == "pure Python (installed with GATEWAY_PURE_PYTHON=1)", describe.stderr
    assert _warnings_at_run(tmp_path / "run", env) == []


def _warnings_at_run(cwd: Path, env: dict[str, str]) -> list[str]:
    """The WARNING lines of a `gateway run` from ``env``'s package, up to its start-up summary (then stopped)."""
    import signal
    import time

    cwd.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--stomp-port", "0", "--mqtt-port", "0", "--ws-port", "0",
         "--admin-port", "0", "--data-dir", "data"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # a warning comes before the summary, whose last line this is
            lines.append(line)
            if "\tadmin HTTP: off" in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines)
    assert any("\thot path: pure Python" in line for line in lines), "".join(lines)
    return [line.split(" ", 1)[1].rstrip("\n") for line in lines if "#warn]" in line]
