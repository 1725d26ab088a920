"""The NVcaffe loader fuzzed like the BVLC one (test_core_fuzz): random NVcaffe nets (its net-level storage types,
its layer types with random parameters, its solver fields), NVcaffe field names in token soup, and mutated NVcaffe
zoo nets. Whatever comes in, the answer is an estimate or a MemPluginError, never another exception or a hang."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_core_fuzz import (
    DIMS,
    FUZZ_SETTINGS,
    TOKENS,
    check_request,
    check_text,
    fill_message,
    param_fields_for,
    plausible_layer,
)
from zoo_cases import NVCAFFE_CASES

from digits_memplugin.core import nvcaffe_pb2
from digits_memplugin.core.flavour import NVCAFFE, flavour_of
from digits_memplugin.core.prototxt import parse_net

NV_TYPES = ["Normalize", "Permute", "PriorBox", "MultiBoxLoss", "DetectionOutput", "DetectionEvaluate",
            "DetectNetTransformation", "L1Loss", "BatchNorm", "Convolution", "Pooling", "Concat", "Flatten", "ReLU",
            "Reshape", "Softmax", "EuclideanLoss", "Eltwise", "Slice"]
NV_PARAM_FIELDS = {
    "Normalize": ["norm_param"],
    "Permute": ["permute_param"],
    "PriorBox": ["prior_box_param"],
    "MultiBoxLoss": ["multibox_loss_param", "loss_param"],
    "DetectionOutput": ["detection_output_param"],
    "DetectionEvaluate": ["detection_evaluate_param"],
    "DetectNetTransformation": ["detectnet_groundtruth_param", "detectnet_augmentation_param", "transform_param"],
    "AnnotatedData": ["data_param", "annotated_data_param", "transform_param"],
}
NET_FIELDS = ["default_forward_type", "default_backward_type", "default_forward_math", "default_backward_math",
              "global_grad_scale", "reduce_buckets"]
NV_TOKENS = [*TOKENS, "default_forward_type:", "FLOAT16", "FLOAT", "DOUBLE", "forward_type:", "backward_type:",
             "batch_norm_param", "scale_bias:", "true", "solver_data_type:", '"AnnotatedData"', '"PriorBox"',
             "prior_box_param", "min_size:", "aspect_ratio:", "transform_param", "resize_param", "height:", "width:",
             "detectnet_groundtruth_param", "stride:", "image_size_x:", "object_class", "src:", "dst:"]


@st.composite
def nvcaffe_request(draw: st.DrawFn) -> dict[str, Any]:
    """A small NVcaffe net: random storage types, an Input, AnnotatedData or DetectNet-style start, then layers of
    NVcaffe's vocabulary with random parameters; sometimes inside a solver with NVcaffe's solver fields."""
    net = nvcaffe_pb2.NetParameter(name="fuzz")
    for field in draw(st.lists(st.sampled_from(NET_FIELDS), max_size=3)):
        value = draw(st.sampled_from([0, 1, 2])) if field.startswith("default_") else draw(st.integers(-2, 8))
        setattr(net, field, value)
    data_shapes: dict[str, Any] = {}
    start = draw(st.sampled_from(["Input", "AnnotatedData", "DetectNet"]))
    if start == "Input":
        layer = net.layer.add(name="input", type="Input", top=["data"])
        layer.input_param.shape.add().dim.extend(draw(st.lists(DIMS, max_size=5)))
    elif start == "AnnotatedData":
        layer = net.layer.add(name="source", type="AnnotatedData", top=["data", "label"])
        for field in NV_PARAM_FIELDS["AnnotatedData"]:
            getattr(layer, field).SetInParent()
            draw(fill_message(getattr(layer, field), sparse=3, small=True))
        if draw(st.booleans()):
            data_shapes["data"] = tuple(draw(st.lists(DIMS, max_size=4)))
    else:
        images = net.layer.add(name="images", type="Input", top=["images"])
        images.input_param.shape.add().dim.extend(draw(st.lists(DIMS, min_size=4, max_size=4)))
        labels = net.layer.add(name="labels", type="Input", top=["labels"])
        labels.input_param.shape.add().dim.extend(draw(st.lists(DIMS, max_size=4)))
        layer = net.layer.add(name="transform", type="DetectNetTransformation", bottom=["images", "labels"],
                              top=["data", "label"])
        for field in NV_PARAM_FIELDS["DetectNetTransformation"]:
            getattr(layer, field).SetInParent()
            draw(fill_message(getattr(layer, field), sparse=3, small=True))
    available = [top for layer in net.layer for top in layer.top]
    for index in range(draw(st.integers(0, 6))):
        draw(plausible_layer(net, available, index, NV_TYPES))
        added = net.layer[len(net.layer) - 1]
        for field in NV_PARAM_FIELDS.get(added.type, []):
            if field not in param_fields_for(added.type):
                getattr(added, field).SetInParent()
                draw(fill_message(getattr(added, field), sparse=4, small=True))
        if draw(st.integers(0, 4)) == 0:
            added.forward_type = draw(st.sampled_from([0, 1, 2, 3]))
    fields: dict[str, Any] = {"data_shapes": data_shapes}
    if draw(st.integers(0, 3)) == 0:
        solver = nvcaffe_pb2.SolverParameter()
        solver.net_param.CopyFrom(net)
        solver.solver_data_type = draw(st.sampled_from([0, 1, 2, 4]))
        solver.test_iter.extend(draw(st.lists(st.integers(1, 3), max_size=1)))
        solver.test_interval = draw(st.sampled_from([0, 100]))
        fields["solver"] = str(solver)
    else:
        fields["net"] = str(net)
    fields["batch"] = draw(st.one_of(st.none(), st.integers(1, 64), st.sampled_from([10**6, 2**31 - 1])))
    fields["engine"] = draw(st.sampled_from(["cpu", "gpu", "gpu-cudnn"]))
    fields["free_bytes"] = draw(st.one_of(st.none(), st.sampled_from([0, 10**9, 10**12])))
    return fields


@FUZZ_SETTINGS
@given(nvcaffe_request())
def test_random_nvcaffe_nets(fields: dict[str, Any]) -> None:
    check_request(fields, "estimate(random NVcaffe net)")


@FUZZ_SETTINGS
@given(st.lists(st.sampled_from(NV_TOKENS), max_size=60).map(" ".join))
def test_nvcaffe_token_soup(text: str) -> None:
    check_text(text)


NV_ZOO = [(case, case.texts()) for case in NVCAFFE_CASES if case.net]


@FUZZ_SETTINGS
@given(st.sampled_from(NV_ZOO), st.data())
def test_mutated_nvcaffe_zoo_nets(picked: Any, data: st.DataObject) -> None:
    case, (net, _) = picked
    lines = net.split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(lines) - 1))
        edit = data.draw(st.sampled_from(["delete", "duplicate", "number", "fp16"]))
        if edit == "delete":
            del lines[at]
        elif edit == "duplicate":
            lines.insert(at, lines[at])
        elif edit == "number":
            lines[at] = "".join(data.draw(st.sampled_from(["0", "1", "-1", "3", "2147483648"])) if c.isdigit() else c
                                for c in lines[at])
        else:
            lines.insert(0, "default_forward_type: FLOAT16")
    check_request({"net": "\n".join(lines), "data_shapes": case.data_shapes}, "estimate(mutated NVcaffe zoo net)")


def test_the_nvcaffe_fuzz_starts_from_nvcaffe_nets() -> None:
    """The mutations start from nets NVcaffe's schema reads, or the fuzzing above says nothing about it."""
    assert all(flavour_of(parse_net(net)) == NVCAFFE for case, (net, _) in NV_ZOO if case.flavour == NVCAFFE)
    assert any(case.flavour == NVCAFFE for case, _ in NV_ZOO)
