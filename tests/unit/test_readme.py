"""The README's two opening commands are the contract with users and with CI."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def commands():
    lines = (ROOT / "README.rst").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_readme_opens_with_start_and_test_commands():
    start, test = commands()[:2]
    assert start.endswith("gateway run")
    assert "pytest" in test


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands()[1] in [line.strip() for line in ci]


def test_readme_is_a_front_door_of_at_most_300_lines():
    """The manual is docs/; the README says what this is, how to start, and where to read on."""
    lines = (ROOT / "README.rst").read_text().splitlines()
    assert len(lines) <= 300, f"README.rst has {len(lines)} lines; move the detail into docs/"


def test_readme_links_every_chapter_of_the_manual():
    text = (ROOT / "README.rst").read_text()
    targets = set(re.findall(r"<(docs/[^>]+)>`_", text))
    for target in targets:
        assert (ROOT / target).is_file(), f"README.rst links {target}, which does not exist"
    chapters = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.rst")}
    assert chapters <= targets, f"chapters the README does not link: {sorted(chapters - targets)}"


def test_readme_renders_without_warnings():
    """It is the package's long description too (setup.cfg): PyPI refuses reStructuredText with errors."""
    import pytest

    core = pytest.importorskip("docutils.core")  # installed with Sphinx (the test extra)
    core.publish_doctree((ROOT / "README.rst").read_text(), settings_overrides={"halt_level": 2, "report_level": 2})
