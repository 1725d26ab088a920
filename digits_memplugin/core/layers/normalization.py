"""Layers that normalise or rescale blobs: Softmax, BatchNorm, Scale, Bias, MVN."""

from __future__ import annotations

from ..errors import ShapeError
from .base import (
    ENGINE_CUDNN,
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
