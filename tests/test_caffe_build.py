"""caffe_build: which Caffe trains and what it can do, read at start-up. Roots whose `caffe` is the scripted stand-in
(tests/scripted_caffe.py: it answers as NVcaffe or a GPU build would, it trains nothing) cover what this machine
cannot build; the real BVLC binary is read in test_jobs_binary_runner.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from scripted_caffe import caffe_root

from digits_memplugin import create_app
from digits_memplugin.host.settings import ConfigError
from digits_memplugin.jobs.child.caffe_build import (
    BINARY,
    BVLC,
    NVCAFFE,
    PYCAFFE,
    CaffeBuildError,
    bundled,
    find_caffe,
    flavour_of_version,
)
from digits_memplugin.jobs.child.caffe_build import caffe_root as named_root


def test_without_a_setting_the_bundled_pycaffe_trains() -> None:
    caffe = find_caffe(None, environ={})
    assert caffe == bundled()
    assert (caffe.runner, caffe.flavour, caffe.version, caffe.cuda, caffe.cudnn) == (PYCAFFE, BVLC, "1.0.0", False, False)
    assert caffe.root is None and caffe.source == "bundled"
    assert caffe.label == "BVLC Caffe 1.0.0 (the bundled pycaffe)"


def test_the_setting_comes_first_then_caffe_root_then_caffe_home_read_as_digits_reads_them() -> None:
    environ = {"CAFFE_ROOT": " '/opt/caffe' ", "CAFFE_HOME": "/opt/home"}
    assert named_root("/mine", environ) == (Path("/mine"), "MEMPLUGIN_CAFFE_ROOT")
    assert named_root(None, environ) == (Path("/opt/caffe"), "CAFFE_ROOT")
    assert named_root(None, {"CAFFE_HOME": '"/opt/home"'}) == (Path("/opt/home"), "CAFFE_HOME")
    assert named_root("", {}) == (None, "bundled")


@pytest.mark.parametrize(("version", "flavour"), [
    ("0.17.4", NVCAFFE), ("0.14.0-alpha", NVCAFFE), ("0.9.1", NVCAFFE), ("0.9.0", BVLC), ("0.99.0", BVLC),
    ("1.0.0", BVLC), ("1.0.0-rc5", BVLC), ("1.0", BVLC),
])
def test_the_version_decides_the_flavour_as_digits_decides(version: str, flavour: str) -> None:
    assert flavour_of_version(version) == flavour


def test_a_scripted_nvcaffe_root_is_read_as_nvcaffe_with_cuda_trained_through_its_binary(tmp_path: Path) -> None:
    """Stand-in: the scripted caffe answers `-version` with 0.17.4 and `device_query` as a CUDA build with no GPU."""
    root = caffe_root(tmp_path / "nvcaffe", version="0.17.4", cuda=True)
    caffe = find_caffe(None, environ={"CAFFE_ROOT": str(root)})
    assert (caffe.flavour, caffe.version, caffe.runner, caffe.cuda) == (NVCAFFE, "0.17.4", BINARY, True)
    assert caffe.source == "CAFFE_ROOT" and caffe.root == str(root)
    assert caffe.binary == str(root / "build" / "tools" / "caffe") and caffe.pycaffe is None
    # A script links nothing the loader can list: cuDNN is not claimed, and the note says why.
    assert not caffe.cudnn and any("could not be listed" in note for note in caffe.notes)
    assert caffe.to_json()["label"] == f"NVcaffe 0.17.4 (at {root}, CAFFE_ROOT)"


def test_a_cpu_only_build_says_so_when_asked_for_a_gpu(tmp_path: Path) -> None:
    root = caffe_root(tmp_path / "cpu", version="1.0.0", cuda=False)
    caffe = find_caffe(root)
    assert (caffe.flavour, caffe.cuda, caffe.cudnn, caffe.abilities) == (BVLC, False, False, "CPU only")


def test_a_pycaffe_that_imports_here_is_what_trains(tmp_path: Path) -> None:
    """A root whose python/caffe imports in this Python (here: the bundled pycaffe's package, linked in) trains
    through pycaffe, with that folder before the server's own on the child's path."""
    root = caffe_root(tmp_path / "root", version="1.0.0", cuda=False)
    import caffe as installed

    (root / "python").mkdir()
    (root / "python" / "caffe").symlink_to(Path(installed.__file__).parent, target_is_directory=True)
    caffe = find_caffe(root)
    assert caffe.runner == PYCAFFE and caffe.pycaffe == str(root / "python") and caffe.version == "1.0.0"


def test_a_pycaffe_that_does_not_import_here_leaves_the_binary_to_train(tmp_path: Path) -> None:
    root = caffe_root(tmp_path / "root", version="1.0.0", cuda=False)
    package = root / "python" / "caffe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import _caffe_built_for_python27\n")
    (package / "_caffe.so").write_bytes(b"not an extension")
    caffe = find_caffe(root)
    assert caffe.runner == BINARY and caffe.pycaffe is None
    assert any("does not import in this Python" in note for note in caffe.notes)


def test_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(CaffeBuildError, match=rf"names {tmp_path / 'missing'}, which is not a folder"):
        find_caffe(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaffeBuildError, match=r"build/tools/caffe is missing or not executable"):
        find_caffe(tmp_path / "empty")
    broken = tmp_path / "broken" / "build" / "tools"
    broken.mkdir(parents=True)
    (broken / "caffe").write_text("#!/nonexistent/interpreter\n")
    (broken / "caffe").chmod(0o755)
    with pytest.raises(CaffeBuildError, match=rf"cannot be run: {broken / 'caffe'}"):
        find_caffe(tmp_path / "broken")


def test_a_caffe_that_does_not_answer_in_time_is_refused_naming_it(tmp_path: Path) -> None:
    silent = tmp_path / "silent" / "build" / "tools"
    silent.mkdir(parents=True)
    (silent / "caffe").write_text("#!/bin/sh\nsleep 60\n")
    (silent / "caffe").chmod(0o755)
    with pytest.raises(CaffeBuildError, match=rf"{silent / 'caffe'} did not answer within 1 s"):
        find_caffe(tmp_path / "silent", timeout=1)


def test_the_app_refuses_to_start_with_a_caffe_that_cannot_train(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"MEMPLUGIN_CAFFE_ROOT names .*nowhere, which is not a folder"):
        create_app({"MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_CAFFE_ROOT": str(tmp_path / "nowhere"),
                    "MEMPLUGIN_ASYNC_MODE": "threading"})


def test_serve_refuses_to_start_with_a_caffe_root_that_cannot_train(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "digits-memplugin"
    result = subprocess.run(
        [script, "serve", "--port", "0", "--data-dir", tmp_path / "data", "--caffe-root", tmp_path / "nowhere"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode != 0
    assert f"MEMPLUGIN_CAFFE_ROOT names {tmp_path / 'nowhere'}, which is not a folder" in result.stderr
    assert "Traceback" not in result.stderr


LENET_NET = (Path(__file__).resolve().parents[2] / "shared" / "zoo" / "caffe_lenet" / "lenet_train_test.prototxt")


def app_with(tmp_path: Path, root: Path | None) -> object:
    config = {"MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True}
    if root is not None:
        config["MEMPLUGIN_CAFFE_ROOT"] = str(root)
    return create_app(config)


@pytest.mark.parametrize("trainer", ["bundled", "scripted-nvcaffe"])
def test_the_devices_api_page_and_estimates_follow_the_caffe_that_trains(tmp_path: Path, trainer: str) -> None:
    """GET devices and the Devices page say which Caffe trains; an estimate of a net both schemas read is of that
    Caffe's flavour, and GPU jobs are estimated with cuDNN only where it has cuDNN (the scripted NVcaffe stand-in
    shows none: a script links no library)."""
    root = caffe_root(tmp_path / "nv", version="0.17.4", cuda=True) if trainer != "bundled" else None
    app = app_with(tmp_path, root)
    try:
        client = app.test_client()  # type: ignore[attr-defined]
        caffe = client.get("/memplugin/api/devices").get_json()["caffe"]
        page = client.get("/memplugin/devices").get_data(as_text=True)
        body = {"net": LENET_NET.read_text(), "data_shapes": {"data": [1, 28, 28]}, "batch": 8, "engine": "gpu"}
        estimate = client.post("/memplugin/api/estimate", json=body).get_json()
        policy = app.extensions["memplugin"].jobs.config.policy  # type: ignore[attr-defined]
    finally:
        app.extensions["memplugin"].close()  # type: ignore[attr-defined]
    if root is None:
        assert (caffe["flavour"], caffe["runner"], caffe["source"]) == ("bvlc", "pycaffe", "bundled")
        assert "Jobs train with <strong>BVLC Caffe 1.0.0 (the bundled pycaffe)</strong>: CPU only" in page
        assert estimate["flavour"] == "bvlc" and policy.gpu_engine == "gpu-cudnn"
    else:
        assert (caffe["flavour"], caffe["runner"], caffe["version"]) == ("nvcaffe", "binary", "0.17.4")
        assert f"NVcaffe 0.17.4 (at {root}, MEMPLUGIN_CAFFE_ROOT)</strong>: CUDA without cuDNN" in page
        assert estimate["flavour"] == "nvcaffe" and policy.gpu_engine == "gpu"


def test_where_a_driver_is_loaded_the_bundled_cuda_build_trains_unless_a_caffe_is_named(tmp_path: Path) -> None:
    """A DIGITS user with GPUs who names no Caffe gets the bundled CUDA build `make install` made where the driver
    is (the CPU-only pycaffe could not train on their GPUs); without a driver, or with a Caffe named, it is not taken."""
    import os

    from digits_memplugin.jobs.child.caffe_build import BUNDLED_CUDA, BUNDLED_CUDA_ROOT, bundled, find_caffe

    if not (BUNDLED_CUDA_ROOT / "build" / "tools" / "caffe").is_file():
        if os.environ.get("CAFFE_CUDA") == "1":
            pytest.fail(f"CAFFE_CUDA=1 but no CUDA Caffe root in {BUNDLED_CUDA_ROOT}: `make install CAFFE_CUDA=1`")
        pytest.skip("no CUDA Caffe root (built by `make install CAFFE_CUDA=1`)")
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06\n")
    chosen = find_caffe(None, environ={}, driver=driver)
    assert (chosen.root, chosen.source, chosen.cuda, chosen.cudnn) == (str(BUNDLED_CUDA_ROOT), BUNDLED_CUDA, True, True)
    assert find_caffe(None, environ={}, driver=tmp_path / "none") == bundled()
    named = caffe_root(tmp_path / "mine", version="1.0.0", cuda=True)
    assert find_caffe(None, environ={"CAFFE_ROOT": str(named)}, driver=driver).root == str(named)
