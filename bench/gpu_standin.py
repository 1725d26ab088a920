"""The GPU truth without a GPU: the real CUDA Caffe binary trains one step in GPU mode under the stand-in CUDA runtime
(bench/standin/), which counts every device allocation Caffe asks for.

The bundled CUDA Caffe root (`make install CAFFE_CUDA=1`) runs `caffe train --gpu=0` on a solver written as the CPU
truth writes it (measure.runner.prepare_solver: synthetic LMDB/HDF5 data of the net's shapes, a test pass at start,
one training iteration), with scripts/build-standin.sh's libraries first on LD_LIBRARY_PATH. The stand-in's report
gives the peak of live device bytes, with and without the cuDNN convolutions' workspace, and every allocating caller.

What it measures is what Caffe asks the device for: never the CUDA context, the driver's rounding, what cuBLAS,
cuRAND or cuDNN allocate for themselves, or the algorithm (and so the workspace) a real cuDNN picks; the stand-in's
cuDNN answers from a stated assumption (bench/standin/cudnn.c, and the report's "cudnn" section).

Engines: `gpu` is Caffe's own GPU kernels, measured with every layer's engine set to CAFFE (the layers a build
without cuDNN has); `gpu-cudnn` keeps the nets' engines (DEFAULT: cuDNN where this build has it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from digits_memplugin.core.layers.base import ENGINE_CUDNN, ENGINE_GPU
from digits_memplugin.core.oom_signatures import fatal_line
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.training import TrainingDefinition
from digits_memplugin.measure.runner import memory_lines, prepare_solver

REPO = Path(__file__).resolve().parent.parent
CUDA_ROOT = Path(sys.prefix) / "share" / "digits-memplugin" / "caffe" / "cuda"
STANDIN_NOTE = ("stand-in CUDA runtime, no GPU: the bytes Caffe asked the device for (cudaMalloc), not the CUDA "
                "context, the driver's rounding or what the CUDA libraries allocate for themselves")

# The layer types whose engine field picks cuDNN or Caffe's own kernels, and where the field is.
ENGINE_FIELDS = {
    "Convolution": "convolution_param",
    "Pooling": "pooling_param",
    "ReLU": "relu_param",
    "Sigmoid": "sigmoid_param",
    "TanH": "tanh_param",
    "Softmax": "softmax_param",
    "SoftmaxWithLoss": "softmax_param",
    "LRN": "lrn_param",
}


class StandinError(RuntimeError):
    """The stand-in could not be built, or Caffe under it did not finish (`log`: Caffe's whole log)."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def cuda_root_installed(root: Path = CUDA_ROOT) -> bool:
    return (root / "build-info.json").is_file()


def standin_libraries(root: Path = CUDA_ROOT, timeout: float = 600) -> Path:
    """The folder of the stand-in libraries for `root`, built (once, cached) by scripts/build-standin.sh, which also
    checks that they define every CUDA entry point the root's binaries import."""
    result = subprocess.run([str(REPO / "scripts" / "build-standin.sh"), str(root)], capture_output=True, text=True,
                            timeout=timeout, check=False)
    if result.returncode != 0:
        raise StandinError(f"scripts/build-standin.sh failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def python_data_as_dummy_data(net: Any, data_shapes: Mapping[str, Any]) -> Any:
    """A copy of `net` whose Python data layers (no bottoms: FCN's VOC readers, which need the dataset and the
    module) are DummyData layers of the whole top shapes given for them, batch first; the estimator takes a Python
    layer's tops as given too."""
    copy = caffe_pb2.NetParameter()
    copy.CopyFrom(net)
    for layer in copy.layer:
        if layer.type != "Python" or len(layer.bottom):
            continue
        shapes = [data_shapes.get(f"{layer.name}/{top}") or data_shapes.get(top) for top in layer.top]
        if any(shape is None for shape in shapes):
            raise StandinError(f"no shape given for the tops of Python data layer {layer.name!r}")
        layer.type = "DummyData"
        layer.ClearField("python_param")
        for shape in shapes:
            layer.dummy_data_param.shape.add().dim.extend(shape)
            filler = layer.dummy_data_param.data_filler.add()
            filler.type, filler.value = "constant", 0.0
    return copy


def with_engine(net: Any, engine: str) -> Any:
    """A copy of `net` (a NetParameter) whose layers run as `engine` runs them: for `gpu`, engine CAFFE on every layer
    type that has an engine field (the layers a Caffe built without cuDNN has); for `gpu-cudnn`, as written."""
    copy = caffe_pb2.NetParameter()
    copy.CopyFrom(net)
    if engine == ENGINE_GPU:
        for layer in copy.layer:
            field = ENGINE_FIELDS.get(layer.type)
            if field is not None:
                param = getattr(layer, field)
                param.engine = param.CAFFE
    elif engine != ENGINE_CUDNN:
        raise ValueError(f"the stand-in measures the GPU engines, not {engine!r}")
    return copy


@dataclasses.dataclass
class StandinMeasurement:
    peak: int
    """The peak of live device bytes (cudaMalloc'd and not freed)."""
    peak_without_workspace: int
    """The peak of the same bytes less the cuDNN convolutions' workspace (allocated by CuDNNConvolutionLayer::Reshape)."""
    workspace: int
    """The workspace live at the peak."""
    by_caller: dict[str, int]
    """Device bytes live at the peak, by the Caffe function that allocated them (demangled, without arguments)."""
    host_pinned_peak: int
    memory_required_for_data: list[int]
    report: dict[str, Any]
    log: str


def _short(caller: str) -> str:
    """caffe::SyncedMemory::mutable_gpu_data() -> caffe::SyncedMemory::mutable_gpu_data"""
    return re.sub(r"\(.*$", "", caller)


def measure_standin(
    definition: TrainingDefinition,
    folder: Path,
    data_shapes: Mapping[str, Any],
    engine: str,
    batch: int | None = None,
    test_batch: int | None = None,
    root: Path = CUDA_ROOT,
    libraries: Path | None = None,
    device_bytes: int | None = None,
    timeout: float = 900.0,
) -> StandinMeasurement:
    """Train `definition` one step with the CUDA Caffe binary in GPU mode under the stand-in, and read its report."""
    libraries = libraries or standin_libraries(root)
    solver_path = prepare_solver(definition, folder, data_shapes, batch, test_batch, gpu=True)
    solver = caffe_pb2.SolverParameter()
    text_format.Parse(solver_path.read_text(), solver)
    # `caffe train` solves to max_iter (pycaffe's child steps once): one iteration after the first test pass.
    solver.max_iter = 1
    solver_path.write_text(text_format.MessageToString(solver))
    for net_path in [solver.train_net, *solver.test_net]:
        net = caffe_pb2.NetParameter()
        text_format.Parse(Path(net_path).read_text(), net)
        net = python_data_as_dummy_data(net, data_shapes)
        Path(net_path).write_text(text_format.MessageToString(with_engine(net, engine)))
    report_path = folder / "standin.json"
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(libraries), os.environ.get("LD_LIBRARY_PATH")])),
        "LD_BIND_NOW": "1",  # a CUDA entry point the stand-in lacked would fail at start, not midway
        "DIGITS_MEMPLUGIN_STANDIN_REPORT": str(report_path),
        "GLOG_logtostderr": "1",
        "GLOG_minloglevel": "0",
        "OPENBLAS_NUM_THREADS": "1",
    }
    if device_bytes is not None:
        env["DIGITS_MEMPLUGIN_STANDIN_DEVICE_BYTES"] = str(device_bytes)
    env.pop("PYTHONPATH", None)
    result = subprocess.run([str(root / "build/tools/caffe"), "train", f"--solver={solver_path}", "--gpu=0"],
                            capture_output=True, text=True, timeout=timeout, env=env, cwd=folder, check=False)
    if result.returncode != 0 or not report_path.is_file():
        fatal = fatal_line(result.stderr)
        tail = "\n".join(result.stderr.splitlines()[-15:])
        raise StandinError(f"the CUDA caffe binary under the stand-in failed (exit {result.returncode}): "
                           f"{fatal or 'no F line'}\n{tail}", result.stderr)
    if "stand-in CUDA runtime" not in result.stderr:
        raise StandinError("the caffe binary did not load the stand-in CUDA runtime (its banner is missing)")
    report = json.loads(report_path.read_text())
    by_caller: dict[str, int] = {}
    for site in report["sites"]:
        if site["kind"] == "device" and site["live_at_peak"]:
            name = _short(site["caller"])
            by_caller[name] = by_caller.get(name, 0) + site["live_at_peak"]
    workspace = sum(site["live_at_peak"] for site in report["sites"] if site["workspace"])
    return StandinMeasurement(
        peak=report["peak_device_bytes"],
        peak_without_workspace=report["peak_device_bytes_without_workspace"],
        workspace=workspace,
        by_caller=dict(sorted(by_caller.items(), key=lambda item: -item[1])),
        host_pinned_peak=report["peak_host_pinned_bytes"],
        memory_required_for_data=memory_lines(result.stderr),
        report=report,
        log=result.stderr,
    )
