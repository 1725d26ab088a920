"""`GET /memplugin/api/devices`: the device document as JSON, on fake GPUs and on this GPU-less machine."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask
from flask.testing import FlaskClient

from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.jobs.child.caffe_build import bundled, devices_document


def test_lists_the_fake_gpus_and_the_cpu(
    fake_gpus: FakeNvml, fixed_host: devices.HostPaths, client: FlaskClient
) -> None:
    response = client.get("/memplugin/api/devices")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body == devices_document(devices.read_devices(), bundled())
    assert body["gpu_count"] == 2 and body["simulated"] is True
    assert [row["key"] for row in body["devices"]] == [gpu.uuid for gpu in fake_gpus.gpus] + ["cpu"]
    assert body["devices"][0]["memory_free"] == fake_gpus.gpus[0].free


def test_without_nvml_lists_only_the_cpu_and_says_why(client: FlaskClient) -> None:
    body = client.get("/memplugin/api/devices").get_json()
    assert body["gpu_count"] == 0
    assert "NVML" in body["gpu_reason"]
    assert body["simulated"] is False
    (cpu,) = body["devices"]
    assert cpu["kind"] == "cpu" and cpu["memory_total"] > 0


def test_a_lost_gpu_is_an_error_row_in_the_api(fake_gpus: FakeNvml, client: FlaskClient) -> None:
    fake_gpus.lose_gpu(0)
    first, second, _cpu = client.get("/memplugin/api/devices").get_json()["devices"]
    assert (first["index"], first["error"], first["memory_free"]) == (0, "GPU is lost", None)
    assert second["error"] is None and second["memory_free"] is not None


def test_other_methods_are_json_405(client: FlaskClient) -> None:
    response = client.post("/memplugin/api/devices")
    assert response.status_code == 405
    assert response.get_json()["status"] == 405
    assert "GET" in response.headers["Allow"]


def test_health_agrees_with_the_device_list(
    install_nvml: Callable[[FakeNvml], FakeNvml], client: FlaskClient
) -> None:
    install_nvml(FakeNvml.from_spec("3x8GiB"))
    health = client.get("/memplugin/api/health").get_json()
    assert (health["gpu_count"], health["gpu_reason"], health["simulated"]) == (3, None, True)


def test_the_route_is_under_the_hosts_prefix(app: Flask) -> None:
    assert "memplugin.api_devices" in app.view_functions
    rules = [rule.rule for rule in app.url_map.iter_rules() if rule.endpoint == "memplugin.api_devices"]
    assert rules == ["/memplugin/api/devices"]
