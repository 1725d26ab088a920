"""Element-wise (neuron) layers: top has the bottom's shape; most keep nothing else."""

from __future__ import annotations

from .base import ENGINE_CPU, Buffer, Count, LayerContext, LayerRule, LayerSetup, count_of, layer_rule, legacy_dim


@layer_rule(
    "ReLU", "Sigmoid", "TanH", "AbsVal", "BNLL", "ELU", "Power", "Exp", "Log", "Threshold", "ReLU6", "HardSigmoid",
    "HardSwish",
)
class NeuronRule(LayerRule):
    """NeuronLayer: one bottom, one top of the same shape, no internal buffers."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        if ctx.type == "Log" and ctx.param.log_param.base <= 0 and ctx.param.log_param.base != -1:
            raise ctx.error("base must be strictly positive (or -1 for e)", field="log_param.base")
        if ctx.type == "Log" and ctx.param.log_param.base == 1:
            # LogLayer divides by log(base) and CHECKs the result is finite.
            raise ctx.error("base 1 has log(base) = 0, which LogLayer divides by", field="log_param.base")
        if ctx.type == "Exp" and ctx.param.exp_param.base <= 0 and ctx.param.exp_param.base != -1:
            raise ctx.error("base must be strictly positive (or -1 for e)", field="exp_param.base")
        if ctx.type == "AbsVal" and ctx.param.top[0] == ctx.param.bottom[0]:
            raise ctx.error("AbsVal does not allow in-place computation", field="top")
        return LayerSetup(tops=[ctx.bottoms[0]])


@layer_rule("Dropout")
class DropoutRule(LayerRule):
    """DropoutLayer: an unsigned-int mask of the input's size."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        ratio = ctx.param.dropout_param.dropout_ratio
        if not 0.0 <= ratio < 1.0:
            raise ctx.error(f"dropout_ratio must be in [0, 1), got {ratio}", field="dropout_param.dropout_ratio")
        return LayerSetup(tops=[ctx.bottoms[0]])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        # Forward_cpu takes rand_vec_.mutable_cpu_data() before it tests the phase, so the CPU allocates the mask
        # in TEST too; Forward_gpu only draws it in TRAIN.
        if ctx.phase != "TRAIN" and engine != ENGINE_CPU:
            return []
        return [Buffer("rand_vec", count_of(ctx.bottoms[0]))]


@layer_rule("PReLU")
class PReLURule(LayerRule):
    """PReLULayer: one slope per channel (or one shared); in place it keeps a copy of its input."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        if len(bottom) < 2:
            raise ctx.error(f"input must have at least 2 axes, got {list(bottom)}", field="bottom")
        legacy_dim(ctx, bottom, 1)  # channels() is a legacy accessor: at most 4 axes
        shared = ctx.param.prelu_param.channel_shared
        return LayerSetup(tops=[bottom], params=[() if shared else (bottom[1],)])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        bottom = ctx.bottoms[0]
        per_item = count_of(bottom[1:])
        # LayerSetUp fills multiplier_ on the host. Only Backward_gpu reads it on the device, beside backward_buff_'s
        # diff, and only when the slope's gradient is computed (param_propagate_down_[0]: its lr_mult is not 0).
        buffers = [Buffer("multiplier", per_item, host_only=True)]
        slope_gradient = ctx.need_backward and (not len(ctx.param.param) or ctx.param.param[0].lr_mult != 0)
        if slope_gradient and engine != ENGINE_CPU:
            buffers += [Buffer("multiplier.gpu", per_item), Buffer("backward_buff.diff", per_item)]
        if len(ctx.param.top) and ctx.param.top[0] == ctx.param.bottom[0]:
            buffers.append(Buffer("bottom_memory", count_of(bottom)))
        return buffers
