"""The plugin's HTML pages: the devices table, the no-GPU banner and the simulated-GPU banner on every page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from digits_memplugin import create_app
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import ERROR_DRIVER_NOT_LOADED, ERROR_NO_PERMISSION, FakeNvml

PAGES = ("/", "/memplugin/", "/memplugin/devices")


@pytest.fixture
def simulated_app(data_dir: Path) -> Flask:
    return create_app(
        {"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "MEMPLUGIN_SIMULATE_GPUS": "2x24GiB"}
    )


@pytest.mark.parametrize("path", PAGES)
def test_every_page_says_when_the_gpus_are_simulated(simulated_app: Flask, path: str) -> None:
    page = simulated_app.test_client().get(path)
    assert page.status_code == 200
    assert 'id="simulated-gpu-banner"' in page.text
    assert "GPUs are simulated." in page.text
    assert 'id="no-gpu-banner"' not in page.text


@pytest.mark.parametrize("path", PAGES)
def test_no_simulated_banner_by_default(client: FlaskClient, path: str) -> None:
    assert 'id="simulated-gpu-banner"' not in client.get(path).text


def test_simulation_from_config_installs_the_fake_library(simulated_app: Flask) -> None:
    listing = devices.read_devices()
    assert listing.simulated
    assert [gpu.memory_total for gpu in listing.gpus] == [24 * 1024**3] * 2


def test_devices_page_shows_each_gpu_and_the_cpu(fake_gpus: FakeNvml, client: FlaskClient) -> None:
    page = client.get("/memplugin/devices").text
    assert 'id="device-table"' in page
    for gpu in fake_gpus.gpus:
        assert f'data-key="{gpu.uuid}"' in page
        assert gpu.name in page
    assert 'data-key="cpu"' in page
    assert "24.0 GiB" in page  # total of GPU 0, formatted
    assert "4242 /usr/bin/python3 (6.0 GiB)" in page
    assert "4343 n/a (2.0 GiB)" in page  # a process NVML will not name
    # Issue 14, 8: a fake library's GPUs are said to be simulated; its driver version is made up, so not shown.
    assert "GPUs simulated by a fake NVML library" in page
    assert "NVIDIA driver 550.54.15" not in page


def test_devices_page_names_the_driver_of_real_gpus(
    fake_gpus: FakeNvml, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices._session, "simulated", False)  # the fake library standing for a real driver
    page = client.get("/memplugin/devices").text
    assert "NVIDIA driver 550.54.15" in page and "simulated" not in page.lower()


def test_devices_page_shows_a_lost_gpu_as_an_error(fake_gpus: FakeNvml, client: FlaskClient) -> None:
    fake_gpus.lose_gpu(1)
    page = client.get("/memplugin/devices").text
    assert "error: GPU is lost" in page
    assert "NVIDIA GeForce RTX 3090" in page


def test_devices_page_without_gpus_has_the_banner_and_the_cpu(client: FlaskClient) -> None:
    page = client.get("/memplugin/devices").text
    assert 'id="no-gpu-banner"' in page and "NVML" in page
    assert 'data-key="cpu"' in page


@pytest.mark.parametrize(
    ("init_error", "why"),
    [
        (ERROR_DRIVER_NOT_LOADED, "No GPU is listed: no NVIDIA driver is running: NVML is installed but the driver"),
        (ERROR_NO_PERMISSION, "No GPU is listed: NVML refused this user"),
        (None, "No GPU is listed: the NVIDIA driver reports no GPU."),
    ],
)
def test_devices_page_without_gpus_says_why(
    install_nvml: Callable[[FakeNvml], FakeNvml], client: FlaskClient, init_error: int | None, why: str
) -> None:
    """Issue 14, 8: no NVIDIA driver, one not loaded or refusing this user, or no GPU at all: the page says which."""
    install_nvml(FakeNvml([], init_error=init_error))
    page = client.get("/memplugin/devices").text
    assert why in page, page


def test_home_page_links_to_the_devices_page_and_api(client: FlaskClient) -> None:
    page = client.get("/").text
    assert 'href="/memplugin/devices"' in page
    assert 'href="/memplugin/api/devices"' in page


def test_the_simulated_flag_reaches_host_templates_only_under_a_prefixed_name(tmp_path: Path) -> None:
    from flask import render_template_string
    from flask_socketio import SocketIO

    import digits_memplugin

    host = Flask("host")
    host.config["MEMPLUGIN_DATA_DIR"] = str(tmp_path)

    @host.get("/")
    def index() -> str:
        return render_template_string("{{ memplugin_simulated }}|{{ banner | default('none') }}")

    digits_memplugin.init_app(host, SocketIO(host, async_mode="threading"), simulate_gpus="1x8GiB")
    # The host's page renders as it did; the plugin's names are prefixed, so they cannot clash.
    assert host.test_client().get("/").text == "True|none"
