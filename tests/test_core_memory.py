"""The memory model's rules, each checked on a small net: solver state per solver type (measured on pycaffe),
in-place and shared blobs, shared params, test nets sharing the train net's weights, engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from zoo_cases import CASES_BY_NAME

from digits_memplugin.core.estimator import Estimator
from digits_memplugin.core.layers.base import FLOAT_BYTES
from digits_memplugin.core.memory import SOLVER_STATE_BLOBS, MemoryOptions, _allocation, job_memory, net_memory
from digits_memplugin.core.net import build_net
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.core.training import training_definition
from digits_memplugin.measure.runner import measure

MiB = 1024 * 1024

SMALL_NET = """
name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 5 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip_a" type: "InnerProduct" bottom: "conv" top: "a" param { name: "shared_w" } param { name: "shared_b" }
        inner_product_param { num_output: 6 } }
layer { name: "ip_b" type: "InnerProduct" bottom: "conv" top: "b" param { name: "shared_w" } param { name: "shared_b" }
        inner_product_param { num_output: 6 } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "sum" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "sum" bottom: "label" top: "loss" }
"""


def small_net(phase: str = "TRAIN"):  # type: ignore[no-untyped-def]
    return build_net(parse_net(SMALL_NET), phase)


def test_in_place_tops_share_the_blob_and_splits_get_their_own_diffs() -> None:
    net = small_net()
    names = [blob.name for blob in net.blobs]
    assert names.count("conv") == 1  # ReLU in place
    split = [layer for layer in net.layers if layer.type == "Split"]
    assert [layer.name for layer in split] == ["conv_relu_0_split"]
    memory = {m.name: m.categories for m in net_memory(net, MemoryOptions())}
    conv_bytes = 4 * 5 * 6 * 6 * FLOAT_BYTES + 16  # one allocation (CPU chunk overhead 16)
    assert memory["conv"]["activations"] == conv_bytes
    assert memory["relu"].get("activations", 0) == 0
    # the split's two tops share conv's data but each has a diff
    assert memory["conv_relu_0_split"]["activation_diffs"] == 2 * conv_bytes
    assert memory["conv_relu_0_split"].get("activations", 0) == 0


def test_params_shared_by_name_are_counted_once() -> None:
    memory = {m.name: m.categories for m in net_memory(small_net(), MemoryOptions())}
    weight = 6 * 5 * 6 * 6 * FLOAT_BYTES + 16
    bias = 6 * FLOAT_BYTES + 16
    assert memory["ip_a"]["params"] == weight + bias
    assert memory["ip_b"].get("params", 0) == 0
    assert memory["ip_b"].get("param_diffs", 0) == 0


@pytest.mark.parametrize("solver_type", sorted(SOLVER_STATE_BLOBS))
def test_solver_history_per_solver_and_engine(solver_type: str) -> None:
    net = small_net()
    param_bytes = sum(m.categories.get("params", 0) for m in net_memory(net, MemoryOptions()))
    for engine, key in (("cpu", "cpu"), ("gpu", "gpu"), ("gpu-cudnn", "gpu")):
        options = MemoryOptions(engine=engine, solver_type=solver_type)
        history = sum(m.categories.get("solver_history", 0) for m in net_memory(net, options))
        per_param = param_bytes if engine == "cpu" else param_bytes - 16 * 4  # no malloc overhead on the GPU
        assert history == SOLVER_STATE_BLOBS[solver_type][key] * per_param


def test_test_nets_share_the_train_nets_params() -> None:
    case = CASES_BY_NAME["caffe_lenet"]
    definition = training_definition(*case.texts())
    train, tests = definition.build(batch=8, data_shapes=case.data_shapes)
    report = job_memory(train, tests, MemoryOptions())
    test_params = sum(m.categories.get("params", 0) for m in report.layers if m.phase == "TEST")
    train_params = sum(m.categories.get("params", 0) for m in report.layers if m.phase == "TRAIN")
    assert test_params == 0
    assert train_params == sum(_allocation(p.count * FLOAT_BYTES, MemoryOptions()) for p in train.params)
    # The test net has no diffs but its loss top, whose diff holds the loss weight (Layer::SetLossWeights).
    test_diffs = sum(m.categories.get("activation_diffs", 0) for m in report.layers if m.phase == "TEST")
    assert test_diffs == FLOAT_BYTES + 16


def test_gpu_engines_leave_out_host_memory_and_add_the_context() -> None:
    case = CASES_BY_NAME["caffe_lenet"]
    definition = training_definition(*case.texts())
    train, tests = definition.build(batch=8, data_shapes=case.data_shapes)
    cpu = job_memory(train, tests, MemoryOptions(engine="cpu"))
    gpu = job_memory(train, tests, MemoryOptions(engine="gpu", cuda_context_bytes=123 * MiB))
    cudnn = job_memory(train, tests, MemoryOptions(engine="gpu-cudnn", cuda_context_bytes=123 * MiB))
    assert gpu.categories["context"] == 123 * MiB
    # the data reader's queue of raw Datums is host memory: on a GPU only the prefetch batches count
    assert gpu.categories["data_prefetch"] < cpu.categories["data_prefetch"]
    # cuDNN convolutions keep no im2col buffer, but a workspace; cuDNN pooling no max index
    assert cudnn.categories["workspace"] > 0 and gpu.categories["workspace"] == 0
    assert cudnn.categories["layer_buffers"] < gpu.categories["layer_buffers"]
    assert any("CUDA context" in line for line in gpu.assumptions)


@pytest.mark.slow
@pytest.mark.parametrize("solver_type", ["Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
def test_solver_state_matches_pycaffe(solver_type: str, tmp_path: Path) -> None:
    """Each solver's CPU path touches a different number of param-sized blobs: measured, not assumed."""
    case = CASES_BY_NAME["caffe_lenet"]
    net, solver = case.texts()
    if solver_type in ("AdaGrad", "RMSProp"):
        solver = solver.replace("momentum: 0.9", "")  # Caffe refuses momentum with these two
    solver += f'\ntype: "{solver_type}"\n' + ('delta: 1e-6\n' if solver_type in ("AdaDelta", "AdaGrad") else "")
    if solver_type in ("AdaDelta",):
        solver = solver.replace("base_lr: 0.01", "base_lr: 1.0")
    definition = training_definition(net, solver)
    report, _, _ = definition.memory(MemoryOptions(solver_type=solver_type), batch=8, data_shapes=case.data_shapes)
    measured = measure(definition, tmp_path, case.data_shapes, batch=8).allocated
    error = report.total_bytes - measured
    assert abs(error) <= max(0.01 * measured, MiB), (solver_type, report.total_bytes, measured)


RESHAPED_NET = """
name: "memo"
layer { name: "data" type: "Data" top: "data" data_param { source: "train_db" batch_size: 2 backend: LMDB } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: 2 } }
layer { name: "scale" type: "Scale" bottom: "conv" top: "scaled" param { lr_mult: 0 } scale_param { bias_term: true } }
layer { name: "deconv" type: "Deconvolution" bottom: "scaled" top: "up"
        convolution_param { num_output: 4 kernel_size: 2 stride: 2 } }
layer { name: "scale2" type: "Scale" bottom: "up" top: "up2" }
layer { name: "loss" type: "EuclideanLoss" bottom: "up2" bottom: "data" top: "loss" }
"""


def _report(definition, engine: str, batch: int, shapes: dict):  # type: ignore[no-untyped-def]
    options = MemoryOptions(engine=engine)
    report, _, _ = definition.memory(options, batch, None, shapes)
    return report.total_bytes, [(layer.name, layer.bytes, dict(layer.categories)) for layer in report.layers]


@pytest.mark.parametrize("engine", ["cpu", "gpu", "gpu-cudnn"])
def test_builds_sharing_a_prepared_net_equal_fresh_builds(engine: str) -> None:
    """Rules keep what they read from a layer's parameters across the builds of one prepared net (ctx.memo): a
    search's builds must come out exactly as fresh ones, whatever the batch, and a bottom of another rank (data
    shapes given per estimate) must be read again, not served from the memo."""
    shared = training_definition(RESHAPED_NET)
    plans = [(5, {"data": (4, 12, 12)}), (1, {"data": (4, 12, 12)}), (3, {"data": (4, 12)}), (2, {"data": (4, 12, 12)}),
             (7, {"data": (4, 12)})]
    for batch, shapes in plans:
        fresh = training_definition(RESHAPED_NET)
        assert _report(shared, engine, batch, shapes) == _report(fresh, engine, batch, shapes)
    one_d = _report(training_definition(RESHAPED_NET), engine, 2, {"data": (4, 12)})
    two_d = _report(training_definition(RESHAPED_NET), engine, 2, {"data": (4, 12, 12)})
    assert one_d[0] < two_d[0]


TRAIN_VAL = """
name: "train_val"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        data_param { source: "train_db" batch_size: 16 backend: LMDB } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST }
        data_param { source: "val_db" batch_size: 10 backend: LMDB } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 8 kernel_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { num_output: 5 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" include { phase: TEST } }
"""


@pytest.mark.parametrize("engine", ["cpu", "gpu-cudnn"])
def test_a_search_builds_the_test_nets_once_and_costs_them_the_same(engine: str) -> None:
    """The test nets do not depend on the train batch: one estimator builds them once for all the batches a search
    tries, and every total equals a fresh build's."""
    shapes = {"data": (3, 12, 12)}
    definition = training_definition(TRAIN_VAL)
    options = MemoryOptions(engine=engine)
    estimator = Estimator(definition, options, shapes)
    _, _, first_tests = estimator.report(4)
    for batch in (1, 9, 33):
        assert estimator.total(batch) == training_definition(TRAIN_VAL).memory(options, batch, None, shapes)[0].total_bytes
    _, _, later_tests = estimator.report(64)
    assert later_tests is first_tests  # built once
    _, _, other_test_batch = estimator.report(64, 3)
    assert other_test_batch is not first_tests
    assert other_test_batch[0].blobs[0].shape[0] == 3
