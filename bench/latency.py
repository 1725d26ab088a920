"""How long the full estimate plus the max-batch search takes, beside pycaffe instantiating the same net.

For ResNet-50 (the zoo's) and ResNet-152 (generated in the same style), as training nets (Data + SoftmaxWithLoss),
in one run on one machine: our median over repeated calls, and pycaffe's median time to build the same train net
in CPU mode (caffe.Net with its Data layer swapped for an Input layer, since the dataset is not here), and the
time asking pycaffe itself takes (a child process training one step on generated data).
Writes the table into docs/benchmarks.md between the `latency` markers.

    .venv/bin/python bench/latency.py [--repeat 21] [--step-repeat 3] [--no-write]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from report import replace_section
from resnet import resnet_deploy
from zoo_cases import ZOO, as_training_net

from digits_memplugin.core.definitions import DEFINITIONS
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.training import TrainingDefinition, training_definition
from digits_memplugin.measure.runner import measure

GiB = 1024**3


def pycaffe_builder(train_text: str, item: tuple[int, ...], batch: int) -> Callable[[], float]:
    """A timer of pycaffe building the train net in CPU mode (Data swapped for Input of the same shape)."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    import caffe
    from caffe.proto import caffe_pb2
    from google.protobuf import text_format

    caffe.set_mode_cpu()
    net = caffe_pb2.NetParameter()
    text_format.Parse(train_text, net)
    data = net.layer[0]
    data.type = "Input"
    data.ClearField("data_param")
    data.input_param.shape.add().dim.extend([batch, *item])
    data.input_param.shape.add().dim.extend([batch])
    folder = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / "train.prototxt"
    path.write_text(text_format.MessageToString(net))

    def build() -> float:
        started = time.perf_counter()
        built = caffe.Net(str(path), caffe.TRAIN)
        seconds = time.perf_counter() - started
        del built
        return seconds

    return build


def pycaffe_step_seconds(train_text: str, item: tuple[int, ...], batch: int, repeat: int) -> list[float]:
    """Asking Caffe itself, as the product would without an estimate: a child process imports pycaffe, builds the
    solver on generated LMDB data and trains one step (measure.runner, which bench/accuracy.py uses), timed whole."""
    definition = training_definition(train_text)
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            measure(definition, Path(folder), {"data": item}, batch=batch)
            times.append(time.perf_counter() - started)
    return times


def estimate_once(train_text: str, item: tuple[int, ...], batch: int, cold: bool) -> tuple[float, dict]:
    """Cold: the text is parsed anew (the definition cache cleared); warm: the form's case, the same text
    estimated again at a batch it was not estimated at, the report built and the search run again."""
    if cold:
        DEFINITIONS.clear()
    request = EstimateRequest(
        net=train_text, data_shapes={"data": item}, engine="gpu-cudnn", free_bytes=16 * GiB, batch=batch
    )
    started = time.perf_counter()
    document = estimate(request)
    return time.perf_counter() - started, document


def benchmark_nets() -> dict[str, str]:
    """The training nets timed here, by name (bench/textformat_floor.sh times C++ parsing them too)."""
    return {
        "ResNet-50 (zoo)": as_training_net((ZOO / "resnet50_kaiminghe" / "ResNet-50-deploy.prototxt").read_text()),
        "ResNet-152 (generated)": as_training_net(resnet_deploy(152)),
    }


def parse_once(train_text: str) -> float:
    """text_format.Parse alone: the floor under any cold estimate (no hand-written parser, by design)."""
    from google.protobuf import text_format

    started = time.perf_counter()
    text_format.Parse(train_text, caffe_pb2.NetParameter())
    return time.perf_counter() - started


def builds_per_estimate(train_text: str, item: tuple[int, ...]) -> int:
    """How many times a cold estimate builds the nets (the report, then the search's exact evaluations)."""
    calls = 0
    memory = TrainingDefinition.memory

    def counted(self: TrainingDefinition, *args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return memory(self, *args, **kwargs)  # type: ignore[arg-type]

    DEFINITIONS.clear()
    TrainingDefinition.memory = counted  # type: ignore[method-assign,assignment]
    try:
        estimate(EstimateRequest(net=train_text, data_shapes={"data": item}, engine="gpu-cudnn", free_bytes=16 * GiB,
                                 batch=256))
    finally:
        TrainingDefinition.memory = memory  # type: ignore[method-assign]
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--step-repeat", type=int, default=3, help="times to run pycaffe's step (seconds each)")
    args = parser.parse_args()
    item = (3, 224, 224)
    nets = benchmark_nets()
    rows = []
    for name, text in nets.items():
        # Round by round, so that the machine's slow and fast spells (its speed varies by up to 2x from minute
        # to minute) fall on every column alike and the ratios hold.
        build = pycaffe_builder(text, item, batch=8)
        cold, warm, parse, theirs, document = [], [], [], [], {}
        for index in range(args.repeat):
            seconds, document = estimate_once(text, item, 256 + index, cold=True)
            cold.append(seconds)
            warm.append(estimate_once(text, item, 256 + args.repeat + index, cold=False)[0])
            parse.append(parse_once(text))
            theirs.append(build())
        builds = builds_per_estimate(text, item)
        step = pycaffe_step_seconds(text, item, batch=8, repeat=args.step_repeat)
        cold_ms, warm_ms = statistics.median(cold) * 1000, statistics.median(warm) * 1000
        parse_ms, theirs_ms = statistics.median(parse) * 1000, statistics.median(theirs) * 1000
        step_ms = statistics.median(step) * 1000
        layers = len({(layer["name"], layer["phase"]) for layer in document["layers"]})
        row = (
            f"| {name} | {layers} | {cold_ms:.1f} | {parse_ms:.1f} | {builds} | {warm_ms:.1f} | {theirs_ms:.0f} | "
            f"{theirs_ms / cold_ms:.2f}x | {theirs_ms / warm_ms:.2f}x | {theirs_ms / parse_ms:.2f}x | "
            f"{step_ms / 1000:.1f} | {step_ms / cold_ms:.0f}x | {document['max_batch_size']} |"
        )
        rows.append(row)
        print(row, flush=True)
    header = [
        (f"Command: `.venv/bin/python bench/latency.py --repeat {args.repeat} --step-repeat {args.step_repeat}` "
        "(one run, this machine, medians)."),
        "Each of the rounds times a cold estimate, a warm one, a parse and a pycaffe build in turn, so that this",
        "machine's slow spells (its speed varies by up to 2x from minute to minute) fall on every column alike.",
        "",
        "An estimate is one call of `core.estimate.estimate` for the training net (gpu-cudnn engine, 16 GiB free,",
        "wanted batch 256): shapes, memory model, max-batch search and plan; *cold* parses the prototxt too, *warm*",
        "finds it parsed (the form re-estimating the same net at another batch or for another device).",
        "\"parse ms\" is `text_format.Parse` of the same text alone, the floor under any cold estimate (the",
        "project parses with text_format and caffe_pb2, never by hand), so \"build / parse\" bounds the speed-up any",
        "such estimator could reach over the pycaffe build, cold; \"builds\" counts the times a cold estimate",
        "shapes and costs the nets: the report at 256, then the search's exact evaluations (batch 1, the fitted",
        "largest batch and the one above it, the plan's batch). `estimate` pauses Python's cyclic garbage",
        "collector while it runs (core/collector.py): a full collection walks caffe_pb2's descriptors and the parsed",
        "net, 20-40 ms, and one fell inside about a third of cold estimates; the objects left for it are collected",
        "between calls.",
        "\"pycaffe build\" is `caffe.Net(train net, TRAIN)` in CPU mode at batch 8, in the same process: it",
        "builds the layers and allocates and fills the weights, but allocates no activations (Caffe does that",
        "lazily), so it is a lower bound on asking Caffe itself, which needs a process, the import and a step too.",
        "\"pycaffe step s\" is that: a child process that imports pycaffe, builds the solver on generated LMDB data",
        f"and trains one step at batch 8, timed whole (median of {args.step_repeat}; measure.runner, as",
        "bench/accuracy.py runs it); \"step / cold\" is how much sooner the estimate answers.",
        "",
        ("| net | layers | cold ms | parse ms | builds | warm ms | pycaffe build ms | build / cold | build / warm "
        "| build / parse | pycaffe step s | step / cold | max batch |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "latency", "\n".join(header + rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
