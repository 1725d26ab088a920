"""The zoo nets the estimator is held to, with the dataset shapes they were written for.

Shared by the tests and the benchmarks (bench/ puts tests/ on sys.path). Deploy-only nets (ResNet-50, MobileNet)
are turned into training nets the way one would train them: a Data layer with labels instead of the Input, and
SoftmaxWithLoss instead of the final Softmax.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from digits_memplugin.core.proto import caffe_pb2

ZOO_VARIABLE = "DIGITS_MEMPLUGIN_ZOO"
BESIDE_THE_CHECKOUT = Path(__file__).resolve().parents[2] / "shared" / "zoo"
"""../shared/zoo relative to the repository's root: where the team keeps the zoo beside its checkouts."""


def find_zoo(environ: Mapping[str, str] = os.environ, beside: Path = BESIDE_THE_CHECKOUT) -> Path:
    """The team's shared zoo: $DIGITS_MEMPLUGIN_ZOO when it is set (and then only there), else ../shared/zoo beside
    the checkout. Nowhere else: a zoo found at some fixed place on this machine would make a clone's tests pass
    here and fail on the next machine."""
    named = environ.get(ZOO_VARIABLE)
    candidate = Path(named) if named else beside
    if (candidate / "SOURCES.tsv").is_file():
        return candidate
    where = (f"${ZOO_VARIABLE} names {candidate}, which holds no SOURCES.tsv" if named else
             f"{candidate} (../shared/zoo beside the checkout) holds no SOURCES.tsv and ${ZOO_VARIABLE} is not set")
    raise FileNotFoundError(
        f"the shared zoo of Caffe nets is missing: {where}; put the zoo beside the checkout or set ${ZOO_VARIABLE} "
        "to its folder"
    )


ZOO = find_zoo()

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
IMAGENET = (3, 256, 256)


@dataclasses.dataclass(frozen=True)
class ZooCase:
    name: str
    net: str
    solver: str | None
    data_shapes: dict[str, Any]
    classes: int | None = None
    batches: tuple[int, ...] = (1, 8, 32)
    deploy: bool = False
    """A deploy-only net, trained through `as_training_net`."""

    def texts(self) -> tuple[str, str | None]:
        net = (ZOO / self.net).read_text()
        if self.deploy:
            net = as_training_net(net)
        solver = (ZOO / self.solver).read_text() if self.solver else None
        return net, solver


CASES = [
    ZooCase("caffe_lenet", "caffe_lenet/lenet_train_test.prototxt", "caffe_lenet/lenet_solver.prototxt",
            {"data": MNIST}, batches=(1, 8, 64)),
    ZooCase("caffe_cifar10_quick", "caffe_cifar10_quick/cifar10_quick_train_test.prototxt",
            "caffe_cifar10_quick/cifar10_quick_solver.prototxt", {"data": CIFAR}),
    ZooCase("caffe_cifar10_full", "caffe_cifar10_full/cifar10_full_train_test.prototxt",
            "caffe_cifar10_full/cifar10_full_solver.prototxt", {"data": CIFAR}),
    ZooCase("caffe_cifar10_full_sigmoid_bn",
            "caffe_cifar10_full_sigmoid_bn/cifar10_full_sigmoid_train_test_bn.prototxt",
            "caffe_cifar10_full_sigmoid_bn/cifar10_full_sigmoid_solver_bn.prototxt", {"data": CIFAR}),
    ZooCase("caffe_hdf5_classification", "caffe_hdf5_classification/train_val.prototxt", None,
            {"data": (4,), "label": ()}, batches=(1, 10, 64)),
    ZooCase("caffe_hdf5_nonlinear", "caffe_hdf5_classification/nonlinear_train_val.prototxt", None,
            {"data": (4,), "label": ()}, batches=(1, 10, 64)),
    ZooCase("caffe_mnist_autoencoder", "caffe_mnist_autoencoder/mnist_autoencoder.prototxt",
            "caffe_mnist_autoencoder/mnist_autoencoder_solver.prototxt", {"data": MNIST}, batches=(1, 8, 100)),
    ZooCase("caffe_mnist_siamese", "caffe_mnist_siamese/mnist_siamese_train_test.prototxt",
            "caffe_mnist_siamese/mnist_siamese_solver.prototxt", {"pair_data": (2, 28, 28)}),
    ZooCase("digits_lenet", "digits_lenet/lenet.prototxt", None, {"data": MNIST}, classes=10, batches=(1, 8, 64)),
    ZooCase("caffe_alexnet", "caffe_alexnet/train_val.prototxt", "caffe_alexnet/solver.prototxt",
            {"data": IMAGENET}, batches=(1, 8)),
    ZooCase("caffe_caffenet", "caffe_caffenet/train_val.prototxt", "caffe_caffenet/solver.prototxt",
            {"data": IMAGENET}, batches=(1, 8)),
    ZooCase("caffenet_v1_legacy_format", "caffenet_v1_legacy_format/train_val.prototxt", None,
            {"data": IMAGENET}, batches=(1, 8)),
    ZooCase("digits_alexnet", "digits_alexnet/alexnet.prototxt", None, {"data": IMAGENET}, classes=1000,
            batches=(1, 8)),
    ZooCase("caffe_googlenet", "caffe_googlenet/train_val.prototxt", "caffe_googlenet/solver.prototxt",
            {"data": IMAGENET}, batches=(1, 8)),
    ZooCase("digits_googlenet", "digits_googlenet/googlenet.prototxt", None, {"data": IMAGENET}, classes=1000,
            batches=(1, 8)),
    ZooCase("squeezenet_v1.1", "squeezenet_v1.1/train_val.prototxt", "squeezenet_v1.1/solver.prototxt",
            {"data": IMAGENET}, batches=(1, 8)),
    ZooCase("mobilenet_v1_shicai", "mobilenet_v1_shicai/mobilenet_deploy.prototxt", None, {"data": (3, 224, 224)},
            batches=(1, 8), deploy=True),
    ZooCase("resnet50_kaiminghe", "resnet50_kaiminghe/ResNet-50-deploy.prototxt", None, {"data": (3, 224, 224)},
            batches=(1, 4), deploy=True),
]
CASES_BY_NAME = {case.name: case for case in CASES}


@dataclasses.dataclass(frozen=True)
class FlavouredCase:
    """A zoo net (or a solver with its nets) for the flavour tests: the Caffe that builds it, and the request
    that estimates it at the batch its authors train with. `files` maps the paths its solver names to zoo files."""

    name: str
    flavour: str
    net: str | None
    solver: str | None = None
    data_shapes: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    classes: int | None = None

    def texts(self) -> tuple[str | None, str | None]:
        net = (ZOO / self.net).read_text() if self.net else None
        solver = (ZOO / self.solver).read_text() if self.solver else None
        return net, solver

    def load(self, path: str) -> tuple[str, str]:
        return (ZOO / self.files[path]).read_text(), self.files[path]


SSD = "ssd300_coco_nvcaffe"
NVCAFFE_CASES = [
    # NVIDIA/caffe's models/resnet18: BatchNorm with scale_bias (NVcaffe's fused BatchNorm + Scale).
    FlavouredCase("nvcaffe_resnet18", "nvcaffe", "nvcaffe_resnet18/train_val.prototxt",
                  "nvcaffe_resnet18/solver.prototxt", {"data": IMAGENET},
                  files={"models/resnet18/train_val.prototxt": "nvcaffe_resnet18/train_val.prototxt"}),
    # SSD300 on COCO: AnnotatedData resizes to 300 x 300 (no item shape needed), PriorBox, MultiBoxLoss, and in the
    # test net DetectionOutput and DetectionEvaluate; its solver names both nets and sets solver_data_type.
    FlavouredCase(SSD, "nvcaffe", None, f"{SSD}/solver.prototxt",
                  files={"models/VGGNet/coco/SSD_300x300/train.prototxt": f"{SSD}/train.prototxt",
                         "models/VGGNet/coco/SSD_300x300/test.prototxt": f"{SSD}/test.prototxt"}),
    FlavouredCase(f"{SSD}/deploy", "ssd", f"{SSD}/deploy.prototxt"),
]
"""The zoo's NVcaffe nets. The SSD deploy net uses no NVcaffe-only field: BVLC's schema reads it, but its layers are
SSD Caffe's (PriorBox, Normalize, DetectionOutput...), which BVLC Caffe has not: flavour "ssd"."""

DETECTNET_PATH = "detectnet_kitti/detectnet_network.prototxt"
"""DIGITS' DetectNet (examples/object-detection points to NVcaffe's examples/kitti/detectnet_network.prototxt), where
the shared zoo keeps it once added (see docs/memory-model.md, NVcaffe); its test is skipped without it."""
DETECTNET = FlavouredCase(
    "detectnet_kitti", "nvcaffe", DETECTNET_PATH, None,
    # DIGITS' KITTI dataset: 1248 x 384 colour images, as DIGITS users give it. The label LMDB's layout is DIGITS'
    # (a header row and one 16-value row per box, DetectNetTransformationLayer::blobToLabels) and the val net's
    # Python layers (caffe.layers.detectnet, never imported) have rules: neither needs a shape.
    {"data": (3, 384, 1248)},
)
DETECTNET_TYPED_SHAPES = {
    # What DetectNet needed typed by hand before: the label at DIGITS' default padding (64 boxes and a header row),
    # the clustering layers' box lists at (num, 50 boxes, 5 values), the scored list alike, and mAP's three scalars.
    "data": (3, 384, 1248),
    "label": (1, 65, 16),
    "cluster/bbox-list": (6, 50, 5),
    "cluster_gt/bbox-list-label": (6, 50, 5),
    "score/bbox-list-scored": (6, 50, 5),
    "mAP/mAP": (1,), "mAP/precision": (1,), "mAP/recall": (1,),
}


def generic_data_shapes(text: str) -> dict[str, Any]:
    """Shapes for the data tops of any zoo net alone: an ImageNet-sized image (an HDF5 row of 4 values), a label,
    and for a Python data layer a small image and its dense label (FCN's VOC layer)."""
    from digits_memplugin.core.prototxt import parse_net

    shapes: dict[str, Any] = {}
    for layer in parse_net(text).layer:
        if layer.type in ("Data", "ImageData", "HDF5Data", "WindowData") and not len(layer.bottom):
            for i, top in enumerate(layer.top):
                shapes[top] = ((4,) if layer.type == "HDF5Data" else IMAGENET) if i == 0 else ()
        elif layer.type == "Python" and not len(layer.bottom):
            for i, top in enumerate(layer.top):
                shapes[top] = (1, 3, 64, 64) if i == 0 else (1, 1, 64, 64)
    return shapes
SMALL = ["caffe_lenet", "caffe_cifar10_quick", "caffe_hdf5_classification", "caffe_mnist_siamese", "digits_lenet"]
"""Cheap enough to measure in `make test` (seconds each)."""


def as_training_net(deploy_text: str, batch: int = 8) -> str:
    """A deploy net as one would train it: the Input becomes a Data layer with labels (read from an LMDB), the
    last Softmax becomes SoftmaxWithLoss against those labels."""
    net = caffe_pb2.NetParameter()
    text_format.Parse(deploy_text, net)
    input_name = None
    if len(net.input):
        input_name = net.input[0]
        net.ClearField("input")
        net.ClearField("input_shape")
        net.ClearField("input_dim")
    layers = list(net.layer)
    net.ClearField("layer")
    data = net.layer.add()
    data.name, data.type = "data", "Data"
    data.top.extend([input_name or "data", "label"])
    data.data_param.source = "train_lmdb"
    data.data_param.backend = caffe_pb2.DataParameter.LMDB
    data.data_param.batch_size = batch
    for layer in layers:
        if layer.type == "Input":
            continue
        copy = net.layer.add()
        copy.CopyFrom(layer)
    last = net.layer[len(net.layer) - 1]
    if last.type != "Softmax":
        raise ValueError(f"expected the deploy net to end with Softmax, it ends with {last.type}")
    last.type = "SoftmaxWithLoss"
    last.bottom.append("label")
    last.top[0] = "loss"
    return text_format.MessageToString(net)
