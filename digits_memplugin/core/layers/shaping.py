"""Layers that split, join and reshape blobs without computing on them: Concat, Slice, Split, Flatten, Reshape,
Tile, Silence, BatchReindex, Filter."""

from __future__ import annotations

from typing import Any

from .base import (
    Count,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    count_of,
    layer_rule,
)


def _axis_or_legacy_dim(ctx: LayerContext, p: Any, legacy: str, shape: Shape, prefix: str) -> int:
    """Concat's and Slice's axis: `axis` (negative from the end), or the legacy non-negative `concat_dim` /
    `slice_dim`; Caffe refuses both at once."""
    if p.HasField(legacy):
        if p.HasField("axis"):
            raise ctx.error(f"give either axis or {legacy}, not both", field=prefix)
        axis = getattr(p, legacy)
        if axis >= len(shape):
            raise ctx.error(f"{legacy} {axis} is out of range for {list(shape)}", field=f"{prefix}.{legacy}")
        return int(axis)
    return ctx.canonical_axis(p.axis, len(shape), f"{prefix}.axis")


@layer_rule("Concat")
class ConcatRule(LayerRule):
    """ConcatLayer: bottoms joined along `axis`; with one bottom the top is the bottom."""

    bottoms = Count(minimum=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.concat_param
        first = ctx.bottoms[0]
        axis = _axis_or_legacy_dim(ctx, p, "concat_dim", first, "concat_param")
        total = 0
        for index, bottom in enumerate(ctx.bottoms):
            if len(bottom) != len(first):
                raise ctx.error(
                    f"all inputs must have the same number of axes; bottom {index} is {list(bottom)}, "
                    f"bottom 0 is {list(first)}",
                    field="bottom",
                )
            for j, (a, b) in enumerate(zip(bottom, first)):
                if j != axis and a != b:
                    raise ctx.error(
                        f"bottom {index} {list(bottom)} differs from bottom 0 {list(first)} on axis {j}; only the "
                        f"concat axis {axis} may differ",
                        field="bottom",
                    )
            total += bottom[axis]
        top = (*first[:axis], total, *first[axis + 1 :])
        if len(ctx.bottoms) == 1:
            return LayerSetup(tops=[top], data_views={0: 0}, diff_views={0: 0})
        return LayerSetup(tops=[top])


@layer_rule("Slice")
class SliceRule(LayerRule):
    """SliceLayer: the bottom cut along `axis` at the slice points (or into equal parts)."""

    bottoms = Count(exact=1)
    tops = Count(minimum=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.slice_param
        bottom = ctx.bottoms[0]
        axis = _axis_or_legacy_dim(ctx, p, "slice_dim", bottom, "slice_param")
        size = bottom[axis]
        tops = len(ctx.param.top)
        points = list(p.slice_point)
        if points:
            if len(points) != tops - 1:
                raise ctx.error(
                    f"{len(points)} slice points for {tops} tops; give one fewer point than tops",
                    field="slice_param.slice_point",
                )
            if tops > size:
                raise ctx.error(f"{tops} slices of an axis of size {size}", field="slice_param.slice_point")
            sizes, previous = [], 0
            for point in points:
                if point <= previous:
                    raise ctx.error(
                        f"slice points must be positive and increasing, got {points}", field="slice_param.slice_point"
                    )
                sizes.append(point - previous)
                previous = point
            sizes.append(size - previous)
            if any(s <= 0 for s in sizes):
                raise ctx.error(f"slice points {points} leave an empty slice of {size}", field="slice_param.slice_point")
        else:
            if size % tops:
                raise ctx.error(
                    f"axis {axis} of size {size} cannot be cut into {tops} equal slices", field="slice_param"
                )
            sizes = [size // tops] * tops
        shapes = [(*bottom[:axis], s, *bottom[axis + 1 :]) for s in sizes]
        if tops == 1:
            return LayerSetup(tops=shapes, data_views={0: 0}, diff_views={0: 0})
        return LayerSetup(tops=shapes)


@layer_rule("Split")
class SplitRule(LayerRule):
    """SplitLayer: every top shares the bottom's data and has a diff of its own (summed in backward)."""

    bottoms = Count(exact=1)
    tops = Count(minimum=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        n = len(ctx.param.top)
        if ctx.param.bottom[0] in ctx.param.top:
            raise ctx.error("Split does not allow in-place computation", field="top")
        return LayerSetup(tops=[ctx.bottoms[0]] * n, data_views=dict.fromkeys(range(n), 0))


def _not_in_place(ctx: LayerContext) -> None:
    """Flatten, Reshape and Split CHECK that the top is not the bottom."""
    if ctx.param.top and ctx.param.bottom and ctx.param.top[0] == ctx.param.bottom[0]:
        raise ctx.error(f"{ctx.type} does not allow in-place computation (top {ctx.param.top[0]!r} is its bottom)",
                        field="top")


@layer_rule("Flatten")
class FlattenRule(LayerRule):
    """FlattenLayer: axes [axis, end_axis] merged; the top shares the bottom's data and diff."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.flatten_param
        bottom = ctx.bottoms[0]
        _not_in_place(ctx)
        start = ctx.canonical_axis(p.axis, len(bottom), "flatten_param.axis")
        end = ctx.canonical_axis(p.end_axis, len(bottom), "flatten_param.end_axis")
        if end + 1 < start:
            raise ctx.error(f"end_axis {p.end_axis} comes before axis {p.axis}", field="flatten_param.end_axis")
        top = (*bottom[:start], count_of(bottom[start : end + 1]), *bottom[end + 1 :])
        return LayerSetup(tops=[top], data_views={0: 0}, diff_views={0: 0})


@layer_rule("Reshape")
class ReshapeRule(LayerRule):
    """ReshapeLayer: 0 copies a bottom axis, -1 is inferred; the top shares the bottom's data and diff."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.reshape_param
        bottom = ctx.bottoms[0]
        _not_in_place(ctx)
        dims = list(p.shape.dim)
        if dims.count(-1) > 1:
            raise ctx.error("at most one dimension can be -1 (inferred)", field="reshape_param.shape")
        if any(d < -1 for d in dims):
            raise ctx.error(f"dimensions must be -1, 0 or positive, got {dims}", field="reshape_param.shape")
        start = p.axis if p.axis >= 0 else len(bottom) + p.axis + 1
        if not 0 <= start <= len(bottom):
            raise ctx.error(f"axis {p.axis} is out of range for {list(bottom)}", field="reshape_param.axis")
        if p.num_axes < -1:
            raise ctx.error("num_axes must be >= -1", field="reshape_param.num_axes")
        end = len(bottom) if p.num_axes == -1 else start + p.num_axes
        if end > len(bottom):
            raise ctx.error(f"axis + num_axes exceeds the {len(bottom)} axes of the bottom", field="reshape_param")
        middle = []
        for i, d in enumerate(dims):
            if d == 0:
                if start + i >= len(bottom):
                    raise ctx.error(f"dimension {i} copies bottom axis {start + i}, which does not exist", field="reshape_param.shape")
                middle.append(bottom[start + i])
            else:
                middle.append(d)
        shape = [*bottom[:start], *middle, *bottom[end:]]
        total = count_of(bottom)
        if -1 in shape:
            known = count_of([d for d in shape if d != -1])
            if known == 0 or total % known:
                raise ctx.error(f"cannot infer -1 in {shape} for {total} elements", field="reshape_param.shape")
            shape[shape.index(-1)] = total // known
        if count_of(shape) != total:
            raise ctx.error(
                f"output count {count_of(shape)} {shape} differs from the input count {total}", field="reshape_param.shape"
            )
        return LayerSetup(tops=[tuple(shape)], data_views={0: 0}, diff_views={0: 0})


@layer_rule("Silence")
class SilenceRule(LayerRule):
    """SilenceLayer: swallows its bottoms."""

    bottoms = Count(minimum=1)
    tops = Count(exact=0)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        return LayerSetup(tops=[])


@layer_rule("Tile")
class TileRule(LayerRule):
    """TileLayer: the bottom repeated `tiles` times along `axis`."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.tile_param
        bottom = ctx.bottoms[0]
        axis = ctx.canonical_axis(p.axis, len(bottom), "tile_param.axis")
        tiles = ctx.positive(p.tiles, "tile_param.tiles")
        shape = list(bottom)
        shape[axis] *= tiles
        return LayerSetup(tops=[tuple(shape)])


@layer_rule("BatchReindex")
class BatchReindexRule(LayerRule):
    """BatchReindexLayer: items of bottom 0 picked by the indices in bottom 1."""

    bottoms = Count(exact=2)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        data, index = ctx.bottoms
        if len(index) != 1:
            raise ctx.error(f"the index bottom must have one axis, got {list(index)}", field="bottom")
        return LayerSetup(tops=[(index[0], *data[1:])])


@layer_rule("Filter")
class FilterRule(LayerRule):
    """FilterLayer: keeps the items whose selector is non-zero. How many is known only at run time; the
    estimate assumes all are kept (the largest the tops can be)."""

    bottoms = Count(minimum=2)
    tops = Count(minimum=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        selector = ctx.bottoms[-1]
        if len(ctx.param.top) != len(ctx.bottoms) - 1:
            raise ctx.error("needs one top per data bottom (all bottoms but the selector)", field="top")
        if not selector or any(d != 1 for d in selector[1:]):
            raise ctx.error(
                f"the selector (last bottom) {list(selector)} must be (N) or (N, 1, ...)", field="bottom"
            )
        for index, bottom in enumerate(ctx.bottoms[:-1]):
            if bottom[0] != selector[0]:
                raise ctx.error(
                    f"bottom {index} has {bottom[0]} items, the selector has {selector[0]}", field="bottom"
                )
        return LayerSetup(tops=list(ctx.bottoms[:-1]))
