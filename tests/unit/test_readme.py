"""The README's two opening commands are the contract with users and with CI."""
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
