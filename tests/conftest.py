"""Shared fixtures: apps whose data lives under the test's tmp_path, and their clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from zoo_cases import ZOO

from digits_memplugin import create_app
from digits_memplugin.core.sizes import GIB, MIB
from digits_memplugin.devices import host_memory
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from digits_memplugin.host.extension import get_plugin

# Fixture modules that test modules import (and load with `pytest_plugins`): rewritten like test modules, so their
# asserts report what failed.
pytest.register_assert_rewrite("browser_fixtures")

REPO = Path(__file__).resolve().parent.parent
__all__ = ["REPO", "ZOO"]  # test modules import these from here; zoo_cases knows where the shared zoo is


@pytest.fixture(autouse=True)
def _scrub_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's environment out of the tests."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "FLASK_APP", "FLASK_DEBUG", "MEMPLUGIN_CAFFE_ROOT",
                 "CAFFE_ROOT", "CAFFE_HOME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _real_nvml_after_each_test() -> Iterator[None]:
    """The NVML library is process-wide: a test that installed fake GPUs must not hand them to the next test."""
    yield
    if devices.is_simulated():
        devices.install_library(None)


@pytest.fixture
def install_nvml() -> Callable[[FakeNvml], FakeNvml]:
    """Plug a fake NVML library into the real bindings for this test."""

    def install(library: FakeNvml) -> FakeNvml:
        devices.install_library(library)
        return library

    return install


def two_gpus() -> list[FakeGpu]:
    """Two GPUs of different sizes with training processes on them, in PCI bus order."""
    return [
        FakeGpu(
            name="NVIDIA GeForce RTX 3090",
            uuid="GPU-aaaaaaaa-1111-2222-3333-444444444444",
            pci_bus_id="00000000:01:00.0",
            memory_total=24 * GIB,
            memory_reserved=300 * MIB,
            memory_used=200 * MIB,
            utilization_gpu=87,
            utilization_memory=41,
            temperature_c=71,
            processes=[
                FakeProcess(pid=4242, name="/usr/bin/python3", used_memory=6 * GIB),
                FakeProcess(pid=4343, name=None, used_memory=2 * GIB),
            ],
        ),
        FakeGpu(
            name="NVIDIA TITAN X (Pascal)",
            uuid="GPU-bbbbbbbb-1111-2222-3333-444444444444",
            pci_bus_id="00000000:02:00.0",
            memory_total=12 * GIB,
            memory_reserved=100 * MIB,
            temperature_c=33,
        ),
    ]


@pytest.fixture
def gpus() -> list[FakeGpu]:
    """Two GPUs with processes (not installed): tests change them before building a library."""
    return two_gpus()


@pytest.fixture
def fake_gpus(install_nvml: Callable[[FakeNvml], FakeNvml], gpus: list[FakeGpu]) -> FakeNvml:
    """The two GPUs with processes, installed."""
    return install_nvml(FakeNvml(gpus))


HOST_MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8192000 kB\n"


def make_host(root: Path, meminfo: str = HOST_MEMINFO, cgroup: str = "0::/\n") -> devices.HostPaths:
    """A /proc and /sys/fs/cgroup of our own (no cgroup limit unless the test adds one): fixed CPU memory."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(meminfo)
    (root / "proc" / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU @ 2.00GHz\n")
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    (root / "cgroup").mkdir()
    return devices.HostPaths(proc=root / "proc", cgroup=root / "cgroup")


@pytest.fixture
def host_tree(tmp_path: Path) -> Callable[..., devices.HostPaths]:
    """Builds a /proc and cgroup tree under tmp_path: `host_tree(meminfo=..., cgroup=...)`."""

    def build(meminfo: str = HOST_MEMINFO, cgroup: str = "0::/\n") -> devices.HostPaths:
        return make_host(tmp_path / "host-tree", meminfo, cgroup)

    return build


@pytest.fixture
def fixed_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> devices.HostPaths:
    """Make every reader that is not given a host read this fixed one, so readings taken apart compare equal."""
    host = make_host(tmp_path / "host")
    monkeypatch.setattr(host_memory, "DEFAULT_HOST", host)
    return host


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


AppFactory = Callable[..., Flask]


@pytest.fixture
def make_app(data_dir: Path) -> Iterator[AppFactory]:
    """Standalone apps (threading mode, TESTING, data in data_dir unless `MEMPLUGIN_DATA_DIR` is given), each with
    the settings it is called with; every one is closed after the test (with the job manager a form post started)."""
    apps: list[Flask] = []

    def make(**config: Any) -> Flask:
        app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True,
                          **config})
        apps.append(app)
        return app

    yield make
    for app in apps:
        get_plugin(app).close()


@pytest.fixture
def app_config() -> dict[str, Any]:
    """The settings a test module's `app` adds to the defaults: a module overrides this fixture (it may take the
    module's own fixtures, e.g. a dataset root) instead of defining an app of its own."""
    return {}


@pytest.fixture
def app(make_app: AppFactory, app_config: dict[str, Any]) -> Flask:
    """The standalone app on tmp_path, with the module's `app_config`."""
    return make_app(**app_config)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
