"""Shared fixtures: apps whose data lives under the test's tmp_path, and their clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from digits_memplugin import create_app

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO.parent / "shared" / "zoo"


@pytest.fixture(autouse=True)
def _scrub_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's environment out of the tests."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "FLASK_APP", "FLASK_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def app(data_dir: Path) -> Iterator[Flask]:
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True})
    yield app


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
