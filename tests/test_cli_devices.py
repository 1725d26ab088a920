"""`digits-memplugin devices`: the table, --json, --simulate-gpus, and agreement with the API and the pushed event."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from digits_memplugin import create_app
from digits_memplugin.cli import main
from digits_memplugin.cli.devices import format_table
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import FakeGpu, FakeNvml
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.child.caffe_build import bundled, devices_document

SCRIPT = Path(sys.executable).parent / "digits-memplugin"
SPEC = "2x24GiB,16GiB"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["devices", *argv]) == 0
    return capsys.readouterr().out


def test_table_without_nvml_lists_the_cpu_and_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_cli(capsys).splitlines()
    assert lines[0].split()[:6] == ["DEVICE", "NAME", "TOTAL", "FREE", "USED", "RESERVED"]
    assert lines[1].startswith("cpu ")
    assert (
        "No GPUs: NVML is missing (libnvidia-ml.so.1 was not found): no NVIDIA driver is installed on this machine "
        "(NVML: NVML Shared Library Not Found)"
    ) in lines


def test_table_of_fake_gpus_with_processes_and_unknowns(
    install_nvml: Callable[[FakeNvml], FakeNvml],
    gpus: list[FakeGpu],
    fixed_host: devices.HostPaths,
    capsys: pytest.CaptureFixture[str],
) -> None:
    unsupported = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"}
    gpus[1].unsupported = frozenset(unsupported)
    install_nvml(FakeNvml(gpus))
    output = run_cli(capsys)
    rows = {line.split()[0]: line for line in output.splitlines()[1:4]}
    assert rows["gpu0"].split()[1:4] == ["NVIDIA", "GeForce", "RTX"]
    assert "24.0 GiB" in rows["gpu0"] and "87 %" in rows["gpu0"] and "71 C" in rows["gpu0"]
    assert "GPU-aaaaaaaa-1111-2222-3333-444444444444" in rows["gpu0"]
    assert rows["gpu1"].count("n/a") == 2  # utilisation and temperature: unsupported, never shown as 0
    assert rows["cpu"].startswith("cpu ") and "Test CPU" in rows["cpu"]
    assert "gpu0: pid 4242 /usr/bin/python3 uses 6.0 GiB" in output
    assert "gpu0: pid 4343 n/a uses 2.0 GiB" in output
    assert "The GPUs are simulated" in output


def test_table_shows_a_lost_gpu_as_an_error(fake_gpus: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    fake_gpus.lose_gpu(0)
    output = run_cli(capsys)
    assert "gpu0: error: GPU is lost" in output
    gpu0 = next(line for line in output.splitlines() if line.startswith("gpu0 "))
    assert " error " in gpu0


def test_json_is_the_device_document(
    fake_gpus: FakeNvml, fixed_host: devices.HostPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    assert json.loads(run_cli(capsys, "--json")) == devices_document(devices.read_devices(), bundled())


def test_simulate_gpus_lists_fake_gpus_of_those_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(run_cli(capsys, "--json", "--simulate-gpus", SPEC))
    assert document["simulated"] is True
    assert [row["memory_total"] for row in document["devices"] if row["kind"] == "gpu"] == [
        24 * 1024**3,
        24 * 1024**3,
        16 * 1024**3,
    ]


def test_a_bad_spec_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["devices", "--simulate-gpus", "lots"])
    assert exit_info.value.code == 2
    assert "argument --simulate-gpus: in GPU spec 'lots'" in capsys.readouterr().err
    assert not devices.is_simulated()


def test_api_cli_and_pushed_event_agree_on_the_same_fake_devices(
    data_dir: Path, fixed_host: devices.HostPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "MEMPLUGIN_SIMULATE_GPUS": SPEC}
    app = create_app(config)
    from_api = app.test_client().get("/memplugin/api/devices").get_json()

    sio = get_plugin(app).socketio.test_client(app, namespace="/memplugin")
    try:
        sio.emit("subscribe_devices", namespace="/memplugin")
        (from_event,) = [e["args"][0] for e in sio.get_received("/memplugin") if e["name"] == "devices"][:1]
    finally:
        sio.disconnect(namespace="/memplugin")
    assert get_plugin(app).device_pusher.wait_stopped(10)

    from_cli = json.loads(run_cli(capsys, "--json", "--simulate-gpus", SPEC))

    assert from_api == from_event == from_cli
    assert from_api["gpu_count"] == 3 and from_api["simulated"] is True


def test_the_console_script_prints_the_same_gpus() -> None:
    result = subprocess.run(
        [SCRIPT, "devices", "--json", "--simulate-gpus", SPEC], capture_output=True, text=True, timeout=60, check=True
    )
    document = json.loads(result.stdout)
    devices.simulate_gpus(SPEC)
    here = devices_document(devices.read_devices(), bundled())
    # Another process reads the CPU at another moment: its free memory may differ; the GPUs may not.
    assert document["devices"][:-1] == here["devices"][:-1]
    assert {k: v for k, v in document.items() if k != "devices"} == {k: v for k, v in here.items() if k != "devices"}
    assert document["devices"][-1]["key"] == "cpu"


def test_help_documents_the_flags() -> None:
    result = subprocess.run([SCRIPT, "devices", "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "--json" in result.stdout and "--simulate-gpus" in result.stdout



def test_simulated_gpus_have_no_driver_version_made_up(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_cli(capsys, "--simulate-gpus", SPEC).splitlines()
    assert "NVIDIA driver: simulated (no driver is behind the simulated GPUs)" in lines
    assert not [line for line in lines if line.startswith("NVIDIA driver ") or "550." in line]
    # The fake library reports a version as a driver would; a table of real GPUs shows it as it is.
    document = devices.read_devices().to_json()
    assert document["simulated"] and document["driver_version"] == "550.54.15"
    assert format_table({**document, "simulated": False}).splitlines()[-1] == "NVIDIA driver 550.54.15"
