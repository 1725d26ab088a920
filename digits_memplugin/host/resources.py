"""Where the packaged templates and static files are, whether installed from a wheel or in editable mode."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_data_dir(name: str) -> Path:
    """The directory of the data-only subpackage `digits_memplugin.<name>` (``templates`` or ``static``)."""
    spec = importlib.util.find_spec(f"digits_memplugin.{name}")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"digits_memplugin.{name} is missing from this installation")
    return Path(next(iter(spec.submodule_search_locations)))


def templates_dir() -> Path:
    return package_data_dir("templates")


def static_dir() -> Path:
    return package_data_dir("static")
