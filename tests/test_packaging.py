"""A built wheel carries templates/ and static/ inside the package and serves its pages from any directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", dist, REPO],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (built,) = dist.glob("digits_memplugin-*.whl")
    return built


def test_wheel_ships_templates_static_and_console_script(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "digits_memplugin/templates/memplugin/home.html" in names
    assert "digits_memplugin/templates/memplugin/base.html" in names
    assert "digits_memplugin/static/css/memplugin.css" in names
    assert "digits_memplugin/web/api/openapi.json" in names
    assert not any(name.startswith(("tests/", "templates/", "static/")) for name in names)
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert "digits-memplugin = digits_memplugin.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_serves_pages_from_another_directory(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel],
        check=True,
        timeout=300,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = """
import json, digits_memplugin
app = digits_memplugin.create_app({"MEMPLUGIN_DATA_DIR": "data", "MEMPLUGIN_ASYNC_MODE": "threading"})
client = app.test_client()
with client.get("/") as home, client.get("/memplugin/static/css/memplugin.css") as css, \\
        client.get("/memplugin/api/openapi.json") as openapi:
    print(json.dumps({"module": digits_memplugin.__file__, "home": home.status_code,
                      "title": "GPU memory for Caffe training" in home.text, "css": css.status_code,
                      "openapi": openapi.status_code}))
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", probe], check=False, cwd=elsewhere, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(report["module"]).is_relative_to(site)  # the wheel's copy, not the source tree
    assert report == {**report, "home": 200, "title": True, "css": 200, "openapi": 200}
    assert (elsewhere / "data" / "secret_key").exists()
