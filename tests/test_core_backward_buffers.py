"""Which internal buffers a layer rule lists, by phase, by whether backward runs, and by engine (issue 13): the
inner layers that get a copy of a LayerParameter, and the buffers only Backward touches. The byte counts against
pycaffe are in test_core_accuracy.py; these are the fast checks of each condition, the GPU engines' included
(this pycaffe build has no GPU to measure them)."""

from __future__ import annotations

import pytest

from digits_memplugin.core.layers.base import ENGINE_CPU, ENGINE_CUDNN, ENGINE_GPU
from digits_memplugin.core.memory import (
    CPU_ALLOCATION_OVERHEAD,
    CPU_MMAP_THRESHOLD,
    MemoryOptions,
    _allocation,
    net_memory,
)
from digits_memplugin.core.net import build_net
from digits_memplugin.core.prototxt import parse_net

INPUT = """
layer { name: "x" type: "Input" top: "x" top: "label" top: "target"
        input_param { shape { dim: 2 dim: 4 dim: 5 dim: 5 } shape { dim: 2 dim: 1 dim: 5 dim: 5 }
                      shape { dim: 2 dim: 4 dim: 5 dim: 5 } } }
"""
COUNT = 2 * 4 * 5 * 5


def buffers(text: str, layer: str, phase: str = "TRAIN", engine: str = ENGINE_CPU) -> dict[str, int]:
    """The buffers `layer` lists as the memory model counts them (host-only ones left out on a GPU)."""
    net = build_net(parse_net(INPUT + text), phase)
    memory = next(m for m in net_memory(net, MemoryOptions(engine=engine)) if m.name == layer)
    return {buffer.name: buffer.count for buffer in memory.buffers}


SOFTMAX_LOSS = 'layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" top: "loss" {} }}\n'


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("extra", ["", "loss_weight: 3"])
def test_softmax_loss_prob_diff_in_every_net(phase: str, extra: str) -> None:
    assert buffers(SOFTMAX_LOSS.format(extra), "loss", phase)["prob.diff"] == COUNT


def test_softmax_loss_prob_diff_not_with_a_zero_weight() -> None:
    assert "prob.diff" not in buffers(SOFTMAX_LOSS.format("loss_weight: 0"), "loss")


def test_softmax_loss_prob_diff_when_insert_splits_moved_the_weight() -> None:
    """The loss also feeds a layer: the Split gets the weight, this layer's is cleared, and LossLayer::LayerSetUp
    adds its 1 again, which the inner Softmax copies."""
    text = SOFTMAX_LOSS.format("loss_weight: 2") + 'layer { name: "p" type: "Power" bottom: "loss" top: "p" }\n'
    assert buffers(text, "loss")["prob.diff"] == COUNT


@pytest.mark.parametrize("engine", [ENGINE_GPU, ENGINE_CUDNN])
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("extra", ["", "loss_weight: 0"])
def test_softmax_loss_prob_diff_is_device_memory_on_a_gpu(engine: str, phase: str, extra: str) -> None:
    """Forward_gpu counts the valid labels in prob_.mutable_gpu_diff() (softmax_loss_layer.cu), in every net and
    whatever the weight; SetLossWeights' host copy is pinned host memory beside it. Measured by the stand-in CUDA
    runtime (tests/test_gpu_standin.py): LeNet's estimate is byte for byte what Caffe asks the device for."""
    assert buffers(SOFTMAX_LOSS.format(extra), "loss", phase, engine)["prob.diff"] == COUNT


@pytest.mark.parametrize("engine", [ENGINE_GPU, ENGINE_CUDNN])
def test_softmax_loss_forward_takes_its_input_gradient_on_a_gpu_in_every_net(engine: str) -> None:
    """Forward_gpu keeps the per-item losses in bottom[0]->mutable_gpu_diff(): in the TEST net too, where no
    backward runs; on the CPU the TEST net has no gradients."""
    text = CONV.format("").replace("num_output: 4", "num_output: 3").replace('top: "conv"', 'top: "ip"')
    text = text.replace('name: "conv"', 'name: "ip"')
    text += 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n'

    def diffs(engine: str) -> int:
        net = build_net(parse_net(INPUT + text), "TEST")
        memory = next(m for m in net_memory(net, MemoryOptions(engine=engine)) if m.name == "ip")
        return memory.categories["activation_diffs"]

    assert diffs(engine) == 2 * 3 * 5 * 5 * 4 and diffs(ENGINE_CPU) == 0


@pytest.mark.parametrize("engine", [ENGINE_GPU, ENGINE_CUDNN])
def test_an_accuracy_and_a_zero_weight_loss_stay_on_the_host_on_a_gpu(engine: str) -> None:
    """Accuracy has no GPU code and a loss writes its scalar with mutable_cpu_data(): an output nothing reads on
    the device, and Layer::Forward does not weigh (loss weight 0), never reaches it."""
    text = ('layer { name: "acc" type: "Accuracy" bottom: "x" bottom: "label" top: "acc" }\n'
            'layer { name: "l2" type: "EuclideanLoss" bottom: "x" bottom: "target" top: "l2" loss_weight: 0 }\n'
            'layer { name: "l1" type: "EuclideanLoss" bottom: "x" bottom: "target" top: "l1" }\n')
    net = build_net(parse_net(INPUT + text), "TEST")

    def activations(engine: str) -> dict[str, int]:
        return {m.name: m.categories["activations"] for m in net_memory(net, MemoryOptions(engine=engine))}

    assert activations(engine)["acc"] == 0 and activations(engine)["l2"] == 0
    assert activations(engine)["l1"] == 4  # weighed by Layer::Forward: gpu_data
    assert activations(ENGINE_CPU)["acc"] > 0 and activations(ENGINE_CPU)["l2"] > 0


SIGMOID_LOSS = 'layer {{ name: "loss" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "target" top: "loss" {} }}\n'


@pytest.mark.parametrize(
    ("extra", "expected"),
    [("", False), ("loss_weight: 1", True), ("loss_weight: 0", False), ("loss_weight: 0.5", True)],
)
def test_sigmoid_loss_output_diff_only_with_a_written_weight(extra: str, expected: bool) -> None:
    for phase in ("TRAIN", "TEST"):
        assert ("sigmoid_output.diff" in buffers(SIGMOID_LOSS.format(extra), "loss", phase)) is expected


def test_sigmoid_loss_output_diff_not_when_insert_splits_moved_the_weight() -> None:
    text = SIGMOID_LOSS.format("loss_weight: 1") + 'layer { name: "p" type: "Power" bottom: "loss" top: "p" }\n'
    assert "sigmoid_output.diff" not in buffers(text, "loss")


LRN_DIFFS = {"product_input.diff", "square_input.diff", "square_output.diff", "pool_output.diff", "power_output.diff"}
LRN = 'layer {{ name: "norm" type: "LRN" bottom: "{}" top: "norm" lrn_param {{ norm_region: WITHIN_CHANNEL }} }}\n'
TAIL = 'layer { name: "loss" type: "EuclideanLoss" bottom: "norm" bottom: "target" top: "loss" }\n'
CONV = 'layer {{ name: "conv" type: "Convolution" bottom: "x" top: "conv" {} convolution_param {{ num_output: 4 kernel_size: 1 }} }}\n'


@pytest.mark.parametrize(
    ("below", "bottom", "phase", "backward"),
    [
        ("", "x", "TRAIN", False),
        (CONV.format("param { lr_mult: 0 } param { lr_mult: 0 }"), "conv", "TRAIN", False),
        (CONV.format(""), "conv", "TRAIN", True),
        (CONV.format(""), "conv", "TEST", False),
    ],
    ids=["on_data", "behind_frozen", "learning", "test_net"],
)
@pytest.mark.parametrize("engine", [ENGINE_CPU, ENGINE_GPU])
def test_lrn_within_channel_gradients_only_where_backward_runs(
    below: str, bottom: str, phase: str, backward: bool, engine: str
) -> None:
    listed = buffers(below + LRN.format(bottom) + TAIL, "norm", phase, engine)
    assert {"square_output", "pool_output", "power_output"} <= set(listed)
    assert (LRN_DIFFS & set(listed)) == (LRN_DIFFS if backward else set())


def test_lrn_within_channel_gradients_with_force_backward() -> None:
    listed = buffers("force_backward: true\n" + LRN.format("x") + TAIL, "norm")
    assert set(listed) >= LRN_DIFFS


BATCH_NORM = 'layer {{ name: "bn" type: "BatchNorm" bottom: "{0}" top: "{0}" }}\n'


def test_batch_norm_x_norm_diff_only_in_place_and_in_backward() -> None:
    under_loss = BATCH_NORM.format("x") + 'layer { name: "loss" type: "EuclideanLoss" bottom: "x" bottom: "target" }\n'
    assert "x_norm.diff" in buffers(under_loss, "bn")
    assert "x_norm.diff" not in buffers(under_loss, "bn", "TEST")
    off_the_loss = BATCH_NORM.format("target") + 'layer { name: "s" type: "Silence" bottom: "target" }\n'
    assert "x_norm.diff" not in buffers(off_the_loss, "bn")
    not_in_place = 'layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y" }\n'
    not_in_place += 'layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" }\n'
    assert "x_norm.diff" not in buffers(not_in_place, "bn")


PRELU = 'layer {{ name: "prelu" type: "PReLU" bottom: "x" top: "p" {} }}\n'
PRELU_TAIL = 'layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "target" }\n'


def test_prelu_keeps_its_slope_gradient_buffers_on_the_gpu_only_when_the_slope_learns() -> None:
    per_item = 4 * 5 * 5
    learning = buffers(PRELU.format("") + PRELU_TAIL, "prelu", engine=ENGINE_GPU)
    assert learning["backward_buff.diff"] == per_item and learning["multiplier.gpu"] == per_item
    assert "multiplier" not in learning  # set in LayerSetUp on the host
    frozen = buffers(PRELU.format("param { lr_mult: 0 }") + PRELU_TAIL, "prelu", engine=ENGINE_GPU)
    assert "backward_buff.diff" not in frozen and "multiplier.gpu" not in frozen
    assert "backward_buff.diff" not in buffers(PRELU.format("") + PRELU_TAIL, "prelu", "TEST", ENGINE_GPU)
    cpu = buffers(PRELU.format("") + PRELU_TAIL, "prelu")
    assert cpu == {"multiplier": per_item}


LSTM_UNIT = """
layer { name: "s" type: "Input" top: "c_prev" top: "gates" top: "cont" top: "c_target"
        input_param { shape { dim: 1 dim: 3 dim: 7 } shape { dim: 1 dim: 3 dim: 28 } shape { dim: 1 dim: 3 }
                      shape { dim: 1 dim: 3 dim: 7 } } }
LOWER
layer { name: "unit" type: "LSTMUnit" bottom: "c_prev" bottom: "GATES" bottom: "cont" top: "c" top: "h" }
layer { name: "loss" type: "EuclideanLoss" bottom: "c" bottom: "c_target" }
layer { name: "silence" type: "Silence" bottom: "h" }
"""


def test_lstm_unit_gate_gradient_on_the_gpu_only_when_backward_reaches_an_input() -> None:
    learned = LSTM_UNIT.replace(
        "LOWER", 'layer { name: "ip" type: "InnerProduct" bottom: "gates" top: "g" '
        "inner_product_param { num_output: 28 axis: 2 } }"
    ).replace("GATES", "g")
    assert buffers(learned, "unit", engine=ENGINE_GPU) == {"X_acts": 3 * 28, "X_acts.diff": 3 * 28}
    assert buffers(learned, "unit", "TEST", ENGINE_GPU) == {"X_acts": 3 * 28}
    on_inputs = LSTM_UNIT.replace("LOWER", "").replace("GATES", "gates")
    assert buffers(on_inputs, "unit", engine=ENGINE_GPU) == {"X_acts": 3 * 28}
    assert buffers(learned, "unit") == {}


def test_cpu_allocations_from_the_mmap_threshold_on_are_whole_pages() -> None:
    cpu = MemoryOptions()
    assert _allocation(1000, cpu) == 1000 + CPU_ALLOCATION_OVERHEAD
    # 2 MiB exactly: glibc's header makes it one page more
    assert _allocation(2 * 1024 * 1024, cpu) == 2 * 1024 * 1024 + 4096
    assert _allocation(CPU_MMAP_THRESHOLD + 1, cpu) % 4096 == 0
    # a sum of many allocations a rule added up is not one mapping
    assert _allocation(2 * 1024 * 1024, cpu, single=False) == 2 * 1024 * 1024 + CPU_ALLOCATION_OVERHEAD
    assert _allocation(2 * 1024 * 1024, MemoryOptions(engine=ENGINE_GPU)) == 2 * 1024 * 1024
