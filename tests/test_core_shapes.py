"""Golden test of shape inference: every net of the zoo, every phase, against what pycaffe builds.

For each net and phase the estimator builds (core.training / core.net), pycaffe builds the same filtered net in a
child process, its data layers replaced by Input layers of the shapes the estimator gave their tops (pycaffe
cannot read the datasets). Every layer (split layers included, names as Caffe's), blob, top and param shape,
loss weight, need-backward flag and Caffe's own "Memory required for data" must match. Nets this Caffe cannot
build must get a clear NetError from the estimator instead.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ZOO
from google.protobuf import text_format

from digits_memplugin.core.errors import NetError, PrototxtSyntaxError
from digits_memplugin.core.net import Net, build_net, input_net
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.training import TrainingDefinition, fill_num_classes, training_definition
from digits_memplugin.estimate.pycaffe_shapes import caffe_net, differences, pycaffe_oracle

pytestmark = pytest.mark.slow

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
IMAGENET = (3, 256, 256)
"""ImageNet-style Data layers: the 256 x 256 images of the BVLC recipes, cropped by the net's transform_param."""


@dataclasses.dataclass(frozen=True)
class ZooNet:
    """A zoo net as a training job reads it (a net file, its solver, or both) and the nets it builds."""

    net: str | None
    solver: str | None = None
    data_shapes: dict[str, Any] = dataclasses.field(default_factory=dict)
    classes: int | None = None
    phases: tuple[str, ...] = ("TRAIN", "TEST")
    """The nets the job builds, train net first: one phase per net (test nets may repeat TEST)."""
    deploy_input: tuple[int, ...] | None = None
    """A DIGITS network's deploy stage, with the Input layer DIGITS adds (shape given here)."""
    oracle: bool = False

    def definition(self) -> TrainingDefinition:
        folder = ZOO / (self.net or self.solver or "").split("/")[0]

        def load(path: str) -> tuple[str, str]:
            file = folder / Path(path).name  # solvers name their nets relative to a Caffe checkout
            return file.read_text(), str(file)

        definition = training_definition(
            (ZOO / self.net).read_text() if self.net else None,
            (ZOO / self.solver).read_text() if self.solver else None,
            net_source=self.net or "net.prototxt",
            solver_source=self.solver or "solver.prototxt",
            load=load,
        )
        if self.classes is not None:
            fill_num_classes(definition, self.classes)
        return definition


DEPLOY = ("TRAIN", "TEST")
"""A deploy net: trained as it is (the estimator's reading of a lone net), and run in TEST."""

ZOO_NETS = {
    "caffe_lenet/lenet_solver": ZooNet("caffe_lenet/lenet_train_test.prototxt", "caffe_lenet/lenet_solver.prototxt",
                                       {"data": MNIST}),
    "caffe_lenet/lenet": ZooNet("caffe_lenet/lenet.prototxt", phases=DEPLOY),
    "caffe_cifar10_quick": ZooNet("caffe_cifar10_quick/cifar10_quick_train_test.prototxt",
                                  "caffe_cifar10_quick/cifar10_quick_solver.prototxt", {"data": CIFAR}),
    "caffe_cifar10_quick/deploy": ZooNet("caffe_cifar10_quick/cifar10_quick.prototxt", phases=DEPLOY),
    "caffe_cifar10_full": ZooNet("caffe_cifar10_full/cifar10_full_train_test.prototxt",
                                 "caffe_cifar10_full/cifar10_full_solver.prototxt", {"data": CIFAR}),
    "caffe_cifar10_full/deploy": ZooNet("caffe_cifar10_full/cifar10_full.prototxt", phases=DEPLOY),
    "caffe_cifar10_full_sigmoid_bn": ZooNet(
        "caffe_cifar10_full_sigmoid_bn/cifar10_full_sigmoid_train_test_bn.prototxt",
        "caffe_cifar10_full_sigmoid_bn/cifar10_full_sigmoid_solver_bn.prototxt", {"data": CIFAR}),
    "caffe_alexnet": ZooNet("caffe_alexnet/train_val.prototxt", "caffe_alexnet/solver.prototxt", {"data": IMAGENET}),
    "caffe_alexnet/deploy": ZooNet("caffe_alexnet/deploy.prototxt", phases=DEPLOY),
    "caffe_caffenet": ZooNet("caffe_caffenet/train_val.prototxt", "caffe_caffenet/solver.prototxt",
                             {"data": IMAGENET}),
    "caffe_caffenet/deploy": ZooNet("caffe_caffenet/deploy.prototxt", phases=DEPLOY),
    "caffe_googlenet": ZooNet("caffe_googlenet/train_val.prototxt", "caffe_googlenet/solver.prototxt",
                              {"data": IMAGENET}),
    "caffe_googlenet/deploy": ZooNet("caffe_googlenet/deploy.prototxt", phases=DEPLOY),
    "caffe_mnist_autoencoder": ZooNet("caffe_mnist_autoencoder/mnist_autoencoder.prototxt",
                                      "caffe_mnist_autoencoder/mnist_autoencoder_solver.prototxt", {"data": MNIST},
                                      phases=("TRAIN", "TEST", "TEST")),
    "caffe_mnist_siamese": ZooNet("caffe_mnist_siamese/mnist_siamese_train_test.prototxt",
                                  "caffe_mnist_siamese/mnist_siamese_solver.prototxt", {"pair_data": (2, 28, 28)}),
    "caffe_mnist_siamese/deploy": ZooNet("caffe_mnist_siamese/mnist_siamese.prototxt", phases=DEPLOY),
    # examples/hdf5_classification writes 4 features per row (make_classification) and a scalar label.
    "caffe_hdf5_classification": ZooNet("caffe_hdf5_classification/train_val.prototxt", None,
                                        {"data": (4,), "label": ()}),
    "caffe_hdf5_classification/nonlinear": ZooNet("caffe_hdf5_classification/nonlinear_train_val.prototxt", None,
                                                  {"data": (4,), "label": ()}),
    "caffenet_v1_legacy_format": ZooNet("caffenet_v1_legacy_format/train_val.prototxt", None, {"data": IMAGENET}),
    "caffenet_v1_legacy_format/deploy": ZooNet("caffenet_v1_legacy_format/deploy.prototxt", phases=DEPLOY),
    "digits_lenet": ZooNet("digits_lenet/lenet.prototxt", None, {"data": MNIST}, classes=10),
    "digits_lenet/deploy": ZooNet("digits_lenet/lenet.prototxt", classes=10, phases=("TEST",),
                                  deploy_input=(1, 1, 28, 28)),
    "digits_alexnet": ZooNet("digits_alexnet/alexnet.prototxt", None, {"data": IMAGENET}, classes=1000),
    "digits_alexnet/deploy": ZooNet("digits_alexnet/alexnet.prototxt", classes=1000, phases=("TEST",),
                                    deploy_input=(1, 3, 227, 227)),
    "digits_googlenet": ZooNet("digits_googlenet/googlenet.prototxt", None, {"data": IMAGENET}, classes=1000),
    "digits_googlenet/deploy": ZooNet("digits_googlenet/googlenet.prototxt", classes=1000, phases=("TEST",),
                                      deploy_input=(1, 3, 224, 224)),
    # FCN's Python data layer gives whole PASCAL images, batch first; 500 x 500 is the largest VOC image.
    "fcn_fcn32s": ZooNet(None, "fcn_fcn32s/solver.prototxt", {"data": (1, 3, 500, 500), "label": (1, 1, 500, 500)}),
    "resnet50_kaiminghe": ZooNet("resnet50_kaiminghe/ResNet-50-deploy.prototxt", phases=DEPLOY),
    "squeezenet_v1.1": ZooNet("squeezenet_v1.1/train_val.prototxt", "squeezenet_v1.1/solver.prototxt",
                              {"data": IMAGENET}),
    "squeezenet_v1.1/deploy": ZooNet("squeezenet_v1.1/deploy.prototxt", phases=DEPLOY),
    "mobilenet_v1_shicai": ZooNet("mobilenet_v1_shicai/mobilenet_deploy.prototxt", phases=DEPLOY),
}


@functools.cache
def zoo_nets(name: str) -> tuple[Net, ...]:
    """The nets the estimator builds for a zoo entry, in the order of its `phases`."""
    zoo = ZOO_NETS[name]
    definition = zoo.definition()
    if zoo.deploy_input is not None:
        return (digits_deploy_net(definition, zoo.deploy_input),)
    train, tests = definition.build(data_shapes=zoo.data_shapes, oracle=pycaffe_oracle if zoo.oracle else None)
    nets = (train, *tests)
    if zoo.phases == DEPLOY and not tests:
        test = build_net(definition.train.param, "TEST", source=definition.train.source, lines=definition.train.lines)
        nets = (train, test)
    return nets


def digits_deploy_net(definition: TrainingDefinition, shape: tuple[int, ...]) -> Net:
    """The deploy stage of a DIGITS network, with the Input layer DIGITS puts in front of it."""
    param = caffe_pb2.NetParameter()
    param.CopyFrom(definition.train.param)
    layers = list(param.layer)
    del param.layer[:]
    data = param.layer.add()
    data.name, data.type = "data", "Input"
    data.top.append("data")
    data.input_param.shape.add().dim.extend(shape)
    param.layer.extend(layers)
    return build_net(param, "TEST", state=caffe_pb2.NetState(stage=["deploy"]))


BUILDS = [
    pytest.param(name, index, id=f"{name}:{phase}{index if zoo.phases.count(phase) > 1 else ''}")
    for name, zoo in ZOO_NETS.items()
    for index, phase in enumerate(zoo.phases)
]


@pytest.mark.parametrize(("name", "index"), BUILDS)
def test_zoo_net_matches_pycaffe(name: str, index: int) -> None:
    net = zoo_nets(name)[index]
    assert len(zoo_nets(name)) == len(ZOO_NETS[name].phases), "the job builds another number of nets"
    assert net.phase == ZOO_NETS[name].phases[index]
    assert not any(layer.from_oracle for layer in net.layers), "every layer of the zoo has a rule"
    built = caffe_net(input_net(net), net.phase)
    assert differences(net, built) == []


def test_the_zoo_table_covers_every_net_file() -> None:
    """Every net of the zoo is in the golden test above or among the nets this Caffe cannot build below."""
    covered: set[str | None] = {zoo.net for zoo in ZOO_NETS.values()} | {zoo.solver for zoo in ZOO_NETS.values()}
    for case in FORK_NETS:
        given, failing = case.values[0], case.values[1]
        assert isinstance(given, tuple) and isinstance(failing, str)
        covered |= {*given, failing}
    covered |= {"fcn_fcn32s/train.prototxt", "fcn_fcn32s/val.prototxt", f"{SSD}/deploy.prototxt",
                "caffe_lenet/lenet_consolidated_solver.prototxt"}
    files = {str(path.relative_to(ZOO)) for path in ZOO.glob("*/*.prototxt")}
    assert files - covered == set()


def test_solver_stages_and_test_nets_are_what_caffe_would_build() -> None:
    """The builds above are the nets Caffe's Solver would set up, not just any nets that match pycaffe."""
    autoencoder = zoo_nets("caffe_mnist_autoencoder")
    assert [len(net.layers) for net in autoencoder] == [22, 22, 22]
    digits = zoo_nets("digits_alexnet")
    assert [net.blob("data").shape for net in digits] == [(128, 3, 227, 227), (32, 3, 227, 227)]
    assert digits[0].blob("fc8").shape == (128, 1000)
    deploy = zoo_nets("digits_lenet/deploy")[0]
    assert deploy.layers[-1].type == "Softmax"
    fcn = zoo_nets("fcn_fcn32s")
    assert fcn[0].blob("score").shape == (1, 21, 500, 500)


# Nets this Caffe cannot build: fork-only fields and layers.

SSD = "ssd300_coco_nvcaffe"
DETECTNET = "detectnet_kitti"
FORK_NETS = [
    # (the net file given, the solver given), the file that fails, the message type, the field, the line
    pytest.param(("nvcaffe_resnet18/train_val.prototxt", "nvcaffe_resnet18/solver.prototxt"),
                 "nvcaffe_resnet18/train_val.prototxt", "BatchNormParameter", "scale_bias", 62, id="nvcaffe_resnet18"),
    pytest.param((f"{SSD}/train.prototxt", None), f"{SSD}/train.prototxt", "TransformationParameter",
                 "resize_param", 16, id="ssd300:train"),
    pytest.param((None, f"{SSD}/solver.prototxt"), f"{SSD}/solver.prototxt", "SolverParameter",
                 "solver_data_type", 10, id="ssd300:solver"),
    pytest.param((f"{SSD}/test.prototxt", None), f"{SSD}/test.prototxt", "TransformationParameter", "resize_param",
                 14, id="ssd300:test"),
    # DIGITS' DetectNet: its solver is BVLC's, its net holds NVcaffe's DetectNetTransformation parameters.
    pytest.param((None, f"{DETECTNET}/detectnet_solver.prototxt"), f"{DETECTNET}/detectnet_network.prototxt",
                 "LayerParameter", "detectnet_groundtruth_param", 72, id="detectnet_kitti"),
]


@pytest.mark.parametrize(("given", "failing", "message", "field", "line"), FORK_NETS)
def test_fork_only_fields_are_read_as_nvcaffe_here_and_refused_by_caffe(
    given: tuple[str | None, str | None], failing: str, message: str, field: str, line: int, tmp_path: Path
) -> None:
    """NVcaffe's fields (DIGITS' Caffe) are read with NVcaffe's schema here (core/flavour.py); BVLC's pycaffe, which
    trains on this server, refuses them at the line the BVLC schema stops at."""
    definition = ZooNet(*given).definition()
    assert definition.flavour == "nvcaffe"
    with pytest.raises(PrototxtSyntaxError) as error:
        _bvlc_parse(failing)
    assert f'"caffe.{message}" has no field named "{field}"' in error.value.message
    assert error.value.line == line
    # pycaffe's own parser refuses the file the same way.
    if "solver" in failing:
        command = ["-c", "import sys, caffe; caffe.get_solver(sys.argv[1])", str(ZOO / failing)]
    else:
        command = ["-m", "digits_memplugin.estimate.pycaffe_shapes", str(ZOO / failing), "TEST"]
    result = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path
    )
    assert result.returncode != 0
    assert f'Message type "caffe.{message}" has no field named "{field}"' in result.stderr


def _bvlc_parse(file: str) -> None:
    """The file through BVLC's schema alone, as pycaffe reads it."""
    message = caffe_pb2.SolverParameter() if "solver" in file else caffe_pb2.NetParameter()
    try:
        text_format.Parse((ZOO / file).read_text(), message)
    except text_format.ParseError as error:
        raise PrototxtSyntaxError(str(error).split(" : ", 1)[-1], source=file, line=error.GetLine()) from None


def test_a_v1_net_inside_a_solver_is_refused_as_caffe_would_not_upgrade_it() -> None:
    """lenet_consolidated_solver holds its net in V1 `layers` inside the solver; Caffe upgrades only net files, so
    it would train a net without layers: the estimator says so rather than estimating another net."""
    with pytest.raises(NetError) as error:
        ZooNet(None, "caffe_lenet/lenet_consolidated_solver.prototxt").definition()
    assert "V1 'layers' format inside the solver" in error.value.message
    assert error.value.source is not None and "lenet_consolidated_solver.prototxt" in error.value.source


def ssd_deploy() -> TrainingDefinition:
    return ZooNet(f"{SSD}/deploy.prototxt").definition()


def test_ssd_deploy_is_shaped_by_the_ssd_rules_as_pycaffe_shapes_it() -> None:
    """The SSD layers (Normalize, Permute, PriorBox, DetectionOutput) have rules (layers/ssd.py), so pycaffe is not
    asked; this Caffe registers them too, and builds the same shapes. DetectionOutput's save_output_param names a
    label map, a name-size file and an output folder it would read, delete and create at set-up: none of it
    changes a shape, and the net pycaffe builds here never has it."""
    definition = ssd_deploy()
    detection = next(layer for layer in definition.train.param.layer if layer.type == "DetectionOutput")
    assert detection.detection_output_param.save_output_param.label_map_file == "data/coco/labelmap_coco.prototxt"

    def oracle(net_param: Any, phase: str) -> Any:  # pragma: no cover - must not be asked
        raise AssertionError("every layer of SSD's deploy net has a rule")

    net = build_net(definition.train.param, "TEST", oracle=oracle)
    assert not any(layer.from_oracle for layer in net.layers)
    assert net.blob("mbox_conf_flatten").shape == (1, 8732 * 81)
    sent = input_net(net)
    assert all(not layer.detection_output_param.HasField("save_output_param") for layer in sent.layer)
    assert differences(net, caffe_net(sent, "TEST")) == []


def test_a_net_error_names_where_the_unknown_field_is() -> None:
    text = (ZOO / "nvcaffe_resnet18/train_val.prototxt").read_text().replace("scale_bias: true", "no_such_field: 1", 1)
    with pytest.raises(NetError) as error:
        training_definition(text, net_source="nvcaffe_resnet18/train_val.prototxt")
    assert str(error.value).startswith("nvcaffe_resnet18/train_val.prototxt:62:")
