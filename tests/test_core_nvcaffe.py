"""NVcaffe (NVIDIA's Caffe fork, which DIGITS ships): its schema flavour, the rules of the layers it adds, its
memory semantics, and the refusal of its jobs on this BVLC server.

Each rule's expected shapes are worked out from NVcaffe 0.17.3's C++ (mirror NEWPLAN/nvcaffe-0.17.3, commit
12cba10, src/caffe/layers/<name>_layer.cpp), as cited per test: no NVcaffe build exists here (it needs CUDA).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from digits_memplugin.core import nvcaffe_pb2
from digits_memplugin.core.errors import NetError, PrototxtSyntaxError, ShapeError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.flavour import (
    BUNDLED_CAFFE,
    BVLC,
    NVCAFFE,
    NVCAFFE_SAFETY_MARGIN,
    NVCAFFE_UNVERIFIED,
    SSD,
    builders,
    caffes_that_build,
    can_train,
    definition_flavour,
    flavour_of,
    nvcaffe_reads,
    pool_allocation,
)
from digits_memplugin.core.layers.base import (
    ACTIVATION_DIFFS,
    ACTIVATIONS,
    ENGINE_CUDNN,
    ENGINE_GPU,
    PARAMS,
    SOLVER_HISTORY,
    WORKSPACE,
)
from digits_memplugin.core.memory import MemoryOptions, job_memory, net_memory
from digits_memplugin.core.net import Net, build_net
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.prototxt import parse_net, parse_solver
from digits_memplugin.core.training import training_definition
from digits_memplugin.jobs.definition.loading import NVCAFFE_REFUSAL, Trainer, load_definition

NV = "default_forward_type: FLOAT\n"
"""A net-level field only NVcaffe's schema has: the text is then read as an NVcaffe net."""


def nv_net(layers: str, phase: str = "TRAIN", head: str = NV, **kwargs: Any) -> Net:
    param = parse_net(head + layers)
    assert flavour_of(param) == NVCAFFE
    return build_net(param, phase, **kwargs)


def shapes(net: Net) -> dict[str, tuple[int, ...]]:
    return {blob.name: blob.shape for blob in net.blobs}


def params(net: Net, layer: str) -> list[tuple[int, ...]]:
    found = next(item for item in net.layers if item.name == layer)
    return [net.params[i].shape for i in found.params]


def input_layer(name: str, *dims: int) -> str:
    shape = " ".join(f"dim: {d}" for d in dims)
    return f'layer {{ name: "{name}" type: "Input" top: "{name}" input_param {{ shape {{ {shape} }} }} }}\n'


# ---------------------------------------------------------------------------------------------- the schema


def test_both_schemas_live_in_one_process_without_clashing() -> None:
    assert caffe_pb2.LayerParameter.DESCRIPTOR.full_name == "caffe.LayerParameter"
    assert nvcaffe_pb2.LayerParameter.DESCRIPTOR.full_name == "nvcaffe.LayerParameter"
    fields = nvcaffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
    # caffe.proto (caffe-0.17): forward_type = 145 ... cudnn_math_override = 150, DetectNet's at 6801 / 6802.
    assert fields["forward_type"].number == 145 and fields["cudnn_math_override"].number == 150
    assert fields["detectnet_groundtruth_param"].number == 6801
    # 0.17.3 moved BVLC's recurrent_param (146, now backward_type) to 151; it has no Parameter layer.
    assert fields["recurrent_param"].number == 151 and "parameter_param" not in fields
    assert nvcaffe_pb2.FLOAT16 == 2 and nvcaffe_pb2.TRAIN == caffe_pb2.TRAIN
    assert "ceil_mode" not in nvcaffe_pb2.PoolingParameter.DESCRIPTOR.fields_by_name
    resize = nvcaffe_pb2.TransformationParameter.DESCRIPTOR.fields_by_name["resize_param"]
    assert resize.number == 208 and resize.message_type.full_name == "nvcaffe.ResizeParameter"


def test_a_net_is_read_with_bvlc_first_and_nvcaffe_when_it_needs_it() -> None:
    plain = input_layer("x", 1, 3, 8, 8)
    assert flavour_of(parse_net(plain)) == BVLC
    assert flavour_of(parse_net(NV + plain)) == NVCAFFE
    bn = plain + 'layer { name: "bn" type: "BatchNorm" bottom: "x" top: "bn" batch_norm_param { scale_bias: true } }'
    assert flavour_of(parse_net(bn)) == NVCAFFE
    solver = parse_solver('base_lr: 0.1 solver_data_type: FLOAT16 lr_policy: "poly" min_lr: 0.001')
    assert flavour_of(solver) == NVCAFFE and solver.solver_data_type == nvcaffe_pb2.FLOAT16


def test_a_text_neither_schema_reads_gets_bvlc_s_error() -> None:
    with pytest.raises(PrototxtSyntaxError) as caught:
        parse_net(NV + 'layer { name: "x" no_such_field: 1 }')
    assert "caffe.NetParameter" in str(caught.value) and "default_forward_type" in str(caught.value)


# ---------------------------------------------------------------------------------------------- SSD rules


def test_prior_box_counts_ratios_flips_and_max_sizes() -> None:
    # prior_box_layer.cpp LayerSetUp: ratios [1] + 2 + 1/2 (flip), x 1 min_size, + 1 max_size = 4 priors;
    # Reshape: (1, 2, H * W * priors * 4).
    net = nv_net(
        input_layer("feat", 2, 512, 38, 38) + input_layer("data", 2, 3, 300, 300)
        + 'layer { name: "p" type: "PriorBox" bottom: "feat" bottom: "data" top: "p" prior_box_param { '
        "min_size: 30 max_size: 60 aspect_ratio: 2 flip: true clip: false variance: 0.1 variance: 0.1 "
        "variance: 0.2 variance: 0.2 step: 8 } }\n"
        # [1, 2, 1/2, 3, 1/3] x 1, no max_size: 5 priors; the repeated 2 and the 0.5 (already there) are dropped.
        + 'layer { name: "q" type: "PriorBox" bottom: "feat" bottom: "data" top: "q" prior_box_param { '
        "min_size: 30 aspect_ratio: 2 aspect_ratio: 3 aspect_ratio: 2 aspect_ratio: 0.5 } }\n"
    )
    assert shapes(net)["p"] == (1, 2, 38 * 38 * 4 * 4)
    assert shapes(net)["q"] == (1, 2, 38 * 38 * 5 * 4)


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("aspect_ratio: 2", "must provide min_size"),
        ("min_size: 30 max_size: 20", "max_size must be greater than min_size"),
        ("min_size: 30 max_size: 60 max_size: 90", "once per min_size"),
        ("min_size: 30 variance: 0.1 variance: 0.2", "one variance or four"),
        ("min_size: 30 img_size: 300 img_h: 300 img_w: 300", "img_size or img_h/img_w"),
        ("min_size: 30 step: 8 step_h: 8 step_w: 8", "step or step_h/step_w"),
    ],
)
def test_prior_box_aborts_where_its_checks_do(param: str, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        nv_net(input_layer("feat", 1, 4, 5, 5) + input_layer("data", 1, 3, 40, 40)
               + f'layer {{ name: "p" type: "PriorBox" bottom: "feat" bottom: "data" top: "p" '
               f"prior_box_param {{ {param} }} }}")


def test_permute_moves_axes_and_shares_the_blob_for_the_identity() -> None:
    # permute_layer.cpp: the given orders first, then the missing axes in order; identity -> ShareData/ShareDiff.
    net = nv_net(
        input_layer("x", 2, 12, 38, 19)
        + 'layer { name: "nhwc" type: "Permute" bottom: "x" top: "nhwc" permute_param { order: 0 order: 2 order: 3 order: 1 } }\n'
        + 'layer { name: "rest" type: "Permute" bottom: "x" top: "rest" permute_param { order: 3 } }\n'
        + 'layer { name: "same" type: "Permute" bottom: "x" top: "same" permute_param { order: 0 } }\n'
    )
    assert shapes(net)["nhwc"] == (2, 38, 19, 12)
    assert shapes(net)["rest"] == (19, 2, 12, 38)
    same = net.blob("same")
    assert same.shape == (2, 12, 38, 19) and same.data_of == net.blob("x").id
    memory = net_memory(net, MemoryOptions(engine=ENGINE_GPU))
    assert next(m for m in memory if m.name == "same").categories[ACTIVATIONS] == 0


@pytest.mark.parametrize(("orders", "message"), [("order: 4", "less than"), ("order: 1 order: 1", "given twice")])
def test_permute_refuses_bad_orders(orders: str, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        nv_net(input_layer("x", 1, 2, 3, 4) + f'layer {{ name: "p" type: "Permute" bottom: "x" top: "p" permute_param {{ {orders} }} }}')


def test_normalize_keeps_the_shape_and_learns_one_scale_or_one_per_channel() -> None:
    # normalize_layer.cpp: blobs_[0] is vector<int>(0) (a scalar) when channel_shared, else (channels).
    net = nv_net(
        input_layer("x", 2, 512, 38, 38)
        + 'layer { name: "per" type: "Normalize" bottom: "x" top: "per" norm_param { across_spatial: false channel_shared: false } }\n'
        + 'layer { name: "one" type: "Normalize" bottom: "x" top: "one" }\n'
    )
    assert shapes(net)["per"] == shapes(net)["one"] == (2, 512, 38, 38)
    assert params(net, "per") == [(512,)] and params(net, "one") == [()]
    buffers = {m.name: {b.name: b.count for b in m.buffers} for m in net_memory(net, MemoryOptions(engine=ENGINE_GPU))}
    assert buffers["per"]["norm"] == 2 * 38 * 38 and buffers["one"]["norm"] == 2
    with pytest.raises(ShapeError, match="at least 2 axes"):
        nv_net(input_layer("x", 5) + 'layer { name: "n" type: "Normalize" bottom: "x" top: "n" }')


ANNOTATED = """layer {{ name: "data" type: "AnnotatedData" top: "data" top: "label"
  data_param {{ source: "train_lmdb" batch_size: {batch} backend: LMDB }}
  transform_param {{ resize_param {{ resize_mode: {mode} height: 300 width: 300 }} }} }}
"""


def test_annotated_data_takes_the_resize_and_a_batch_of_boxes() -> None:
    # annotated_data_layer.cpp DataLayerSetUp: top[0] = (batch, InferBlobShape(resized datum)), top[1] =
    # (1, 1, boxes, 8) with at least one box.
    net = nv_net(ANNOTATED.format(batch=8, mode="WARP"))
    assert shapes(net) == {"data": (8, 3, 300, 300), "label": (1, 1, 8 * 8, 8)}
    given = nv_net(ANNOTATED.format(batch=8, mode="WARP"), data_shapes={"label": (5,), "data": (3, 480, 640)})
    assert shapes(given) == {"data": (8, 3, 300, 300), "label": (1, 1, 5, 8)}
    with pytest.raises(ShapeError, match="FIT_SMALL_SIZE only supports a batch size of 1"):
        nv_net(ANNOTATED.format(batch=8, mode="FIT_SMALL_SIZE"))


def detection_inputs(num: int = 2, priors: int = 24, classes: int = 21) -> str:
    return (input_layer("loc", num, priors * 4) + input_layer("conf", num, priors * classes)
            + input_layer("priors", 1, 2, priors * 4) + input_layer("gt", 1, 1, 3, 8))


def test_multibox_loss_checks_priors_against_predictions() -> None:
    # multibox_loss_layer.cpp Reshape: num_priors = bottom[2]->height() / 4; loc channels = priors x 4 (shared
    # location), conf channels = priors x classes; a scalar loss (LossLayer).
    layer = ('layer {{ name: "loss" type: "MultiBoxLoss" bottom: "loc" bottom: "conf" bottom: "priors" bottom: "gt" '
             'top: "loss" propagate_down: true propagate_down: true propagate_down: false propagate_down: false '
             "multibox_loss_param {{ num_classes: {classes} {extra} }} }}")
    net = nv_net(detection_inputs() + layer.format(classes=21, extra=""))
    assert shapes(net)["loss"] == ()
    with pytest.raises(ShapeError, match="confidence predictions"):
        nv_net(detection_inputs() + layer.format(classes=20, extra=""))
    with pytest.raises(ShapeError, match="background_label_id"):
        nv_net(detection_inputs() + layer.format(classes=21, extra="background_label_id: 21"))
    with pytest.raises(ShapeError, match="negative mining needs share_location"):
        nv_net(detection_inputs() + layer.format(classes=21, extra="share_location: false"))


def test_detection_output_is_one_fake_row_growing_to_keep_top_k_per_image() -> None:
    # detection_output_layer.cpp Reshape: (1, 1, 1, 7); Forward keeps at most keep_top_k rows per image.
    net = nv_net(detection_inputs()
                 + 'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "priors" top: "det" '
                 "detection_output_param { num_classes: 21 keep_top_k: 200 nms_param { nms_threshold: 0.45 } } }\n"
                 + 'layer { name: "eval" type: "DetectionEvaluate" bottom: "det" bottom: "gt" top: "eval" '
                 "detection_evaluate_param { num_classes: 21 background_label_id: 0 } }\n", phase="TEST")
    # detection_evaluate_layer.cpp Reshape: (1, 1, positive classes (20) + the detection rows (1), 5).
    assert shapes(net)["det"] == (1, 1, 1, 7) and shapes(net)["eval"] == (1, 1, 21, 5)
    buffers = {b.name: b.count for m in net_memory(net, MemoryOptions(engine=ENGINE_GPU)) for b in m.buffers}
    assert buffers["top.grown"] == (2 * 200 - 1) * 7
    assert buffers["conf_permute"] == 2 * 24 * 21 and "bbox_permute" not in buffers
    with pytest.raises(ShapeError, match="must be \\(1, 1, rows, 8\\)"):
        nv_net(input_layer("det", 1, 1, 1, 7) + input_layer("gt", 1, 1, 3, 7)
               + 'layer { name: "e" type: "DetectionEvaluate" bottom: "det" bottom: "gt" top: "e" '
               "detection_evaluate_param { num_classes: 2 } }", phase="TEST")


# ---------------------------------------------------------------------------------------------- DetectNet


TRANSFORM = """layer {{ name: "t" type: "DetectNetTransformation" bottom: "images" bottom: "labels"
  top: "data" top: "tensor"
  detectnet_groundtruth_param {{ stride: 16 image_size_x: 1248 image_size_y: 384 {classes} }} }}
"""


def test_detectnet_transformation_gives_the_image_size_and_a_grid_of_labels() -> None:
    # detectnet_transform_layer.cpp Reshape: (N, 3, image_size_y, image_size_x) and coverage_->dimensions():
    # (TRANSFORMED_LABEL_SIZE 8 + classes, image_size_y / stride, image_size_x / stride).
    inputs = input_layer("images", 2, 3, 370, 1224) + input_layer("labels", 2, 1, 50, 16)
    one = nv_net(inputs + TRANSFORM.format(classes="object_class { src: 1 dst: 0 }"))
    assert shapes(one)["data"] == (2, 3, 384, 1248) and shapes(one)["tensor"] == (2, 9, 24, 78)
    two = nv_net(inputs + TRANSFORM.format(classes="object_class { src: 1 dst: 0 } object_class { src: 2 dst: 1 }"))
    assert shapes(two)["tensor"] == (2, 10, 24, 78)
    with pytest.raises(ShapeError, match="three-channel"):
        nv_net(input_layer("images", 2, 1, 370, 1224) + input_layer("labels", 2, 1, 50, 16) + TRANSFORM.format(classes=""))


def test_l1_loss_wants_equal_counts_and_keeps_diff_and_sign() -> None:
    # l1_loss_layer.cpp Reshape: LossLayer's same-num check, count(1) equal, diff_ and sign_ like bottom[0].
    net = nv_net(input_layer("a", 2, 4, 24, 78) + input_layer("b", 2, 4, 24, 78)
                 + 'layer { name: "l1" type: "L1Loss" bottom: "a" bottom: "b" top: "l1" }')
    assert shapes(net)["l1"] == ()
    buffers = {b.name: b.count for m in net_memory(net, MemoryOptions(engine=ENGINE_GPU)) for b in m.buffers}
    assert buffers["diff"] == buffers["sign"] == 2 * 4 * 24 * 78
    with pytest.raises(ShapeError, match="same dimension"):
        nv_net(input_layer("a", 2, 4, 24, 78) + input_layer("b", 2, 1, 24, 78)
               + 'layer { name: "l1" type: "L1Loss" bottom: "a" bottom: "b" top: "l1" }')


CLUSTERING = "caffe.layers.detectnet.clustering"
MEAN_AP = "caffe.layers.detectnet.mean_ap"


def python_layer(name: str, module: str, layer: str, bottoms: tuple[str, ...], tops: tuple[str, ...],
                 param_str: str | None = None) -> str:
    wiring = "".join(f' bottom: "{b}"' for b in bottoms) + "".join(f' top: "{t}"' for t in tops)
    param = f" param_str: '{param_str}'" if param_str is not None else ""
    return (f'layer {{ name: "{name}" type: "Python"{wiring} '
            f'python_param {{ module: "{module}" layer: "{layer}"{param} }} }}\n')


DETECTIONS = "1248, 352, 16, 0.6, 3, 0.02, 22, 1"
"""DIGITS' DetectNet's param_str for ClusterDetections (image x, y, stride, thresholds, min height, 1 class)."""


def test_detectnet_s_python_layers_are_shaped_by_their_source() -> None:
    """clustering.py and mean_ap.py (NVcaffe's python/caffe/layers/detectnet) are never imported; their reshape
    fixes the tops: one (images, max_boxes, 5) box list per class, the scored list at (images, 50, 5), mAP's three
    one-value tops. No shape need be given."""
    inputs = input_layer("cov", 2, 1, 24, 78) + input_layer("boxes", 2, 4, 24, 78)
    net = nv_net(
        inputs
        + python_layer("cluster", CLUSTERING, "ClusterDetections", ("cov", "boxes"), ("det",), DETECTIONS)
        + python_layer("cluster_gt", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("gt",), "1248, 352, 16, 1")
        + python_layer("score", MEAN_AP, "ScoreDetections", ("gt", "det"), ("scored",))
        + python_layer("mAP", MEAN_AP, "mAP", ("scored",), ("mAP", "precision", "recall"), "1248, 352, 16")
    )
    found = shapes(net)
    assert found["det"] == found["gt"] == found["scored"] == (2, 50, 5)
    assert found["mAP"] == found["precision"] == found["recall"] == (1,)
    two = input_layer("cov2", 3, 2, 24, 78) + input_layer("boxes", 3, 4, 24, 78)
    net = nv_net(two + python_layer("c", CLUSTERING, "ClusterDetections", ("cov2", "boxes"), ("car", "person"),
                                    "1248, 352, 16, 0.6, 3, 0.02, 22, 2, 30"))
    assert shapes(net)["car"] == shapes(net)["person"] == (3, 30, 5)
    # A shape given for such a top is checked past the batch axis (a planner's batch changes the first).
    given = nv_net(inputs + python_layer("cluster", CLUSTERING, "ClusterDetections", ("cov", "boxes"), ("det",),
                                         DETECTIONS), data_shapes={"cluster/det": (6, 50, 5)})
    assert shapes(given)["det"] == (2, 50, 5)
    with pytest.raises(ShapeError, match=r"shapes top 'det' as \[2, 50, 5\].*\[6, 40, 5\].*differs"):
        nv_net(inputs + python_layer("cluster", CLUSTERING, "ClusterDetections", ("cov", "boxes"), ("det",),
                                     DETECTIONS), data_shapes={"cluster/det": (6, 40, 5)})
    # Any other Python layer still needs its shapes given.
    mine = python_layer("mine", "my.layers", "Cluster", ("cov",), ("out",))
    assert shapes(nv_net(inputs + mine, data_shapes={"mine/out": (2, 7)}))["out"] == (2, 7)
    with pytest.raises(ShapeError, match="never imports"):
        nv_net(inputs + mine)


@pytest.mark.parametrize(("layer", "message"), [
    (python_layer("c", CLUSTERING, "ClusterDetections", ("cov", "boxes"), ("det",)),
     r"param_str value 1 \(image_size_x\) must be an integer, got ''"),
    (python_layer("c", CLUSTERING, "ClusterDetections", ("cov", "boxes"), ("det",), "1248, 352, 16, 0.6"),
     "has 4 value.*reads gridbox_rect_thresh from value 5"),
    (python_layer("c", CLUSTERING, "ClusterDetections", ("cov", "boxes"), ("det",), "1248, 352, 16, x, 3, 0.02, 22"),
     r"value 4 \(gridbox_cvg_threshold\) must be a number"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("a",), "1248, 3_52, 16"),
     r"value 2 \(image_size_y\) must be an integer, got ' 3_52'"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("a",), "\u0661\u0662, 352, 16"),
     "value 1 .* must be an integer"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("a",), "9" * 5000 + ", 352, 16"),
     r"got '9{40}\.\.\. \(5000 characters\)'$"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("a", "b"), "1248, 352, 16, 1"),
     "has 2 top.*names 1 class"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("a", "b"), "1248, 352, 16, 2"),
     "1 class channel.*names 2"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov", "boxes"), ("a",), "1248, 352, 16, 1, -1"),
     "max_boxes must not be negative"),
    (python_layer("c", CLUSTERING, "ClusterGroundtruth", ("cov",), ("a",), "1248, 352, 16"), "at least 2 bottom"),
    (python_layer("s", MEAN_AP, "ScoreDetections", ("cov", "other"), ("scored",)), "# of images not matching"),
    (python_layer("m", MEAN_AP, "mAP", ("cov",), ("mAP", "precision")), "exactly 3 top"),
])
def test_detectnet_s_python_layers_stop_where_their_source_does(layer: str, message: str) -> None:
    inputs = input_layer("cov", 2, 1, 24, 78) + input_layer("boxes", 2, 4, 24, 78) + input_layer("other", 3, 1)
    with pytest.raises(ShapeError, match=message):
        nv_net(inputs + layer)


def test_nvcaffe_batch_norm_learns_scale_and_bias_with_scale_bias() -> None:
    # batch_norm_layer.cpp LayerSetUp: blobs_ mean (C), variance (C), correction (1); with scale_bias (or a
    # scale/bias filler) also scale (C) and bias (C).
    net = nv_net(input_layer("x", 2, 16, 7, 7)
                 + 'layer { name: "sb" type: "BatchNorm" bottom: "x" top: "sb" batch_norm_param { scale_bias: true } }\n'
                 + 'layer { name: "plain" type: "BatchNorm" bottom: "x" top: "plain" }\n'
                 + 'layer { name: "filled" type: "BatchNorm" bottom: "x" top: "filled" batch_norm_param { bias_filler { value: 0 } } }\n')
    assert params(net, "sb") == params(net, "filled") == [(16,), (16,), (1,), (16,), (16,)]
    assert params(net, "plain") == [(16,), (16,), (1,)]
    with pytest.raises(ShapeError, match="2 or at least 4 axes"):
        nv_net(input_layer("x", 2, 16, 7) + 'layer { name: "bn" type: "BatchNorm" bottom: "x" top: "bn" }')


# ---------------------------------------------------------------------------------------------- memory


def test_pool_rounds_small_allocations_to_powers_of_two() -> None:
    # gpu_memory.cpp: cub::CachingDeviceAllocator(BIN_GROWTH 2, MIN_BIN 6, MAX_BIN 22).
    assert [pool_allocation(n) for n in (0, 1, 64, 65, 4 << 20, (4 << 20) + 1)] == [0, 64, 64, 128, 4 << 20, (4 << 20) + 1]


def big_conv(extra: str = "") -> str:
    """Two 3x3 convolutions on a 16 MiB blob (64 x 256 x 256 floats) and a loss."""
    return input_layer("x", 1, 64, 256, 256) + (
        f'layer {{ name: "c1" type: "Convolution" bottom: "x" top: "c1" {extra} '
        "convolution_param { num_output: 64 kernel_size: 3 pad: 1 } }\n"
        'layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2" '
        "convolution_param { num_output: 64 kernel_size: 3 pad: 1 } }\n"
        'layer { name: "loss" type: "EuclideanLoss" bottom: "c2" bottom: "x" top: "loss" }\n'
    )


def by_layer(net: Net, engine: str = ENGINE_GPU) -> dict[str, dict[str, int]]:
    return {m.name: dict(m.categories) for m in net_memory(net, MemoryOptions(engine=engine, flavour=NVCAFFE))}


def test_float16_storage_halves_data_and_diffs() -> None:
    # NVcaffe's Layer<Ftype, Btype>: tops and params in the forward type, diffs in the backward type; the net's
    # default_forward_type / default_backward_type apply where a layer sets none. 16 MiB blobs: no pool rounding.
    fp32 = by_layer(nv_net(big_conv()))
    fp16 = by_layer(nv_net(big_conv(), head="default_forward_type: FLOAT16 default_backward_type: FLOAT16\n"))
    assert fp16["c1"][ACTIVATIONS] * 2 == fp32["c1"][ACTIVATIONS] == 64 * 256 * 256 * 4
    assert fp16["c2"][ACTIVATION_DIFFS] * 2 == fp32["c2"][ACTIVATION_DIFFS]
    mixed = by_layer(nv_net(big_conv("forward_type: FLOAT16")))
    assert mixed["c1"][ACTIVATIONS] * 2 == fp32["c1"][ACTIVATIONS] and mixed["c2"] == fp32["c2"]


def test_one_shared_cudnn_workspace_is_counted_once() -> None:
    net = nv_net(big_conv())
    report = job_memory(net, [], MemoryOptions(engine=ENGINE_CUDNN, flavour=NVCAFFE))
    assert sum(1 for layer in report.layers if layer.categories.get(WORKSPACE)) == 1
    assert NVCAFFE_UNVERIFIED in report.assumptions
    bvlc = build_net(parse_net(big_conv()), "TRAIN")
    bvlc_report = job_memory(bvlc, [], MemoryOptions(engine=ENGINE_CUDNN))
    assert sum(1 for layer in bvlc_report.layers if layer.categories.get(WORKSPACE)) == 2


def test_solver_data_type_sets_the_history_storage() -> None:
    net = NV + big_conv()
    full = estimate(EstimateRequest(net=net, solver='base_lr: 0.1 solver_data_type: FLOAT', engine=ENGINE_GPU))
    half = estimate(EstimateRequest(net=net, solver='base_lr: 0.1 solver_data_type: FLOAT16', engine=ENGINE_GPU))
    assert half["categories"][SOLVER_HISTORY] * 2 == full["categories"][SOLVER_HISTORY]
    assert half["categories"][PARAMS] == full["categories"][PARAMS]


def test_the_estimate_names_its_flavour_and_plans_nvcaffe_with_a_wider_margin() -> None:
    bvlc = estimate(EstimateRequest(net=big_conv(), free_bytes=8 << 30))
    nv = estimate(EstimateRequest(net=NV + big_conv(), free_bytes=8 << 30))
    assert bvlc["flavour"] == BVLC and bvlc["safety_margin"] == 0.03  # the policy's CPU margin, as jobs plan
    assert nv["flavour"] == NVCAFFE and nv["safety_margin"] == NVCAFFE_SAFETY_MARGIN
    assert nv["usable_bytes"] < bvlc["usable_bytes"]
    assert NVCAFFE_UNVERIFIED in nv["assumptions"] and NVCAFFE_UNVERIFIED not in bvlc["assumptions"]


def test_an_nvcaffe_net_gets_no_pycaffe_fallback() -> None:
    def oracle(param: Any, phase: str) -> Any:  # pragma: no cover - must not be asked
        raise AssertionError("BVLC's pycaffe cannot read an NVcaffe net")

    with pytest.raises(NetError, match="NVcaffe net, which BVLC's pycaffe cannot shape"):
        nv_net(input_layer("x", 1, 3, 4, 4) + 'layer { name: "r" type: "NoSuchLayer" bottom: "x" top: "r" }', oracle=oracle)


# ---------------------------------------------------------------------------------------------- jobs


def test_a_job_for_an_nvcaffe_net_is_refused_before_it_starts(tmp_path: Path) -> None:
    net = NV + input_layer("x", 1, 3, 8, 8)
    refusal = re.escape(NVCAFFE_REFUSAL.format(caffe=Trainer().label))
    with pytest.raises(NetError, match=refusal):
        load_definition(net, "base_lr: 0.01 max_iter: 10", folder=tmp_path, roots=[tmp_path])
    with pytest.raises(NetError, match=f"{refusal} \\(its solver"):
        load_definition(input_layer("x", 1, 3, 8, 8), "base_lr: 0.01 max_iter: 10 solver_data_type: FLOAT",
                        folder=tmp_path, roots=[tmp_path])


def detectnet_shaped(trunk_stride: int = 16) -> str:
    """A net wired like DIGITS' DetectNet (data and label LMDBs, the transformation, the label slices and masks,
    coverage and box heads on a stride-16 trunk, L1 and Euclidean losses, the val net's clustering Python layers)
    with a four-convolution trunk in place of GoogLeNet's."""
    data = "".join(
        f'layer {{ name: "{phase}_{top}" type: "Data" top: "{top}" data_param {{ source: "{phase}_{top}" '
        f"backend: LMDB batch_size: {batch} }} include {{ phase: {caffe_phase} {stage} }} }}\n"
        for phase, batch, caffe_phase, stage in (("train", 10, "TRAIN", ""), ("val", 6, "TEST", 'stage: "val"'))
        for top in ("data", "label")
    )
    both = 'include { phase: TRAIN } include { phase: TEST stage: "val" }'
    transform = "".join(
        f'layer {{ name: "{phase}_transform" type: "DetectNetTransformation" bottom: "data" bottom: "label" '
        'top: "transformed_data" top: "transformed_label" detectnet_groundtruth_param { stride: 16 scale_cvg: 0.4 '
        "gridbox_type: GRIDBOX_MIN min_cvg_len: 20 obj_norm: true image_size_x: 1248 image_size_y: 384 "
        "object_class { src: 1 dst: 0 } } transform_param { mean_value: 127 } "
        f"include {{ phase: {caffe_phase} {stage} }} }}\n"
        for phase, caffe_phase, stage in (("train", "TRAIN", ""), ("val", "TEST", 'stage: "val"'))
    )
    labels = (
        'layer { name: "slice-label" type: "Slice" bottom: "transformed_label" top: "foreground-label" '
        'top: "bbox-label" top: "size-label" top: "obj-label" top: "coverage-label" '
        f"slice_param {{ slice_dim: 1 slice_point: 1 slice_point: 5 slice_point: 7 slice_point: 8 }} {both} }}\n"
        'layer { name: "coverage-block" type: "Concat" bottom: "foreground-label" bottom: "foreground-label" '
        f'bottom: "foreground-label" bottom: "foreground-label" top: "coverage-block" {both} }}\n'
        'layer { name: "size-block" type: "Concat" bottom: "size-label" bottom: "size-label" top: "size-block" '
        f"{both} }}\n"
        'layer { name: "obj-block" type: "Concat" bottom: "obj-label" bottom: "obj-label" bottom: "obj-label" '
        f'bottom: "obj-label" top: "obj-block" {both} }}\n'
        'layer { name: "bb-label-norm" type: "Eltwise" bottom: "bbox-label" bottom: "size-block" '
        f'top: "bbox-label-norm" eltwise_param {{ operation: PROD }} {both} }}\n'
        'layer { name: "bb-obj-norm" type: "Eltwise" bottom: "bbox-label-norm" bottom: "obj-block" '
        f'top: "bbox-obj-label-norm" eltwise_param {{ operation: PROD }} {both} }}\n'
    )
    trunk, bottom = "", "transformed_data"
    for index in range(4):
        trunk += (f'layer {{ name: "conv{index}" type: "Convolution" bottom: "{bottom}" top: "conv{index}" '
                  f"convolution_param {{ num_output: 32 kernel_size: 3 pad: 1 stride: 2 }} }}\n"
                  f'layer {{ name: "relu{index}" type: "ReLU" bottom: "conv{index}" top: "conv{index}" }}\n')
        bottom = f"conv{index}"
    heads = (
        f'layer {{ name: "cvg/classifier" type: "Convolution" bottom: "{bottom}" top: "cvg/classifier" '
        "convolution_param { num_output: 1 kernel_size: 1 } }\n"
        'layer { name: "coverage/sig" type: "Sigmoid" bottom: "cvg/classifier" top: "coverage" }\n'
        f'layer {{ name: "bbox/regressor" type: "Convolution" bottom: "{bottom}" top: "bboxes" '
        "convolution_param { num_output: 4 kernel_size: 1 } }\n"
        'layer { name: "bbox_mask" type: "Eltwise" bottom: "bboxes" bottom: "coverage-block" top: "bboxes-masked" '
        f"eltwise_param {{ operation: PROD }} {both} }}\n"
        'layer { name: "bbox-norm" type: "Eltwise" bottom: "bboxes-masked" bottom: "size-block" '
        f'top: "bboxes-masked-norm" eltwise_param {{ operation: PROD }} {both} }}\n'
        'layer { name: "bbox-obj-norm" type: "Eltwise" bottom: "bboxes-masked-norm" bottom: "obj-block" '
        f'top: "bboxes-obj-masked-norm" eltwise_param {{ operation: PROD }} {both} }}\n'
        'layer { name: "bbox_loss" type: "L1Loss" bottom: "bboxes-obj-masked-norm" bottom: "bbox-obj-label-norm" '
        f'top: "loss_bbox" loss_weight: 2 {both} }}\n'
        'layer { name: "coverage_loss" type: "EuclideanLoss" bottom: "coverage" bottom: "coverage-label" '
        f'top: "loss_coverage" {both} }}\n'
        'layer { name: "cluster" type: "Python" bottom: "coverage" bottom: "bboxes" top: "bbox-list" '
        'python_param { module: "caffe.layers.detectnet.clustering" layer: "ClusterDetections" '
        "param_str: '1248, 352, 16, 0.6, 3, 0.02, 22, 1' } "
        'include { phase: TEST stage: "val" } }\n'
    )
    return data + transform + labels + trunk + heads


def test_a_detectnet_shaped_net_estimates_at_digits_defaults() -> None:
    """DIGITS' defaults for DetectNet on KITTI: 1248 x 384 images, batch 10, validation batch 6, DIGITS' stages;
    the label tensor's 9 channels slice into DetectNet's five labels, and the losses meet the heads' shapes. The
    image shape is all it needs: the label LMDB's layout is DIGITS', the clustering layer's top its source's."""
    document = estimate(EstimateRequest(net=detectnet_shaped(), data_shapes={"data": (3, 384, 1248)},
                                        engine=ENGINE_CUDNN, free_bytes=12 << 30))
    assert document["flavour"] == NVCAFFE
    assert document["batch_size"] == 10 and document["test_batch_size"] == 6
    layers = {(layer["name"], layer["phase"]): layer for layer in document["layers"]}
    assert layers[("train_transform", "TRAIN")]["type"] == "DetectNetTransformation"
    assert ("cluster", "TEST") in layers and ("cluster", "TRAIN") not in layers
    net = build_net(parse_net(detectnet_shaped()), "TRAIN", data_shapes={"data": (3, 384, 1248)},
                    state=caffe_pb2.NetState(stage=["train"]))
    assert shapes(net)["label"] == (10, 1, 65, 16) and shapes(net)["transformed_label"] == (10, 9, 24, 78)
    assert shapes(net)["bboxes"] == (10, 4, 24, 78) and shapes(net)["coverage-block"] == (10, 4, 24, 78)


def test_detectnet_s_label_is_taken_as_digits_writes_it_and_the_estimate_says_so() -> None:
    """No label shape given: DIGITS' layout at its default padding (1 x 65 x 16 floats), said in the assumptions,
    the same figures as that shape given; a given shape wins and is not assumed; the `*` image shorthand does not
    turn the label into an image."""
    def run(shapes: dict[str, Any]) -> dict[str, Any]:
        return estimate(EstimateRequest(net=detectnet_shaped(), data_shapes=shapes, engine=ENGINE_CUDNN))

    alone = run({"data": (3, 384, 1248)})
    note = next(a for a in alone["assumptions"] if a.startswith("no shape given for 'label'"))
    assert "1 x 65 x 16 floats" in note and "DIGITS" in note
    assert alone["total_bytes"] == run({"data": (3, 384, 1248), "label": (1, 65, 16)})["total_bytes"]
    typed = run({"data": (3, 384, 1248), "label": (1, 40, 16)})
    assert not any("'label'" in a for a in typed["assumptions"]) and typed["total_bytes"] != alone["total_bytes"]
    assert run({"*": (3, 384, 1248)})["total_bytes"] == alone["total_bytes"]


SSD_LAYERS = (
    input_layer("feat", 2, 16, 10, 10) + input_layer("data", 2, 3, 300, 300)
    + 'layer { name: "norm" type: "Normalize" bottom: "feat" top: "norm" norm_param { across_spatial: false channel_shared: false } }\n'
    + 'layer { name: "norm1" type: "Normalize" bottom: "feat" top: "norm1" }\n'
    + 'layer { name: "loc" type: "Convolution" bottom: "norm" top: "loc" convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }\n'
    + 'layer { name: "conf" type: "Convolution" bottom: "norm" top: "conf" convolution_param { num_output: 84 kernel_size: 3 pad: 1 } }\n'
    + 'layer { name: "loc_perm" type: "Permute" bottom: "loc" top: "loc_perm" permute_param { order: 0 order: 2 order: 3 order: 1 } }\n'
    + 'layer { name: "conf_perm" type: "Permute" bottom: "conf" top: "conf_perm" permute_param { order: 0 order: 2 order: 3 order: 1 } }\n'
    + 'layer { name: "loc_flat" type: "Flatten" bottom: "loc_perm" top: "loc_flat" }\n'
    + 'layer { name: "conf_flat" type: "Flatten" bottom: "conf_perm" top: "conf_flat" }\n'
    + 'layer { name: "priors" type: "PriorBox" bottom: "norm" bottom: "data" top: "priors" prior_box_param { '
    "min_size: 30 max_size: 60 aspect_ratio: 2 flip: true variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }\n"
)
"""A small SSD head: 4 priors per cell of a 10 x 10 map, 21 classes."""


def test_the_ssd_rules_build_what_this_pycaffe_builds() -> None:
    """pycaffe here (brocolli's Caffe) carries Wei Liu's SSD layers, the same code NVcaffe took: on BVLC-schema nets
    the rules give its shapes exactly, params included."""
    from digits_memplugin.core.net import input_net
    from digits_memplugin.estimate.pycaffe_shapes import caffe_net, differences

    train = SSD_LAYERS + input_layer("gt", 1, 1, 3, 8) + (
        'layer { name: "loss" type: "MultiBoxLoss" bottom: "loc_flat" bottom: "conf_flat" bottom: "priors" '
        'bottom: "gt" top: "loss" propagate_down: true propagate_down: true propagate_down: false '
        "propagate_down: false multibox_loss_param { num_classes: 21 } }\n"
    )
    test = SSD_LAYERS + input_layer("gt", 1, 1, 3, 8) + (
        'layer { name: "det" type: "DetectionOutput" bottom: "loc_flat" bottom: "conf_flat" bottom: "priors" '
        'top: "det" detection_output_param { num_classes: 21 keep_top_k: 20 nms_param { nms_threshold: 0.45 top_k: 40 } '
        "confidence_threshold: 0.01 } }\n"
        'layer { name: "eval" type: "DetectionEvaluate" bottom: "det" bottom: "gt" top: "eval" '
        "detection_evaluate_param { num_classes: 21 } }\n"
    )
    for text, phase in ((train, "TRAIN"), (test, "TEST")):
        param = parse_net(text)
        assert flavour_of(param) == BVLC
        net = build_net(param, phase)
        assert differences(net, caffe_net(input_net(net), phase)) == []


SSD_TRAIN = SSD_LAYERS + input_layer("gt", 1, 1, 3, 8) + (
    'layer { name: "loss" type: "MultiBoxLoss" bottom: "loc_flat" bottom: "conf_flat" bottom: "priors" '
    'bottom: "gt" top: "loss" propagate_down: true propagate_down: true propagate_down: false '
    "propagate_down: false multibox_loss_param { num_classes: 21 } }\n"
)


def test_an_ssd_net_without_nvcaffe_fields_is_ssd_caffe_s_not_bvlc_s() -> None:
    """SSD's layers read with BVLC's schema, but BVLC Caffe has none of them: the net is "ssd", built by SSD Caffe
    (this server's pycaffe is one) and NVcaffe 0.17, not by BVLC Caffe."""
    param = parse_net(SSD_TRAIN)
    assert flavour_of(param) == BVLC and definition_flavour([param]) == SSD
    document = estimate(EstimateRequest(net=SSD_TRAIN, engine=ENGINE_CUDNN, free_bytes=8 << 30))
    assert document["flavour"] == SSD and NVCAFFE_UNVERIFIED not in document["assumptions"]
    definition = training_definition(SSD_TRAIN, None)
    assert definition.flavour == SSD and definition.builders == {SSD, NVCAFFE}
    assert can_train(BUNDLED_CAFFE, SSD) and can_train(NVCAFFE, SSD) and not can_train(BVLC, SSD)


def test_who_may_train_each_flavour() -> None:
    """builders(flavour): BVLC nets build anywhere, SSD nets in SSD Caffe and NVcaffe, NVcaffe's in NVcaffe only; for
    given messages, NVcaffe drops out when its schema cannot read one (BVLC's Parameter layer)."""
    assert builders(BVLC) == {BVLC, SSD, NVCAFFE} and builders(SSD) == {SSD, NVCAFFE} and builders(NVCAFFE) == {NVCAFFE}
    plain = parse_net(input_layer("x", 1, 2) + 'layer { name: "r" type: "ReLU" bottom: "x" top: "r" }')
    assert caffes_that_build([plain, None]) == {BVLC, SSD, NVCAFFE} and nvcaffe_reads(plain)
    parameter = parse_net('layer { name: "w" type: "Parameter" top: "w" parameter_param { shape { dim: 3 } } }')
    assert definition_flavour([parameter]) == BVLC and not nvcaffe_reads(parameter)
    assert caffes_that_build([parameter]) == {BVLC, SSD}
    nv = parse_net(NV + input_layer("x", 1, 2))
    assert caffes_that_build([nv]) == {NVCAFFE} and definition_flavour([plain, nv]) == NVCAFFE
    solver = parse_solver("base_lr: 0.1 larc: true")
    assert definition_flavour([plain, solver]) == NVCAFFE


def test_an_nvcaffe_solver_makes_the_whole_job_nvcaffe() -> None:
    """A BVLC-schema net trained by an NVcaffe solver runs in NVcaffe: its pool, its shared workspace, its margin."""
    document = estimate(EstimateRequest(net=big_conv(), solver="base_lr: 0.1 solver_data_type: FLOAT",
                                        engine=ENGINE_CUDNN, free_bytes=8 << 30))
    assert document["flavour"] == NVCAFFE and NVCAFFE_UNVERIFIED in document["assumptions"]
    assert sum(1 for layer in document["layers"] if layer["categories"].get(WORKSPACE)) == 1
