"""InsertSplits: a Split layer wherever a top feeds several consumers, named as Caffe names them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import NetError
from .filtering import line_of


def insert_splits(
    layers: list[tuple[int | None, Any]], source: str, lines: Sequence[int | None]
) -> list[tuple[int | None, Any]]:
    """InsertSplits (src/caffe/util/insert_splits.cpp): a Split layer wherever a top feeds several consumers."""
    last_top: dict[str, tuple[int, int]] = {}
    bottom_source: dict[tuple[int, int], tuple[int, int]] = {}
    consumers: dict[tuple[int, int], int] = {}
    loss_weights: dict[tuple[int, int], float] = {}
    names = [layer.name for _, layer in layers]
    # Repeated fields are read by slicing: a list in one call, where iterating the pure-Python container costs a
    # call per element (most of preparing a ResNet-152).
    for i, (orig, layer) in enumerate(layers):
        tops = layer.top[:]
        for j, blob in enumerate(layer.bottom[:]):
            if blob not in last_top:
                raise NetError(
                    f"unknown bottom blob {blob!r} (bottom index {j}): no earlier layer in this phase produces it",
                    source=source,
                    line=line_of(lines, orig),
                    layer=layer.name,
                    layer_type=layer.type,
                    field="bottom",
                )
            top_idx = last_top[blob]
            bottom_source[(i, j)] = top_idx
            consumers[top_idx] = consumers.get(top_idx, 0) + 1
        for j, blob in enumerate(tops):
            last_top[blob] = (i, j)
        for j, weight in enumerate(layer.loss_weight[: len(tops)]):
            top_idx = last_top[tops[j]]
            loss_weights[top_idx] = weight
            if weight:
                consumers[top_idx] = consumers.get(top_idx, 0) + 1

    split_index: dict[tuple[int, int], int] = {}
    result: list[tuple[int | None, Any]] = []
    for i, (orig, original) in enumerate(layers):
        # Copied only when renamed below: the parsed net is shared by every phase and build, and most layers of
        # a net keep their bottoms (copying them all was a third of preparing a ResNet).
        layer = original
        for j in range(len(original.bottom)):
            top_idx = bottom_source[(i, j)]
            if consumers.get(top_idx, 0) > 1:
                if layer is original:
                    layer = _copy(original)
                k = split_index.get(top_idx, 0)
                split_index[top_idx] = k + 1
                layer.bottom[j] = _split_blob_name(names[top_idx[0]], layer.bottom[j], top_idx[1], k)
        position = len(result)
        result.append((orig, layer))
        for j, top in enumerate(original.top[:]):
            top_idx = (i, j)
            count = consumers.get(top_idx, 0)
            if count > 1:
                loss_weight = loss_weights.get(top_idx, 0.0)
                split = type(original)()  # the net's own schema (BVLC or NVcaffe)
                split.bottom.append(top)
                split.name = f"{top}_{names[i]}_{j}_split"
                split.type = "Split"
                for k in range(count):
                    split.top.append(_split_blob_name(names[i], top, j, k))
                    if loss_weight:
                        split.loss_weight.append(loss_weight if k == 0 else 0.0)
                if loss_weight:
                    if layer is original:
                        layer = _copy(original)
                        result[position] = (orig, layer)
                    layer.ClearField("loss_weight")
                    split_index[top_idx] = split_index.get(top_idx, 0) + 1
                result.append((None, split))
    return result


def _copy(layer: Any) -> Any:
    copy = type(layer)()
    copy.CopyFrom(layer)
    return copy


def _split_blob_name(layer_name: str, blob_name: str, blob_idx: int, split_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{blob_idx}_split_{split_idx}"
