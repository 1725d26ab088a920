"""Recurrent layers: LSTM and RNN unroll into an internal Net, as Caffe's RecurrentLayer does; LSTMUnit is one step.

RecurrentLayer::LayerSetUp (src/caffe/layers/recurrent_layer.cpp) builds a NetParameter from the layer's
FillUnrolledNet (lstm_layer.cpp, rnn_layer.cpp) and runs Net::Init on it. The rules here build the same
NetParameter and hand it to `core.net.build_net`, so the unrolled net's shapes, shared params and backward flags
come from the same code as any other net's. The layer's params are the unrolled net's own (unshared) params; its
top shares data and diff with the unrolled net's output blob, its bottoms with the unrolled net's inputs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..errors import UnrollLimitError
from ..proto import caffe_pb2
from .base import (
    ACTIVATION_DIFFS,
    ENGINE_CPU,
    Buffer,
    Count,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    SubNet,
    count_of,
    layer_rule,
)


@layer_rule("LSTMUnit")
class LSTMUnitRule(LayerRule):
    """LSTMUnitLayer: one LSTM step; c_{t-1} (1, N, D), gates (1, N, 4D), cont (1, N) -> c_t, h_t; keeps X_acts_."""

    bottoms = Count(exact=3)
    tops = Count(exact=2)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def setup(self, ctx: LayerContext) -> LayerSetup:
        c_prev, gates, _ = ctx.bottoms
        num = c_prev[1] if len(c_prev) > 1 else None
        for index, bottom in enumerate(ctx.bottoms):
            axes = 2 if index == 2 else 3
            if len(bottom) != axes or bottom[0] != 1 or bottom[1] != num:
                raise ctx.error(
                    f"bottom {index} {list(bottom)} must have {axes} axes, 1 timestep and the {num} streams of "
                    f"bottom 0",
                    field="bottom",
                )
        if gates[2] != 4 * c_prev[2]:
            raise ctx.error(
                f"the gate input {list(gates)} must have 4 x {c_prev[2]} (the hidden size) channels", field="bottom"
            )
        return LayerSetup(tops=[c_prev, c_prev])

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return index < 2  # Backward_cpu writes the diffs of c_{t-1} and the gates when either needs backward

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        # X_acts_ holds the gate activations for the GPU kernels only; Forward_cpu recomputes them. Backward_gpu
        # writes their gradient into X_acts_'s diff, unless neither c_{t-1} nor the gates need one.
        if engine == ENGINE_CPU:
            return []
        count = count_of(ctx.bottoms[1])
        buffers = [Buffer("X_acts", count)]
        if ctx.need_backward and any(ctx.bottom_need_backward[:2]):
            buffers.append(Buffer("X_acts.diff", count))
        return buffers


def _layer(net: Any, name: str, layer_type: str, bottoms: list[str], tops: list[str]) -> Any:
    layer = net.layer.add()
    layer.name = name
    layer.type = layer_type
    layer.bottom.extend(bottoms)
    layer.top.extend(tops)
    return layer


def _inner_product(
    net: Any, name: str, bottom: str, top: str, num_output: int, axis: int, params: list[str], bias: bool,
    p: Any,
) -> Any:
    """InnerProduct as FillUnrolledNet's hidden_param / biased_hidden_param: named (shared) params, the layer's
    fillers, propagate_down left to the caller."""
    layer = _layer(net, name, "InnerProduct", [bottom], [top])
    ip = layer.inner_product_param
    ip.num_output = num_output
    ip.bias_term = bias
    ip.axis = axis
    ip.weight_filler.CopyFrom(p.weight_filler)
    if bias:
        ip.bias_filler.CopyFrom(p.bias_filler)
    for param_name in params:
        layer.param.add().name = param_name
    return layer


MAX_UNROLLED_STEPS = 500
"""Timesteps the estimator unrolls at most: ~1 s to build here (2 s at 1000, 6.6 s at 3000). Past it a batch (the
first axis, which recurrent nets use for time) counts as one that cannot be built, so the planner's search over it
stays bounded (3 s for a small LSTM against 8 GiB; it never ended before)."""


class RecurrentRule(LayerRule):
    """RecurrentLayer: bottoms x (T, N, ...), cont (T, N), optional x_static (N, ...), then the initial hidden
    states when expose_hidden; tops the output (T, N, num_output), then the final hidden states when
    expose_hidden."""

    bottoms = Count(minimum=2)
    tops = Count(minimum=1)
    recurrent_inputs: ClassVar[tuple[str, ...]] = ()
    """RecurrentInputBlobNames, in the order the exposed bottoms come."""
    output: ClassVar[str] = ""
    """OutputBlobNames (one output for both LSTM and RNN)."""
    unrolled_per_step: ClassVar[int] = 0
    """Layers of the unrolled net per timestep, the Split layers Net::Init inserts included (a static input adds
    one), at most."""
    unrolled_fixed: ClassVar[int] = 12
    """Layers of the unrolled net besides its timesteps (inputs, slices, the static input's, concat, pseudo-loss,
    their splits), at most."""

    def layers_held(self, param: Any) -> int:
        """The unrolled net at the most timesteps the estimator unrolls: the cost counts the worst a batch may ask."""
        return self.unrolled_fixed + self.unrolled_per_step * MAX_UNROLLED_STEPS

    def recurrent_outputs(self, steps: int) -> list[str]:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def fill_unrolled_net(self, net: Any, p: Any, steps: int, static: bool) -> None:  # pragma: no cover
        raise NotImplementedError

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        # Backward_cpu runs the unrolled net's backward unconditionally, and its x_transform has propagate_down
        # true: x's diff (shared with bottom 0) is written whatever propagate_down says.
        return index == 0

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.recurrent_param
        exposed = len(self.recurrent_inputs) if p.expose_hidden else 0
        least = 2 + exposed
        if not least <= len(ctx.bottoms) <= least + 1:
            raise ctx.error(
                f"takes {least} or {least + 1} bottom blobs (x, cont, optional x_static"
                + (", the initial hidden states" if exposed else "")
                + f"), got {len(ctx.bottoms)}",
                field="bottom",
            )
        if len(ctx.param.top) != 1 + exposed:
            raise ctx.error(f"takes exactly {1 + exposed} top blob(s), got {len(ctx.param.top)}", field="top")
        x, cont = ctx.bottoms[0], ctx.bottoms[1]
        if len(x) < 2:
            raise ctx.error(f"bottom 0 must have at least 2 axes (timesteps, streams, ...), got {list(x)}", field="bottom")
        steps, streams = x[0], x[1]
        if len(cont) != 2 or tuple(cont) != (steps, streams):
            raise ctx.error(
                f"bottom 1 (sequence continuation) must be ({steps}, {streams}) like bottom 0's first axes, "
                f"got {list(cont)}",
                field="bottom",
            )
        static = len(ctx.bottoms) > 2 + exposed
        if static:
            x_static = ctx.bottoms[2]
            if len(x_static) < 1 or x_static[0] != streams:
                raise ctx.error(
                    f"bottom 2 (static input) must start with the {streams} streams, got {list(x_static)}",
                    field="bottom",
                )
        num_output = ctx.positive(p.num_output, "recurrent_param.num_output")
        if steps <= 0:
            raise ctx.error(f"bottom 0 must have at least one timestep, got {list(x)}", field="bottom")
        if steps > MAX_UNROLLED_STEPS:
            raise UnrollLimitError(
                f"would unroll {steps} timesteps; the estimator builds at most {MAX_UNROLLED_STEPS} (each is "
                "several layers of an inner net)",
                source=ctx.source, line=ctx.line, layer=ctx.name, layer_type=ctx.type, field="bottom",
            )

        net = ctx.build_subnet(self.unrolled_param(ctx, static, steps))

        hidden: Shape = (1, streams, num_output)
        for index, bottom in enumerate(ctx.bottoms[2 + static :], start=2 + static):
            if tuple(bottom) != hidden:
                raise ctx.error(
                    f"bottom {index} {list(bottom)} must match the hidden state input shape {list(hidden)}",
                    field="bottom",
                )
        tops = [net.blob(self.output).shape]
        if exposed:
            tops += [net.blob(name).shape for name in self.recurrent_outputs(steps)]
        params = [param.shape for param in net.params if param.owner is None]
        # x, cont and x_static share the bottoms' data (x and x_static their diffs too), the output shares the
        # top's data and diff, and the initial hidden states of an exposed layer share the exposed bottoms' data.
        shared = {"x", "cont", "x_static", self.output, *(self.recurrent_inputs if exposed else ())}
        return LayerSetup(
            tops=tops,
            params=params,
            details={"steps": steps},
            subnet=SubNet(net=net, shared_blobs=frozenset(shared)),
        )

    def unrolled_param(self, ctx: LayerContext, static: bool, steps: int) -> Any:
        """RecurrentLayer::LayerSetUp's NetParameter: inputs, FillUnrolledNet, name prefix, pseudo-losses."""
        net = caffe_pb2.NetParameter()
        inputs = _layer(net, "", "Input", [], ["x", "cont"] + (["x_static"] if static else []))
        for bottom in ctx.bottoms[: 3 if static else 2]:
            inputs.input_param.shape.add().dim.extend(bottom)
        self.fill_unrolled_net(net, ctx.param.recurrent_param, steps, static)
        if ctx.name:
            for layer in net.layer:
                layer.name = f"{ctx.name}_{layer.name}"
        pseudo = _layer(net, f"{self.output}_pseudoloss", "Reduction", [self.output], [f"{self.output}_pseudoloss"])
        pseudo.loss_weight.append(1)
        return net

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        """The layer's own: LayerSetUp zeroes the recurrent outputs' diffs, touching them whether or not backward
        does. The unrolled net itself is counted by the memory model (`setup.subnet`)."""
        assert setup.subnet is not None
        net = setup.subnet.net
        training = net.phase == "TRAIN" and ctx.need_backward
        buffers = []
        for name in self.recurrent_outputs(setup.details["steps"]):
            blob = net.blob(name)
            if not (training and net.layers[blob.producer].need_backward):
                buffers.append(Buffer(f"unrolled.{name}.diff", blob.count, category=ACTIVATION_DIFFS))
        return buffers


@layer_rule("LSTM")
class LSTMRule(RecurrentRule):
    """LSTMLayer: gates from W_xc x + b_c (+ W_xc_static x_static) + W_hc h_{t-1}, an LSTMUnit per timestep."""

    recurrent_inputs = ("h_0", "c_0")
    output = "h"
    unrolled_per_step = 7

    def recurrent_outputs(self, steps: int) -> list[str]:
        return [f"h_{steps}", "c_T"]

    def fill_unrolled_net(self, net: Any, p: Any, steps: int, static: bool) -> None:
        """LSTMLayer::FillUnrolledNet."""
        num_output = p.num_output
        inputs = _layer(net, "", "Input", [], ["c_0", "h_0"])
        for _ in range(2):
            inputs.input_param.shape.add()  # filled below: both are (1, N, num_output)
        cont_slice = _layer(net, "cont_slice", "Slice", ["cont"], [])
        cont_slice.slice_param.axis = 0
        x_transform = _inner_product(net, "x_transform", "x", "W_xc_x", num_output * 4, 2, ["W_xc", "b_c"], True, p)
        x_transform.propagate_down.append(True)
        if static:
            x_static = _inner_product(
                net, "W_xc_x_static", "x_static", "W_xc_x_static_preshape", num_output * 4, 1, ["W_xc_static"],
                False, p,
            )
            x_static.propagate_down.append(True)
            reshape = _layer(net, "W_xc_x_static_reshape", "Reshape", ["W_xc_x_static_preshape"], ["W_xc_x_static"])
            reshape.reshape_param.shape.dim.extend([1, -1, num_output * 4])
        x_slice = _layer(net, "W_xc_x_slice", "Slice", ["W_xc_x"], [])
        x_slice.slice_param.axis = 0
        concat_bottoms = []
        for t in range(1, steps + 1):
            cont_slice.top.append(f"cont_{t}")
            x_slice.top.append(f"W_xc_x_{t}")
            cont_h = _layer(net, f"h_conted_{t - 1}", "Scale", [f"h_{t - 1}", f"cont_{t}"], [f"h_conted_{t - 1}"])
            cont_h.scale_param.axis = 0
            _inner_product(net, f"transform_{t}", f"h_conted_{t - 1}", f"W_hc_h_{t - 1}", num_output * 4, 2,
                           ["W_hc"], False, p)
            gate_bottoms = [f"W_hc_h_{t - 1}", f"W_xc_x_{t}"] + (["W_xc_x_static"] if static else [])
            gate = _layer(net, f"gate_input_{t}", "Eltwise", gate_bottoms, [f"gate_input_{t}"])
            gate.eltwise_param.operation = gate.eltwise_param.SUM
            _layer(net, f"unit_{t}", "LSTMUnit", [f"c_{t - 1}", f"gate_input_{t}", f"cont_{t}"], [f"c_{t}", f"h_{t}"])
            concat_bottoms.append(f"h_{t}")
        _layer(net, "", "Split", [f"c_{steps}"], ["c_T"])
        concat = _layer(net, "h_concat", "Concat", concat_bottoms, ["h"])
        concat.concat_param.axis = 0

    def unrolled_param(self, ctx: LayerContext, static: bool, steps: int) -> Any:
        net = super().unrolled_param(ctx, static, steps)
        for shape in net.layer[1].input_param.shape:
            shape.dim.extend([1, ctx.bottoms[0][1], ctx.param.recurrent_param.num_output])
        return net


@layer_rule("RNN")
class RNNRule(RecurrentRule):
    """RNNLayer: h_t = tanh(W_hh h_{t-1} + W_xh x_t + b_h (+ W_xh_static x_static)), o_t = tanh(W_ho h_t + b_o)."""

    recurrent_inputs = ("h_0",)
    output = "o"
    unrolled_per_step = 8

    def recurrent_outputs(self, steps: int) -> list[str]:
        return [f"h_{steps}"]

    def fill_unrolled_net(self, net: Any, p: Any, steps: int, static: bool) -> None:
        """RNNLayer::FillUnrolledNet."""
        num_output = p.num_output
        inputs = _layer(net, "", "Input", [], ["h_0"])
        inputs.input_param.shape.add()  # filled by unrolled_param: (1, N, num_output)
        cont_slice = _layer(net, "cont_slice", "Slice", ["cont"], [])
        cont_slice.slice_param.axis = 0
        x_transform = _inner_product(net, "x_transform", "x", "W_xh_x", num_output, 2, ["W_xh", "b_h"], True, p)
        x_transform.propagate_down.append(True)
        if static:
            x_static = _inner_product(
                net, "W_xh_x_static", "x_static", "W_xh_x_static_preshape", num_output, 1, ["W_xh_static"], False, p,
            )
            x_static.propagate_down.append(True)
            reshape = _layer(net, "W_xh_x_static_reshape", "Reshape", ["W_xh_x_static_preshape"], ["W_xh_x_static"])
            reshape.reshape_param.shape.dim.extend([1, -1, num_output])
        x_slice = _layer(net, "W_xh_x_slice", "Slice", ["W_xh_x"], [])
        x_slice.slice_param.axis = 0
        concat_bottoms = []
        for t in range(1, steps + 1):
            cont_slice.top.append(f"cont_{t}")
            x_slice.top.append(f"W_xh_x_{t}")
            cont_h = _layer(net, f"h_conted_{t - 1}", "Scale", [f"h_{t - 1}", f"cont_{t}"], [f"h_conted_{t - 1}"])
            cont_h.scale_param.axis = 0
            _inner_product(net, f"W_hh_h_{t - 1}", f"h_conted_{t - 1}", f"W_hh_h_{t - 1}", num_output, 2, ["W_hh"],
                           False, p)
            sum_bottoms = [f"W_hh_h_{t - 1}", f"W_xh_x_{t}"] + (["W_xh_x_static"] if static else [])
            input_sum = _layer(net, f"h_input_sum_{t}", "Eltwise", sum_bottoms, [f"h_neuron_input_{t}"])
            input_sum.eltwise_param.operation = input_sum.eltwise_param.SUM
            _layer(net, f"h_neuron_{t}", "TanH", [f"h_neuron_input_{t}"], [f"h_{t}"])
            _inner_product(net, f"W_ho_h_{t}", f"h_{t}", f"W_ho_h_{t}", num_output, 2, ["W_ho", "b_o"], True, p)
            _layer(net, f"o_neuron_{t}", "TanH", [f"W_ho_h_{t}"], [f"o_{t}"])
            concat_bottoms.append(f"o_{t}")
        concat = _layer(net, "o_concat", "Concat", concat_bottoms, ["o"])
        concat.concat_param.axis = 0

    def unrolled_param(self, ctx: LayerContext, static: bool, steps: int) -> Any:
        net = super().unrolled_param(ctx, static, steps)
        net.layer[1].input_param.shape[0].dim.extend([1, ctx.bottoms[0][1], ctx.param.recurrent_param.num_output])
        return net
