"""Caffe's own bookkeeping on the CPU engine, layer type by layer type, against the memory model's constants.

Each net is an Input, 20 layers of one type on tiny (2 x 3 x 1 x 1) blobs, and a EuclideanLoss, trained one step
with a test net of the same layers (measure.runner, as bench/accuracy.py does): its blobs are a few bytes, so what
pycaffe allocates is nearly all bookkeeping (layer objects, LayerParameter copies, Blob and SyncedMemory objects,
the solver's per-param Blobs, protobuf's descriptors). "per layer" is (measured - measured for the net without
the 20 layers) / 40, the model's the same difference of its estimate; core/cpu_bookkeeping.py's CPU_* constants were
fitted on these nets. Writes the table into docs/benchmarks.md between the `bookkeeping` markers.

    .venv/bin/python bench/bookkeeping.py [--only NAME,NAME] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from report import replace_section

from digits_memplugin.core.memory import MemoryOptions
from digits_memplugin.core.training import training_definition
from digits_memplugin.measure.runner import measure

LAYERS = 20
SOLVER = 'base_lr: 0.01 lr_policy: "fixed" test_iter: 1 test_interval: 1 max_iter: 10'
HEAD = """layer { name: "x" type: "Input" top: "x" top: "t" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 1 dim: 1 } shape { dim: 2 dim: 3 dim: 1 dim: 1 } shape { dim: 2 } } }
"""
TAIL = 'layer {{ name: "loss" type: "EuclideanLoss" bottom: "{}" bottom: "t" top: "loss" }}\n'

# name -> (a layer, formatted with its index i and its bottom; None: the net without them, chained: each layer
# takes the previous one's top "b{i-1}", else all take "x")
CHAINED = {
    "Power": 'type: "Power"',
    "ReLU (in place)": None,
    "TanH": 'type: "TanH"',
    "Concat": 'type: "Concat"',
    "Flatten": 'type: "Flatten"',
    "InnerProduct": 'type: "InnerProduct" inner_product_param { num_output: 3 }',
    "InnerProduct, no bias": 'type: "InnerProduct" inner_product_param { num_output: 3 bias_term: false }',
    "Convolution": 'type: "Convolution" convolution_param { num_output: 3 kernel_size: 1 }',
    "Deconvolution": 'type: "Deconvolution" convolution_param { num_output: 3 kernel_size: 1 }',
    "BatchNorm": 'type: "BatchNorm"',
    "Scale": 'type: "Scale"',
    "Scale, bias": 'type: "Scale" scale_param { bias_term: true }',
    "PReLU": 'type: "PReLU"',
    "Pooling": 'type: "Pooling" pooling_param { kernel_size: 1 }',
    "Dropout": 'type: "Dropout"',
    "Softmax": 'type: "Softmax"',
    "LRN": 'type: "LRN"',
    "LRN, WITHIN_CHANNEL": 'type: "LRN" lrn_param { norm_region: WITHIN_CHANNEL local_size: 1 }',
}
FANNED = {
    "Eltwise": 'type: "Eltwise" bottom: "x" bottom: "t"',
    "Slice": 'type: "Slice" bottom: "x" top: "s{i}" slice_param { slice_point: 1 }',
    "Accuracy": 'type: "Accuracy" bottom: "x" bottom: "label"',
    "SoftmaxWithLoss": 'type: "SoftmaxWithLoss" bottom: "x" bottom: "label"',
    "SigmoidCrossEntropyLoss": 'type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t"',
}


def net_text(name: str | None) -> str:
    """The calibration net for a layer type; None: the Input and the loss alone."""
    text = HEAD
    if name is None:
        return text + TAIL.format("x")
    if name == "ReLU (in place)":
        text += "".join(f'layer {{ name: "l{i}" type: "ReLU" bottom: "x" top: "x" }}\n' for i in range(LAYERS))
        return text + TAIL.format("x")
    if name in CHAINED:
        previous = "x"
        for i in range(LAYERS):
            text += f'layer {{ name: "l{i}" bottom: "{previous}" top: "b{i}" {CHAINED[name]} }}\n'
            previous = f"b{i}"
        return text + TAIL.format(previous)
    for i in range(LAYERS):
        text += f'layer {{ name: "l{i}" top: "b{i}" {FANNED[name].replace("{i}", str(i))} }}\n'
    return text + TAIL.format("x")


def run(name: str | None) -> tuple[int, int]:
    """(measured, estimated) bytes of one training step of the calibration net."""
    definition = training_definition(net_text(name), SOLVER)
    report, _, _ = definition.memory(MemoryOptions())
    with tempfile.TemporaryDirectory() as folder:
        measured = measure(definition, Path(folder), {}).allocated
    return measured, report.steady_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated layer types (the table's names)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    names = [n for n in (*CHAINED, *FANNED) if not args.only or n in args.only.split(",")]
    started = time.monotonic()
    base_measured, base_estimated = run(None)
    base_error = base_estimated - base_measured
    rows = [f"| Input + EuclideanLoss alone | {base_measured:,} | {base_estimated:,} | {base_error:+,} | | |"]
    print(rows[0], flush=True)
    for name in names:
        measured, estimated = run(name)
        row = (
            f"| {name} | {measured:,} | {estimated:,} | {estimated - measured:+,} | "
            f"{(measured - base_measured) / (2 * LAYERS):,.0f} | {(estimated - base_estimated) / (2 * LAYERS):,.0f} |"
        )
        rows.append(row)
        print(row, flush=True)
    header = [
        (f"Command: `.venv/bin/python bench/bookkeeping.py` ({len(rows)} nets, {time.monotonic() - started:.0f} s on "
         "this machine)."),
        "",
        (f"Each net: an Input, {LAYERS} layers of one type on 2 x 3 x 1 x 1 blobs and a EuclideanLoss, a train and "
         "a test net; bytes pycaffe allocated in one step (mallinfo2) against the estimate, and per layer of the "
         "type (either net) beyond the net without them."),
        "",
        "| layers | measured | estimated | error | measured per layer | estimated per layer |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "bookkeeping", "\n".join(header + rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
