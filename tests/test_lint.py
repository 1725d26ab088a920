"""The tree follows the project's ruff rule set (pyproject.toml), so CI catches what a reviewer would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run(
        [ruff, "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO, check=False, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing() -> None:
    """The package type-checks (pyproject.toml's mypy settings): CI runs it as `make lint` does."""
    mypy = Path(sys.executable).parent / "mypy"
    result = subprocess.run(
        [mypy, "--no-incremental", "--cache-dir", "/dev/null", "digits_memplugin"],
        cwd=REPO, check=False, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
