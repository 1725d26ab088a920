"""Settings read from MEMPLUGIN_* keys: the device fields (poll interval, simulated GPUs) and their validation."""

from __future__ import annotations

import math

import pytest

from digits_memplugin.host.settings import ConfigError, Settings


def test_device_defaults_poll_every_two_seconds_and_never_simulate() -> None:
    settings = Settings.from_config({})
    assert settings.devices_poll_seconds == 2.0
    assert settings.simulate_gpus is None


def test_device_settings_come_from_config_keys_and_overrides() -> None:
    config = {"MEMPLUGIN_DEVICES_POLL_SECONDS": 5, "MEMPLUGIN_SIMULATE_GPUS": " 2x24GiB "}
    settings = Settings.from_config(config)
    assert settings.devices_poll_seconds == 5.0
    assert isinstance(settings.devices_poll_seconds, float)
    assert settings.simulate_gpus == "2x24GiB"
    overridden = Settings.from_config(config, {"devices_poll_seconds": 0.5, "simulate_gpus": None})
    assert (overridden.devices_poll_seconds, overridden.simulate_gpus) == (0.5, None)


def test_config_items_round_trip_the_device_settings() -> None:
    settings = Settings.from_config({"MEMPLUGIN_DEVICES_POLL_SECONDS": 0.25, "MEMPLUGIN_SIMULATE_GPUS": "24GiB,16GiB"})
    items = settings.config_items()
    assert items["MEMPLUGIN_DEVICES_POLL_SECONDS"] == 0.25
    assert items["MEMPLUGIN_SIMULATE_GPUS"] == "24GiB,16GiB"
    assert Settings.from_config(items) == settings


@pytest.mark.parametrize("value", [0, -1, 0.0, math.inf, math.nan, "2", True, None])
def test_poll_interval_must_be_a_positive_number(value: object) -> None:
    with pytest.raises(ConfigError, match="MEMPLUGIN_DEVICES_POLL_SECONDS must be a number of seconds greater than 0"):
        Settings.from_config({"MEMPLUGIN_DEVICES_POLL_SECONDS": value})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (2, "MEMPLUGIN_SIMULATE_GPUS must be a GPU spec"),
        ("", "MEMPLUGIN_SIMULATE_GPUS: the GPU spec is empty"),
        ("2x24", "MEMPLUGIN_SIMULATE_GPUS: in GPU spec '2x24'.*not a memory size"),
        ("0x8GiB", "MEMPLUGIN_SIMULATE_GPUS: .*at least 1"),
    ],
)
def test_simulated_gpus_must_be_a_valid_spec(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_config({"MEMPLUGIN_SIMULATE_GPUS": value})


def test_every_setting_has_one_check_and_a_bool_is_no_number() -> None:
    import dataclasses

    from digits_memplugin.host.settings import COERCE

    assert set(COERCE) == {field.name for field in dataclasses.fields(Settings)}
    with pytest.raises(ConfigError, match=r"^MEMPLUGIN_JOB_NICE must be a whole number from 0 to 19, got True$"):
        Settings.from_config({"MEMPLUGIN_JOB_NICE": True})
    with pytest.raises(ConfigError, match=r"^MEMPLUGIN_DEVICES_POLL_SECONDS must be a number of seconds greater than 0"):
        Settings.from_config({"MEMPLUGIN_DEVICES_POLL_SECONDS": 10**400})
