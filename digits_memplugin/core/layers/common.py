"""Layers that project, combine or reduce blobs: InnerProduct, Eltwise, ArgMax, Reduction, Embed, Parameter,
HDF5Output."""

from __future__ import annotations

from .base import (
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


@layer_rule("Parameter")
class ParameterRule(LayerRule):
    """ParameterLayer: a learned blob of the given shape, as its top."""

    bottoms = Count(exact=0)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        shape = tuple(ctx.param.parameter_param.shape.dim)
        # The top shares the param's data and diff (ShareData/ShareDiff), so it allocates nothing of its own.
        return LayerSetup(tops=[shape], params=[shape], details={"external_tops": True})
