"""Layers that reshape, combine, normalise or project blobs."""

from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from .base import (
    ENGINE_CUDNN,
    INT_BYTES,
    Buffer,
    Count,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    count_of,
    layer_rule,
    legacy_dim,
)


@layer_rule("InnerProduct")
class InnerProductRule(LayerRule):
    """InnerProductLayer: weights [N, K] ([K, N] transposed), bias [N], a bias multiplier of the batch's size."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.inner_product_param
        bottom = ctx.bottoms[0]
        axis = ctx.canonical_axis(p.axis, len(bottom), "inner_product_param.axis")
        num_output = ctx.positive(p.num_output, "inner_product_param.num_output")
        inputs = count_of(bottom[axis:])
        weight = (inputs, num_output) if p.transpose else (num_output, inputs)
        params: list[Shape] = [weight] + ([(num_output,)] if p.bias_term else [])
        return LayerSetup(
            tops=[(*bottom[:axis], num_output)], params=params, details={"rows": count_of(bottom[:axis])}
        )

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        if not ctx.param.inner_product_param.bias_term:
            return []
        return [Buffer("bias_multiplier", setup.details["rows"])]


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


@layer_rule("Eltwise")
class EltwiseRule(LayerRule):
    """EltwiseLayer: bottoms of one shape combined; MAX keeps an int index per element."""

    bottoms = Count(minimum=2)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.eltwise_param
        if len(p.coeff) and len(p.coeff) != len(ctx.bottoms):
            raise ctx.error(
                f"takes one coefficient per bottom ({len(ctx.bottoms)}), got {len(p.coeff)}", field="eltwise_param.coeff"
            )
        if len(p.coeff) and p.operation == p.PROD:
            raise ctx.error("coefficients are for summation only, not PROD", field="eltwise_param.coeff")
        first = ctx.bottoms[0]
        for index, bottom in enumerate(ctx.bottoms[1:], start=1):
            if bottom != first:
                raise ctx.error(
                    f"bottom {index} has shape {list(bottom)}, bottom 0 has {list(first)}; they must match",
                    field="bottom",
                )
        return LayerSetup(tops=[first])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.eltwise_param
        if p.operation == p.MAX:
            return [Buffer("max_idx", count_of(setup.tops[0]), INT_BYTES)]
        return []


@layer_rule("Softmax")
class SoftmaxRule(LayerRule):
    """SoftmaxLayer: a multiplier over the softmax axis and a scale per position."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return True  # Backward_cpu has no propagate_down test

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        axis = ctx.canonical_axis(ctx.param.softmax_param.axis, len(bottom), "softmax_param.axis")
        return LayerSetup(tops=[bottom], details={"axis": axis})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.softmax_param
        if engine == ENGINE_CUDNN and p.engine in (p.DEFAULT, p.CUDNN):
            return []
        return softmax_buffers(ctx.bottoms[0], setup.details["axis"])


def softmax_buffers(bottom: Shape, axis: int) -> list[Buffer]:
    """SoftmaxLayer's scale_ and sum_multiplier_; the latter is filled on the host in Reshape and read only by
    Forward_cpu's gemm (softmax_layer.cu's kernels need none), so it never reaches the device."""
    return [Buffer("sum_multiplier", bottom[axis], host_only=True),
            Buffer("scale", count_of(bottom) // max(bottom[axis], 1))]


@layer_rule("BatchNorm")
class BatchNormRule(LayerRule):
    """BatchNormLayer: mean, variance and a moving-average factor as params; per-element temp_ and x_norm_."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return True  # Backward_cpu has no propagate_down test

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        if len(bottom) < 2:
            # LayerSetUp takes 1 channel for a 1-axis bottom, but Reshape then reads shape(1) and aborts.
            raise ctx.error(f"input must have at least 2 axes (num, channels, ...), got {list(bottom)}", field="bottom")
        channels = bottom[1]
        return LayerSetup(tops=[bottom], params=[(channels,), (channels,), (1,)], details={"channels": channels})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        bottom = ctx.bottoms[0]
        count = count_of(bottom)
        channels = setup.details["channels"]
        num = bottom[0]
        spatial = count // (num * channels) if num * channels else 0
        buffers = [
            Buffer("mean", channels),
            Buffer("variance", channels),
            Buffer("temp", count),
            Buffer("x_norm", count),
            Buffer("batch_sum_multiplier", num),
            Buffer("spatial_sum_multiplier", spatial),
            Buffer("num_by_chans", num * channels),
        ]
        in_place = ctx.param.top[0] == ctx.param.bottom[0]
        if ctx.need_backward and in_place:  # Backward_cpu/gpu copy the top's diff there first, when in place
            buffers.append(Buffer("x_norm.diff", count))
        return buffers


def _axes_blob_shape(ctx: LayerContext, bottom: Shape, axis_value: int, num_axes: int, field: str) -> Shape:
    axis = ctx.canonical_axis(axis_value, len(bottom), f"{field}.axis")
    if num_axes < -1:
        raise ctx.error("num_axes must be non-negative, or -1 to extend to the end of bottom[0]", field=f"{field}.num_axes")
    if num_axes >= 0 and len(bottom) < axis + num_axes:
        raise ctx.error(
            f"the {field.split('_', maxsplit=1)[0]} blob's shape extends past bottom[0]'s shape {list(bottom)} from axis {axis}",
            field=f"{field}.num_axes",
        )
    return tuple(bottom[axis:] if num_axes == -1 else bottom[axis : axis + num_axes])


def _scale_learned(ctx: LayerContext) -> bool:
    """Whether the learned scale's lr_mult is not 0 (no ParamSpec: 1), read once per prepared net."""
    learned = ctx.memo.get("scale_learned")
    if learned is None:
        learned = ctx.memo["scale_learned"] = not len(ctx.param.param) or ctx.param.param[0].lr_mult != 0
    return bool(learned)


def _scale_gradient(ctx: LayerContext) -> bool:
    """Whether ScaleLayer's backward computes the scale's gradient: the learned scale's lr_mult is not 0, or the
    second bottom needs backward."""
    if ctx.phase != "TRAIN" or not ctx.need_backward:
        return False
    if len(ctx.bottoms) == 2:
        return len(ctx.bottom_need_backward) > 1 and ctx.bottom_need_backward[1]
    return _scale_learned(ctx)


@layer_rule("Scale")
class ScaleRule(LayerRule):
    """ScaleLayer: a learned (or second-bottom) scale broadcast over the bottom, with an optional Bias sub-layer."""

    bottoms = Count(minimum=1, maximum=2)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        # The learned scale's gradient goes through bottom[0]'s diff ("hack: store big eltwise product in bottom[0]
        # diff") unless the layer works in place or the scale is as big as the bottom.
        if len(ctx.bottoms) != 1 or ctx.param.top[0] == ctx.param.bottom[0]:
            return False
        learned = _scale_learned(ctx)
        p = ctx.param.scale_param
        try:
            scale = _axes_blob_shape(ctx, ctx.bottoms[0], p.axis, p.num_axes, "scale_param")
        except ShapeError:
            return False
        return learned and count_of(scale) != count_of(ctx.bottoms[0])

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.scale_param
        bottom = ctx.bottoms[0]
        if len(ctx.bottoms) == 2:
            scale = ctx.bottoms[1]
            params: list[Shape] = []
        else:
            scale = _axes_blob_shape(ctx, bottom, p.axis, p.num_axes, "scale_param")
            params = [scale]
        axis = 0 if len(scale) == 0 else ctx.canonical_axis(p.axis, len(bottom), "scale_param.axis")
        if len(bottom) < axis + len(scale) or tuple(bottom[axis : axis + len(scale)]) != tuple(scale):
            raise ctx.error(
                f"scale shape {list(scale)} does not match bottom {list(bottom)} from axis {axis}", field="scale_param"
            )
        if p.bias_term:
            params.append(scale if len(ctx.bottoms) == 1 else tuple(ctx.bottoms[1]))
        outer = count_of(bottom[:axis])
        inner = count_of(bottom[axis + len(scale) :])
        return LayerSetup(
            tops=[bottom],
            params=params,
            details={"outer": outer, "inner": inner, "scale_dim": count_of(scale), "bias": p.bias_term},
        )

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        d = setup.details
        count = count_of(ctx.bottoms[0])
        buffers = [Buffer("sum_multiplier", max(d["outer"], d["inner"]))]
        if ctx.param.top[0] == ctx.param.bottom[0]:
            buffers.append(Buffer("temp", count))
        # Backward_cpu sums the scale's gradient through sum_result_ when it is neither an element-wise product
        # nor reducible in place (inner or outer dimension 1, or a single scale value).
        if (
            _scale_gradient(ctx)
            and d["scale_dim"] != count
            and d["inner"] != 1
            and d["outer"] != 1
            and d["outer"] * d["scale_dim"] != 1
        ):
            buffers.append(Buffer("sum_result", d["outer"] * d["scale_dim"]))
        if d["bias"]:
            buffers.append(Buffer("bias.bias_multiplier", d["inner"]))
        return buffers


@layer_rule("Bias")
class BiasRule(LayerRule):
    """BiasLayer: a learned (or second-bottom) bias broadcast over the bottom."""

    bottoms = Count(minimum=1, maximum=2)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.bias_param
        bottom = ctx.bottoms[0]
        if len(ctx.bottoms) == 2:
            bias, params = ctx.bottoms[1], []
        else:
            bias = _axes_blob_shape(ctx, bottom, p.axis, p.num_axes, "bias_param")
            params = [bias]
        axis = 0 if len(bias) == 0 else ctx.canonical_axis(p.axis, len(bottom), "bias_param.axis")
        if len(bottom) < axis + len(bias) or tuple(bottom[axis : axis + len(bias)]) != tuple(bias):
            raise ctx.error(f"bias shape {list(bias)} does not match bottom {list(bottom)} from axis {axis}", field="bias_param")
        return LayerSetup(tops=[bottom], params=params, details={"inner": count_of(bottom[axis + len(bias) :])})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        return [Buffer("bias_multiplier", setup.details["inner"])]


@layer_rule("Silence")
class SilenceRule(LayerRule):
    """SilenceLayer: swallows its bottoms."""

    bottoms = Count(minimum=1)
    tops = Count(exact=0)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        return LayerSetup(tops=[])


@layer_rule("HDF5Output")
class HDF5OutputRule(LayerRule):
    """HDF5OutputLayer: no tops; LayerSetUp creates (truncates) hdf5_output_param.file_name, which the estimator
    never does (this rule is why such a net never goes to pycaffe). Each Forward copies the data and label bottoms
    into host blobs of their legacy 4-D shapes and writes them: it CHECKs at most 4 axes (num(), channels()...)
    and the same num on both, so Caffe would abort at the first iteration; refused here."""

    bottoms = Count(exact=2)
    tops = Count(exact=0)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        nums = [legacy_dim(ctx, bottom, 0) for bottom in ctx.bottoms]
        if nums[0] != nums[1]:
            raise ctx.error(
                f"data and label must have the same batch size, got {nums[0]} and {nums[1]} (Caffe aborts at the "
                "first forward)",
                field="bottom",
            )
        return LayerSetup(tops=[])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        # Forward_gpu copies into mutable_cpu_data too: host memory on every engine.
        return [
            Buffer("data_blob", count_of(ctx.bottoms[0]), host_only=True),
            Buffer("label_blob", count_of(ctx.bottoms[1]), host_only=True),
        ]


@layer_rule("ArgMax")
class ArgMaxRule(LayerRule):
    """ArgMaxLayer: the top_k indices (and values) along an axis, or over each item."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.argmax_param
        bottom = ctx.bottoms[0]
        k = ctx.positive(p.top_k, "argmax_param.top_k")
        if not bottom:
            raise ctx.error("the input has no axes to take the maximum over", field="bottom")
        if p.HasField("axis"):
            axis = ctx.canonical_axis(p.axis, len(bottom), "argmax_param.axis")
            if k > bottom[axis]:
                raise ctx.error(f"top_k {k} exceeds the axis size {bottom[axis]}", field="argmax_param.top_k")
            shape = list(bottom)
            shape[axis] = k
            return LayerSetup(tops=[tuple(shape)])
        if k > count_of(bottom[1:]):
            raise ctx.error(f"top_k {k} exceeds the item size {count_of(bottom[1:])}", field="argmax_param.top_k")
        shape = [bottom[0], 2 if p.out_max_val else 1, k]
        while len(shape) < max(len(bottom), 3):
            shape.append(1)
        return LayerSetup(tops=[tuple(shape[: max(len(bottom), 3)])])


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


@layer_rule("Reduction")
class ReductionRule(LayerRule):
    """ReductionLayer: the axes from `axis` on reduced to one value per leading position."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        axis = ctx.canonical_axis(ctx.param.reduction_param.axis, len(bottom), "reduction_param.axis")
        return LayerSetup(tops=[tuple(bottom[:axis])], details={"inner": count_of(bottom[axis:])})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.reduction_param
        if p.operation not in (p.SUM, p.MEAN):
            return []  # ASUM and SUMSQ keep no multiplier
        return [Buffer("sum_multiplier", setup.details["inner"])]


@layer_rule("Embed")
class EmbedRule(LayerRule):
    """EmbedLayer: a lookup table [input_dim, num_output] (and a bias) indexed by the bottom's values."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.embed_param
        num_output = ctx.positive(p.num_output, "embed_param.num_output")
        input_dim = ctx.positive(p.input_dim, "embed_param.input_dim")
        params: list[Shape] = [(input_dim, num_output)] + ([(num_output,)] if p.bias_term else [])
        bottom = ctx.bottoms[0]
        return LayerSetup(tops=[(*bottom, num_output)], params=params, details={"rows": count_of(bottom)})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        if not ctx.param.embed_param.bias_term:
            return []
        return [Buffer("bias_multiplier", setup.details["rows"])]


@layer_rule("MVN")
class MVNRule(LayerRule):
    """MVNLayer: reads the bottom as (num, channels, height, width), so its top has 4 axes; mean and variance per
    item and channel, a temp_ of the input's size."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return True  # Backward_cpu has no propagate_down test

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        top = tuple(legacy_dim(ctx, bottom, i) for i in range(4))
        return LayerSetup(tops=[top])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.mvn_param
        n, c, h, w = setup.tops[0]
        buffers = [Buffer("mean", n * c)]
        if p.normalize_variance:
            buffers.append(Buffer("variance", n * c))
        buffers += [Buffer("temp", n * c * h * w), Buffer("sum_multiplier", c * h * w if p.across_channels else h * w)]
        return buffers


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


@layer_rule("Parameter")
class ParameterRule(LayerRule):
    """ParameterLayer: a learned blob of the given shape, as its top."""

    bottoms = Count(exact=0)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        shape = tuple(ctx.param.parameter_param.shape.dim)
        # The top shares the param's data and diff (ShareData/ShareDiff), so it allocates nothing of its own.
        return LayerSetup(tops=[shape], params=[shape], details={"external_tops": True})
