"""The pages' browser libraries: pinned in package.json with its lock, installed from npm into static/vendor/ by
scripts/frontend.sh (cached), and never loaded from anywhere else."""

from __future__ import annotations

import json
import os
import re
import subprocess
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "frontend.sh"
LIBRARIES = ("bootstrap", "chart.js", "socket.io-client")


def test_libraries_are_pinned_exactly_and_locked() -> None:
    package = json.loads((REPO / "package.json").read_text())
    lock = json.loads((REPO / "package-lock.json").read_text())
    pins = package["dependencies"]
    assert set(pins) == set(LIBRARIES)
    for name, pin in pins.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", pin), f"{name} is not pinned to one version: {pin}"
        assert lock["packages"][f"node_modules/{name}"]["version"] == pin
        assert lock["packages"][f"node_modules/{name}"]["integrity"].startswith("sha512-")
    assert lock["packages"][""]["dependencies"] == pins, "package-lock.json is out of date with package.json"
    assert pins["bootstrap"].startswith("5.")


def test_socketio_client_speaks_the_servers_protocol() -> None:
    """socket.io-client 4 speaks Socket.IO protocol 5 over Engine.IO 4, as python-socketio 5 does."""
    pin = json.loads((REPO / "package.json").read_text())["dependencies"]["socket.io-client"]
    assert pin.startswith("4.")
    assert version("python-socketio").startswith("5.")
    assert version("python-engineio").startswith("4.")


def test_static_vendor_matches_the_lock() -> None:
    result = subprocess.run([SCRIPT, "--check"], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_second_set_up_run_does_not_call_npm(tmp_path: Path) -> None:
    """With static/vendor/ current, the script returns without npm (so without the network)."""
    marker = tmp_path / "npm-was-called"
    fake = tmp_path / "bin" / "npm"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    result = subprocess.run([SCRIPT], check=False, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert result.stdout == ""


def test_pages_load_nothing_from_another_origin() -> None:
    """No CDN: every script, stylesheet and font a page or a script names is served by the plugin itself."""
    files = [*(REPO / "templates").rglob("*.html"), *(REPO / "static" / "js").rglob("*.js"),
             *(REPO / "static" / "css").rglob("*.css")]
    assert len(files) >= 6
    for file in files:
        text = file.read_text()
        assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", text), file
        assert not re.search(r"""url\(\s*["']?(https?:)?//""", text), file
        assert not re.search(r"""\bimport\s.*["']https?://""", text), file
