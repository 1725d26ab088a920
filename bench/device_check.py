"""The device check: the bundled CUDA Caffe binary on a real GPU, its peak device memory per net and batch, and the
largest batch that trains, found by real out-of-memory failures. bench/gpu_accuracy.py compares the JSON it writes
with the estimate (docs/benchmarks.md, "The GPU path on a GPU").

Two steps, because the GPU machine is bare (Python 3.12, numpy 2 and CUDA 13's pip packages; no network, no project
environment, at most 64 MiB carried there):

    prepare (here, in the project's environment; builds the bundle, ignored by git):
        .venv/bin/python bench/device_check.py prepare            # -> build/device-check/ and its size
    run (on the GPU machine, any Python 3.8+; the standard library and the bundle's nvidia-ml-py only):
        python3 bench/device_check.py run --out $OUT/device_check.json
    rehearse (here, without a GPU: the stand-in CUDA runtime instead of CUDA, a fake NVML library under nvidia-ml-py):
        .venv/bin/python bench/device_check.py run --rehearse --out build/device_check_rehearsal.json

The bundle holds the nets (zoo nets with DummyData instead of their data layers, as templates of the train batch),
the caffe binary and libcaffe with every non-CUDA library they load (and the loader, for a machine whose C library
is older), the memory probe (bench/standin/probe.c, LD_PRELOAD: Caffe's cudaMalloc calls counted on the real
runtime, and cudaMemGetInfo after each), and nvidia-ml-py's pynvml.py. The CUDA libraries are the machine's own
(its Python's nvidia-* packages), never carried.

Each run (`caffe train --gpu=0`) tests once and trains while the parent polls NVML every 10 ms for the process's
usedGpuMemory and the device's used memory; once the second iteration is logged and the probe's count of device
bytes has held for a second, SIGINT stops it (Caffe's "stop"), so that NVML reads the peak however fast the net
is. The probe's report gives the peak of Caffe's own device bytes and of cudaMemGetInfo's total - free. A run that fails keeps its out-of-memory lines (glog's F line and
any line naming "out of memory" or a cuDNN status) as Caffe wrote them. The largest-batch searches (LeNet, AlexNet,
GoogLeNet) start at the estimate's prediction for the free memory measured at the time and bracket the answer by
real failures; LeNet's and AlexNet's largest batches on a whole H200 are bounded by Caffe's INT_MAX-element blob
limit rather than memory, so those two searches first fill the device with a ballast (a separate CUDA process
holding memory) to leave a stated amount free.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUNDLE = REPO / "build" / "device-check"
ARCHIVE = REPO / "build" / "device-check.tar.gz"
GiB = 1024**3
MiB = 1024**2
BATCH_TOKEN = 987654321
"""Stands for the train batch in the bundle's net templates (the first dim of the train net's DummyData tops)."""
CARRY_LIMIT = 64 * MiB
SCHEMA = 1

# What runs, in order: (zoo case, batches measured with each engine). The searches follow the first three.
MEASURED = [
    ("caffe_lenet", (64, 512)),
    ("caffe_alexnet", (32, 128)),
    ("caffe_googlenet", (16, 64)),
    ("caffe_cifar10_quick", (32, 256)),
    ("caffe_cifar10_full_sigmoid_bn", (32, 256)),
    ("squeezenet_v1.1", (16, 64)),
    ("resnet50_kaiminghe", (8, 32)),
    ("caffe_caffenet", (32, 128)),
]
"""MobileNet is left out: BVLC creates 3 cuDNN handles and streams per group of every convolution, thousands for its
depthwise layers, which takes minutes to set up."""
SEARCHED = [
    # (case, engine, bytes to leave free with a ballast or None for the whole device)
    ("caffe_lenet", "gpu-cudnn", 4 * GiB),
    ("caffe_alexnet", "gpu-cudnn", 16 * GiB),
    ("caffe_googlenet", "gpu-cudnn", None),
]
ENGINES = ("gpu-cudnn", "gpu")
SEARCH_RUNS = 9
"""At most this many runs per search: from the prediction, steps of 10% to a bracket, then halving it."""
REHEARSAL_DEVICE_BYTES = 16 * GiB
"""The stand-in device of the rehearsal: small, so that the searches' batches fit this machine's memory."""
REHEARSAL_LEAVE = {"caffe_lenet": 2 * GiB, "caffe_alexnet": 4 * GiB}
ITERATIONS_AT_MOST = 100000
HOLD_SECONDS = 1.0
"""A run is stopped (SIGINT, which `caffe train` takes as "stop") once it has logged its second iteration and its
device bytes (the probe's live count) have not grown for this long, NVML polled throughout: the peak, reached
after the first test pass and iteration, lasts while NVML reads it, however fast the net's iterations are."""
OOM_MARKERS = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_INTERNAL_ERROR",
               "CUDNN_STATUS_EXECUTION_FAILED", "CUBLAS_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation", "bad_alloc")
HOST_PINNED_SOURCE = "syncedmem.hpp"
"""Where CaffeMallocHost's CUDA_CHECK(cudaMallocHost(...)) fails: "out of memory" in CUDA's words, but of pinned host
memory, not the device's (in GPU mode every host copy of a blob is pinned)."""


# ---------------------------------------------------------------------------------------------------- prepare


def _dummy_data(layer: Any, shapes: list[tuple[int, ...]]) -> Any:
    """A DummyData layer standing for data layer `layer`: same name, tops and rules, constant tops of `shapes`."""
    from digits_memplugin.core.proto import caffe_pb2

    dummy = caffe_pb2.LayerParameter()
    dummy.name, dummy.type = layer.name, "DummyData"
    dummy.top.extend(layer.top)
    for rule in layer.include:
        dummy.include.add().CopyFrom(rule)
    for rule in layer.exclude:
        dummy.exclude.add().CopyFrom(rule)
    for shape in shapes:
        dummy.dummy_data_param.shape.add().dim.extend(shape)
        filler = dummy.dummy_data_param.data_filler.add()
        filler.type, filler.value = "constant", 0.0  # filled once at set-up, never refilled
    return dummy


def _fed_by_dummy_data(param: Any, net: Any, train_batch: int | None) -> Any:
    """A copy of NetParameter `param` whose data layers of `net`'s phase are DummyData of the shapes `net` (built by
    the estimator) gives their tops; with `train_batch`, the first dim becomes BATCH_TOKEN."""
    from digits_memplugin.core.proto import caffe_pb2

    built = {layer.name: layer for layer in net.layers if not layer.bottoms}
    copy = caffe_pb2.NetParameter()
    copy.CopyFrom(param)
    layers = list(copy.layer)
    copy.ClearField("layer")
    for layer in layers:
        source = built.get(layer.name)
        if source is not None and layer.type in ("Data", "ImageData", "HDF5Data", "WindowData", "MemoryData"):
            shapes = [net.blobs[top].shape for top in source.tops]
            if train_batch is not None:
                shapes = [(BATCH_TOKEN, *shape[1:]) for shape in shapes]
            copy.layer.add().CopyFrom(_dummy_data(layer, shapes))
        else:
            copy.layer.add().CopyFrom(layer)
    return copy


def _solver_text(definition: Any) -> str:
    """The solver of one run: the zoo solver's type and settings, the bundle's nets, a test pass at start, then
    iterations until the check stops it (SIGINT: Caffe's "stop"), GPU mode, nothing written."""
    from google.protobuf import text_format

    from digits_memplugin.core.proto import caffe_pb2

    solver = caffe_pb2.SolverParameter()
    if definition.solver is not None:
        solver.CopyFrom(definition.solver)
    for field in ("net", "net_param", "train_net", "train_net_param", "test_net", "test_net_param", "test_state",
                  "test_iter", "train_state"):
        solver.ClearField(field)
    solver.train_net = "train.prototxt"
    if definition.train.state is not None:
        solver.train_state.CopyFrom(definition.train.state)
    for index, test in enumerate(definition.tests):
        solver.test_net.append(f"test{index}.prototxt")
        solver.test_iter.append(1)
        if test.state is not None:
            solver.test_state.add().CopyFrom(test.state)
    if definition.tests:
        solver.test_interval = 1000
        solver.test_initialization = True
    solver.max_iter = ITERATIONS_AT_MOST  # the check stops it with SIGINT once NVML has read the peak
    solver.display = 1
    solver.snapshot = 0
    solver.snapshot_after_train = False
    solver.snapshot_prefix = "snapshot"
    solver.solver_mode = caffe_pb2.SolverParameter.GPU
    if not solver.HasField("base_lr"):
        solver.base_lr = 0.01
    if not solver.HasField("lr_policy"):
        solver.lr_policy = "fixed"
    return text_format.MessageToString(solver)


def net_templates(case: Any, engine: str) -> dict[str, Any]:
    """The bundle's nets of zoo case `case` for `engine`: the train net (its batch BATCH_TOKEN), the test nets at
    their own batch, the solver."""
    from google.protobuf import text_format
    from gpu_standin import with_engine

    from digits_memplugin.core.training import fill_num_classes, training_definition

    net_text, solver_text = case.texts()
    definition = training_definition(net_text, solver_text, net_source=case.net)
    if case.classes:
        fill_num_classes(definition, case.classes)
    train, tests = definition.build(batch=case.batches[0], data_shapes=case.data_shapes)
    texts = {
        "train": text_format.MessageToString(with_engine(_fed_by_dummy_data(definition.train.param, train, 1), engine)),
        "tests": [
            text_format.MessageToString(with_engine(_fed_by_dummy_data(test_def.param, test_net, None), engine))
            for test_def, test_net in zip(definition.tests, tests)
        ],
        "solver": _solver_text(definition),
    }
    if str(BATCH_TOKEN) not in texts["train"]:
        raise RuntimeError(f"{case.name}: no data layer in the train net to take the batch")
    return texts


def _library_closure(binaries: list[Path]) -> dict[str, Path]:
    """Every library the binaries load, by soname, as ldd resolves them here, less the CUDA libraries (the GPU
    machine's own) and the kernel's vDSO."""
    found: dict[str, Path] = {}
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=60).stdout
        for line in out.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                found[parts[0]] = Path(parts[2])
            elif parts and parts[0].startswith("/") and "ld-linux" in parts[0]:
                found[Path(parts[0]).name] = Path(parts[0])
    cuda = ("libcudart", "libcublas", "libcurand", "libcudnn", "libcuda.", "libnvidia")
    return {name: path for name, path in found.items() if not name.startswith(cuda)}


def prepare(out: Path) -> int:
    """Build the bundle under `out` and say what it weighs against the carry limit."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(HERE))
    from gpu_standin import CUDA_ROOT, standin_libraries
    from zoo_cases import CASES_BY_NAME

    from digits_memplugin.core.memory import DEFAULT_CUDA_CONTEXT_BYTES

    if not (CUDA_ROOT / "build-info.json").is_file():
        print(f"no CUDA Caffe root in {CUDA_ROOT}: run `make install CAFFE_CUDA=1`", file=sys.stderr)
        return 2
    libraries = standin_libraries()
    if out.exists():
        shutil.rmtree(out)
    (out / "caffe/build/tools").mkdir(parents=True)
    (out / "caffe/build/lib").mkdir(parents=True)
    (out / "lib").mkdir()
    (out / "python").mkdir()
    binary, libcaffe = CUDA_ROOT / "build/tools/caffe", CUDA_ROOT / "build/lib/libcaffe.so.1.0.0"
    shutil.copy2(binary, out / "caffe/build/tools/caffe")
    shutil.copy2(libcaffe, out / "caffe/build/lib/libcaffe.so.1.0.0")
    for name, path in _library_closure([binary, libcaffe]).items():
        if name.startswith("libcaffe"):
            continue
        shutil.copy2(path, out / "lib" / name)
        if not name.startswith(("ld-linux", "libc.so", "libm.so", "libpthread", "libdl.so", "librt.so")):
            subprocess.run(["strip", "--strip-unneeded", str(out / "lib" / name)], check=False, timeout=120)
    shutil.copy2(libraries / "libdigits_memplugin_probe.so", out / "lib" / "libdigits_memplugin_probe.so")
    import pynvml

    shutil.copy2(pynvml.__file__, out / "python" / "pynvml.py")
    build_info = json.loads((CUDA_ROOT / "build-info.json").read_text())
    nets: dict[str, Any] = {}
    names = list(dict.fromkeys([name for name, _ in MEASURED] + [name for name, _, _ in SEARCHED]))
    for name in names:
        case = CASES_BY_NAME[name]
        nets[name] = {engine: net_templates(case, engine) for engine in ENGINES}
    plan = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "caffe": {key: build_info.get(key) for key in ("build_key", "cuda", "cudnn", "compute_capabilities")},
        "batch_token": BATCH_TOKEN,
        "measured": [[name, list(batches)] for name, batches in MEASURED],
        "searched": [list(entry) for entry in SEARCHED],
        "search_start": _search_starts(nets),
        "default_cuda_context_bytes": DEFAULT_CUDA_CONTEXT_BYTES,
        "nets": nets,
    }
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    sizes = {str(path.relative_to(out)): path.stat().st_size for path in sorted(out.rglob("*")) if path.is_file()}
    total = sum(sizes.values())
    for path, size in sorted(sizes.items(), key=lambda item: -item[1]):
        print(f"{size / MiB:9.2f} MiB  {path}")
    # What travels is one gzip'd tar of the folder (OpenBLAS alone is 35 MiB, 9 MiB packed).
    archive = out.parent / f"{out.name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    packed = archive.stat().st_size
    tree = _tracked_bytes()
    (out / "sizes.json").write_text(json.dumps({"total": total, "archive": packed, "tracked_tree": tree,
                                                "files": sizes}, indent=1))
    shown = archive.relative_to(REPO) if archive.is_relative_to(REPO) else archive
    print(f"{total / MiB:9.2f} MiB  in all ({total:,} bytes), {shown}: {packed / MiB:.2f} MiB "
          f"({packed:,} bytes); with the tracked tree ({tree / MiB:.2f} MiB) {(packed + tree) / MiB:.2f} MiB of "
          f"the {CARRY_LIMIT / MiB:.0f} MiB that may travel")
    return 0 if packed + tree <= CARRY_LIMIT else 1


def _tracked_bytes() -> int:
    """The bytes of the files git tracks: the working tree travels with what is carried."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    return sum((REPO / name).stat().st_size for name in listed.decode().split("\0") if name and (REPO / name).is_file())


def _search_starts(nets: dict[str, Any]) -> dict[str, Any]:
    """For each search: the estimate (engine, CUDA context included) at batch 1 and at a second batch, the two
    points of the line the device check starts from (the free memory is only known there)."""
    from digits_memplugin.core.memory import MemoryOptions
    from digits_memplugin.core.training import training_definition

    starts = {}
    for name, engine, _ in SEARCHED:
        texts = nets[name][engine]
        points = {}
        for batch in (1, 64):
            definition = training_definition(texts["train"].replace(str(BATCH_TOKEN), str(batch)), texts["solver"],
                                             load=_loader(texts), net_source=f"{name}/train.prototxt")
            report, _, _ = definition.memory(MemoryOptions(engine=engine, solver_type=definition.solver_type,
                                                           l1_regularization=definition.l1_regularization))
            points[batch] = report.total_bytes
        starts[f"{name}/{engine}"] = {"bytes_at_1": points[1], "bytes_per_item": (points[64] - points[1]) / 63}
    return starts


def _loader(texts: dict[str, Any]) -> Any:
    """Reads the files a bundle solver names (test0.prototxt...) from the templates."""

    def load(path: str) -> tuple[str, str]:
        name = Path(path).name
        if name.startswith("test") and name.endswith(".prototxt"):
            return texts["tests"][int(name[4:-9])], name
        if name == "train.prototxt":
            return texts["train"], name
        raise FileNotFoundError(path)

    return load


# ---------------------------------------------------------------------------------------------------- run


class Nvml:
    """NVML through nvidia-ml-py: the device's used memory, and a process's usedGpuMemory."""

    def __init__(self, pynvml: Any, index: int = 0) -> None:
        self.pynvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def describe(self) -> dict[str, Any]:
        n = self.pynvml
        memory = n.nvmlDeviceGetMemoryInfo(self.handle)

        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        return {"name": text(n.nvmlDeviceGetName(self.handle)), "uuid": text(n.nvmlDeviceGetUUID(self.handle)),
                "driver": text(n.nvmlSystemGetDriverVersion()), "memory_total": memory.total,
                "memory_used_at_start": memory.used}

    def device_used(self) -> int:
        return int(self.pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def device_free(self) -> int:
        return int(self.pynvml.nvmlDeviceGetMemoryInfo(self.handle).free)

    def process_used(self, pid: int) -> int | None:
        for process in self.pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if process.pid == pid:
                used = process.usedGpuMemory
                return None if used is None else int(used)
        return None


class RehearsalNvml(Nvml):
    """The rehearsal's NVML: the real nvidia-ml-py bindings over the project's fake NVML library (one GPU the size of
    the stand-in device), whose process list the monitor fills from the stand-in's live file before each query."""

    def __init__(self, pynvml: Any, device_bytes: int) -> None:
        from digits_memplugin.devices import reader as devices
        from digits_memplugin.devices.fake_nvml import FakeGpu, FakeNvml

        self.gpu = FakeGpu(name="digits-memplugin stand-in (no GPU)", uuid="GPU-5a4d1000-0000-0000-0000-000000000000",
                           pci_bus_id="00000000:18:00.0", memory_total=device_bytes)
        devices.install_library(FakeNvml([self.gpu]))
        super().__init__(pynvml)

    def show(self, pid: int | None, live_file: Path | None) -> None:
        from digits_memplugin.devices.fake_nvml import FakeProcess

        live = 0
        if live_file is not None and live_file.is_file():
            data = live_file.read_bytes()
            if len(data) >= 8:
                live = struct.unpack("<Q", data[:8])[0]
        self.gpu.processes = [FakeProcess(pid, "caffe", live)] if pid else []


class Machine:
    """Where the runs happen: the CUDA libraries, the loader, NVML, the time left."""

    def __init__(self, bundle: Path, work: Path, rehearse: bool, budget: float, own_loader: bool = False) -> None:
        self.bundle = bundle
        self.work = work
        self.rehearse = rehearse
        self.deadline = time.monotonic() + budget
        self.plan = json.loads((bundle / "plan.json").read_text())
        sys.path.insert(0, str(bundle / "python"))
        import pynvml

        if rehearse:
            sys.path.insert(0, str(HERE))
            from gpu_standin import CUDA_ROOT, standin_libraries

            self.cuda_dirs = [str(standin_libraries(CUDA_ROOT))]
            self.device_bytes = REHEARSAL_DEVICE_BYTES
            self.nvml: Nvml = RehearsalNvml(pynvml, self.device_bytes)
        else:
            self.cuda_dirs = cuda_library_dirs()
            self.nvml = Nvml(pynvml)
            self.device_bytes = self.nvml.describe()["memory_total"]
        self.loader: list[str] = []
        self.started_with = self._choose_loader(own_loader)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def env(self, run: Path, device_bytes: int | None = None) -> dict[str, str]:
        lib = str(self.bundle / "lib")
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        env.update({
            "LD_LIBRARY_PATH": os.pathsep.join([*self.cuda_dirs, str(self.bundle / "caffe/build/lib"), lib]),
            "LD_PRELOAD": str(self.bundle / "lib" / "libdigits_memplugin_probe.so"),
            "DIGITS_MEMPLUGIN_PROBE_REPORT": str(run / "probe.json"),
            "DIGITS_MEMPLUGIN_LIVE": str(run / "live"),
            "GLOG_logtostderr": "1",
            "OPENBLAS_NUM_THREADS": "4",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "0",
        })
        if self.rehearse:
            env["DIGITS_MEMPLUGIN_STANDIN_DEVICE_BYTES"] = str(device_bytes or self.device_bytes)
            env["DIGITS_MEMPLUGIN_STANDIN_REPORT"] = str(run / "standin.json")
        return env

    def command(self, *args: str) -> list[str]:
        return [*self.loader, str(self.bundle / "caffe/build/tools/caffe"), *args]

    def _choose_loader(self, own_loader: bool) -> str:
        """The machine's own loader when the binary starts with it (unless `own_loader`), else the bundle's, with
        the bundle's C library."""
        probe = self.work / "version"
        probe.mkdir(parents=True, exist_ok=True)
        env = self.env(probe)
        env.pop("LD_PRELOAD")
        first = subprocess.run(self.command("--version"), capture_output=True, text=True, timeout=120, env=env,
                               check=False)
        if first.returncode == 0 and not own_loader:
            return "the machine's loader"
        loaders = sorted((self.bundle / "lib").glob("ld-linux*.so*"))
        if not loaders:
            raise RuntimeError(f"caffe does not start and the bundle has no loader:\n{first.stderr[-2000:]}")
        self.loader = [str(loaders[0]), "--library-path", env["LD_LIBRARY_PATH"]]
        second = subprocess.run(self.command("--version"), capture_output=True, text=True, timeout=120, env=env,
                                check=False)
        if second.returncode != 0:
            raise RuntimeError(f"caffe starts with neither loader:\n{first.stderr[-1500:]}\n{second.stderr[-1500:]}")
        why = "asked for" if first.returncode == 0 else (first.stderr.strip().splitlines() or ["failed"])[-1][:200]
        return f"the bundle's loader ({why})"


def cuda_library_dirs() -> list[str]:
    """The folders of the CUDA runtime, cuBLAS, cuRAND and cuDNN in this Python's nvidia-* packages (CUDA 13's
    layout nvidia/cu13/lib, or one folder per package), else the system's."""
    wanted = ("libcudart.so.13", "libcublas.so.13", "libcurand.so.10", "libcudnn.so.9")
    found: dict[str, str] = {}
    roots = []
    try:
        import nvidia  # namespace package of the pip wheels

        roots = [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    for root in roots:
        for library in wanted:
            for path in sorted(root.glob(f"*/lib/{library}")) + sorted(root.glob(f"*/*/lib/{library}")):
                found.setdefault(library, str(path.parent))
    for library in wanted:
        if library not in found:
            for folder in ("/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"):
                if (Path(folder) / library).exists():
                    found[library] = folder
                    break
    missing = [library for library in wanted if library not in found]
    if missing:
        raise RuntimeError(f"no {', '.join(missing)} in this Python's nvidia packages ({roots}) or the system")
    return list(dict.fromkeys(found.values()))


def _oom_lines(log: str) -> list[str]:
    """glog's F lines and every line naming an out-of-memory, as Caffe wrote them."""
    lines = [line for line in log.splitlines() if line.startswith("F") or any(m in line for m in OOM_MARKERS)]
    return lines[:12]


def _oom_kind(log: str) -> str | None:
    """"device", "host_pinned" (CaffeMallocHost's cudaMallocHost), or None when the log shows no out-of-memory."""
    found = [line for line in log.splitlines() if any(m in line for m in OOM_MARKERS)]
    if not found:
        return None
    return "host_pinned" if all(HOST_PINNED_SOURCE in line for line in found) else "device"


def _live_peak(path: Path) -> int | None:
    """The peak device bytes the probe (or the stand-in) keeps in the live file, None before it exists."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return struct.unpack("<QQ", data[:16])[1] if len(data) >= 16 else None


def run_caffe(machine: Machine, name: str, engine: str, batch: int, device_bytes: int | None = None,
              timeout: float = 180) -> dict[str, Any]:
    """One run: the net at `batch`, Caffe training in GPU mode while NVML is polled, stopped once its peak has held
    (HOLD_SECONDS); what it used, or how it failed."""
    texts = machine.plan["nets"][name][engine]
    run = machine.work / f"{name}-{engine}-{batch}"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    (run / "train.prototxt").write_text(texts["train"].replace(str(machine.plan["batch_token"]), str(batch)))
    for index, test in enumerate(texts["tests"]):
        (run / f"test{index}.prototxt").write_text(test)
    (run / "solver.prototxt").write_text(texts["solver"])
    log_path, live_path = run / "caffe.log", run / "live"
    started = time.monotonic()
    peak_process, peak_device, polls, stopped, timed_out = 0, 0, 0, False, False
    with open(log_path, "w") as log:
        baseline = machine.nvml.device_used() if not machine.rehearse else 0
        process = subprocess.Popen(machine.command("train", "--solver=solver.prototxt", "--gpu=0"), cwd=run,
                                   env=machine.env(run, device_bytes), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        last_peak, steady_since = None, time.monotonic()
        while process.poll() is None:
            now = time.monotonic()
            if now - started > timeout:
                os.killpg(process.pid, signal.SIGKILL)
                timed_out = True
                break
            if isinstance(machine.nvml, RehearsalNvml):
                machine.nvml.show(process.pid, live_path)
            used = machine.nvml.process_used(process.pid)
            if used is not None:
                peak_process = max(peak_process, used)
            peak_device = max(peak_device, machine.nvml.device_used() - baseline)
            polls += 1
            peak = _live_peak(live_path)
            if peak != last_peak:
                last_peak, steady_since = peak, now
            elif not stopped and now - steady_since >= HOLD_SECONDS and "Iteration 2, " in log_path.read_text(
                    errors="replace"):
                os.kill(process.pid, signal.SIGINT)  # Caffe's "stop": it ends the solve and exits 0
                stopped = True
            time.sleep(0.01)
        process.wait()
    if isinstance(machine.nvml, RehearsalNvml):
        machine.nvml.show(None, None)
    log_text = log_path.read_text(errors="replace")
    probe = json.loads((run / "probe.json").read_text()) if (run / "probe.json").is_file() else None
    result: dict[str, Any] = {
        "net": name, "engine": engine, "batch": batch, "returncode": process.returncode, "timed_out": timed_out,
        "seconds": round(time.monotonic() - started, 2), "trained": process.returncode == 0 and not timed_out,
        "stopped_at_peak": stopped, "iterations": log_text.count(", loss = ") - 1,
        "nvml_process_peak_bytes": peak_process or None, "nvml_device_used_peak_bytes": peak_device or None,
        "nvml_polls": polls,
    }
    if probe is not None:
        workspace = sum(site["live_at_peak"] for site in probe["sites"] if site["workspace"])
        result.update({
            "probe_peak_bytes": probe["peak_device_bytes"],
            "probe_peak_bytes_without_workspace": probe["peak_device_bytes_without_workspace"],
            "probe_workspace_at_peak_bytes": workspace,
            "memgetinfo_peak_used_bytes": probe.get("peak_memgetinfo_used_bytes"),
            "memgetinfo_total_bytes": probe.get("memgetinfo_total_bytes"),
            "failed_allocations": probe["failed_allocations"],
        })
    if probe is not None:
        result["host_pinned_peak_bytes"] = probe["peak_host_pinned_bytes"]
    if not result["trained"]:
        kind = None if timed_out else _oom_kind(log_text)
        result["oom"] = kind == "device"
        result["oom_kind"] = kind
        result["oom_lines"] = _oom_lines(log_text)
        result["log_tail"] = log_text.splitlines()[-25:]
    shutil.rmtree(run, ignore_errors=True)
    return result


class Ballast:
    """A separate CUDA process holding device memory until closed, so that `leave` bytes stay free (by NVML)."""

    SCRIPT = r"""
import ctypes, sys
cudart = ctypes.CDLL(sys.argv[1])
leave, held, chunk, ptrs = int(sys.argv[2]), 0, 1 << 30, []
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
while chunk >= (1 << 20):
    cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    if free.value - chunk < leave:
        chunk //= 2
        continue
    p = ctypes.c_void_p()
    if cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(chunk)) != 0:
        chunk //= 2
        continue
    ptrs.append(p)
    held += chunk
cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
print(held, free.value, flush=True)
sys.stdin.read()
"""

    def __init__(self, machine: Machine, leave: int) -> None:
        cudart = next(str(Path(d) / "libcudart.so.13") for d in machine.cuda_dirs if (Path(d) / "libcudart.so.13").exists())
        self.process = subprocess.Popen([sys.executable, "-c", self.SCRIPT, cudart, str(leave)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline().split()
        if len(line) != 2:
            self.close()
            raise RuntimeError("the ballast process did not report what it holds")
        self.held, self.free = int(line[0]), int(line[1])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def search(machine: Machine, name: str, engine: str, leave: int | None) -> dict[str, Any]:
    """The largest batch that trains, bracketed by real failures from the estimate's prediction."""
    ballast = None
    device_bytes = None
    note = "the whole device"
    if machine.rehearse:
        leave = REHEARSAL_LEAVE.get(name, leave)
        device_bytes = leave or machine.device_bytes
        free = device_bytes
        note = f"a stand-in device of {device_bytes / GiB:.1f} GiB"
    elif leave is not None:
        ballast = Ballast(machine, leave)
        free = machine.nvml.device_free()
        note = f"a ballast process holding {ballast.held / GiB:.1f} GiB, {free / GiB:.2f} GiB free by NVML"
    else:
        free = machine.nvml.device_free()
    start = machine.plan["search_start"][f"{name}/{engine}"]
    predicted = max(1, int((free - start["bytes_at_1"]) / start["bytes_per_item"]) + 1)
    runs: list[dict[str, Any]] = []
    fits: int | None = None
    fails: int | None = None
    try:
        batch = predicted
        while len(runs) < SEARCH_RUNS and machine.time_left() > 30:
            result = run_caffe(machine, name, engine, batch, device_bytes, timeout=240)
            runs.append(result)
            if result["trained"]:
                fits = batch if fits is None else max(fits, batch)
            elif result.get("oom"):
                fails = batch if fails is None else min(fails, batch)
            else:
                break  # neither trained nor out of device memory (host pinned memory, a CHECK): the log says why
            if fits is not None and fails is not None:
                if fails - fits <= max(1, fits // 200):
                    break
                batch = (fits + fails) // 2
            elif fails is None:
                batch = max(batch + 1, int(batch * 1.1))
            else:
                batch = max(1, int(batch / 1.1))
    finally:
        if ballast is not None:
            ballast.close()
    oom = next((r for r in runs if r.get("oom")), None)
    return {
        "net": name, "engine": engine, "memory": note, "free_bytes_at_start": free, "predicted": predicted,
        "largest_trained": fits, "smallest_failed": fails, "runs": runs,
        "oom_lines": oom["oom_lines"] if oom else [],
        "exact": fits is not None and fails is not None and fails - fits == 1,
    }


def unpacked(bundle: Path, work: Path) -> Path:
    """The bundle folder: `bundle` itself, or a .tar.gz of it unpacked under `work`."""
    if bundle.is_dir():
        return bundle
    with tarfile.open(bundle, "r:gz") as tar:
        members = tar.getmembers()
        for member in members:  # the bundle is ours, but never write outside the work folder
            if member.name.startswith("/") or ".." in Path(member.name).parts:
                raise RuntimeError(f"{bundle}: unsafe path {member.name!r}")
        if hasattr(tarfile, "data_filter"):  # Python 3.12 (and 3.11.4+): the safe filter, said outright
            tar.extractall(work / "bundle", members=members, filter="data")
        else:
            tar.extractall(work / "bundle", members=members)
    folders = [p for p in (work / "bundle").iterdir() if p.is_dir()]
    if len(folders) != 1 or not (folders[0] / "plan.json").is_file():
        raise RuntimeError(f"{bundle} does not hold one bundle folder with a plan.json")
    return folders[0]


def run_all(args: argparse.Namespace) -> int:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="device-check-"))
    machine = Machine(unpacked(args.bundle, work), work, args.rehearse, args.budget, args.bundle_loader)
    describe = machine.nvml.describe()
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "rehearsal": args.rehearse,
        "note": ("REHEARSAL under the stand-in CUDA runtime (no GPU): device figures are what Caffe asked the "
                 "stand-in for, NVML is the project's fake library fed by the stand-in, the searches run on a small "
                 "stand-in device; nothing here was measured on a GPU") if args.rehearse else
                ("measured on a GPU: NVML per process and device, the probe's cudaMalloc count and cudaMemGetInfo"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": {"host": platform.node(), "python": platform.python_version(), "gpu": describe,
                    "cuda_library_dirs": machine.cuda_dirs, "caffe_started_with": machine.started_with},
        "plan": {key: machine.plan[key] for key in ("created", "caffe", "measured", "searched", "search_start",
                                                    "default_cuda_context_bytes", "batch_token")},
        "nets": machine.plan["nets"],
        "runs": [],
        "searches": [],
        "skipped": [],
    }

    def save() -> None:
        report["seconds"] = round(time.monotonic() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))

    only = set(args.only.split(",")) if args.only else None
    measured = [(n, b) for n, b in machine.plan["measured"] if only is None or n in only]
    searched = [s for s in machine.plan["searched"] if only is None or s[0] in only]
    key_nets = {s[0] for s in searched}
    order = [m for m in measured if m[0] in key_nets] + [("search", s) for s in searched] + \
            [m for m in measured if m[0] not in key_nets]
    try:
        for name, what in order:
            if name == "search":
                if machine.time_left() < 60:
                    report["skipped"].append(f"search {what[0]}: out of time")
                    continue
                result = search(machine, *what)
                report["searches"].append(result)
                print(f"search {what[0]} {what[1]}: predicted {result['predicted']}, trained up to "
                      f"{result['largest_trained']}, failed from {result['smallest_failed']}", flush=True)
            else:
                for batch in what:
                    for engine in ENGINES:
                        if machine.time_left() < 20:
                            report["skipped"].append(f"{name} {engine} {batch}: out of time")
                            continue
                        result = run_caffe(machine, name, engine, batch)
                        report["runs"].append(result)
                        print(f"{name} {engine} {batch}: trained={result['trained']} "
                              f"nvml={result['nvml_process_peak_bytes']} probe={result.get('probe_peak_bytes')} "
                              f"{result['seconds']} s", flush=True)
            save()
    finally:
        save()
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out} ({report['seconds']} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="build the bundle (the project's environment)")
    p.add_argument("--out", type=Path, default=BUNDLE)
    r = sub.add_parser("run", help="run the check (on the GPU machine, or --rehearse here)")
    r.add_argument("--bundle", type=Path, default=ARCHIVE, help="the bundle's .tar.gz, or its folder")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget", type=float, default=420.0, help="seconds for all runs (default 420)")
    r.add_argument("--rehearse", action="store_true", help="the stand-in CUDA runtime and a fake NVML, no GPU")
    r.add_argument("--only", help="comma-separated net names")
    r.add_argument("--bundle-loader", action="store_true",
                   help="start caffe with the bundle's loader and C library even where the machine's would do")
    args = parser.parse_args()
    if args.command == "prepare":
        return prepare(args.out)
    return run_all(args)


if __name__ == "__main__":
    raise SystemExit(main())
