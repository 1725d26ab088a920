"""jobs.scheduling.scheduler (placement) and jobs.definition.request: device choices as clients write them, candidate devices, the memory
an attempt may use (free memory, what our own attempts still hold back, the CPU cap), and request validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from digits_memplugin.core.sizes import GIB, MIB
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.jobs.definition.request import parse_job_request
from digits_memplugin.jobs.scheduling.scheduler import AUTO, candidates, limit_for, normalise_device


@pytest.fixture
def device_list(install_nvml: Any, gpus: Any) -> devices.DeviceList:
    install_nvml(FakeNvml(gpus))
    return devices.read_devices()


@pytest.mark.parametrize(
    ("written", "expected"),
    [("auto", AUTO), ("", AUTO), ("next available", AUTO), ("CPU", "cpu"), (0, 0), ("1", 1), ("gpu:1", 1),
     ("GPU-bbbbbbbb", 1), ("gpu-aaaaaaaa-1111-2222-3333-444444444444", 0)],
)
def test_device_choices_normalise_to_auto_cpu_or_a_uuid(
    device_list: devices.DeviceList, written: Any, expected: Any
) -> None:
    result = normalise_device(written, device_list)
    assert result == (device_list.gpus[expected].uuid if isinstance(expected, int) else expected)


@pytest.mark.parametrize("written", [2, "7", "GPU-ffff", "gpu:9"])
def test_devices_that_do_not_exist_are_errors(device_list: devices.DeviceList, written: Any) -> None:
    with pytest.raises(ValueError, match="no GPU has"):
        normalise_device(written, device_list)


def test_auto_means_the_gpus_or_the_cpu_without_them(device_list: devices.DeviceList, fixed_host: Any) -> None:
    found, reason = candidates(AUTO, device_list)
    assert [d.key for d in found] == [gpu.uuid for gpu in device_list.gpus] and reason is None
    no_gpus = dataclasses.replace(device_list, gpus=(), gpu_reason="no driver")
    assert [d.key for d in candidates(AUTO, no_gpus)[0]] == ["cpu"]
    assert [d.key for d in candidates("cpu", device_list)[0]] == ["cpu"]


def test_a_gpu_outside_cuda_visible_devices_is_not_a_candidate(
    device_list: devices.DeviceList, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", device_list.gpus[1].uuid or "")
    found, _ = candidates(AUTO, device_list)
    assert [d.key for d in found] == [device_list.gpus[1].uuid]
    none, reason = candidates(str(device_list.gpus[0].uuid), device_list)
    assert none == [] and reason is not None and "not available" in reason


def test_gpu_limit_is_free_memory_less_what_our_attempts_still_hold_back(device_list: devices.DeviceList) -> None:
    gpu = device_list.gpus[1]
    limit = limit_for(gpu, reserved=1 * GIB)
    assert limit is not None
    assert limit.limit_bytes == gpu.memory_free - 1 * GIB  # type: ignore[operator]
    assert limit.capacity_bytes == gpu.memory_total - gpu.memory_reserved  # type: ignore[operator]
    assert limit.cap_bytes is None
    unknown = dataclasses.replace(gpu, memory_free=None)
    assert limit_for(unknown) is None


def test_cpu_limit_is_the_cap_less_stacks_when_one_is_set(device_list: devices.DeviceList) -> None:
    cpu = dataclasses.replace(device_list.cpu, memory_free=8 * GIB, memory_total=16 * GIB)
    capped = limit_for(cpu, cap=64 * MIB, cap_overhead=2 * MIB)
    assert capped is not None
    assert (capped.limit_bytes, capped.cap_bytes, capped.overhead_bytes) == (62 * MIB, 64 * MIB, 2 * MIB)
    free = limit_for(cpu, reserved=GIB)
    assert free is not None and (free.limit_bytes, free.cap_bytes) == (7 * GIB, None)
    tight = limit_for(dataclasses.replace(cpu, memory_free=10 * MIB), cap=64 * MIB)
    assert tight is not None and tight.limit_bytes == 10 * MIB  # the machine must have the room too


def parse(**body: Any) -> tuple[Any, dict[str, Any]]:
    return parse_job_request({"net": "n", "solver": "s", **body}, default_attempts=5)


def test_a_minimal_request_takes_the_defaults() -> None:
    request, errors = parse()
    assert errors == {}
    assert (request.device, request.batch, request.start) == ("auto", None, "plan")
    assert (request.safety_margin, request.policy.max_attempts) == (None, 5)  # the margin: the device's default


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"batch": 0}, "batch"),
        ({"batch": "big"}, "batch"),
        ({"batch": True}, "batch"),
        ({"device": -1}, "device"),
        ({"data": {"train": 3}}, "data"),
        ({"data_shapes": {"data": [3, 0]}}, "data_shapes.data"),
        ({"memory_cap": "lots"}, "memory_cap"),
        ({"memory_cap": 1000}, "memory_cap"),
        ({"max_iter": -5}, "max_iter"),
        ({"fallback": {"start": "now"}}, "fallback"),
        ({"fallback": {"max_attempts": 0}}, "fallback"),
        ({"fallback": {"safety_margin": 1.5}}, "fallback"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"net": ""}, "net"),
    ],
)
def test_each_bad_field_is_named(body: dict[str, Any], field: str) -> None:
    request, errors = parse(**body)
    assert request is None and field in errors


def test_sizes_and_fallback_fields_are_read() -> None:
    request, _ = parse(memory_cap="2GiB", batch="auto", fallback={"start": "wanted", "max_attempts": 3, "growth": 0.2})
    assert request.memory_cap == 2 * GIB and request.batch == "auto"
    assert (request.start, request.policy.max_attempts, request.policy.growth) == ("wanted", 3, 0.2)
    assert request.spec("cpu")["fallback"] == {
        "safety_margin": None, "growth": 0.2, "max_attempts": 3, "start": "wanted",
    }


def test_not_an_object_is_an_error() -> None:
    assert parse_job_request([1], default_attempts=5) == (None, {"body": "expected a JSON object"})
    request, _ = parse(fallback={"safety_margin": 0.2})
    assert request.safety_margin == 0.2
