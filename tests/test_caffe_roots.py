"""The bundled Caffe roots `make install` builds (scripts/build-caffe.sh): the CPU root's `caffe` binary, and with
CAFFE_CUDA=1 the CUDA + cuDNN root's binary and pycaffe. Everything here runs the real binaries and the real
pycaffe builds, each in a child process with a time limit.

The CUDA tests need the CUDA root: they are skipped where it was not asked for (CAFFE_CUDA unset or 0, as the
Makefile exports it), and fail where it was asked for but is missing. On a machine without a GPU (CI's) the CUDA
build's CPU mode must train exactly as the CPU build does, and its GPU mode must end at once with an error that
says there is no GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, ZOO
from test_jobs_fixtures import write_lmdb

from digits_memplugin.core.training import training_definition
from digits_memplugin.measure.runner import measure

pytestmark = pytest.mark.slow

ROOTS = Path(sys.prefix) / "share" / "digits-memplugin" / "caffe"
CPU_ROOT = ROOTS / "cpu"
CUDA_ROOT = ROOTS / "cuda"
CUDA_ASKED = os.environ.get("CAFFE_CUDA") == "1"
TIMEOUT = 300  # seconds for one training child; LeNet's ten iterations take a few
NOISE = 16 * 1024
"""Bytes two mallinfo2 readings of LeNet by one build drift apart run to run: seen here in two clusters about 7 KB
apart (0.03% of the 28.7 MB), with either build."""
NO_GPU = r"CUDA driver version is insufficient for CUDA runtime version|no CUDA-capable device is detected"
"""CUDA's reason in glog's F line where there is no driver, or a driver and no GPU."""
AT_ONCE = 60  # seconds within which GPU mode without a GPU must have ended (it takes well under one)


def _has_gpu() -> bool:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return False
    try:
        return subprocess.run([nvidia_smi, "-L"], capture_output=True, timeout=30, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="module")
def cuda_root() -> Path:
    if not (CUDA_ROOT / "build-info.json").exists():
        if CUDA_ASKED:
            pytest.fail(f"CAFFE_CUDA=1 but no CUDA Caffe root in {CUDA_ROOT}: `make install CAFFE_CUDA=1` builds it")
        pytest.skip("no CUDA Caffe root (built by `make install CAFFE_CUDA=1`)")
    return CUDA_ROOT


def info(root: Path) -> dict:
    return json.loads((root / "build-info.json").read_text())


def readelf(binary: Path) -> str:
    return subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True, timeout=60).stdout


def ldd(binary: Path, **env: str) -> dict[str, str]:
    """What each needed library resolves to, as the dynamic loader finds it."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, **env}).stdout
    found = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


# --- LeNet, trained by a binary or a pycaffe, and the records its log gives

_RECORD = re.compile(
    r"(Iteration \d+, (loss|lr) = \S+|Iteration \d+, Testing net \(#\d+\)|(Train|Test) net output #\d+: .*"
    r"|Memory required for data: \d+|Optimization Done\.)"
)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's LeNet and its solver on small synthetic MNIST LMDBs: 10 iterations of batch 16, a test pass of 16
    items at 0, 5 and 10, a fixed random seed (so two runs of the same build agree bit for bit)."""
    folder = tmp_path_factory.mktemp("lenet")
    train = write_lmdb(folder / "train_lmdb", records=48)
    test = write_lmdb(folder / "test_lmdb", records=16)
    net = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    net = net.replace("examples/mnist/mnist_train_lmdb", str(train)).replace("examples/mnist/mnist_test_lmdb", str(test))
    net = net.replace("batch_size: 64", "batch_size: 16").replace("batch_size: 100", "batch_size: 16")
    (folder / "net.prototxt").write_text(net)
    (folder / "solver.prototxt").write_text(
        f'net: "{folder / "net.prototxt"}"\ntest_iter: 1\ntest_interval: 5\nbase_lr: 0.01\nmomentum: 0.9\n'
        'weight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 1\nmax_iter: 10\n'
        f'snapshot: 0\nsnapshot_after_train: false\nsnapshot_prefix: "{folder / "snap"}"\nrandom_seed: 7\n'
        "solver_mode: CPU\n"
    )
    return folder / "solver.prototxt"


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0", "OPENBLAS_NUM_THREADS": "1", **extra}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def records(log: str) -> list[str]:
    """The solver's and the nets' records in a log (losses, learning rates, test outputs, data sizes), less glog's
    headers and the timings, in order."""
    found = []
    for line in log.splitlines():
        header, _, message = line.partition("] ")
        if " caffe.cpp:" in header:  # the binary's own lines (its second "Optimization Done."), not the solver's
            continue
        message = re.sub(r" \([\d.]+ iter/s, [\d.]+s/\d+ iters?\)", "", message)
        match = _RECORD.search(message)
        if match:
            found.append(match.group(1).strip())
    return found


def train_with_binary(root: Path, solver: Path, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(root / "build/tools/caffe"), "train", f"--solver={solver}", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=solver.parent, check=False)


_PYCAFFE_TRAIN = """
import sys, caffe
print("pycaffe:", caffe.__file__, flush=True)
caffe.set_mode_cpu()
caffe.get_solver(sys.argv[1]).solve()
"""


def train_with_pycaffe(solver: Path, python_path: Path | None) -> subprocess.CompletedProcess[str]:
    env = _env(**({"PYTHONPATH": str(python_path)} if python_path else {}))
    return subprocess.run([sys.executable, "-c", _PYCAFFE_TRAIN, str(solver)], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, cwd=solver.parent, check=False)


def trained(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    found = records(result.stderr)
    assert found[-1] == "Optimization Done.", found[-5:]
    assert sum(record.startswith("Iteration") and ", loss = " in record for record in found) == 11  # 0 to 10
    return found


# --- The CPU root


def test_cpu_root_is_laid_out_as_digits_expects() -> None:
    build = info(CPU_ROOT)
    assert build["variant"] == "cpu" and build["flavour"] == "BVLC" and build["caffe_version"] == "1.0.0"
    assert build["cuda"] is None and build["cudnn"] is None and build["pycaffe"] is None
    assert (CPU_ROOT / "build/tools/caffe").is_file() and os.access(CPU_ROOT / "build/tools/caffe", os.X_OK)
    assert not (CPU_ROOT / "python").exists()  # its pycaffe is the environment's own wheel
    version = subprocess.run([str(CPU_ROOT / "build/tools/caffe"), "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert version.returncode == 0 and "version 1.0.0" in version.stdout + version.stderr


def test_cpu_binary_finds_libcaffe_beside_it_through_runpath() -> None:
    dynamic = readelf(CPU_ROOT / "build/tools/caffe")
    assert "(RPATH)" not in dynamic
    assert "$ORIGIN/../lib" in re.search(r"Library runpath: \[(.*)\]", dynamic).group(1).split(":")
    libcaffe = Path(ldd(CPU_ROOT / "build/tools/caffe")["libcaffe.so.1.0.0"])
    assert libcaffe.resolve() == (CPU_ROOT / "build/lib/libcaffe.so.1.0.0").resolve()
    assert "not found" not in " ".join(ldd(CPU_ROOT / "build/tools/caffe").values())


def test_cpu_binary_trains_lenet_as_the_cpu_pycaffe_does(lenet: Path) -> None:
    by_binary = trained(train_with_binary(CPU_ROOT, lenet))
    by_pycaffe = trained(train_with_pycaffe(lenet, None))
    assert by_binary == by_pycaffe
    assert "Test net output #0: accuracy = " in " ".join(by_binary)


def test_a_second_install_builds_nothing() -> None:
    before = {path: path.stat().st_ino for path in CPU_ROOT.rglob("*") if path.is_file()}
    result = subprocess.run([str(REPO / "scripts/build-caffe.sh"), sys.executable, "cpu"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "already installed" in result.stderr
    assert {path: path.stat().st_ino for path in CPU_ROOT.rglob("*") if path.is_file()} == before


def test_a_patch_that_no_longer_applies_stops_the_build(tmp_path: Path) -> None:
    """The source edits are checked: one that does not apply exactly ends the build with its name, before anything
    is compiled or installed."""
    scripts = tmp_path / "scripts"
    shutil.copytree(REPO / "scripts", scripts)
    patch = scripts / "caffe-patches" / "02-net-construction-log.patch"
    patch.write_text(patch.read_text().replace("Initializing net from parameters", "Initialising net from parameters"))
    cache = tmp_path / "cache"
    (cache / "sdist").mkdir(parents=True)
    sdist = Path(os.environ.get("DIGITS_MEMPLUGIN_CACHE", Path.home() / ".cache/digits-memplugin"))
    (cache / "sdist" / "brocolli-caffe-9.0.2.tar.gz").symlink_to(sdist / "sdist" / "brocolli-caffe-9.0.2.tar.gz")
    result = subprocess.run([str(scripts / "build-caffe.sh"), sys.executable, "cpu"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "DIGITS_MEMPLUGIN_CACHE": str(cache),
                                              "CAFFE_ROOTS_DIR": str(tmp_path / "roots")}, check=False)
    assert result.returncode != 0
    assert "patch 02-net-construction-log.patch no longer applies" in result.stderr
    assert not (tmp_path / "roots").exists()
    assert not list((cache / "caffe").glob("cpu-*/root"))


# --- The CUDA root


def test_cuda_root_is_laid_out_as_digits_expects(cuda_root: Path) -> None:
    build = info(cuda_root)
    assert build["variant"] == "cuda" and build["flavour"] == "BVLC" and build["caffe_version"] == "1.0.0"
    assert build["cuda"]["version"].startswith("13.") and build["cudnn"].startswith("9.")
    assert build["compute_capabilities"] and all(re.fullmatch(r"\d+\.\d", cc) for cc in build["compute_capabilities"])
    assert (cuda_root / "build/tools/caffe").is_file() and (cuda_root / "python/caffe/_caffe.so").is_file()
    assert (cuda_root / "python/caffe/proto/caffe_pb2.py").is_file()
    for name, path in build["libraries"].items():
        assert (cuda_root / path).is_file() and (cuda_root / path).name == name
    assert set(build["libraries"]) >= {"libcudart.so.13", "libcublas.so.13", "libcurand.so.10", "libcudnn.so.9"}


def test_cuda_binaries_load_the_roots_cuda_libraries_through_runpath(cuda_root: Path) -> None:
    libraries = info(cuda_root)["libraries"]
    for binary in ("build/tools/caffe", "build/lib/libcaffe.so.1.0.0", "python/caffe/_caffe.so"):
        dynamic = readelf(cuda_root / binary)
        assert "(RPATH)" not in dynamic, binary
        assert "$ORIGIN/../../cuda-libs/nvidia/cu13/lib" in dynamic, binary
    libcaffe = readelf(cuda_root / "build/lib/libcaffe.so.1.0.0")
    for needed in ("libcudart.so.13", "libcublas.so.13", "libcurand.so.10", "libcudnn.so.9"):
        assert f"Shared library: [{needed}]" in libcaffe  # the CUDA runtime too: shared, not static
    resolved = ldd(cuda_root / "build/tools/caffe")
    for name in ("libcudart.so.13", "libcublas.so.13", "libcurand.so.10", "libcudnn.so.9"):
        assert Path(resolved[name]).resolve() == (cuda_root / libraries[name]).resolve(), (name, resolved[name])
    assert not any(path.startswith("/usr/local/cuda") for path in resolved.values())
    assert "not found" not in " ".join(resolved.values())


def test_library_path_overrides_the_roots_cuda_runtime(cuda_root: Path, tmp_path: Path) -> None:
    """Issue 25 puts a stand-in libcudart.so.13 in the runtime's place through the library path: RUNPATH lets it."""
    elsewhere = tmp_path / "lib"
    elsewhere.mkdir()
    shutil.copy(cuda_root / info(cuda_root)["libraries"]["libcudart.so.13"], elsewhere / "libcudart.so.13")
    resolved = ldd(cuda_root / "build/tools/caffe", LD_LIBRARY_PATH=str(elsewhere))
    assert resolved["libcudart.so.13"] == str(elsewhere / "libcudart.so.13")


def test_cuda_binary_in_cpu_mode_trains_lenet_as_the_cpu_binary_does(cuda_root: Path, lenet: Path) -> None:
    assert trained(train_with_binary(cuda_root, lenet)) == trained(train_with_binary(CPU_ROOT, lenet))


def test_cuda_pycaffe_in_cpu_mode_trains_lenet_as_the_cpu_pycaffe_does(cuda_root: Path, lenet: Path) -> None:
    cuda = train_with_pycaffe(lenet, cuda_root / "python")
    assert f"pycaffe: {cuda_root / 'python/caffe/__init__.py'}" in cuda.stdout  # the CUDA build, not the wheel
    assert trained(cuda) == trained(train_with_pycaffe(lenet, None))


def test_cuda_pycaffe_in_cpu_mode_allocates_what_the_cpu_pycaffe_does(
    cuda_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mallinfo2 around solver construction, one training iteration and the first test pass (measure/child.py), for
    the zoo's LeNet at batch 64. Run to run one build's reading moves by up to about 7 KB (where the prefetch
    threads stand when it settles), so each build is read three times and the least readings compared within NOISE; the
    CUDA build makes no CUDA call in CPU mode, so its log has none of BVLC's messages about cuBLAS or cuRAND."""
    net = ZOO / "caffe_lenet" / "lenet_train_test.prototxt"
    definition = training_definition(net.read_text(), (ZOO / "caffe_lenet" / "lenet_solver.prototxt").read_text(),
                                     net_source=str(net))
    shapes = {"data": (1, 28, 28)}
    readings: dict[str, list[int]] = {"cpu": [], "cuda": []}
    logs = {}
    for run in range(3):
        for build, python_path in (("cpu", None), ("cuda", cuda_root / "python")):
            if python_path is None:
                monkeypatch.delenv("PYTHONPATH", raising=False)
            else:
                monkeypatch.setenv("PYTHONPATH", str(python_path))
            measured = measure(definition, tmp_path / f"{build}{run}", shapes)
            readings[build].append(measured.allocated)
            logs[build] = measured.log
    imported = subprocess.run([sys.executable, "-c", "import caffe; print(caffe.__file__)"], capture_output=True,
                              text=True, timeout=120, check=True).stdout.strip()
    assert imported == str(cuda_root / "python/caffe/__init__.py")  # what measure's children imported
    assert min(readings["cpu"]) > 20_000_000
    # The least of three readings: a reading only ever gains from what the threads happen to hold (one of 31 KB seen).
    assert abs(min(readings["cuda"]) - min(readings["cpu"])) <= NOISE, readings
    assert not re.search(r"Cublas|Curand|cuDNN|CUDNN", logs["cuda"]), logs["cuda"][-2000:]


@pytest.mark.skipif(_has_gpu(), reason="a GPU is here: GPU mode would train")
def test_cuda_binary_in_gpu_mode_without_a_gpu_ends_at_once_saying_so(cuda_root: Path, lenet: Path) -> None:
    result = train_with_binary(cuda_root, lenet, "--gpu=0", timeout=AT_ONCE)
    assert result.returncode != 0
    fatal = [line for line in result.stderr.splitlines() if line.startswith("F")]
    assert fatal, result.stderr[-2000:]
    assert re.search(NO_GPU, fatal[0]), fatal[0]
    assert "Iteration" not in result.stderr


@pytest.mark.skipif(_has_gpu(), reason="a GPU is here: GPU mode would train")
def test_cuda_pycaffe_in_gpu_mode_without_a_gpu_ends_at_once_saying_so(cuda_root: Path, lenet: Path) -> None:
    script = "import sys, caffe\ncaffe.set_mode_gpu()\ncaffe.set_device(0)\ncaffe.get_solver(sys.argv[1]).solve()\n"
    result = subprocess.run([sys.executable, "-c", script, str(lenet)], capture_output=True, text=True, timeout=AT_ONCE,
                            env=_env(PYTHONPATH=str(cuda_root / "python")), cwd=lenet.parent, check=False)
    assert result.returncode != 0
    fatal = [line for line in result.stderr.splitlines() if line.startswith("F")]
    assert fatal and re.search(NO_GPU, fatal[0]), result.stderr[-2000:]
    assert "Iteration" not in result.stderr
