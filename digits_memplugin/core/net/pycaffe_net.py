"""The nets pycaffe is given: for a `ShapeOracle` (the layers the rules cannot shape, after Input layers of what
they shaped) and `input_net` (a built net's phase with its data layers as Input layers), every layer sanitized."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import NetError
from ..layers import Shape
from ..proto import caffe_pb2
from ..sanitize import opened_field, refusal, sanitized
from .filtering import line_of
from .model import Blob, Layer, Net
from .prepare import PreparedNet

ShapeOracle = Callable[[Any, str], Mapping[str, tuple[list[Shape], list[Shape]]]]
"""Asks real Caffe for shapes: (NetParameter, phase) -> layer name -> (tops, params). The net it is given holds
Input layers for what the rules shaped, then the layers it must shape, with no layer that opens a file or imports
code and no path-bearing field (`core.sanitize`)."""


def ask_oracle(
    oracle: ShapeOracle, prepared: PreparedNet, built: list[Layer], blobs: list[Blob]
) -> Mapping[str, tuple[list[Shape], list[Shape]]]:
    """The oracle's shapes for the rule-less layers from the next one to build (`len(built)`) on, keyed by name; its
    errors name a layer but not where it is written, so that is added."""
    try:
        oracle_param, asked = _oracle_net(prepared, built, blobs)
        answer = oracle(oracle_param, prepared.phase)
    except NetError as error:
        if error.source is None:
            error.source = prepared.source
            orig = next((index for index, layer in prepared.filtered if layer.name == error.layer), None)
            error.line = line_of(prepared.lines, orig)
        raise
    return {name: shapes for name, shapes in answer.items() if name in asked}


def _oracle_net(prepared: PreparedNet, built: list[Layer], blobs: list[Blob]) -> tuple[Any, set[str]]:
    """The net pycaffe is asked to build, and the names of the rule-less layers it shapes.

    Every layer shaped so far becomes an Input layer of the blobs it created, at their shapes now (an in-place
    layer may have reshaped them since): pycaffe never sees a data layer, a Python layer or a layer that writes, and
    fills no weights it is not asked about. Then come the layers from the next one to build, sanitized (no
    include/exclude rules, no path-bearing field), up to the last rule-less one before the first layer that would
    open a file to be set up or is a data layer (a later question covers what lies past it). The first of them has
    no rule (or its rule deferred to pycaffe): if it opens a file to be set up (a data layer without a rule, such as
    AnnotatedData), it is refused here."""
    net_param = prepared.net_param
    oracle_param = caffe_pb2.NetParameter()
    oracle_param.name = net_param.name
    if net_param.force_backward:
        oracle_param.force_backward = True
    for layer in built:
        if layer.source_index is None:
            continue  # a split layer: Caffe inserts it again
        named = len(prepared.layers[layer.index].tops)
        created = [blobs[i] for i in layer.tops[:named] if blobs[i].producer == layer.index]
        if created:
            replacement = oracle_param.layer.add()
            replacement.name = layer.name
            replacement.type = "Input"
            for blob in created:
                replacement.top.append(blob.name)
                replacement.input_param.shape.add().dim.extend(blob.shape)
    pending: list[Any] = []
    asked: set[str] = set()
    sent = 0
    for position, spec in enumerate(prepared.layers[len(built) :]):
        if spec.orig is None:
            continue
        original = net_param.layer[spec.orig]  # its bottoms as written: Caffe inserts the splits again
        opened = opened_field(original)
        current = position == 0  # the layer being built: no rule, or its rule deferred to pycaffe
        if opened is not None:
            if current:
                raise refusal(original, opened)
            break
        if spec.rule is not None and spec.rule.is_data and not current:
            break
        pending.append(sanitized(original))
        if spec.rule is None or current:
            asked.add(spec.name)
            sent = len(pending)
    oracle_param.layer.extend(pending[:sent])
    return oracle_param, asked


def input_net(net: Net) -> Any:
    """The net Caffe would build for `net`'s phase, as a NetParameter pycaffe can build without any dataset: the
    layers the phase keeps (no include/exclude rules left, splits left for Caffe to insert again), each data
    layer replaced by an Input layer of the shapes computed for its tops, each path-bearing field cleared (a layer
    that opens a file to be set up, such as HDF5Output, stays: pycaffe_shapes refuses such a net)."""
    if net.param is None:
        raise ValueError("the net does not know the NetParameter it was built from")
    filtered = [(layer.source_index, net.param.layer[layer.source_index]) for layer in net.layers
                if layer.source_index is not None]
    return _input_net(net.param, filtered, net.layers, net.blobs)


def _input_net(net_param: Any, filtered: list[tuple[int, Any]], built: list[Layer], blobs: list[Blob]) -> Any:
    """The filtered net (before splits: Caffe inserts them again) with its data layers replaced by Input layers of
    the shapes computed for them, every layer sanitized."""
    oracle_param = caffe_pb2.NetParameter()
    oracle_param.name = net_param.name
    if net_param.force_backward:
        oracle_param.force_backward = True
    by_source = {layer.source_index: layer for layer in built if layer.source_index is not None}
    for orig, layer in filtered:
        built_layer = by_source.get(orig)
        if built_layer is not None and built_layer.rule is not None and built_layer.rule.is_data:
            replacement = oracle_param.layer.add()
            replacement.name = layer.name
            replacement.type = "Input"
            replacement.top.extend(layer.top)
            for blob_id in built_layer.tops[: len(layer.top)]:
                replacement.input_param.shape.add().dim.extend(blobs[blob_id].shape)
            continue
        oracle_param.layer.append(sanitized(layer))
    return oracle_param
