"""Legacy definitions upgraded exactly as Caffe's UpgradeNetAsNeeded / UpgradeSolverAsNeeded do.

The strongest check: Caffe's own upgraded layers. pycaffe builds the net in a child process and saves it
(Net::ToProto keeps each layer's LayerParameter as upgraded, filtered, split and set up); we compare every layer,
field by field, with ours after the same filtering and split insertion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from conftest import ZOO
from test_core_netstate import run_pycaffe

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.layers.base import PHASE_TEST, PHASE_TRAIN
from digits_memplugin.core.net import build_net, filter_layers, insert_splits, net_state
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.prototxt import parse_net, parse_solver
from digits_memplugin.core.sourcemap import layer_lines
from digits_memplugin.core.upgrade import SOLVER_TYPES, V1_LAYER_TYPES

V1_DIR = ZOO / "caffenet_v1_legacy_format"
needs_v1_zoo = pytest.mark.skipif(not V1_DIR.is_dir(), reason="the zoo is not available")


def write_imagenet_like_data(root: Path) -> None:
    """The files the V1 CaffeNet names, relative to Caffe's working directory: one 3x256x256 image per LMDB and a
    mean image, so that its data layers can be set up."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(3, 256, 256), dtype=np.uint8)
    datum = caffe_pb2.Datum(channels=3, height=256, width=256, data=pixels.tobytes(), label=1)
    for name in ("ilsvrc12_train_lmdb", "ilsvrc12_val_lmdb"):
        (root / "examples" / "imagenet").mkdir(parents=True, exist_ok=True)
        env = lmdb.open(str(root / "examples" / "imagenet" / name), map_size=1 << 24)
        with env.begin(write=True) as txn:
            txn.put(b"00000000", datum.SerializeToString())
        env.close()
    mean = caffe_pb2.BlobProto(num=1, channels=3, height=256, width=256)
    mean.data.extend(np.full(3 * 256 * 256, 100.0, dtype=np.float32).tolist())
    (root / "data" / "ilsvrc12").mkdir(parents=True)
    (root / "data" / "ilsvrc12" / "imagenet_mean.binaryproto").write_bytes(mean.SerializeToString())


def our_layers(text: str, phase: str) -> list[Any]:
    """Our upgraded net after FilterNet and InsertSplits, each layer with the phase Net::Init gives it, and what
    a layer's own SetUp adds to its LayerParameter (LossLayer::LayerSetUp: loss_weight 1 when none is given)."""
    param = parse_net(text)
    filtered = filter_layers(param, net_state(param, phase), "net.prototxt", layer_lines(text))
    layers = []
    for _, layer in insert_splits(list(filtered), "net.prototxt", layer_lines(text)):
        if not layer.HasField("phase"):
            layer.phase = getattr(caffe_pb2, phase)
        if layer.type.endswith("Loss") and not len(layer.loss_weight):
            layer.loss_weight.append(1.0)
        # Through the wire format, as Caffe's are: floats become float32 on both sides.
        layers.append(caffe_pb2.LayerParameter.FromString(layer.SerializeToString()))
    return layers


def caffe_layers(saved: Path) -> list[Any]:
    return list(caffe_pb2.NetParameter.FromString(saved.read_bytes()).layer)


def assert_same_layers(ours: list[Any], theirs: list[Any]) -> None:
    assert [layer.name for layer in ours] == [layer.name for layer in theirs]
    for mine, caffes in zip(ours, theirs):
        assert mine == caffes, f"layer {mine.name!r}:\n--- ours\n{mine}\n--- Caffe's\n{caffes}"


@pytest.fixture(scope="module")
def caffe_saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Caffe's layers for every net this module compares, built in one pycaffe child."""
    root = tmp_path_factory.mktemp("upgrade")
    write_imagenet_like_data(root)
    nets = {name: (text, phase) for name, (text, phase) in NETS.items()}
    if V1_DIR.is_dir():
        nets["v1_train_val_TRAIN"] = ((V1_DIR / "train_val.prototxt").read_text(), "TRAIN")
        nets["v1_train_val_TEST"] = ((V1_DIR / "train_val.prototxt").read_text(), "TEST")
        nets["v1_deploy"] = ((V1_DIR / "deploy.prototxt").read_text(), "TEST")
    jobs = []
    for name, (text, phase) in nets.items():
        (root / f"{name}.prototxt").write_text(text)
        jobs.append({"kind": "save", "path": f"{name}.prototxt", "phase": phase, "out": f"{name}.layers"})
    results = run_pycaffe(jobs, root)
    failed = {name: result["fatal"] for name, result in zip(nets, results) if "fatal" in result}
    assert not failed, failed
    return {name: root / f"{name}.layers" for name in nets}


V1_DATA = """name: "v1-data"
layers {
  name: "data" type: DATA top: "data" top: "label"
  data_param {
    source: "examples/imagenet/ilsvrc12_val_lmdb" backend: LMDB batch_size: 2
    scale: 0.5 mean_file: "data/ilsvrc12/imagenet_mean.binaryproto" crop_size: 200 mirror: true
  }
}
layers {
  name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0 param: "shared_w" blob_share_mode: PERMISSIVE
  convolution_param { num_output: 2 kernel_size: 3 stride: 2 }
}
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "flat" type: FLATTEN bottom: "conv" top: "flat" }
layers { name: "drop" type: DROPOUT bottom: "flat" top: "flat" dropout_param { dropout_ratio: 0.3 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "flat" top: "ip" inner_product_param { num_output: 3 } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss" loss_weight: 2 }
layers { name: "acc" type: ACCURACY bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
layers { name: "silence" type: SILENCE bottom: "acc" exclude { phase: TRAIN } }
"""

INPUT_SHAPES = """name: "two-inputs"
input: "a"
input_shape { dim: 2 dim: 3 dim: 4 dim: 4 }
input: "b"
input_shape { dim: 2 dim: 5 }
layer { name: "pool" type: "Pooling" bottom: "a" top: "p" pooling_param { pool: AVE kernel_size: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "b" top: "ip" inner_product_param { num_output: 2 } }
"""

INPUT_DIMS_V1 = """name: "dims"
input: "data"
input_dim: 1
input_dim: 3
input_dim: 8
input_dim: 8
layers { name: "pool" type: POOLING bottom: "data" top: "pool" pooling_param { pool: MAX kernel_size: 2 } }
layers { name: "sm" type: SOFTMAX bottom: "pool" top: "prob" }
"""

BATCH_NORM = """name: "bn"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
        param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 } }
"""

NETS = {
    "v1_data_TRAIN": (V1_DATA, "TRAIN"),
    "v1_data_TEST": (V1_DATA, "TEST"),
    "input_shapes": (INPUT_SHAPES, "TEST"),
    "input_dims_v1": (INPUT_DIMS_V1, "TEST"),
}


@pytest.mark.parametrize("name", list(NETS))
def test_upgraded_like_caffe(caffe_saved: dict[str, Path], name: str) -> None:
    text, phase = NETS[name]
    assert_same_layers(our_layers(text, phase), caffe_layers(caffe_saved[name]))


@needs_v1_zoo
@pytest.mark.parametrize(
    ("name", "file", "phase"),
    [
        ("v1_train_val_TRAIN", "train_val.prototxt", PHASE_TRAIN),
        ("v1_train_val_TEST", "train_val.prototxt", PHASE_TEST),
        ("v1_deploy", "deploy.prototxt", PHASE_TEST),
    ],
)
def test_zoo_v1_caffenet_upgraded_like_caffe(caffe_saved: dict[str, Path], name: str, file: str, phase: str) -> None:
    text = (V1_DIR / file).read_text()
    ours = our_layers(text, phase)
    assert_same_layers(ours, caffe_layers(caffe_saved[name]))
    # What the comparison covers: V1 type names, blobs_lr/weight_decay as ParamSpecs, the input fields.
    types = {layer.type for layer in ours}
    assert {"Convolution", "ReLU", "Pooling", "LRN", "InnerProduct"} <= types
    assert any(len(layer.param) == 2 and layer.param[1].lr_mult == 2 for layer in ours) == (file == "train_val.prototxt")
    assert (ours[0].type == "Input") == (file == "deploy.prototxt")


def test_data_transformation_fields_move_to_transform_param() -> None:
    data = parse_net(V1_DATA).layer[0]
    assert data.type == "Data"
    assert (data.transform_param.scale, data.transform_param.crop_size, data.transform_param.mirror) == (0.5, 200, True)
    assert data.transform_param.mean_file == "data/ilsvrc12/imagenet_mean.binaryproto"
    assert not any(data.data_param.HasField(f) for f in ("scale", "mean_file", "crop_size", "mirror"))
    assert data.data_param.batch_size == 2
    conv = parse_net(V1_DATA).layer[1]
    assert [(p.name, p.lr_mult, p.decay_mult, p.share_mode) for p in conv.param] == [
        ("shared_w", 1, 1, caffe_pb2.ParamSpec.PERMISSIVE),
        ("", 2, 0, caffe_pb2.ParamSpec.STRICT),
    ]
    assert list(parse_net(V1_DATA).layer[6].loss_weight) == [2]


def test_every_v1_layer_type_has_its_v2_name() -> None:
    names = {value.name for value in caffe_pb2.V1LayerParameter.LayerType.DESCRIPTOR.values}
    assert {caffe_pb2.V1LayerParameter.LayerType.Value(name) for name in names} == set(V1_LAYER_TYPES)
    net = parse_net("\n".join(f'layers {{ name: "l{i}" type: {name} }}' for i, name in enumerate(sorted(names))))
    assert [layer.type for layer in net.layer] == [
        V1_LAYER_TYPES[caffe_pb2.V1LayerParameter.LayerType.Value(name)] for name in sorted(names)
    ]
    assert "SoftmaxWithLoss" in {layer.type for layer in net.layer}


def test_input_fields_become_an_input_layer_first() -> None:
    net = parse_net(INPUT_SHAPES)
    assert not (len(net.input) or len(net.input_shape) or len(net.input_dim))
    first = net.layer[0]
    assert (first.name, first.type, list(first.top)) == ("input", "Input", ["a", "b"])
    assert [list(shape.dim) for shape in first.input_param.shape] == [[2, 3, 4, 4], [2, 5]]
    assert [layer.name for layer in net.layer] == ["input", "pool", "ip"]
    assert [list(s.dim) for s in parse_net(INPUT_DIMS_V1).layer[0].input_param.shape] == [[1, 3, 8, 8]]


def test_input_shape_wins_over_input_dim_and_extra_shapes_are_dropped() -> None:
    text = 'input: "a"\ninput_shape { dim: 7 }\ninput_shape { dim: 9 }\ninput_dim: 1\ninput_dim: 2\n'
    [layer] = parse_net(text).layer
    assert [list(s.dim) for s in layer.input_param.shape] == [[7]]


def test_input_without_shape_is_dropped_like_a_legacy_caffemodel() -> None:
    net = parse_net('input: "data"\nlayer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n')
    assert [layer.name for layer in net.layer] == ["r"]
    with pytest.raises(NetError, match="unknown bottom blob 'data'"):
        build_net(net, PHASE_TEST)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('input: "a"\ninput: "b"\ninput_shape { dim: 1 }\n', "input_shape"),
        ('input: "a"\ninput: "b"\ninput_dim: 1\ninput_dim: 1\ninput_dim: 1\ninput_dim: 1\ninput_dim: 1\n', "input_dim"),
    ],
)
def test_too_few_input_shapes_is_an_error(text: str, field: str) -> None:
    """Caffe reads past the end of the repeated field there (undefined behaviour); we refuse."""
    with pytest.raises(NetError) as raised:
        parse_net(text, "deploy.prototxt")
    assert (raised.value.field, raised.value.source) == (field, "deploy.prototxt")
    assert "declares 2 inputs" in str(raised.value)


def test_old_batch_norm_params_are_cleared_only_when_there_are_three() -> None:
    assert len(parse_net(BATCH_NORM).layer[1].param) == 0
    two = BATCH_NORM.replace(" param { lr_mult: 0 } }", " }")
    assert len(parse_net(two).layer[1].param) == 2


def test_v0_nets_are_refused_clearly() -> None:
    text = 'name: "v0"\nlayers {\n  layer { name: "conv1" type: "conv" num_output: 96 kernelsize: 11 }\n}\n'
    with pytest.raises(NetError) as raised:
        parse_net(text, "old.prototxt")
    assert str(raised.value).startswith("old.prototxt: uses the V0 layer format")
    assert "upgrade_net_proto_text" in str(raised.value)


def test_v1_and_v2_layers_mixed_are_refused_like_caffe() -> None:
    with pytest.raises(NetError, match="mixes the V1 'layers' format and the current 'layer' format"):
        parse_net('layers { name: "a" type: RELU }\nlayer { name: "b" type: "ReLU" }\n')


# ------------------------------------------------------------------------------------------ solvers


@pytest.mark.parametrize("enum_name", list(caffe_pb2.SolverParameter.SolverType.keys()))
def test_solver_type_enum_becomes_the_type_string(enum_name: str) -> None:
    solver = parse_solver(f"solver_type: {enum_name}\n")
    assert solver.type == SOLVER_TYPES[caffe_pb2.SolverParameter.SolverType.Value(enum_name)]
    assert not solver.HasField("solver_type")
    assert solver.type.upper() == enum_name


def test_solver_type_and_type_together_is_an_error() -> None:
    with pytest.raises(NetError) as raised:
        parse_solver('solver_type: ADAM\ntype: "Adam"\n', "solver.prototxt")
    assert raised.value.field == "solver_type"
    assert "both" in str(raised.value) and str(raised.value).startswith("solver.prototxt: ")


def test_a_current_solver_is_left_alone() -> None:
    solver = parse_solver('type: "Nesterov"\nbase_lr: 0.1\n')
    assert (solver.type, solver.base_lr) == ("Nesterov", pytest.approx(0.1))


INLINE_V1 = 'net_param {\n  layers { name: "d" type: DUMMY_DATA top: "x" dummy_data_param { shape { dim: 2 } } }\n}\n'
INLINE_INPUT = (
    'net_param {\n  input: "data"\n  input_dim: 2\n  input_dim: 3\n  input_dim: 1\n  input_dim: 1\n'
    '  layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }\n}\n'
)
SOLVER_TAIL = 'base_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\nsnapshot_prefix: "snap"\nsolver_mode: CPU\n'


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (INLINE_V1, "net_param", "V1 'layers' format inside the solver"),
        (INLINE_INPUT, "net_param", "net-level input fields inside the solver"),
        (INLINE_V1.replace("net_param", "train_net_param"), "train_net_param", "with no layers at all"),
        (
            'train_net_param { }\ntest_net_param { }\n' + INLINE_V1.replace("net_param", "test_net_param"),
            "test_net_param",
            "test net #1 uses the V1",
        ),
    ],
)
def test_legacy_nets_inside_a_solver_are_refused(body: str, field: str, message: str) -> None:
    with pytest.raises(NetError) as raised:
        parse_solver(body + SOLVER_TAIL, "solver.prototxt")
    assert raised.value.field == field
    assert message in str(raised.value)


def test_caffe_does_not_upgrade_nets_inside_a_solver(tmp_path: Path) -> None:
    """Why they are refused: Solver::InitTrainNet copies net_param without UpgradeNetAsNeeded."""
    (tmp_path / "v1.prototxt").write_text(INLINE_V1 + SOLVER_TAIL)
    (tmp_path / "input.prototxt").write_text(INLINE_INPUT + SOLVER_TAIL)
    v1, inputs = run_pycaffe(
        [{"kind": "solver", "path": "v1.prototxt"}, {"kind": "solver", "path": "input.prototxt"}], tmp_path
    )
    assert v1 == {"train": [], "tests": []}  # the V1 layers are silently gone
    assert "Unknown bottom blob 'data'" in inputs["fatal"]
