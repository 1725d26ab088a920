"""The MEMPLUGIN_* keys of training jobs: defaults, sizes, validation, and what the job manager makes of them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from digits_memplugin.core.sizes import GIB
from digits_memplugin.host.settings import ConfigError, Settings
from digits_memplugin.jobs.manager import ManagerConfig


def test_job_defaults() -> None:
    settings = Settings.from_config({"MEMPLUGIN_DATA_DIR": "/srv/memplugin"})
    assert (settings.jobs_per_gpu, settings.jobs_per_cpu, settings.job_max_attempts) == (1, 1, 5)
    assert settings.dataset_roots is None and settings.cpu_memory_cap is None and settings.job_safety_margin is None
    assert settings.gpu_engine is None and settings.job_events_per_second == 4.0  # None: the Caffe that trains says
    assert settings.caffe_root is None
    config = ManagerConfig.from_settings(settings)
    assert config.dataset_roots == (Path("/srv/memplugin/datasets"),)
    assert (config.cpu_safety_margin, config.gpu_safety_margin) == (0.03, 0.05)


def test_job_settings_are_read_and_normalised(tmp_path: Path) -> None:
    settings = Settings.from_config(
        {
            "MEMPLUGIN_DATASET_ROOTS": [str(tmp_path / "a"), tmp_path / "b"],
            "MEMPLUGIN_CPU_MEMORY_CAP": "2GiB",
            "MEMPLUGIN_JOB_SAFETY_MARGIN": 0.1,
            "MEMPLUGIN_JOBS_PER_GPU": 2,
            "MEMPLUGIN_GPU_ENGINE": "gpu",
        }
    )
    assert settings.dataset_roots == (tmp_path / "a", tmp_path / "b")
    assert settings.cpu_memory_cap == 2 * GIB
    config = ManagerConfig.from_settings(settings)
    assert (config.cpu_safety_margin, config.gpu_safety_margin, config.jobs_per_gpu) == (0.1, 0.1, 2)
    assert Settings.from_config({"MEMPLUGIN_DATASET_ROOTS": "relative"}).dataset_roots == (Path("relative").absolute(),)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("MEMPLUGIN_JOBS_PER_GPU", 0),
        ("MEMPLUGIN_JOBS_PER_CPU", True),
        ("MEMPLUGIN_JOB_MAX_ATTEMPTS", 1.5),
        ("MEMPLUGIN_CPU_MEMORY_CAP", "lots"),
        ("MEMPLUGIN_CPU_MEMORY_CAP", 100),
        ("MEMPLUGIN_JOB_SAFETY_MARGIN", 1.0),
        ("MEMPLUGIN_GPU_ENGINE", "cpu"),
        ("MEMPLUGIN_JOB_EVENTS_PER_SECOND", 0),
        ("MEMPLUGIN_DATASET_ROOTS", [""]),
    ],
)
def test_bad_job_settings_fail_at_start_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        Settings.from_config({key: value})


def test_the_watchdog_silence_is_a_setting_of_seconds() -> None:
    assert Settings.from_config({}).job_stall_seconds == 600.0
    settings = Settings.from_config({"MEMPLUGIN_JOB_STALL_SECONDS": 90})
    assert settings.job_stall_seconds == 90.0
    assert ManagerConfig.from_settings(settings).stall_seconds == 90.0
    for value in (0, 0.5, -1, math.inf, math.nan, "600", True, None):
        with pytest.raises(ConfigError, match="MEMPLUGIN_JOB_STALL_SECONDS must be a number of seconds of at least 1"):
            Settings.from_config({"MEMPLUGIN_JOB_STALL_SECONDS": value})
