"""Sliding-window layers: Convolution, Deconvolution, Pooling, LRN, Im2col, Crop."""

from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from .base import (
    ENGINE_CPU,
    ENGINE_CUDNN,
    INT_BYTES,
    WORKSPACE,
    Buffer,
    Count,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    count_of,
    layer_rule,
    optional,
    spatial_param,
)

CUDNN_STREAMS_PER_GROUP = 3
"""BVLC's cudnn_conv_layer.cpp: one stream (and handle) each for forward, backward-data, backward-filter."""
CUDNN_LRN_MAX_N = 16
"""cuDNN's largest LRN window; GetLRNLayer falls back to Caffe's LRNLayer above it."""
CUDNN_WORKSPACE_LIMIT = 8 * 1024 * 1024
"""BVLC picks cuDNN algorithms under this workspace limit (bytes), per group and direction."""


def conv_output_dim(ctx: LayerContext, size: int, kernel: int, stride: int, pad: int, dilation: int, axis: int) -> int:
    extent = dilation * (kernel - 1) + 1
    out = (size + 2 * pad - extent) // stride + 1
    if size + 2 * pad < extent:
        raise ctx.error(
            f"kernel extent {extent} exceeds the padded input {size + 2 * pad} on spatial axis {axis}",
            field="convolution_param.kernel_size",
        )
    return out


def _uses_cudnn(ctx: LayerContext) -> bool:
    """GetConvolutionLayer on a cuDNN build: CuDNNConvolutionLayer for engine DEFAULT or CUDNN without dilation."""
    p = ctx.param.convolution_param
    return ctx.type == "Convolution" and p.engine in (p.DEFAULT, p.CUDNN) and not any(d > 1 for d in p.dilation)


def _window(
    ctx: LayerContext, p: Any, num_spatial: int, *, check_stride: bool
) -> tuple[list[int], list[int], list[int], list[int]]:
    """kernel, stride, pad and dilation from a convolution_param, read and checked in Caffe's order (the
    convolution checks its stride; Im2col leaves that to im2col)."""
    kernel = spatial_param(
        ctx, list(p.kernel_size), optional(p, "kernel_h"), optional(p, "kernel_w"), num_spatial, 0,
        "convolution_param.kernel_size",
    )
    if num_spatial and (not kernel or any(k <= 0 for k in kernel)):
        raise ctx.error("filter dimensions must be positive", field="convolution_param.kernel_size")
    stride = spatial_param(
        ctx, list(p.stride), optional(p, "stride_h"), optional(p, "stride_w"), num_spatial, 1,
        "convolution_param.stride",
    )
    if check_stride and any(s <= 0 for s in stride):
        raise ctx.error("stride dimensions must be positive", field="convolution_param.stride")
    pad = spatial_param(
        ctx, list(p.pad), optional(p, "pad_h"), optional(p, "pad_w"), num_spatial, 0, "convolution_param.pad"
    )
    dilation = spatial_param(ctx, list(p.dilation), None, None, num_spatial, 1, "convolution_param.dilation")
    return kernel, stride, pad, dilation


ConvGeometry = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int, bool, bool]
"""(channel axis, kernel, stride, pad, dilation, num_output, group, bias_term, uses cuDNN)."""


def _conv_geometry(ctx: LayerContext, axes: int) -> ConvGeometry:
    """BaseConvolutionLayer::LayerSetUp's reading of convolution_param for a bottom of `axes` axes, checked."""
    p = ctx.param.convolution_param
    channel_axis = ctx.canonical_axis(p.axis, axes, "convolution_param.axis")
    num_spatial = axes - (channel_axis + 1)
    if num_spatial < 0:
        raise ctx.error("the input has no spatial axes", field="convolution_param.axis")
    kernel, stride, pad, dilation = _window(ctx, p, num_spatial, check_stride=True)
    num_output = ctx.positive(p.num_output, "convolution_param.num_output")
    group = ctx.positive(p.group, "convolution_param.group")
    return (
        channel_axis, tuple(kernel), tuple(stride), tuple(pad), tuple(dilation), num_output, group, bool(p.bias_term),
        _uses_cudnn(ctx),
    )


@layer_rule("Convolution", "Deconvolution")
class ConvolutionRule(LayerRule):
    """BaseConvolutionLayer: weights [out, in/group, k...], optional bias, a per-image im2col buffer.

    The layer factory picks cuDNN for Convolution (engine DEFAULT or CUDNN, no dilation) only: Deconvolution is
    always Caffe's own DeconvolutionLayer, col_buffer_ included."""

    bottoms = Count(minimum=1)
    tops = Count(minimum=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        # Caffe's own engine fetches the bottom diff up front; CuDNNConvolutionLayer only under propagate_down.
        return not (engine == ENGINE_CUDNN and _uses_cudnn(ctx))

    def setup(self, ctx: LayerContext) -> LayerSetup:
        reverse = ctx.type == "Deconvolution"
        if len(ctx.param.top) != len(ctx.bottoms):
            raise ctx.error(
                f"needs one top per bottom ({len(ctx.bottoms)} bottoms, {len(ctx.param.top)} tops)", field="top"
            )
        bottom = ctx.bottoms[0]
        for index, other in enumerate(ctx.bottoms[1:], start=1):
            if other != bottom:
                raise ctx.error(f"all bottoms must have the same shape; bottom {index} is {list(other)}", field="bottom")
        # The geometry depends on the bottom's number of axes only: read once per prepared net (see ctx.memo).
        key = ("convolution", len(bottom))
        geometry = ctx.memo.get(key)
        if geometry is None:
            geometry = ctx.memo[key] = _conv_geometry(ctx, len(bottom))
        channel_axis, kernel, stride, pad, dilation, num_output, group, bias_term, cudnn = geometry
        first_spatial = channel_axis + 1
        is_1x1 = all(k == 1 and s == 1 and q == 0 for k, s, q in zip(kernel, stride, pad))
        channels = bottom[channel_axis]
        if channels % group:
            raise ctx.error(f"input channels {channels} are not a multiple of group {group}", field="convolution_param.group")
        if num_output % group:
            raise ctx.error(
                f"num_output {num_output} is not a multiple of group {group}", field="convolution_param.num_output"
            )
        conv_out_channels, conv_in_channels = (channels, num_output) if reverse else (num_output, channels)
        weight: Shape = (conv_out_channels, conv_in_channels // group, *kernel)
        params = [weight] + ([(num_output,)] if bias_term else [])

        spatial_in = bottom[first_spatial:]
        spatial_out: list[int] = []
        for axis, size in enumerate(spatial_in):
            k, s, q, d = kernel[axis], stride[axis], pad[axis], dilation[axis]
            if reverse:
                out = s * (size - 1) + d * (k - 1) + 1 - 2 * q
                if out <= 0:
                    raise ctx.error(f"output size {out} on spatial axis {axis} is not positive", field="convolution_param")
            else:
                out = conv_output_dim(ctx, size, k, s, q, d, axis)
            spatial_out.append(out)
        top: Shape = (*bottom[:channel_axis], num_output, *spatial_out)
        kernel_dim = conv_in_channels // group * count_of(kernel)
        conv_out_spatial = count_of(spatial_in if reverse else spatial_out)
        return LayerSetup(
            tops=[top] * len(ctx.bottoms),
            params=params,
            details={
                "is_1x1": is_1x1,
                "col_buffer": kernel_dim * group * conv_out_spatial,
                "bias_multiplier": count_of(spatial_out) if bias_term else 0,
                "group": group,
                "cudnn": cudnn,
                "num_bottoms": len(ctx.bottoms),
            },
        )

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        d = setup.details
        buffers = []
        if engine == ENGINE_CUDNN and d["cudnn"]:
            # CuDNNConvolutionLayer never touches col_buffer_; bias_multiplier_ is set on the host only. Its
            # workspace holds the largest of the three chosen algorithms' needs, per group and stream, each under
            # BVLC's 8 MiB limit; the algorithm's need is taken as one group's im2col matrix, which is what the
            # GEMM-based algorithms cuDNN prefers under a limit use.
            per_group = min(CUDNN_WORKSPACE_LIMIT, d["col_buffer"] // d["group"] * 4)
            buffers.append(
                Buffer("cudnn_workspace", per_group * d["group"] * CUDNN_STREAMS_PER_GROUP, 1, category=WORKSPACE)
            )
            return buffers
        # im2col needs the buffer unless the kernel is 1x1 (stride 1, no pad); backward_cpu_gemm (the gradient for
        # the bottom, and Deconvolution's forward) takes col_buffer_.mutable_cpu_data() before it tests is_1x1_.
        reverse = ctx.type == "Deconvolution"
        bottom_gradient = ctx.phase == "TRAIN" and ctx.need_backward and any(ctx.bottom_need_backward)
        if not d["is_1x1"] or reverse or bottom_gradient:
            buffers.append(Buffer("col_buffer", d["col_buffer"]))
        if d["bias_multiplier"]:
            buffers.append(Buffer("bias_multiplier", d["bias_multiplier"]))
        return buffers


def pooled_size(
    ctx: LayerContext, size: int, kernel: int, pad: int, stride: int, ceil_mode: bool, padded: bool, axis: str,
    field: str,
) -> int:
    """PoolingLayer::Reshape for one spatial axis: ceil (or floor) of the window count, then the last window
    clipped when it would start in the padding (`padded`: any pad, on either axis)."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if padded:
        if (out - 1) * stride >= size + pad:
            out -= 1
        if (out - 1) * stride >= size + pad:
            raise ctx.error(
                f"the last pooling window on the {axis} would start in the padding ({out} windows of stride "
                f"{stride} over {size} + pad {pad})",
                field=field,
            )
    if out <= 0:
        raise ctx.error(f"kernel {kernel} exceeds the padded input {axis} {size + 2 * pad}", field=field)
    return out


def pooled_shape(
    ctx: LayerContext, bottom: Shape, kernel: tuple[int, int], pad: tuple[int, int], stride: tuple[int, int],
    method: int, ceil_mode: bool, prefix: str,
) -> Shape:
    """PoolingLayer::LayerSetUp's CHECKs and Reshape's output shape, for Pooling and SPP's inner poolings."""
    if len(bottom) != 4:
        raise ctx.error(f"input must have 4 axes (num, channels, height, width), got {list(bottom)}", field="bottom")
    if kernel[0] <= 0 or kernel[1] <= 0:
        raise ctx.error("filter dimensions cannot be zero", field=f"{prefix}.kernel_size")
    if stride[0] <= 0 or stride[1] <= 0:
        raise ctx.error("stride must be positive", field=f"{prefix}.stride")
    padded = bool(pad[0] or pad[1])
    if padded:
        p = ctx.param.pooling_param
        if method not in (p.AVE, p.MAX):
            raise ctx.error("padding is implemented only for average and max pooling", field=f"{prefix}.pad")
        if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
            raise ctx.error(
                f"pad {pad[0]} x {pad[1]} must be smaller than the kernel {kernel[0]} x {kernel[1]}",
                field=f"{prefix}.pad",
            )
    height = pooled_size(ctx, bottom[2], kernel[0], pad[0], stride[0], ceil_mode, padded, "height",
                         f"{prefix}.kernel_size")
    width = pooled_size(ctx, bottom[3], kernel[1], pad[1], stride[1], ceil_mode, padded, "width",
                        f"{prefix}.kernel_size")
    return (bottom[0], bottom[1], height, width)


@layer_rule("Pooling")
class PoolingRule(LayerRule):
    """PoolingLayer (this tree's, with `ceil_mode`): MAX keeps an int index per output unless a mask top exists.

    Under cuDNN, BVLC's layer factory still builds Caffe's own PoolingLayer for MAX pooling (and for a mask
    top): only AVE and STOCHASTIC pooling run in CuDNNPoolingLayer, which keeps no index."""

    bottoms = Count(exact=1)
    tops = Count(minimum=1, maximum=2)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.pooling_param
        bottom = ctx.bottoms[0]
        if len(bottom) != 4:
            raise ctx.error(f"input must have 4 axes (num, channels, height, width), got {list(bottom)}", field="bottom")
        if p.global_pooling:
            if p.HasField("kernel_size") or p.HasField("kernel_h") or p.HasField("kernel_w"):
                raise ctx.error("with global_pooling the filter size cannot be given", field="pooling_param")
            kernel_h, kernel_w = bottom[2], bottom[3]
        else:
            if p.HasField("kernel_size") == (p.HasField("kernel_h") and p.HasField("kernel_w")):
                raise ctx.error(
                    "give kernel_size, or kernel_h and kernel_w (both, for a non-square filter)",
                    field="pooling_param.kernel_size",
                )
            kernel_h, kernel_w = (p.kernel_size, p.kernel_size) if p.HasField("kernel_size") else (p.kernel_h, p.kernel_w)
        if not ((not p.HasField("pad") and p.HasField("pad_h") and p.HasField("pad_w"))
                or (not p.HasField("pad_h") and not p.HasField("pad_w"))):
            raise ctx.error("give pad, or pad_h and pad_w (both)", field="pooling_param.pad")
        if not ((not p.HasField("stride") and p.HasField("stride_h") and p.HasField("stride_w"))
                or (not p.HasField("stride_h") and not p.HasField("stride_w"))):
            raise ctx.error("give stride, or stride_h and stride_w (both)", field="pooling_param.stride")
        pad_h, pad_w = (p.pad_h, p.pad_w) if p.HasField("pad_h") else (p.pad, p.pad)
        stride_h, stride_w = (p.stride_h, p.stride_w) if p.HasField("stride_h") else (p.stride, p.stride)
        if kernel_h <= 0 or kernel_w <= 0:
            raise ctx.error("filter dimensions cannot be zero", field="pooling_param.kernel_size")
        if p.global_pooling and (pad_h or pad_w or stride_h != 1 or stride_w != 1):
            raise ctx.error("with global_pooling only pad = 0 and stride = 1 are allowed", field="pooling_param")
        top = pooled_shape(
            ctx, bottom, (kernel_h, kernel_w), (pad_h, pad_w), (stride_h, stride_w), p.pool,
            getattr(p, "ceil_mode", True),  # NVcaffe has no ceil_mode: it always rounds up, as this default does
            "pooling_param",
        )
        mask_top = len(ctx.param.top) > 1
        cudnn = p.engine in (p.DEFAULT, p.CUDNN) and not mask_top and p.pool != p.MAX
        return LayerSetup(
            tops=[top] * len(ctx.param.top),
            details={"method": p.pool, "mask_top": mask_top, "cudnn": cudnn},
        )

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        d = setup.details
        if engine == ENGINE_CUDNN and d["cudnn"]:
            return []  # CuDNNPoolingLayer keeps no index
        return pooling_buffers(ctx, d["method"], d["mask_top"], count_of(setup.tops[0]), engine)


def pooling_buffers(ctx: LayerContext, method: int, mask_top: bool, count: int, engine: str) -> list[Buffer]:
    """Caffe's PoolingLayer: max_idx_ for MAX without a mask top; rand_idx_ for STOCHASTIC, written by the GPU
    forward only (Forward_cpu has no stochastic pooling)."""
    p = ctx.param.pooling_param
    if method == p.MAX and not mask_top:
        return [Buffer("max_idx", count, INT_BYTES)]
    if method == p.STOCHASTIC and engine != ENGINE_CPU:
        return [Buffer("rand_idx", count)]
    return []


@layer_rule("SPP")
class SPPRule(LayerRule):
    """SPPLayer: for each pyramid level i, a pooling into 2^i x 2^i bins (kernel and pad chosen to cover the
    input), flattened and concatenated along the channels; with one level, a single pooling into the top.

    Its inner layers are Caffe's own (never cuDNN): a Split of the bottom (one diff per level in backward), one
    pooling output per level (data, and diff in backward, shared with its Flatten), and each pooling's index.
    Caffe's own SPP tests stop at pyramid_height 3 for a reason: a level with more bins than pixels needs a pad
    no smaller than its kernel, which PoolingLayer refuses."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return False

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.spp_param
        bottom = ctx.bottoms[0]
        if len(bottom) != 4:
            raise ctx.error(f"input must have 4 axes (num, channels, height, width), got {list(bottom)}", field="bottom")
        if bottom[2] <= 0 or bottom[3] <= 0:
            raise ctx.error(f"input dimensions cannot be zero, got {list(bottom)}", field="bottom")
        levels = ctx.positive(p.pyramid_height, "spp_param.pyramid_height")
        pool = {p.MAX: ctx.param.pooling_param.MAX, p.AVE: ctx.param.pooling_param.AVE,
                p.STOCHASTIC: ctx.param.pooling_param.STOCHASTIC}[p.pool]
        outputs: list[Shape] = []
        for level in range(levels):
            bins = 2**level
            kernel_h, kernel_w = -(-bottom[2] // bins), -(-bottom[3] // bins)
            pad_h, pad_w = (kernel_h * bins - bottom[2] + 1) // 2, (kernel_w * bins - bottom[3] + 1) // 2
            try:
                outputs.append(
                    pooled_shape(ctx, bottom, (kernel_h, kernel_w), (pad_h, pad_w), (kernel_h, kernel_w), pool, True,
                                 "spp_param")
                )
            except ShapeError as error:
                raise ctx.error(
                    f"pyramid level {level} ({bins} x {bins} bins over {bottom[2]} x {bottom[3]}): {error.message}",
                    field="spp_param.pyramid_height",
                ) from None
        if levels == 1:
            top: Shape = outputs[0]
        else:
            top = (bottom[0], sum(count_of(shape[1:]) for shape in outputs))
        return LayerSetup(tops=[top], details={"outputs": outputs, "pool": pool})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        outputs: list[Shape] = setup.details["outputs"]
        pool = setup.details["pool"]
        if len(outputs) == 1:
            return pooling_buffers(ctx, pool, False, count_of(outputs[0]), engine)
        # Backward returns at once unless the bottom needs a gradient; then each level's pooling output gets a
        # diff (shared with its Flatten) and each split top a diff of the bottom's size.
        training = ctx.phase == "TRAIN" and ctx.need_backward and any(ctx.bottom_need_backward)
        buffers = []
        for level, shape in enumerate(outputs):
            buffers.append(Buffer(f"level{level}.pooled", count_of(shape)))
            if training:
                buffers.append(Buffer(f"level{level}.pooled.diff", count_of(shape)))
                buffers.append(Buffer(f"level{level}.split.diff", count_of(ctx.bottoms[0])))
            buffers += [
                Buffer(f"level{level}.{b.name}", b.count, b.itemsize)
                for b in pooling_buffers(ctx, pool, False, count_of(shape), engine)
            ]
        return buffers


@layer_rule("LRN")
class LRNRule(LayerRule):
    """LRNLayer: ACROSS_CHANNELS keeps a scale_ blob; WITHIN_CHANNEL chains split, power, pool, power, product."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.lrn_param
        if p.local_size % 2 != 1:
            raise ctx.error("LRN only supports odd values for local_size", field="lrn_param.local_size")
        bottom = ctx.bottoms[0]
        if len(bottom) != 4:
            raise ctx.error(f"input must have 4 axes (num, channels, height, width), got {list(bottom)}", field="bottom")
        details: dict[str, int] = {}
        if p.norm_region == p.WITHIN_CHANNEL:
            pad = (p.local_size - 1) // 2
            pooled = []
            for size in bottom[2:]:
                out = -(-(size + 2 * pad - p.local_size) // 1) + 1
                if pad and (out - 1) >= size + pad:
                    out -= 1
                pooled.append(out)
            details["pool_output"] = bottom[0] * bottom[1] * pooled[0] * pooled[1]
        return LayerSetup(tops=[bottom], details=details)

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.lrn_param
        count = count_of(ctx.bottoms[0])
        cudnn = engine == ENGINE_CUDNN and p.engine in (p.DEFAULT, p.CUDNN)
        if p.norm_region == p.ACROSS_CHANNELS:
            # GetLRNLayer keeps Caffe's own LRN when local_size exceeds CUDNN_LRN_MAX_N.
            cudnn = cudnn and p.local_size <= CUDNN_LRN_MAX_N
            return [] if cudnn else [Buffer("scale", count)]
        if cudnn:
            return [Buffer("lcn_temp", 2 * count)]  # CuDNNLCNLayer's two temporaries of the input's size
        pool = setup.details["pool_output"]
        buffers = [Buffer("square_output", count), Buffer("pool_output", pool), Buffer("power_output", pool)]
        # The inner layers get fresh LayerParameters (no loss weight), so set-up touches no diff; only
        # WithinChannelBackward does, and it returns at once unless propagate_down[0]. Net::Backward calls it only
        # for a layer that needs backward, in the train net.
        if ctx.need_backward and ctx.bottom_need_backward and ctx.bottom_need_backward[0]:
            buffers += [
                Buffer("product_input.diff", count),
                Buffer("square_input.diff", count),
                Buffer("square_output.diff", count),
                Buffer("pool_output.diff", pool),
                Buffer("power_output.diff", pool),
            ]
        return buffers


@layer_rule("Im2col")
class Im2colRule(LayerRule):
    """Im2colLayer: the column matrix of every image as its top."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return True

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.convolution_param
        bottom = ctx.bottoms[0]
        channel_axis = ctx.canonical_axis(p.axis, len(bottom), "convolution_param.axis")
        num_spatial = len(bottom) - channel_axis - 1
        if num_spatial < 1:
            raise ctx.error(f"the input {list(bottom)} has no spatial axis after the channel axis {channel_axis}",
                            field="convolution_param.axis")
        kernel, stride, pad, dilation = _window(ctx, p, num_spatial, check_stride=False)
        channels = bottom[channel_axis]
        spatial = [
            conv_output_dim(ctx, size, kernel[i], stride[i], pad[i], dilation[i], i)
            for i, size in enumerate(bottom[channel_axis + 1 :])
        ]
        return LayerSetup(tops=[(*bottom[:channel_axis], channels * count_of(kernel), *spatial)])


@layer_rule("Crop")
class CropRule(LayerRule):
    """CropLayer: bottom 0 cropped to bottom 1's shape from `axis` on, at the given offsets."""

    bottoms = Count(exact=2)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return index == 0  # bottom 0's diff, fetched before propagate_down[0] is tested (bottom 1 is never written)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.crop_param
        bottom, reference = ctx.bottoms
        if len(reference) < len(bottom):
            raise ctx.error(
                f"bottom 1 {list(reference)} must have at least the {len(bottom)} axes of bottom 0 {list(bottom)}",
                field="bottom",
            )
        axis = ctx.canonical_axis(p.axis, len(bottom), "crop_param.axis")
        cropped = len(bottom) - axis
        if len(p.offset) > 1 and len(p.offset) != cropped:
            raise ctx.error(
                f"give one offset or one per cropped axis ({cropped}), got {len(p.offset)}", field="crop_param.offset"
            )
        shape = list(bottom)
        for i in range(axis, len(bottom)):
            offset = 0
            if len(p.offset) == 1:
                offset = p.offset[0]
            elif len(p.offset) > 1:
                offset = p.offset[i - axis]
            shape[i] = reference[i]
            if bottom[i] - offset < reference[i]:
                raise ctx.error(
                    f"crop of size {reference[i]} at offset {offset} does not fit axis {i} of size {bottom[i]}",
                    field="crop_param.offset",
                )
        return LayerSetup(tops=[tuple(shape)])
