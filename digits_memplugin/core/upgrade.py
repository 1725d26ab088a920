"""Caffe's own upgrades of legacy definitions (src/caffe/util/upgrade_proto.cpp), ported to caffe_pb2 messages.

Same order and same rules as UpgradeNetAsNeeded: data-transformation fields, V1 `layers` to V2 `layer`, net-level
`input` fields to an Input layer, old three-param BatchNorm; and the solver's `solver_type` enum to `type`.
V0 nets (layers with a nested `layer`) predate 2014 and are refused with a clear error.
"""

from __future__ import annotations

from typing import Any

from .errors import NetError
from .proto import caffe_pb2

V1 = caffe_pb2.V1LayerParameter

# UpgradeV1LayerType: the V1 enum's names to the registry's type strings.
V1_LAYER_TYPES: dict[int, str] = {
    V1.NONE: "",
    V1.ABSVAL: "AbsVal",
    V1.ACCURACY: "Accuracy",
    V1.ARGMAX: "ArgMax",
    V1.BNLL: "BNLL",
    V1.CONCAT: "Concat",
    V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
    V1.CONVOLUTION: "Convolution",
    V1.DECONVOLUTION: "Deconvolution",
    V1.DATA: "Data",
    V1.DROPOUT: "Dropout",
    V1.DUMMY_DATA: "DummyData",
    V1.EUCLIDEAN_LOSS: "EuclideanLoss",
    V1.ELTWISE: "Eltwise",
    V1.EXP: "Exp",
    V1.FLATTEN: "Flatten",
    V1.HDF5_DATA: "HDF5Data",
    V1.HDF5_OUTPUT: "HDF5Output",
    V1.HINGE_LOSS: "HingeLoss",
    V1.IM2COL: "Im2col",
    V1.IMAGE_DATA: "ImageData",
    V1.INFOGAIN_LOSS: "InfogainLoss",
    V1.INNER_PRODUCT: "InnerProduct",
    V1.LRN: "LRN",
    V1.MEMORY_DATA: "MemoryData",
    V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss",
    V1.MVN: "MVN",
    V1.POOLING: "Pooling",
    V1.POWER: "Power",
    V1.RELU: "ReLU",
    V1.SIGMOID: "Sigmoid",
    V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss",
    V1.SILENCE: "Silence",
    V1.SOFTMAX: "Softmax",
    V1.SOFTMAX_LOSS: "SoftmaxWithLoss",
    V1.SPLIT: "Split",
    V1.SLICE: "Slice",
    V1.TANH: "TanH",
    V1.WINDOW_DATA: "WindowData",
    V1.THRESHOLD: "Threshold",
}

# The per-type parameter messages UpgradeV1LayerParameter copies, in its order.
V1_COPIED_PARAMS = (
    "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param", "convolution_param", "data_param",
    "dropout_param", "dummy_data_param", "eltwise_param", "exp_param", "hdf5_data_param", "hdf5_output_param",
    "hinge_loss_param", "image_data_param", "infogain_loss_param", "inner_product_param", "lrn_param",
    "memory_data_param", "mvn_param", "pooling_param", "power_param", "relu_param", "sigmoid_param",
    "softmax_param", "slice_param", "tanh_param", "threshold_param", "window_data_param", "transform_param",
    "loss_param",
)

# UpgradeNetDataTransformation: V1 data layers that carried transformation fields in their own parameter.
V1_TRANSFORM_OWNERS = {V1.DATA: "data_param", V1.IMAGE_DATA: "image_data_param", V1.WINDOW_DATA: "window_data_param"}
TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")

SOLVER_TYPES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}


def upgrade_net(net: Any, source: str) -> None:
    """Upgrade `net` (a caffe_pb2.NetParameter) in place."""
    if any(v1_layer.HasField("layer") for v1_layer in net.layers):
        raise NetError(
            "uses the V0 layer format (layers { layer { ... } }), which this tool does not read; "
            "upgrade it with Caffe's upgrade_net_proto_text",
            source=source,
        )
    _upgrade_data_transformation(net)
    if len(net.layers):
        _upgrade_v1_net(net, source)
    if len(net.input):
        _upgrade_input(net, source)
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            del layer.param[:]


def _upgrade_data_transformation(net: Any) -> None:
    """UpgradeNetDataTransformation, run only when NetNeedsDataUpgrade: like the C++ macro, it touches the
    transform_param and the data layer's own parameter of every V1 data layer (an empty message becomes present)."""
    needs_upgrade = any(
        getattr(v1_layer, owner).HasField(field)
        for v1_layer in net.layers
        if (owner := V1_TRANSFORM_OWNERS.get(v1_layer.type)) is not None
        for field in TRANSFORM_FIELDS
    )
    if not needs_upgrade:
        return
    for v1_layer in net.layers:
        owner = V1_TRANSFORM_OWNERS.get(v1_layer.type)
        if owner is None:
            continue
        params = getattr(v1_layer, owner)
        params.SetInParent()
        v1_layer.transform_param.SetInParent()
        for field in TRANSFORM_FIELDS:
            if params.HasField(field):
                setattr(v1_layer.transform_param, field, getattr(params, field))
                params.ClearField(field)


def _upgrade_v1_net(net: Any, source: str) -> None:
    if len(net.layer):
        raise NetError(
            "mixes the V1 'layers' format and the current 'layer' format; Caffe refuses such a net", source=source
        )
    v1_layers = list(net.layers)
    net.ClearField("layers")
    for v1_layer in v1_layers:
        layer = net.layer.add()
        layer.bottom.extend(v1_layer.bottom)
        layer.top.extend(v1_layer.top)
        if v1_layer.HasField("name"):
            layer.name = v1_layer.name
        for rule in v1_layer.include:
            layer.include.add().CopyFrom(rule)
        for rule in v1_layer.exclude:
            layer.exclude.add().CopyFrom(rule)
        if v1_layer.HasField("type"):
            if v1_layer.type not in V1_LAYER_TYPES:
                raise NetError(f"unknown V1 layer type {v1_layer.type}", source=source, layer=v1_layer.name or None)
            layer.type = V1_LAYER_TYPES[v1_layer.type]
        for blob in v1_layer.blobs:
            layer.blobs.add().CopyFrom(blob)
        for i, name in enumerate(v1_layer.param):
            _param_spec(layer, i).name = name
        for i, mode in enumerate(v1_layer.blob_share_mode):
            _param_spec(layer, i).share_mode = mode  # STRICT and PERMISSIVE have the same numbers in both enums
        for i, lr in enumerate(v1_layer.blobs_lr):
            _param_spec(layer, i).lr_mult = lr
        for i, decay in enumerate(v1_layer.weight_decay):
            _param_spec(layer, i).decay_mult = decay
        layer.loss_weight.extend(v1_layer.loss_weight)
        for field in V1_COPIED_PARAMS:
            if v1_layer.HasField(field):
                getattr(layer, field).CopyFrom(getattr(v1_layer, field))


def _param_spec(layer: Any, index: int) -> Any:
    """The layer's ParamSpec at `index`, adding empty ones up to it (as UpgradeV1LayerParameter does)."""
    while len(layer.param) <= index:
        layer.param.add()
    return layer.param[index]


def _upgrade_input(net: Any, source: str) -> None:
    """UpgradeNetInput: `input` + `input_shape`/`input_dim` become an Input layer placed first."""
    names = list(net.input)
    if len(net.input_shape) or len(net.input_dim):
        shapes: list[list[int]] = []
        if len(net.input_shape):
            if len(net.input_shape) < len(names):
                raise NetError(
                    f"declares {len(names)} inputs but {len(net.input_shape)} input_shape entries",
                    source=source,
                    field="input_shape",
                )
            shapes = [list(shape.dim) for shape in net.input_shape[: len(names)]]
        else:
            if len(net.input_dim) < 4 * len(names):
                raise NetError(
                    f"declares {len(names)} inputs but {len(net.input_dim)} input_dim values (4 per input expected)",
                    source=source,
                    field="input_dim",
                )
            dims = list(net.input_dim)
            shapes = [dims[4 * i : 4 * i + 4] for i in range(len(names))]
        layers = list(net.layer)
        net.ClearField("layer")
        input_layer = net.layer.add()
        input_layer.name = "input"
        input_layer.type = "Input"
        input_layer.top.extend(names)
        for shape in shapes:
            input_layer.input_param.shape.add().dim.extend(shape)
        for layer in layers:
            net.layer.add().CopyFrom(layer)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def check_inline_net(net: Any, source: str, field: str, index: int | None = None) -> None:
    """Refuse a net given inside a solver in a legacy form. Caffe's Solver copies net_param, train_net_param and
    test_net_param as they are, without UpgradeNetAsNeeded: V1 `layers` would leave it a net with no layers at all
    and net-level `input` fields are ignored (its first layer then fails on an unknown bottom). Either way the net
    Caffe trains is not the one written, so the estimate says so instead of upgrading it."""
    which = "" if index is None else f"test net #{index} "
    if len(net.layers):
        raise NetError(
            which + "uses the V1 'layers' format inside the solver; Caffe upgrades only net files, so it would build this "
            "net with no layers at all; convert it to 'layer' blocks or move it to a file named by `net`",
            source=source,
            field=field,
        )
    if len(net.input) or len(net.input_shape) or len(net.input_dim):
        raise NetError(
            which + "uses net-level input fields inside the solver; Caffe reads them only from net files and ignores them "
            "here; declare the inputs with an Input layer instead",
            source=source,
            field=field,
        )


def upgrade_solver(solver: Any, source: str) -> None:
    """UpgradeSolverType: the legacy `solver_type` enum becomes the `type` string."""
    if not solver.HasField("solver_type"):
        return
    if solver.HasField("type"):
        raise NetError(
            "sets both the old solver_type (enum) and the new type (string); Caffe refuses that",
            source=source,
            field="solver_type",
        )
    solver.type = SOLVER_TYPES[solver.solver_type]
    solver.ClearField("solver_type")
