"""Bad input: every way a definition can be wrong gets a clear error of the project's own type, quickly.

First, hand-picked absurd dimensions and shape errors through the estimator, each checked for the layer and field
it names. Then hypothesis: arbitrary text and bytes, token soup, random nets built from the zoo's layer vocabulary
with random parameters, and random mutations of the zoo's nets go through parse_net, parse_solver and estimate;
nothing but a MemPluginError may come out, and nothing may take long. The strategies and the checks are shared
with bench/fuzz.py, which runs them for many more examples.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_netstate import run_pycaffe
from zoo_cases import ZOO

from digits_memplugin.core.errors import MemPluginError, NetError, ShapeError, UnsupportedLayerError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.layers import known_types, rule_for
from digits_memplugin.core.layers.base import PHASE_TRAIN
from digits_memplugin.core.layers.data import DataSpec
from digits_memplugin.core.net import build_net
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.prototxt import parse_net, parse_solver
from digits_memplugin.core.sourcemap import layer_lines

HANG_SECONDS = 60.0
"""No single input may take longer (the real bound is far lower: the largest zoo net estimates in 0.1 s)."""
INT32_MAX = 2**31 - 1

# ============================================================================ hand-picked bad input, estimated


def input_net(*dims: int, extra: str = "") -> str:
    shape = " ".join(f"dim: {d}" for d in dims)
    return f'name: "n"\nlayer {{ name: "in" type: "Input" top: "data" input_param {{ shape {{ {shape} }} }} }}\n{extra}'


def conv(params: str, name: str = "conv", bottom: str = "data", top: str = "conv") -> str:
    return (
        f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{top}"\n'
        f"  convolution_param {{ {params} }} }}\n"
    )


DATA_NET = (
    'name: "d"\nlayer { name: "mnist" type: "Data" top: "data" top: "label"\n'
    '  data_param { source: "x" backend: LMDB batch_size: 64 } }\n'
    + conv("num_output: 4 kernel_size: 5")
)
DATA_ONLY = DATA_NET.split("layer { name: \"conv\"")[0]
HDF5_ONLY = (
    'layer { name: "h5" type: "HDF5Data" top: "data" top: "label" hdf5_data_param { source: "x" batch_size: 64 } }\n'
)
CONCAT = (
    'layer { name: "half" type: "Pooling" bottom: "data" top: "half" pooling_param { pool: MAX kernel_size: 2 '
    "stride: 2 } }\n"
    'layer { name: "cat" type: "Concat" bottom: "data" bottom: "half" top: "cat" }\n'
)


@dataclasses.dataclass(frozen=True)
class Bad:
    """An input the estimator must refuse: the error class, the layer and field it names, a fragment of it."""

    net: str
    error: type[NetError]
    layer: str | None
    field: str | None
    fragment: str
    line: int | None = None
    request: dict[str, Any] = dataclasses.field(default_factory=dict)


BAD = {
    "dim-int-max-squared": Bad(
        input_net(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX), ShapeError, "in", None, "Caffe's limit is 2147483647", 2
    ),
    "dims-overflowing-int64": Bad(
        input_net(2**63 - 1, 2**63 - 1, 2**63 - 1), ShapeError, "in", None, "(INT_MAX)", 2
    ),
    "negative-dim": Bad(input_net(-1, 3, 8, 8), ShapeError, "in", None, "negative dimension", 2),
    "kernel-larger-than-input": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 5")),
        ShapeError, "conv", "convolution_param.kernel_size", "kernel extent 5 exceeds the padded input 4", 3,
    ),
    "kernel-4294967295": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 4294967295")),
        ShapeError, "conv", "convolution_param.kernel_size", "exceeds the padded input", 3,
    ),
    "dilation-overflow": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 3 dilation: 4294967295")),
        ShapeError, "conv", "convolution_param.kernel_size", "kernel extent 8589934591", 3,
    ),
    "pad-4294967295": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 3 pad: 4294967295")),
        ShapeError, "conv", None, "(INT_MAX)", 3,
    ),
    "num-output-4294967295": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 4294967295 kernel_size: 3")),
        ShapeError, "conv", None, "(INT_MAX)", 3,
    ),
    "num-output-zero": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 0 kernel_size: 3")),
        ShapeError, "conv", "convolution_param.num_output", "must be positive", 3,
    ),
    "group-not-dividing": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 3 group: 4294967295")),
        ShapeError, "conv", "convolution_param.group", "not a multiple of group", 3,
    ),
    "concat-mismatch": Bad(
        input_net(1, 3, 4, 4, extra=CONCAT), ShapeError, "cat", "bottom", "only the concat axis 1 may differ", 4
    ),
    "missing-bottom": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 3", bottom="nope")),
        NetError, "conv", "bottom", "unknown bottom blob 'nope'", 3,
    ),
    "top-produced-twice": Bad(
        input_net(1, 3, 4, 4, extra=conv("num_output: 2 kernel_size: 3") + conv("num_output: 2 kernel_size: 3", "c2")),
        ShapeError, "c2", "top", "produced by more than one layer", 5,
    ),
    "inner-product-4294967295": Bad(
        input_net(1, 3, 4, 4, extra='layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"\n'
                  "  inner_product_param { num_output: 4294967295 } }\n"),
        ShapeError, "ip", None, "(INT_MAX)", 3,
    ),
    "tile-int-max": Bad(
        input_net(1, 3, 4, 4, extra='layer { name: "t" type: "Tile" bottom: "data" top: "t" '
                  "tile_param { tiles: 2147483647 } }\n"),
        ShapeError, "t", None, "(INT_MAX)", 3,
    ),
    "reshape-int64-max": Bad(
        input_net(1, 3, 4, 4, extra='layer { name: "r" type: "Reshape" bottom: "data" top: "r" '
                  "reshape_param { shape { dim: -1 dim: 9223372036854775807 } } }\n"),
        ShapeError, "r", "reshape_param.shape", "cannot infer -1", 3,
    ),
    "dummy-data-int64-max": Bad(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 9223372036854775807 } } }\n',
        ShapeError, "d", None, "(INT_MAX)", 1,
    ),
    "data-layer-batch-uint32-max": Bad(
        DATA_NET.replace("batch_size: 64", "batch_size: 4294967295"), ShapeError, "mnist", None, "(INT_MAX)", 2,
        {"data_shapes": {"data": (1, 28, 28)}},
    ),
    "data-shape-10**18": Bad(
        DATA_NET, ShapeError, "mnist", None, "(INT_MAX)", 2, {"data_shapes": {"data": (10**18, 28, 28)}}
    ),
    "data-shape-missing": Bad(DATA_NET, ShapeError, "mnist", "top", "give the dataset's item shape for 'data'", 2),
    "data-shape-zero": Bad(
        DATA_NET, ShapeError, "mnist", "top", "must be positive", 2, {"data_shapes": {"data": (0, 28, 28)}}
    ),
    "data-smaller-than-kernel": Bad(
        DATA_NET, ShapeError, "conv", "convolution_param.kernel_size", "exceeds the padded input", 4,
        {"data_shapes": {"data": (1, 3, 3)}},
    ),
    "unknown-layer-type": Bad(
        input_net(1, 3, 4, 4, extra='layer { name: "n" type: "ROIPooling" bottom: "data" top: "n" }\n'),
        UnsupportedLayerError, "n", "type", "not known to the estimator", 3,
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_clear_error_naming_the_layer(name: str) -> None:
    bad = BAD[name]
    started = time.monotonic()
    with pytest.raises(bad.error) as raised:
        estimate(EstimateRequest(net=bad.net, net_source="train_val.prototxt", **bad.request))
    assert time.monotonic() - started < 5
    error = raised.value
    assert (error.layer, error.field, error.line) == (bad.layer, bad.field, bad.line)
    assert bad.fragment in str(error)
    assert str(error).startswith(f"train_val.prototxt:{bad.line}: layer {bad.layer!r}")


def test_a_huge_free_memory_is_planned_within_the_search_bound() -> None:
    started = time.monotonic()
    document = estimate(EstimateRequest(net=input_net(1, 3, 8, 8, extra=conv("num_output: 2 kernel_size: 3")),
                                        free_bytes=10**30))
    assert time.monotonic() - started < 5
    assert document["max_batch_size"] == 1 << 20
    assert document["plan"]["fits"]


def test_int_max_elements_exactly_is_allowed_like_caffe() -> None:
    assert estimate(EstimateRequest(net=input_net(INT32_MAX, 1, 1, 1)))["total_bytes"] > 4 * INT32_MAX


FIXED_BUGS: dict[str, tuple[str, dict[str, Any], str]] = {
    # name -> (net text, request fields, "file:function" where the fuzzers found it; each is refused now)
    "data-shape-str": (DATA_ONLY, {"data_shapes": {"data": "abc"}}, "core/layers/data.py:_spec (TypeError)"),
    "data-shape-int": (DATA_ONLY, {"data_shapes": {"data": 5}}, "core/layers/data.py:_spec (TypeError)"),
    "data-shape-float": (
        DATA_ONLY, {"data_shapes": {"data": (1.5, 28, 28)}}, "core/layers/data.py:_spec (float bytes, no error)"
    ),
    "data-shape-bool": (
        DATA_ONLY, {"data_shapes": {"data": (True, 28, 28)}}, "core/layers/data.py:_spec (bool taken as 1)"
    ),
    "classes-over-uint32": (
        input_net(1, 3, 4, 4, extra='layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" }\n'),
        {"classes": 2**32},
        "core/training.py:fill_num_classes (ValueError from the uint32 setter)",
    ),
    "cuda-context-negative": (
        input_net(1, 3, 4, 4), {"engine": "gpu", "cuda_context_bytes": -(10**12)},
        "core/estimate.py:EstimateRequest.__post_init__ (negative total_bytes)",
    ),
    "cuda-context-str": (
        input_net(1, 3, 4, 4), {"engine": "gpu", "cuda_context_bytes": "300MB"},
        "core/estimate.py:EstimateRequest.__post_init__ (TypeError)",
    ),
    "data-shapes-not-a-mapping": (
        DATA_ONLY, {"data_shapes": "data=1,28,28"},
        "core/estimate.py:EstimateRequest.__post_init__ (data_shapes unchecked: ValueError from dict())",
    ),
    "data-spec-rows-negative": (
        HDF5_ONLY, {"data_shapes": {"data": DataSpec((4,), rows=-5), "label": ()}},
        "core/layers/data.py:DataSpec (rows unchecked: a negative file size is estimated)",
    ),
    "data-spec-itemsize-negative": (
        DATA_ONLY, {"data_shapes": {"data": DataSpec((1, 28, 28), stored_itemsize=-100)}},
        "core/layers/data.py:DataSpec (stored_itemsize unchecked: negative reader bytes)",
    ),
    "batch-zero-with-free-memory": (
        input_net(0, 3, 4, 4), {"free_bytes": 10**9},
        "core/estimate.py:estimate (a net whose batch is 0 reaches planner.plan_batch: ValueError)",
    ),
    "zero-size-blob": (
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 0 dim: 3 } } }\n', {},
        (
            "core/net/build.py:_check_blob_size (a blob of 0 elements has no memory; Caffe aborts on CHECK(data_) the "
            "first time a layer touches it: at set-up for DummyData, in the first forward for any other top)"
        ),
    ),
    "prelu-over-4-axes": (
        input_net(2, 3, 4, 4, 4, extra='layer { name: "p" type: "PReLU" bottom: "data" top: "p" }\n'), {},
        (
            "core/layers/neuron.py:PReLURule.setup (PReLULayer reads channels() with Caffe's legacy accessors, "
            "which CHECK num_axes() <= 4)"
        ),
    ),
    "argmax-scalar-bottom": (
        input_net(2, 3, extra='layer { name: "r" type: "Reduction" bottom: "data" top: "r" }\n'
                  'layer { name: "am" type: "ArgMax" bottom: "r" top: "am" }\n'),
        {},
        "core/layers/common.py:ArgMaxRule.setup (IndexError on a 0-axis bottom; Caffe: CHECK start_axis <= end_axis)",
    ),
    "empty-blob-over-int-max": (
        input_net(INT32_MAX, 3, 0), {},
        (
            "core/net/build.py:_check_blob_size (Blob::Reshape checks each dim against INT_MAX / the count so far, left "
            "to right, before a later 0 empties the blob)"
        ),
    ),
    "invalid-filler-type": (
        input_net(2, 3, extra='layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"\n'
                  '  inner_product_param { num_output: 2 weight_filler { type: "nope" } } }\n'),
        {},
        "core/layers (every rule with a filler): GetFiller aborts on an unknown filler type at set-up",
    ),
    "sparse-filler-not-gaussian": (
        input_net(2, 3, extra='layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"\n'
                  '  inner_product_param { num_output: 2 weight_filler { type: "xavier" sparse: 2 } } }\n'),
        {},
        "core/layers (every rule with a filler): only the gaussian filler takes `sparse`; the others CHECK it is -1",
    ),
    "more-than-32-axes": (
        input_net(*[1] * 33), {}, "core/net/build.py:_check_blob_size (Caffe's kMaxBlobAxes is 32)"
    ),
    "dim-over-int-max-in-empty-blob": (
        input_net(0, 2**31), {}, "core/net/build.py:_check_blob_size (each dim must be <= INT_MAX, even when count is 0)"
    ),
}


FIXED_OVERSTRICT: dict[str, tuple[str, str]] = {
    # name -> (net text Caffe builds, "file:function" where the fuzzers found it refused; each is estimated now)
    "in-place-top-changing-shape": (
        input_net(2, 3, 4, 4, extra='layer { name: "am" type: "ArgMax" bottom: "data" top: "data" }\n'),
        (
            "core/net/build.py:build_net refuses an in-place top whose shape changes; Caffe builds it (the layer's "
            "Reshape reshapes the shared blob), so the net gets an error instead of an estimate"
        ),
    ),
}


@pytest.mark.parametrize("name", list(FIXED_OVERSTRICT))
def test_nets_caffe_builds_are_estimated(name: str) -> None:
    assert estimate(EstimateRequest(net=FIXED_OVERSTRICT[name][0]))["total_bytes"] > 0


def test_an_in_place_layer_that_grows_its_blob_counts_the_larger_buffer() -> None:
    """ArgMax in place on (2, 3, 4, 4) reshapes the shared blob to (2, 1, 1): the blob keeps its 96 floats."""
    document = estimate(EstimateRequest(net=FIXED_OVERSTRICT["in-place-top-changing-shape"][0]))
    data = [layer for layer in document["layers"] if layer["name"] == "in"]
    assert data and data[0]["categories"]["activations"] == 2 * 3 * 4 * 4 * 4 + 16


FIXED_BUGS["log-base-one"] = (
    input_net(2, 3, extra='layer { name: "log" type: "Log" bottom: "data" top: "log" log_param { base: 1 } }\n'),
    {},
    "core/layers/neuron.py:NeuronRule.setup (LogLayer CHECKs that 1/log(base) is finite: base 1 is refused)",
)
# A new finding gets a strict-xfail reproducer here until it is fixed, then joins FIXED_BUGS. None are open.


@pytest.mark.parametrize("name", list(FIXED_BUGS))
def test_inputs_the_fuzzers_found_are_refused_with_a_net_error(name: str) -> None:
    net, request, _ = FIXED_BUGS[name]
    with pytest.raises(NetError) as raised:
        estimate(EstimateRequest(net=net, **request))
    assert str(raised.value)


# ============================================================================ the checks the fuzzers run

TRIED: collections.Counter[str] = collections.Counter()
"""Inputs tried per target in this process, reported at the end of the module and by bench/fuzz.py."""

KNOWN_ESCAPES: list[tuple[type[BaseException], str, str, str]] = []
"""Escapes the fuzzers found in code this suite does not own: (type, message fragment, file the innermost frame
is in, reproducer name). They are counted, not failed, so the fuzzers go on looking for new ones; each gets a
strict xfail reproducer until it is fixed. None are open."""


def known_escape(error: BaseException) -> str | None:
    """The reproducer name of an escape the fuzzers found before, or None for a new one."""
    frames = traceback.extract_tb(error.__traceback__)
    innermost = frames[-1].filename if frames else ""
    for kind, fragment, where, bug in KNOWN_ESCAPES:
        if isinstance(error, kind) and fragment in str(error) and innermost.endswith(where):
            return bug
    return None


def only_our_errors(target: str, call: Callable[[], object]) -> None:
    """Run `call`; anything raised but a MemPluginError fails, and so does taking longer than HANG_SECONDS."""
    TRIED[target] += 1
    started = time.monotonic()
    try:
        call()
    except MemPluginError as error:
        assert str(error), "an error must say something"
    except Exception as error:
        bug = known_escape(error)
        if bug is None:
            raise
        TRIED[f"known bug {bug}"] += 1
    elapsed = time.monotonic() - started
    assert elapsed < HANG_SECONDS, f"{target} took {elapsed:.1f} s"


def check_text(text: str | bytes) -> None:
    only_our_errors("parse_net", lambda: parse_net(text))
    only_our_errors("parse_solver", lambda: parse_solver(text))
    only_our_errors("estimate(net)", lambda: estimate(EstimateRequest(net=text)))  # type: ignore[arg-type]
    only_our_errors("estimate(solver)", lambda: estimate(EstimateRequest(solver=text)))  # type: ignore[arg-type]


def check_request(fields: dict[str, Any], target: str = "estimate(random net)") -> None:
    def run() -> None:
        document = estimate(EstimateRequest(**fields))
        total = document["total_bytes"]
        assert isinstance(total, int) and total >= 0, f"total_bytes {total!r}"
        json.dumps(document, allow_nan=False)

    only_our_errors(target, run)


# ============================================================================ strategies

TOKENS = [
    "layer", "layers", "{", "}", "<", ">", "[", "]", ":", ",", ";", "name:", "type:", "bottom:", "top:", '"data"',
    '"conv"', '"Convolution"', '"Pooling"', '"InnerProduct"', '"Input"', '"ReLU"', '"Concat"', "convolution_param",
    "pooling_param", "inner_product_param", "input_param", "shape", "dim:", "num_output:", "kernel_size:", "stride:",
    "pad:", "group:", "pool:", "MAX", "AVE", "include", "exclude", "phase:", "TRAIN", "TEST", "stage:", "min_level:",
    "loss_weight:", "param", "lr_mult:", "input:", "input_dim:", "input_shape", "net_param", "test_iter:",
    "test_interval:", "test_state", "solver_type:", "ADAM", "CONVOLUTION", "0", "1", "-1", "3", "2147483647",
    "4294967295", "9223372036854775807", "1e400", "nan", "inf", '"\\q"', "#", "\n", "\x00", "\u00a0", "\ufeff",
]

LAYER_TYPES = sorted(
    set(known_types()) - {"Python"}
    | {"DetectionOutput", "Normalize", "Permute", "PriorBox", "NoSuchLayer", ""}
)
"""Every type the estimator has a rule for (the zoo's vocabulary and more), and a few it must refuse."""

PARAM_FIELD_FOR_TYPE = {"Deconvolution": "convolution_param", "SoftmaxWithLoss": "softmax_param"}
_PARAM_FIELDS = {
    f.name.removesuffix("_param").replace("_", ""): f.name
    for f in caffe_pb2.LayerParameter.DESCRIPTOR.fields
    if f.name.endswith("_param") and f.message_type is not None
}

FD = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name["name"].__class__
INT_EXTREMES = {
    FD.TYPE_INT32: [0, 1, 2, 3, -1, INT32_MAX, -(2**31), 1000, 65536],
    FD.TYPE_INT64: [0, 1, 2, 3, -1, 2**63 - 1, -(2**63), INT32_MAX, 2**31, 2**40],
    FD.TYPE_UINT32: [0, 1, 2, 3, 2**32 - 1, 2**31, 1000, 65536],
    FD.TYPE_UINT64: [0, 1, 2, 2**64 - 1, 2**40],
}
INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), INT32_MAX),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
}
DIMS = st.one_of(st.integers(0, 9), st.sampled_from([1, 2, 3, 28, 227, 0, -1, -7, INT32_MAX, 2**31, 2**40, 2**63 - 1]))
NAMES = st.sampled_from(["data", "label", "a", "b", "c", "conv", "ip", "loss", "x"])


def scalar(field: Any, small: bool = False) -> st.SearchStrategy[Any]:
    """Values for one field: anything its type allows, or with `small` mostly what a real net would hold."""
    kind = field.type
    if kind in INT_RANGES and small:
        return st.one_of(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8), st.sampled_from(INT_EXTREMES[kind]))
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        return st.one_of(st.integers(0, 8), st.sampled_from(INT_EXTREMES[kind]), st.integers(low, high))
    if kind == FD.TYPE_BOOL:
        return st.booleans()
    if kind in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0]), st.floats(width=32))
    if kind == FD.TYPE_ENUM:
        return st.sampled_from([value.number for value in field.enum_type.values])
    if kind == FD.TYPE_STRING:
        return st.one_of(st.sampled_from(["", "x", "data", "caffe.layers", "relative/path", "../up"]), st.text(max_size=6))
    if kind == FD.TYPE_BYTES:
        return st.binary(max_size=6)
    raise AssertionError(f"no strategy for field type {kind}")


@st.composite
def fill_message(draw: st.DrawFn, message: Any, depth: int = 0, sparse: int = 4, small: bool = False) -> Any:
    """Random values in a random subset of a message's fields (one in `sparse`; nested messages two levels deep)."""
    for field in message.DESCRIPTOR.fields:
        if draw(st.integers(0, sparse - 1)) != 0:
            continue
        repeated = field.label == FD.LABEL_REPEATED
        count = draw(st.integers(0, 3)) if repeated else 1
        for _ in range(count):
            if field.type == FD.TYPE_MESSAGE:
                if depth >= 2:
                    break
                child = getattr(message, field.name).add() if repeated else getattr(message, field.name)
                child.SetInParent()
                draw(fill_message(child, depth + 1, sparse, small))
            elif repeated:
                getattr(message, field.name).append(draw(scalar(field, small)))
            else:
                setattr(message, field.name, draw(scalar(field, small)))
    return message


def param_fields_for(layer_type: str) -> list[str]:
    name = PARAM_FIELD_FOR_TYPE.get(layer_type) or _PARAM_FIELDS.get(layer_type.lower())
    return [f for f in (name, "loss_param" if "Loss" in layer_type else None) if f]


@st.composite
def random_rule(draw: st.DrawFn) -> Any:
    rule = caffe_pb2.NetStateRule()
    if draw(st.booleans()):
        rule.phase = draw(st.sampled_from([caffe_pb2.TRAIN, caffe_pb2.TEST]))
    if draw(st.integers(0, 3)) == 0:
        rule.min_level = draw(st.integers(-2, 2))
    if draw(st.integers(0, 3)) == 0:
        rule.max_level = draw(st.integers(-2, 2))
    rule.stage.extend(draw(st.lists(st.sampled_from(["train", "val", "deploy"]), max_size=2)))
    rule.not_stage.extend(draw(st.lists(st.sampled_from(["train", "val", "deploy"]), max_size=1)))
    return rule


@st.composite
def random_layer(
    draw: st.DrawFn, net: Any, available: list[str], index: int, types: list[str] = LAYER_TYPES
) -> None:
    layer = net.layer.add(name=draw(st.one_of(st.just(f"l{index}"), NAMES)), type=draw(st.sampled_from(types)))
    bottoms = draw(st.lists(st.one_of(st.sampled_from(available), NAMES) if available else NAMES, max_size=3))
    layer.bottom.extend(bottoms)
    tops = draw(st.integers(0, 3))
    for t in range(tops):
        in_place = bottoms and t < len(bottoms) and draw(st.integers(0, 3)) == 0
        layer.top.append(bottoms[t] if in_place else draw(st.one_of(st.just(f"t{index}_{t}"), NAMES)))
    for field in param_fields_for(layer.type):
        getattr(layer, field).SetInParent()
        draw(fill_message(getattr(layer, field)))
    choice = draw(st.integers(0, 9))
    if choice == 0:
        layer.include.extend(draw(st.lists(random_rule(), min_size=1, max_size=2)))
    elif choice == 1:
        layer.exclude.extend(draw(st.lists(random_rule(), min_size=1, max_size=2)))
    elif choice == 2:
        layer.loss_weight.extend(draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0]), max_size=3)))
    elif choice == 3:
        for _ in range(draw(st.integers(1, 3))):
            spec = layer.param.add(lr_mult=draw(st.sampled_from([0.0, 1.0, 2.0])))
            if draw(st.booleans()):
                spec.name = draw(st.sampled_from(["w", "b", "shared"]))
    elif choice == 4:
        layer.propagate_down.extend(draw(st.lists(st.booleans(), max_size=3)))
    available.extend(layer.top)


@st.composite
def random_request(draw: st.DrawFn) -> dict[str, Any]:
    """A small net from the layer vocabulary with random parameters, sometimes wrapped in a random solver, and
    random (valid-typed) request fields."""
    net = caffe_pb2.NetParameter(name="fuzz")
    net.force_backward = draw(st.booleans())
    data_shapes: dict[str, Any] = {}
    first = draw(st.sampled_from(["Input", "Data", "DummyData", "HDF5Data", "ImageData", "MemoryData", "none"]))
    if first == "Input":
        layer = net.layer.add(name="input", type="Input", top=["data"])
        layer.input_param.shape.add().dim.extend(draw(st.lists(DIMS, max_size=5)))
    elif first == "DummyData":
        layer = net.layer.add(name="dummy", type="DummyData", top=["data", "label"])
        for _ in range(draw(st.integers(1, 2))):
            layer.dummy_data_param.shape.add().dim.extend(draw(st.lists(DIMS, max_size=5)))
    elif first != "none":
        layer = net.layer.add(name="source", type=first, top=["data", "label"])
        for field in param_fields_for(first):
            getattr(layer, field).SetInParent()
            draw(fill_message(getattr(layer, field)))
        if draw(st.booleans()):
            layer.transform_param.crop_size = draw(st.sampled_from([0, 1, 5, 28, 300, 2**32 - 1]))
        data_shapes["data"] = tuple(draw(st.lists(DIMS, max_size=4)))
        if draw(st.booleans()):
            data_shapes["label"] = DataSpec(tuple(draw(st.lists(DIMS, max_size=2))), rows=draw(st.integers(1, 10**6)))
    available = list(net.layer[0].top) if len(net.layer) else []
    plausible = bool(available) and draw(st.integers(0, 3)) != 0
    for index in range(draw(st.integers(0, 6))):
        if plausible:
            draw(plausible_layer(net, available, index, LAYER_TYPES))
        else:
            draw(random_layer(net, available, index))
    text = str(net)
    fields: dict[str, Any] = {"data_shapes": data_shapes}
    if draw(st.integers(0, 3)) == 0:
        solver = caffe_pb2.SolverParameter()
        solver.net_param.CopyFrom(net)
        solver.test_iter.extend(draw(st.lists(st.integers(1, 3), max_size=2)))
        solver.test_interval = draw(st.sampled_from([0, 1, 100]))
        for _ in range(draw(st.integers(0, 2))):
            solver.test_state.add().stage.extend(draw(st.lists(st.sampled_from(["train", "val"]), max_size=1)))
        solver.type = draw(st.sampled_from(["SGD", "Adam", "AdaDelta", "Nesterov", "RMSProp", "AdaGrad", "Bogus"]))
        solver.momentum = draw(st.sampled_from([0.0, 0.9]))
        fields["solver"] = str(solver)
    else:
        fields["net"] = text
    fields["batch"] = draw(st.one_of(st.none(), st.integers(1, 64), st.sampled_from([10**6, INT32_MAX, 10**12])))
    fields["test_batch"] = draw(st.one_of(st.none(), st.integers(1, 8)))
    fields["engine"] = draw(st.sampled_from(["cpu", "gpu", "gpu-cudnn"]))
    fields["free_bytes"] = draw(st.one_of(st.none(), st.sampled_from([0, 1, 10**6, 10**9, 10**12, 10**30])))
    fields["safety_margin"] = draw(st.sampled_from([0.0, 0.1, 0.99]))
    fields["classes"] = draw(st.one_of(st.none(), st.integers(1, 1000)))
    return fields


def zoo_nets() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, text, data shapes) of every zoo net this Caffe can parse, with shapes for its data layers."""
    nets: list[tuple[str, str, dict[str, Any]]] = []
    if not ZOO.is_dir():
        return nets
    for path in sorted(ZOO.glob("*/*.prototxt")):
        if "solver" in path.name:
            continue
        text = path.read_text()
        try:
            param = parse_net(text)
        except MemPluginError:
            continue
        shapes: dict[str, Any] = {}
        for layer in param.layer:
            if layer.type in ("Data", "ImageData", "HDF5Data", "WindowData") and not len(layer.bottom):
                for i, top in enumerate(layer.top):
                    shapes[top] = ((4,) if layer.type == "HDF5Data" else (3, 256, 256)) if i == 0 else ()
            elif layer.type == "Python" and not len(layer.bottom):
                for i, top in enumerate(layer.top):
                    shapes[top] = (1, 3, 64, 64) if i == 0 else (1, 1, 64, 64)
        nets.append((f"{path.parent.name}/{path.name}", text, shapes))
    return nets


ZOO_NETS = zoo_nets()
NUMBER_REPLACEMENTS = ["0", "1", "-1", "2", "3", "7", "2147483647", "2147483648", "4294967295", "-2147483648",
                       "9223372036854775807", "99999999999999999999", "1e400", "nan", "0.5"]


@st.composite
def zoo_mutation(draw: st.DrawFn) -> dict[str, Any]:
    """A zoo net with a few random edits: a line deleted, duplicated or swapped, a number or word changed, a
    character deleted or inserted."""
    name, text, shapes = draw(st.sampled_from(ZOO_NETS))
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.integers(0, 6))
        if edit == 0:
            del lines[i]
        elif edit == 1:
            lines.insert(i, lines[i])
        elif edit == 2:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif edit in (3, 4):
            words = lines[i].split(" ")
            k = draw(st.integers(0, len(words) - 1))
            if edit == 3 or any(c.isdigit() for c in words[k]):
                words[k] = draw(st.sampled_from(NUMBER_REPLACEMENTS))
            else:
                words[k] = draw(st.sampled_from(["TEST", "TRAIN", "MAX", '"data"', '"Concat"', "{", "}", "x"]))
            lines[i] = " ".join(words)
        elif edit == 5 and lines[i]:
            k = draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:k] + lines[i][k + 1 :]
        else:
            k = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:k] + draw(st.sampled_from(list('{}":#\\0'))) + lines[i][k:]
        if not lines:
            lines = [""]
    return {"net": "\n".join(lines), "net_source": name, "data_shapes": shapes, "classes": 10,
            "free_bytes": draw(st.sampled_from([None, 10**9]))}


RAW_TEXT = st.one_of(st.text(max_size=300), st.binary(max_size=300))
TOKEN_SOUP = st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join)

FUZZ_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
"""The default run. Hangs are caught by HANG_SECONDS in the checks, not by hypothesis' deadline (flaky on a busy
machine); bench/fuzz.py runs the same strategies for many more examples."""

# ============================================================================ differential: pycaffe builds them too

NOT_BUILDABLE = {"Data", "ImageData", "HDF5Data", "WindowData", "Python", "Input", "DummyData", "HDF5Output"}
"""Types pycaffe cannot build without files (or that only start a net, below); HDF5Output would create the file
its random file_name names."""
SMALL_DIMS = st.one_of(
    *[st.integers(1, 9)] * 4, *[st.integers(1, 32)] * 4, st.sampled_from([1, 2, 3, 16, 28, 0, -1, INT32_MAX, 2**31])
)
CAFFE_MEMORY_LIMIT = 2 << 30
"""Address space of each pycaffe build: a net whose fillers need more is skipped, not compared."""
MAX_COMPARED_PARAMS = 50_000_000
"""Nets with more learnable values than this are not sent to pycaffe (its fillers would touch all of them)."""


@st.composite
def plausible_layer(draw: st.DrawFn, net: Any, available: list[str], index: int, types: list[str]) -> None:
    """A layer wired the way real nets are (bottoms that exist, new or in-place tops) with a few small parameter
    values: most such nets build, so the comparison reaches shapes instead of stopping at wiring errors."""
    layer = net.layer.add(name=f"l{index}", type=draw(st.sampled_from(types)))
    rule = rule_for(layer.type)
    bottoms, tops = (rule.bottoms, rule.tops) if rule is not None else (None, None)

    def how_many(count: Any, default: int) -> int:
        if count is None:
            return default
        if count.exact is not None:
            return count.exact
        low = count.minimum or 0
        return draw(st.integers(low, max(low, min(count.maximum or low + 1, low + 1))))

    layer.bottom.extend(draw(st.sampled_from(available)) for _ in range(how_many(bottoms, 1)))
    for t in range(how_many(tops, 1)):
        in_place = t == 0 and len(layer.bottom) > 0 and draw(st.integers(0, 4)) == 0
        layer.top.append(layer.bottom[0] if in_place else f"t{index}_{t}")
    for field in param_fields_for(layer.type):
        getattr(layer, field).SetInParent()
        draw(fill_message(getattr(layer, field), sparse=6, small=True))
    if draw(st.integers(0, 9)) == 0:
        layer.param.add(lr_mult=draw(st.sampled_from([0.0, 1.0])), name=draw(st.sampled_from(["", "shared"])))
    if draw(st.integers(0, 9)) == 0:
        layer.propagate_down.extend([draw(st.booleans()) for _ in layer.bottom])
    available.extend(top for top in layer.top if top not in available)


@st.composite
def random_caffe_net(draw: st.DrawFn, types: list[str]) -> str:
    """A random net pycaffe can try to build: an Input or DummyData source, then layers of `types`."""
    net = caffe_pb2.NetParameter(name="differential")
    axes = st.one_of(st.just(4), st.just(4), st.integers(1, 5))
    if draw(st.booleans()):
        layer = net.layer.add(name="input", type="Input", top=["data"])
        layer.input_param.shape.add().dim.extend(draw(st.lists(SMALL_DIMS, min_size=draw(axes), max_size=5)))
    else:
        layer = net.layer.add(name="dummy", type="DummyData", top=["data", "label"])
        for _ in range(draw(st.integers(1, 2))):
            size = draw(axes)
            layer.dummy_data_param.shape.add().dim.extend(draw(st.lists(SMALL_DIMS, min_size=size, max_size=size)))
    available = list(layer.top)
    plausible = draw(st.integers(0, 3)) != 0
    for index in range(draw(st.integers(1, 5))):
        if plausible:
            draw(plausible_layer(net, available, index, types))
        else:
            draw(random_layer(net, available, index, types))
    return str(net)


def our_build(text: str) -> dict[str, list[int]] | BaseException:
    """The blob shapes of our TRAIN net, or what it raised (a NetError, or anything else that escaped)."""
    try:
        net = build_net(parse_net(text), PHASE_TRAIN, lines=layer_lines(text))
    except Exception as error:  # noqa: BLE001 - an escape is a finding, reported with the net
        return error
    return {blob.name: list(blob.shape) for blob in net.blobs}


def too_big_for_caffe(text: str) -> bool:
    try:
        net = build_net(parse_net(text), PHASE_TRAIN)
    except Exception:  # noqa: BLE001 - our_build reports it
        return False
    return sum(math.prod(param.shape) for param in net.params) > MAX_COMPARED_PARAMS


KNOWN_DIFFERENCES: list[tuple[str, str]] = []
"""Caffe refuses, we build: (Caffe's CHECK message, reproducer name). Counted, not failed. None are open."""
KNOWN_OVERSTRICT: list[tuple[str, str]] = [
    # DropoutLayer only DCHECKs the ratio: a debug build aborts, a release build trains with scale 1/0.
    ("dropout_ratio must be in [0, 1)", "intended: Caffe's own DCHECK"),
    # Caffe builds a net with an empty blob when no layer touches it at set-up, then aborts at the first forward.
    ("would create an empty blob", "intended: Caffe aborts at the first forward"),
    # BVLC's EltwiseLayer::Reshape CHECKs equal bottom shapes; this pycaffe's tree has the CHECK commented out.
    ("; they must match", "intended: BVLC checks Eltwise shapes"),
    # BVLC's ScaleLayer::Reshape CHECKs the scale's shape against bottom[0]; this tree commented that loop out too
    # (scale_layer.cpp:83-87; its BiasLayer keeps the CHECK).
    ("scale_param: scale shape", "intended: BVLC checks Scale shapes"),
]
"""We refuse, Caffe builds: (our message, why). Counted, not failed."""


_OVERSIZED_BLOB = re.compile(r"would create a blob of \d+ elements \[([\d, ]+)\]; Caffe's limit is")


def caffe_dimension_overflowed(message: str) -> bool:
    """Our refusal names a blob with a dimension past INT_MAX: Caffe computes dimensions in int (Tile's
    `shape(axis) * tiles`), so where it "built" such a net the dimension overflowed, which C++ leaves undefined, and
    its shapes mean nothing. A blob whose dimensions all fit but whose count does not is a real difference: Caffe's
    Blob::Reshape CHECKs the count."""
    found = _OVERSIZED_BLOB.search(message)
    return found is not None and any(int(dim) > 2**31 - 1 for dim in found.group(1).split(","))


def differences_with_caffe(texts: list[str], folder: Path) -> list[dict[str, Any]]:
    """Build each net with pycaffe and with build_net; every disagreement (one builds, the other refuses; or
    different blob shapes). Refusals that say nothing about the net (this build has no cuDNN, the memory limit)
    are left out."""
    texts = [text for text in texts if not too_big_for_caffe(text)]
    jobs = []
    for index, text in enumerate(texts):
        (folder / f"random{index}.prototxt").write_text(text)
        jobs.append({"kind": "net", "path": f"random{index}.prototxt", "phase": "TRAIN", "level": 0, "stages": [],
                     "memory_limit": CAFFE_MEMORY_LIMIT})
    differences = []
    for text, caffe in zip(texts, run_pycaffe(jobs, folder)):
        TRIED["pycaffe differential"] += 1
        fatal = caffe.get("fatal", "")
        if any(why in fatal for why in ("unknown engine", "bad_alloc", "Cannot allocate memory", "allocation of size")):
            continue
        ours = our_build(text)
        if isinstance(ours, UnsupportedLayerError):
            continue
        if isinstance(ours, BaseException) and not isinstance(ours, NetError):
            bug = known_escape(ours)
            if bug is not None:
                TRIED[f"known bug {bug}"] += 1
            else:
                differences.append({"net": text, "ours": f"escaped: {ours!r}", "caffe": fatal or "built"})
            continue
        caffe_ok = "blobs" in caffe
        if isinstance(ours, NetError) and caffe_ok:
            known = [bug for fragment, bug in KNOWN_OVERSTRICT if fragment in str(ours)]
            if caffe_dimension_overflowed(str(ours)):
                known.append("intended: Caffe computed a dimension past INT_MAX in int (overflow, undefined)")
            if known:
                TRIED[f"known bug {known[0]}"] += 1
            else:
                differences.append({"net": text, "ours": str(ours), "caffe": "built"})
        elif not isinstance(ours, NetError) and not caffe_ok:
            known = [bug for fragment, bug in KNOWN_DIFFERENCES if fragment in fatal]
            if known:
                TRIED[f"known bug {known[0]}"] += 1
            else:
                differences.append({"net": text, "ours": "built", "caffe": fatal})
        elif caffe_ok and ours != caffe["blobs"]:
            differences.append({"net": text, "ours": ours, "caffe": caffe["blobs"]})
        else:
            TRIED["pycaffe differential: both built" if caffe_ok else "pycaffe differential: both refused"] += 1
    return differences


def collect(strategy: st.SearchStrategy[Any], count: int, derandomize: bool) -> list[Any]:
    """`count` examples of a strategy (hypothesis' generation, without a test around each one)."""
    found: list[Any] = []

    @settings(max_examples=count, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=derandomize)
    @given(strategy)
    def gather(value: Any) -> None:
        found.append(value)

    gather()
    return found


# ============================================================================ the fuzz tests


@pytest.fixture(scope="module", autouse=True)
def report_counts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Print the number of inputs tried per target (visible with -s) and write them to the pytest tmp dir."""
    yield
    path = tmp_path_factory.getbasetemp() / "fuzz_counts.json"
    path.write_text(json.dumps(dict(TRIED), indent=2))
    print(f"\nfuzz inputs tried: {dict(TRIED)} (written to {path})")


@FUZZ_SETTINGS
@given(RAW_TEXT)
def test_arbitrary_text_and_bytes(text: str | bytes) -> None:
    check_text(text)


@FUZZ_SETTINGS
@given(TOKEN_SOUP)
def test_prototxt_token_soup(text: str) -> None:
    check_text(text)


@FUZZ_SETTINGS
@given(random_request())
def test_random_nets_from_the_layer_vocabulary(fields: dict[str, Any]) -> None:
    check_request(fields)


@pytest.mark.skipif(not ZOO_NETS, reason="the zoo is not available")
@FUZZ_SETTINGS
@given(zoo_mutation())
def test_mutated_zoo_nets(fields: dict[str, Any]) -> None:
    check_request(fields, "estimate(mutated zoo net)")


@pytest.mark.skipif(not ZOO_NETS, reason="the zoo is not available")
def test_the_zoo_nets_themselves_estimate() -> None:
    """The mutations start from nets that estimate (a few are refused for good reasons, as Caffe would)."""
    refused = {}
    for name, text, shapes in ZOO_NETS:
        try:
            estimate(EstimateRequest(net=text, data_shapes=shapes, classes=10))
        except MemPluginError as error:
            refused[name] = type(error).__name__
    assert len(refused) <= len(ZOO_NETS) // 3, refused


def test_the_fuzz_strategies_reach_the_estimator() -> None:
    """A fuzzer that only ever produces parse errors tests nothing deep: random nets must often estimate."""
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(random_request())
    def sample(fields: dict[str, Any]) -> None:
        try:
            estimate(EstimateRequest(**fields))
            outcomes["estimated"] += 1
        except MemPluginError as error:
            outcomes[type(error).__name__] += 1

    sample()
    assert outcomes["estimated"] >= 10, outcomes
    assert outcomes["ShapeError"] >= 10, outcomes
    assert math.fsum(outcomes.values()) >= 100


@pytest.fixture(scope="module")
def caffe_types(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    [result] = run_pycaffe([{"kind": "types"}], tmp_path_factory.mktemp("types"))
    return sorted((set(result["types"]) & set(known_types())) - NOT_BUILDABLE)


def test_random_nets_build_like_caffe(caffe_types: list[str], tmp_path: Path) -> None:
    """Differential: pycaffe builds 150 random nets too; we must refuse what it refuses and build what it builds,
    with the same blob shapes. (Derandomized, so a disagreement is found again on every run.)"""
    texts = collect(random_caffe_net(caffe_types), 150, derandomize=True)
    differences = differences_with_caffe(texts, tmp_path)
    assert not differences, json.dumps(differences[:3], indent=1)


def test_only_a_dimension_caffe_overflowed_counts_as_an_intended_refusal() -> None:
    """The differential excuses our INT_MAX refusal only where Caffe's own int arithmetic overflowed (a dimension
    past INT_MAX); a blob of fitting dimensions but too many elements Caffe refuses too, so it stays a difference."""
    overflowed = ("layer 'l1' (Tile): would create a blob of 120259084288 elements [2, 30064771072, 2]; "
                  "Caffe's limit is 2147483647 (INT_MAX)")
    counted = "layer 'ip' (InnerProduct): would create a blob of 4294967296 elements [65536, 65536]; Caffe's limit is"
    assert caffe_dimension_overflowed(overflowed)
    assert not caffe_dimension_overflowed(counted + " 2147483647 (INT_MAX)")
    assert not caffe_dimension_overflowed("would create an empty blob [0, 3]")
